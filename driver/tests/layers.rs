//! The driver's floors hold: imports run one way, csi → volume → content, over a ground every
//! floor may stand on; inside content the sources stand side by side on the cluster floor; the
//! lazy wing is entered by its doors; and no two modules reach each other, at any depth. Read
//! from the source itself, every path a file names (`crate::…`, `super::…`, `self::…`, brace
//! groups expanded, and inside attribute strings such as serde's
//! `deserialize_with = "crate::…"`, which the compiler resolves as any path) resolved to the
//! module it reaches, then judged by the rules below. Tests are exempt (a `tests.rs`, a `tests/`
//! folder, a trailing `#[cfg(test)] mod tests`): they may reach across to build fixtures.
//!
//! The rules:
//! - the ground ([`GROUND`]: the apiserver client, metrics, quoting, units, …) reaches only the
//!   ground: `metrics` names no volume type, `units` no configuration;
//! - the three floors (`csi`, `volume`, `content`) reach the ground and each other downwards,
//!   never the process around them (`cli`, `config`, `plugin`, `program`, `controllers`,
//!   `error`, `health`), which assembles them and may reach any;
//! - `csi` and `volume` reach content only through its face (what a volume asks, the files it
//!   gets, its errors and changes, the tokens, a lazy volume's files, the shares' per-node
//!   entries it wants written: `content::{ask, changes, error, payload, tokens, lazy,
//!   share_entries}` and the items of `content` itself); `volume` never reaches
//!   `csi`, `content` neither;
//! - the face reaches only the face; `content::cluster` the face and itself; `content::shares`
//!   the face, the cluster and itself; `content::projection` those and the shares;
//!   `content::external` the face, the cluster and itself; `content::kubernetes_source`, the one
//!   dispatcher, all of content;
//! - outside the lazy wing (`volume::lazy`), it is entered by two doors: its own items (a lazy
//!   mount, a taken volume, what hands volumes over) and `volume::lazy::handover` (taking a
//!   node's volumes, offering them); never its FUSE session, filesystem or open files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules of content a volume, the wire and the face itself may reach.
const FACE: [&str; 9] =
    ["ask", "changes", "error", "payload", "tokens", "lazy", "static_dir", "live_volumes", "share_entries"];

/// The ground: top-level modules any floor may reach, which reach only each other.
const GROUND: [&str; 7] = ["apiserver", "dir_tree", "fair_slots", "metrics", "quote", "units", "unpoisoned"];

/// The three floors.
const FLOORS: [&str; 3] = ["csi", "volume", "content"];

/// The most `.rs` files `driver/src` may hold loose (beside its folders), `lib.rs` and
/// `main.rs` counted: past it, what the crate is made of stops showing at a glance.
const MOST_LOOSE_FILES: usize = 12;

/// Why `from` may not reach `to` (both module paths from the crate root), or `None` when it may.
fn refusal(from: &[String], to: &[String]) -> Option<String> {
    let top = |path: &[String]| path.first().cloned().unwrap_or_default();
    // An item of the crate root (DRIVER_NAME) is ground.
    let is_item = |part: &str| part.chars().next().is_some_and(char::is_uppercase);
    let (from_top, to_top) = (top(from), top(to));
    if from_top != to_top && !is_item(&to_top) {
        let ground = |part: &str| GROUND.contains(&part);
        let floor = |part: &str| FLOORS.contains(&part);
        if ground(&from_top) && !ground(&to_top) {
            return Some(format!("the ground reaches only the ground, and {to_top} is not of it"));
        }
        if floor(&from_top) && !floor(&to_top) && !ground(&to_top) {
            return Some(format!("{to_top} is the process around the floors, above them"));
        }
    }
    if let Some(why) = lazy_door_refusal(from, to) {
        return Some(why);
    }
    let in_content = |path: &[String]| -> Option<String> {
        (top(path) == "content").then(|| path.get(1).cloned().unwrap_or_default())
    };
    // An item of `content` itself (ContentSource, PassId, …) is the face; so is a face module.
    let is_face = |part: &str| FACE.contains(&part) || part.is_empty() || is_item(part);
    match (from_top.as_str(), to_top.as_str()) {
        ("volume" | "content", "csi") => return Some("the CSI wire is above it".into()),
        ("content", "volume") => return Some("the volume layer is above it".into()),
        _ => {}
    }
    let target = in_content(to)?;
    let allowed: Vec<&str> = match in_content(from).as_deref() {
        // The process around the layers (configuration, the command line, the plugin that
        // assembles them) may reach any of them; the wire and the volume layer only the face.
        None if matches!(from_top.as_str(), "csi" | "volume") => vec![],
        None => return None,
        Some("kubernetes_source") => return None,
        Some(part) if is_face(part) => vec![],
        Some("cluster") => vec!["cluster"],
        Some("shares") => vec!["cluster", "shares"],
        Some("projection") => vec!["cluster", "shares", "projection"],
        Some("external") => vec!["cluster", "external"],
        Some(other) => return Some(format!("content::{other} is no floor the rules know: add it to them")),
    };
    if is_face(&target) || allowed.contains(&target.as_str()) {
        return None;
    }
    Some(format!("content::{target} is not its to reach (it may reach the face{})", {
        let more: String = allowed.iter().map(|a| format!(", content::{a}")).collect();
        more
    }))
}

