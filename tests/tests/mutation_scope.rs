//! The mutation report cannot drift from what was run: every path of `tests/mutation/scope.tsv`
//! names a file of the tree (a rename cannot silently empty a piece), every mutant in the
//! committed outcomes belongs to its piece's scope, and each row of `tests/mutation/REPORT.md` is
//! the one the committed outcomes make (or says the piece was not run), and a piece whose code
//! changed since its mutants were made is named stale in the report's "Falling short" (so a
//! change to a safety path cannot leave an old score standing as if it were current).
//! `tests/mutation/run` writes both; this runs in every test run, without mutating anything.

use std::collections::BTreeMap;
use std::path::Path;

use inline_guard_tests::code_digest::{code_hash, code_of, path_matches};
use inline_guard_tests::repo_root;
use serde_json::Value;

/// `(piece, path)` of each scope line.
fn scope() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join("tests/mutation/scope.tsv")).expect("tests/mutation/scope.tsv");
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert!(fields.len() == 3, "scope.tsv: expected <piece>TAB<path>TAB<why>: {line:?}");
            (fields[0].to_string(), fields[1].to_string())
        })
        .collect()
}

fn rust_files_below(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| {
            let path = entry.path();
            if path.is_dir() {
                rust_files_below(&path)
            } else {
                usize::from(path.extension().is_some_and(|e| e == "rs"))
            }
        })
        .sum()
}

#[test]
fn every_scope_path_names_a_file_of_the_tree() {
    let root = repo_root();
    let scope = scope();
    assert!(scope.len() >= 10, "the scope lost its safety paths: {scope:?}");
    for (piece, path) in scope {
        let found = match path.strip_suffix("/**") {
            Some(dir) => rust_files_below(&root.join(dir)),
            None => usize::from(root.join(&path).is_file()),
        };
        assert!(found > 0, "tests/mutation/scope.tsv: piece {piece}: {path} names no file of the tree");
    }
}

/// Names of surviving mutants reviewed as equivalent.
fn equivalents() -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join("tests/mutation/equivalent.tsv"))
        .expect("tests/mutation/equivalent.tsv");
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line.split('\t').next().unwrap_or_default().to_string())
        .collect()
}

/// The report's row for `piece`, made from its committed outcomes (`None`: not run), as
/// `report.py` makes it.
fn row(piece: &str, outcomes: Option<&Value>, equivalent: &[String]) -> String {
    let Some(data) = outcomes else { return format!("| {piece} | not run |{}", " |".repeat(7)) };
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for mutant in data["mutants"].as_array().expect("outcomes: a mutants array") {
        let mut kind = mutant["outcome"].as_str().expect("outcomes: an outcome");
        if kind == "missed" && equivalent.iter().any(|name| mutant["name"] == name.as_str()) {
            kind = "equivalent";
        }
        *kinds.entry(kind).or_default() += 1;
    }
    let count = |kind: &str| kinds.get(kind).copied().unwrap_or(0);
    let caught = count("caught") + count("timeout");
    let scored = caught + count("missed");
    let shown = match (caught * 100).checked_div(scored) {
        Some(percent) => format!("{caught} of {scored} ({percent} %)"),
        None => "no viable mutant".to_string(),
    };
    let counts: Vec<String> =
        ["caught", "timeout", "missed", "equivalent", "unviable"].iter().map(|k| count(k).to_string()).collect();
    let minutes = data["seconds"].as_u64().expect("outcomes: seconds") / 60;
    format!("| {piece} | {} | {} | {shown} | {minutes} min |", data["tree"].as_str().unwrap_or("?"), counts.join(" | "))
}

#[test]
fn the_report_shows_what_the_committed_outcomes_hold_and_nothing_else() {
    let root = repo_root();
    let scope = scope();
    let report = std::fs::read_to_string(root.join("tests/mutation/REPORT.md")).expect("tests/mutation/REPORT.md");
    let equivalent = equivalents();
    let mut pieces: Vec<&str> = Vec::new();
    for (piece, _) in &scope {
        if !pieces.contains(&piece.as_str()) {
            pieces.push(piece);
        }
    }
    let outcomes_dir = root.join("tests/mutation/outcomes");
    for entry in std::fs::read_dir(&outcomes_dir).expect("tests/mutation/outcomes").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(piece) = name.strip_suffix(".json") {
            assert!(pieces.contains(&piece), "outcomes/{name} is of no piece of the scope: remove it or run the piece");
        }
    }
    for piece in pieces {
        let path = outcomes_dir.join(format!("{piece}.json"));
        let outcomes: Option<Value> = path.exists().then(|| {
            let text = std::fs::read_to_string(&path).expect("an outcomes file");
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        });
        if let Some(data) = &outcomes {
            let paths: Vec<&str> = scope.iter().filter(|(p, _)| p == piece).map(|(_, path)| path.as_str()).collect();
            for mutant in data["mutants"].as_array().expect("outcomes: a mutants array") {
                let file = mutant["file"].as_str().unwrap_or_default();
                assert!(
                    paths.iter().any(|path| path_matches(path, file)),
                    "outcomes/{piece}.json holds a mutant of {file}, outside the piece's scope {paths:?}: the outcomes are stale; rerun tests/mutation/run {piece}"
                );
            }
        }
        let expected = row(piece, outcomes.as_ref(), &equivalent);
        assert!(
            report.lines().any(|line| line == expected),
            "tests/mutation/REPORT.md lacks the row the committed outcomes make for piece {piece}:\n{expected}\n(rewrite it with `python3 tests/mutation/report.py report > tests/mutation/REPORT.md`)"
        );
    }
}

