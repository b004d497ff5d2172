//! The driver's floors hold: imports run one way, csi → volume → content, and inside content
//! the sources stand side by side on the cluster floor. Read from the source itself, every path
//! a file names (`crate::…`, `super::…`, `self::…`, brace groups expanded) resolved to the
//! module it reaches, then judged by the rules below. Tests are exempt (a `tests.rs`, a
//! `tests/` folder, a trailing `#[cfg(test)] mod tests`): they may reach across to build
//! fixtures.
//!
//! The rules:
//! - the process around the layers (`cli`, `config`, `plugin`, …) assembles them and may reach
//!   any; `csi` and `volume` reach content only through its face (what a volume asks, the files it
//!   gets, its errors and changes, the tokens, a lazy volume's files: `content::{ask, changes,
//!   error, payload, tokens, lazy}` and the items of `content` itself); `volume` never reaches
//!   `csi`, `content` neither.
//! - the face reaches only the face; `content::cluster` the face and itself; `content::shares`
//!   the face, the cluster and itself; `content::projection` those and the shares;
//!   `content::external` the face, the cluster and itself; `content::kubernetes_source`, the one
//!   dispatcher, all of content.

use std::path::{Path, PathBuf};

/// The modules of content a volume, the wire and the face itself may reach.
const FACE: [&str; 8] = ["ask", "changes", "error", "payload", "tokens", "lazy", "static_dir", "live_volumes"];

/// Why `from` may not reach `to` (both module paths from the crate root), or `None` when it may.
fn refusal(from: &[String], to: &[String]) -> Option<String> {
    let top = |path: &[String]| path.first().cloned().unwrap_or_default();
    let in_content = |path: &[String]| -> Option<String> {
        (top(path) == "content").then(|| path.get(1).cloned().unwrap_or_default())
    };
    // An item of `content` itself (ContentSource, PassId, …) is the face; so is a face module.
    let is_face =
        |part: &str| FACE.contains(&part) || part.is_empty() || part.chars().next().is_some_and(char::is_uppercase);
    match (top(from).as_str(), top(to).as_str()) {
        ("volume" | "content", "csi") => return Some("the CSI wire is above it".into()),
        ("content", "volume") => return Some("the volume layer is above it".into()),
        _ => {}
    }
    let target = in_content(to)?;
    let allowed: Vec<&str> = match in_content(from).as_deref() {
        // The process around the layers (configuration, the command line, the plugin that
        // assembles them) may reach any of them; the wire and the volume layer only the face.
        None if matches!(top(from).as_str(), "csi" | "volume") => vec![],
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
    // What they allow.
    assert!(!refused("content::projection::fetch", "content::shares::source"));
    assert!(!refused("content::kubernetes_source", "content::external::provider_volume"));
    assert!(!refused("volume::lazy_filesystem", "content::lazy::LazyFiles"));
    assert!(!refused("csi::request", "content::tokens::Tokens"));
    assert!(!refused("content::external::provider_class", "content::cluster::Cluster"));
    assert!(!refused("csi::node", "volume::service"));
    assert!(!refused("cli", "content::external::providers::Providers"));
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