/// Why `from`, outside the lazy wing, may not reach `to` inside it: only by its doors.
fn lazy_door_refusal(from: &[String], to: &[String]) -> Option<String> {
    let wing = ["volume".to_string(), "lazy".to_string()];
    if !to.starts_with(&wing) || from.starts_with(&wing) {
        return None;
    }
    let room = to.get(2).map(String::as_str).unwrap_or_default();
    let door = room.is_empty() || room == "handover" || room.chars().next().is_some_and(char::is_uppercase);
    (!door).then(|| {
        format!(
            "volume::lazy::{room} is inside the lazy wing: enter by its doors (its items, or volume::lazy::handover)"
        )
    })
}

/// Every `.rs` file under `dir` that is not a test file, with its module path.
fn sources(root: &Path, dir: &Path, found: &mut Vec<(PathBuf, Vec<String>)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if name != "tests" {
                sources(root, &path, found);
            }
            continue;
        }
        if !name.ends_with(".rs") || name == "tests.rs" {
            continue;
        }
        let relative = path.strip_prefix(root).unwrap().with_extension("");
        let mut module: Vec<String> = relative.iter().map(|c| c.to_string_lossy().to_string()).collect();
        if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            module.pop();
        }
        found.push((path, module));
    }
}

/// The code of `text` without comments and without a trailing `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// The paths `code` names from `crate`, `super` or `self`, brace groups expanded, as written.
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut at = 0;
    while at < bytes.len() {
        let rest: String = bytes[at..bytes.len().min(at + 7)].iter().collect();
        let boundary = at == 0 || !(bytes[at - 1].is_alphanumeric() || bytes[at - 1] == '_' || bytes[at - 1] == ':');
        let starts = ["crate::", "super::", "self::"].iter().find(|s| rest.starts_with(**s));
        match starts {
            Some(_) if boundary => {
                let (tree, end) = path_tree(&bytes, at);
                paths.extend(tree);
                at = end;
            }
            _ => at += 1,
        }
    }
    paths
}

/// The paths of the path tree starting at `at` (`a::b::{c, d::e}`), and where it ends.
fn path_tree(chars: &[char], mut at: usize) -> (Vec<String>, usize) {
    let mut prefix = String::new();
    while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_' || chars[at] == ':') {
        prefix.push(chars[at]);
        at += 1;
    }
    if at < chars.len() && chars[at] == '{' && prefix.ends_with("::") {
        let mut paths = Vec::new();
        at += 1;
        loop {
            while at < chars.len() && (chars[at].is_whitespace() || chars[at] == ',') {
                at += 1;
            }
            if at >= chars.len() || chars[at] == '}' {
                return (paths, at + 1);
            }
            let (inner, end) = path_tree(chars, at);
            paths.extend(inner.into_iter().map(|p| format!("{prefix}{p}")));
            // Skip what follows a path in a group (`as name`).
            at = end;
            while at < chars.len() && !matches!(chars[at], ',' | '}') {
                at += 1;
            }
        }
    }
    (vec![prefix.trim_end_matches(':').to_string()], at)
}