/// `git args...` in the checkout, its output; `None` when it fails.
fn git(args: &[&str]) -> Option<String> {
    let output = std::process::Command::new("git").args(args).current_dir(repo_root()).output().expect("git runs");
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn the_code_hash_is_the_one_report_py_records() {
    let code = "fn f() {}\n";
    let python = std::process::Command::new("python3")
        .args(["-c", "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())", code])
        .output()
        .expect("python3 runs");
    assert_eq!(String::from_utf8_lossy(&python.stdout).trim(), code_hash(code));
}

#[test]
fn a_piece_whose_code_changed_since_its_run_is_named_stale_in_the_report() {
    let root = repo_root();
    let scope = scope();
    let report = std::fs::read_to_string(root.join("tests/mutation/REPORT.md")).expect("tests/mutation/REPORT.md");
    let tracked = git(&["ls-files", "*.rs"]).expect("git ls-files: the suite runs in a git checkout");
    let (mut expected, mut read_from_history, mut with_history) = (Vec::new(), 0, 0);
    for entry in std::fs::read_dir(root.join("tests/mutation/outcomes")).expect("tests/mutation/outcomes").flatten() {
        let Some(piece) = entry.file_name().to_string_lossy().strip_suffix(".json").map(str::to_string) else {
            continue;
        };
        let data: Value = serde_json::from_str(&std::fs::read_to_string(entry.path()).unwrap()).unwrap();
        let tree = data["tree"].as_str().expect("outcomes: a tree");
        let base: String = tree.chars().take_while(char::is_ascii_hexdigit).collect();
        assert!(!base.is_empty(), "outcomes/{piece}.json names no commit: {tree:?}");
        let paths: Vec<&str> = scope.iter().filter(|(p, _)| *p == piece).map(|(_, path)| path.as_str()).collect();
        let files: Vec<&str> =
            tracked.lines().filter(|file| paths.iter().any(|path| path_matches(path, file))).collect();
        // Outcomes that record their code's hashes are compared without git's history (a
        // shallow clone too); older ones by the file at their commit.
        if let Some(recorded) = data["code"].as_object() {
            let mut all: Vec<&str> = files.clone();
            all.extend(recorded.keys().map(String::as_str).filter(|file| !files.contains(file)));
            all.sort();
            for file in all {
                let now = std::fs::read_to_string(root.join(file)).ok().map(|text| code_hash(&code_of(&text)));
                if now.as_deref() != recorded.get(file).and_then(Value::as_str) {
                    expected.push(format!(
                        "- piece {piece}: the code of {file} changed since {base}: rerun tests/mutation/run {piece}"
                    ));
                }
            }
            continue;
        }
        with_history += 1;
        for file in files {
            let before = git(&["show", &format!("{base}:{file}")]);
            read_from_history += usize::from(before.is_some());
            let now = std::fs::read_to_string(root.join(file)).expect("a tracked file");
            if before.is_none_or(|before| code_of(&before) != code_of(&now)) {
                expected.push(format!(
                    "- piece {piece}: the code of {file} changed since {base}: rerun tests/mutation/run {piece}"
                ));
            }
        }
    }
    // The comparison by history saw history: a checkout without it would call every file changed.
    assert!(
        with_history == 0 || read_from_history > 0,
        "no scoped file could be read at its piece's commit: is the history there? (a shallow clone: git fetch --unshallow)"
    );
    expected.sort();
    let mut named: Vec<String> =
        report.lines().filter(|line| line.contains(": the code of ")).map(str::to_string).collect();
    named.sort();
    assert_eq!(
        named, expected,
        "tests/mutation/REPORT.md must name exactly the pieces whose code changed since they were run \
         (rewrite it with `python3 tests/mutation/report.py report > tests/mutation/REPORT.md`, or rerun them)"
    );
}