/// `path` as written in module `module`, resolved from the crate root.
fn resolve(module: &[String], path: &str) -> Vec<String> {
    let mut parts = path.split("::").filter(|p| !p.is_empty()).peekable();
    let mut resolved: Vec<String> = module.to_vec();
    match parts.peek().copied() {
        Some("crate") => {
            parts.next();
            resolved.clear();
        }
        _ => {
            while let Some(step) = parts.peek().copied() {
                match step {
                    "super" => {
                        resolved.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                parts.next();
            }
        }
    }
    resolved.extend(parts.map(String::from));
    resolved
}

#[test]
fn imports_run_one_way_and_the_sources_stand_side_by_side() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    let mut judged = 0;
    let mut broken = Vec::new();
    for (path, module) in &files {
        let code = code_of(&std::fs::read_to_string(path).unwrap());
        for named in named_paths(&code) {
            let to = resolve(module, &named);
            judged += 1;
            if let Some(why) = refusal(module, &to) {
                broken.push(format!("{}: {named}: {why}", path.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    // Positive control: the walk saw the layers and their imports of each other.
    assert!(files.iter().any(|(_, m)| m == &["content", "external", "lazy_files"]), "{files:?}");
    assert!(judged > 500, "only {judged} paths read: the walk is broken");
    assert!(broken.is_empty(), "imports against the floors:\n{}", broken.join("\n"));
}

#[test]
fn the_rules_refuse_what_the_floors_forbid() {
    let path = |text: &str| text.split("::").map(String::from).collect::<Vec<_>>();
    let refused = |from: &str, to: &str| refusal(&path(from), &path(to)).is_some();
    // What the floors used to allow, and must not any more.
    assert!(refused("volume::service::publish", "content::external::lazy_files::LazyFiles"));
    assert!(refused("content::shares::source", "content::external::providers"));
    assert!(refused("content::external::provider_class", "content::shares::source"));
    assert!(refused("content::external::helper_protocol", "content::projection::compose"));
    assert!(refused("content::ask", "content::projection::compose"));
    assert!(refused("content::cluster::watch", "content::shares::source"));
    assert!(refused("volume::service", "csi::request"));
    assert!(refused("content::changes", "volume::live"));
    // The ground and the process around the floors (each was an import circle once).
    assert!(refused("content::external::provider", "config::duration"));
    assert!(refused("metrics", "volume::refresh::share_gauges::Mounted"));
    assert!(refused("csi::socket", "error::RunError"));
    assert!(refused("apiserver::client", "cli::run"));
    assert!(refused("units", "config::DriverConfig"));
    // The lazy wing's doors.
    assert!(refused("volume::live", "volume::lazy::filesystem::LazyMount"));
    assert!(refused("volume::service::publish", "volume::lazy::fuse::session"));
    // What they allow.
    assert!(!refused("content::projection::fetch", "content::shares::source"));
    assert!(!refused("content::kubernetes_source", "content::external::provider_volume"));
    assert!(!refused("volume::lazy::filesystem", "content::lazy::LazyFiles"));
    assert!(!refused("csi::request", "content::tokens::Tokens"));
    assert!(!refused("content::external::provider_class", "content::cluster::Cluster"));
    assert!(!refused("csi::node", "volume::service"));
    assert!(!refused("cli", "content::external::providers::Providers"));
    assert!(!refused("content::external::provider", "units::duration"));
    assert!(!refused("volume::service", "metrics::Metrics"));
    assert!(!refused("controllers::startup_taint", "content::cluster::node_owner"));
    assert!(!refused("volume::live", "volume::lazy::LazyMount"));
    assert!(!refused("plugin", "volume::lazy::handover::offer::Offer"));
    assert!(!refused("volume::lazy::handover::take", "volume::lazy::filesystem::HandedLazyVolume"));
    assert!(!refused("csi::socket", "DRIVER_NAME"));
}

#[test]
fn paths_are_read_through_groups_renames_and_super() {
    let code = "use super::{lazy_files::HelperFiles, provider as p};\nuse crate::content::{ContentSource, shares::source};\nlet x = super::super::cluster::Cluster::new();";
    let named = named_paths(code);
    assert_eq!(
        named,
        [
            "super::lazy_files::HelperFiles",
            "super::provider",
            "crate::content::ContentSource",
            "crate::content::shares::source",
            "super::super::cluster::Cluster::new"
        ]
    );
    let module = ["content".to_string(), "external".to_string(), "exec".to_string()];
    assert_eq!(
        resolve(&module, "super::lazy_files::HelperFiles"),
        ["content", "external", "lazy_files", "HelperFiles"]
    );
    assert_eq!(resolve(&module, "super::super::cluster::Cluster"), ["content", "cluster", "Cluster"]);
}

#[test]
fn paths_in_attribute_strings_are_read() {
    let code = "#[serde(default = \"d\", deserialize_with = \"crate::units::duration\")]\nfield: u64,";
    assert_eq!(named_paths(code), ["crate::units::duration"]);
}

/// The module `path` reaches: its longest prefix that is a module of `modules`.
fn module_reached(path: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<String> {
    (0..=path.len()).rev().map(|end| path[..end].to_vec()).find(|prefix| modules.contains(prefix)).unwrap_or_default()
}

/// Every circle of modules reaching each other: for each module, the groups of its children
/// (each with what lies below it) that reach one another round, as (the parent, the children).
fn circles(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    modules: &BTreeSet<Vec<String>>,
) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let parents: BTreeSet<Vec<String>> =
        modules.iter().filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).collect();
    for parent in parents {
        let child = |module: &Vec<String>| {
            (module.len() > parent.len() && module.starts_with(&parent)).then(|| module[parent.len()].clone())
        };
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, reached) in edges {
            let Some(a) = child(from) else { continue };
            for to in reached {
                if let Some(b) = child(to).filter(|b| *b != a) {
                    graph.entry(a.clone()).or_default().insert(b);
                }
            }
        }
        // Two children are in one circle when each reaches the other (through any others).
        let reach = |start: &String| {
            let mut seen = BTreeSet::from([start.clone()]);
            let mut next = vec![start.clone()];
            while let Some(at) = next.pop() {
                for to in graph.get(&at).into_iter().flatten() {
                    if seen.insert(to.clone()) {
                        next.push(to.clone());
                    }
                }
            }
            seen
        };
        let mut placed = BTreeSet::new();
        for start in graph.keys() {
            if placed.contains(start) {
                continue;
            }
            let circle: Vec<String> =
                reach(start).into_iter().filter(|other| other != start && reach(other).contains(start)).collect();
            if !circle.is_empty() {
                let mut members = circle;
                members.push(start.clone());
                members.sort();
                placed.extend(members.iter().cloned());
                found.push((if parent.is_empty() { "crate".to_string() } else { parent.join("::") }, members));
            }
        }
    }
    found
}

/// A module's path from the crate root.
type Module = Vec<String>;

/// What each module reaches.
type Reaches = BTreeMap<Module, BTreeSet<Module>>;

/// What each module of the driver's source reaches, and its modules.
fn reaches() -> (Reaches, BTreeSet<Module>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(_, m)| m.clone()).collect();
    let mut edges: Reaches = BTreeMap::new();
    for (path, module) in &files {
        let code = code_of(&std::fs::read_to_string(path).unwrap());
        for named in named_paths(&code) {
            let to = module_reached(&resolve(module, &named), &modules);
            if !to.is_empty() {
                edges.entry(module.clone()).or_default().insert(to);
            }
        }
    }
    (edges, modules)
}

#[test]
fn no_two_modules_reach_each_other() {
    let (edges, modules) = reaches();
    // Positive control: the walk sees the process reach the floors and the floors the ground.
    let reached = |from: &[&str], to: &[&str]| {
        let (from, to): (Vec<String>, Vec<String>) =
            (from.iter().map(|s| s.to_string()).collect(), to.iter().map(|s| s.to_string()).collect());
        edges.get(&from).is_some_and(|set| set.contains(&to))
    };
    assert!(reached(&["plugin"], &["volume", "service"]) && reached(&["volume", "service"], &["metrics"]), "{edges:?}");
    let found = circles(&edges, &modules);
    assert!(found.is_empty(), "modules that reach each other (the parent, the circle): {found:?}");
}

#[test]
fn the_circle_finder_finds_a_circle_through_a_third_module() {
    let module = |text: &str| text.split("::").map(String::from).collect::<Vec<_>>();
    let modules: BTreeSet<_> = ["a", "a::x", "b", "c", "d"].map(module).into_iter().collect();
    let edges = BTreeMap::from([
        (module("a::x"), BTreeSet::from([module("b")])),
        (module("b"), BTreeSet::from([module("c")])),
        (module("c"), BTreeSet::from([module("a")])),
        (module("d"), BTreeSet::from([module("a")])),
    ]);
    let found = circles(&edges, &modules);
    assert_eq!(found, [("crate".to_string(), vec!["a".to_string(), "b".to_string(), "c".to_string()])]);
}

#[test]
fn the_top_level_holds_at_most_a_dozen_loose_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let loose: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == "rs"))
        .map(|path| path.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert!(loose.contains(&"lib.rs".to_string()), "the walk did not see lib.rs: {loose:?}");
    assert!(
        loose.len() <= MOST_LOOSE_FILES,
        "{} loose files in driver/src (at most {MOST_LOOSE_FILES}): {loose:?}",
        loose.len()
    );
}
