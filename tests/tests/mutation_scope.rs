//! The mutation report cannot drift from what was run: every path of `tests/mutation/scope.tsv`
//! names a file of the tree (a rename cannot silently empty a piece), every mutant in the
//! committed outcomes belongs to its piece's scope, and each row of `tests/mutation/REPORT.md` is
//! the one the committed outcomes make (or says the piece was not run), and a piece whose code
//! changed since its mutants were made is named stale in the report's "Falling short" (so a
//! change to a safety path cannot leave an old score standing as if it were current).
//! `tests/mutation/run` writes both; this runs in every test run, without mutating anything.

use std::collections::BTreeMap;
use std::path::Path;

use inline_guard_tests::code_digest::{
    changed_files, code_digests, code_hash, code_of, path_matches, test_digest, tracked_files,
};
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
    inline_guard_tests::walk::files_under(dir).iter().filter(|path| path.extension().is_some_and(|e| e == "rs")).count()
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
    let mut judged_by_nothing: Vec<String> = Vec::new();
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
        // Older outcomes are compared by the file at their commit; a clone without that commit
        // (a shallow one) cannot tell, and such a piece must be waiting (see the test below).
        if git(&["cat-file", "-e", &format!("{base}^{{commit}}")]).is_none() {
            judged_by_nothing.push(piece.clone());
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
    let mut named: Vec<String> = report
        .lines()
        .filter(|line| line.contains(": the code of "))
        .filter(|line| !judged_by_nothing.iter().any(|piece| line.starts_with(&format!("- piece {piece}: "))))
        .map(str::to_string)
        .collect();
    named.sort();
    assert_eq!(
        named, expected,
        "tests/mutation/REPORT.md must name exactly the pieces whose code changed since they were run \
         (rewrite it with `python3 tests/mutation/report.py report > tests/mutation/REPORT.md`, or rerun them)"
    );
}

/// `(piece, why)` of `tests/mutation/waiting.tsv`: the pieces whose committed outcomes are known
/// to be older than their code, each with why its rerun waits.
fn waiting() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(repo_root().join("tests/mutation/waiting.tsv")).expect("tests/mutation/waiting.tsv");
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (piece, why) = line.split_once('\t').unwrap_or((line, ""));
            assert!(!why.trim().is_empty(), "waiting.tsv: expected <piece>TAB<why its rerun waits>: {line:?}");
            (piece.to_string(), why.to_string())
        })
        .collect()
}

/// The gate of every test run: a piece's committed outcomes are of its code as it is now, by the
/// digests they record (no history needed), or the piece is listed in `waiting.tsv` with why; a
/// listed piece whose outcomes are current fails too, so the list only shrinks as pieces are
/// rerun. A change to a scoped file thus fails the suite until its piece runs again.
#[test]
fn every_piece_is_of_its_code_as_it_is_or_listed_as_waiting() {
    let root = repo_root();
    let scope = scope();
    let waiting = waiting();
    let mut pieces: Vec<&str> = Vec::new();
    for (piece, _) in &scope {
        if !pieces.contains(&piece.as_str()) {
            pieces.push(piece);
        }
    }
    for (piece, _) in &waiting {
        assert!(pieces.contains(&piece.as_str()), "waiting.tsv names {piece}, no piece of the scope");
    }
    let mut problems = Vec::new();
    for piece in pieces {
        let waits = waiting.iter().any(|(p, _)| p == piece);
        let path = root.join(format!("tests/mutation/outcomes/{piece}.json"));
        let outcomes: Option<Value> =
            std::fs::read_to_string(&path).ok().map(|text| serde_json::from_str(&text).expect("an outcomes file"));
        let recorded = outcomes.as_ref().and_then(|data| data["code"].as_object()).map(|code| {
            code.iter().map(|(file, digest)| (file.clone(), digest.as_str().unwrap_or_default().to_string())).collect()
        });
        let Some(recorded) = recorded else {
            if !waits {
                problems.push(format!(
                    "piece {piece}: {}: run it (tests/mutation/run {piece}) and commit its outcomes with the report",
                    if outcomes.is_some() { "its outcomes record no digests of their code" } else { "not run" }
                ));
            }
            continue;
        };
        let paths: Vec<String> = scope.iter().filter(|(p, _)| p == piece).map(|(_, path)| path.clone()).collect();
        let mut now = code_digests(&root, &paths).expect("the scope's files can be read");
        // The mutants are made of Rust files only, as report.py reads them.
        now.retain(|file, _| file.ends_with(".rs"));
        let mut changed = changed_files(&recorded, &now);
        changed.extend(mutants_no_longer_known_caught(&root, outcomes.as_ref().expect("outcomes were read")));
        match (changed.is_empty(), waits) {
            (true, true) => problems.push(format!(
                "piece {piece}: its outcomes are of its code as it is: remove it from tests/mutation/waiting.tsv"
            )),
            (false, false) => problems.push(format!(
                "piece {piece}: its outcomes are older than its code or its tests ({}): rerun tests/mutation/run {piece} and commit its outcomes with the report",
                changed.join(", ")
            )),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "the mutation outcomes do not keep up with the code:\n{}", problems.join("\n"));
}

/// The caught mutants of one piece's outcomes every one of whose killing tests changed or went
/// since (outcomes record which tests failed against each mutant, and each such test's digest):
/// such a mutant is no longer known to be caught. Outcomes recorded before they named their
/// killers name none.
fn mutants_no_longer_known_caught(root: &Path, outcomes: &Value) -> Vec<String> {
    let Some(tests) = outcomes["tests"].as_object() else { return Vec::new() };
    let tracked = tracked_files(root).expect("git ls-files");
    let changed: Vec<&String> = tests
        .iter()
        .filter(|(test, digest)| test_digest(root, &tracked, test) != digest.as_str().unwrap_or_default())
        .map(|(test, _)| test)
        .collect();
    let mut lost = Vec::new();
    for mutant in outcomes["mutants"].as_array().into_iter().flatten() {
        let killers: Vec<&str> =
            mutant["killed_by"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        if !killers.is_empty() && killers.iter().all(|killer| changed.iter().any(|test| test.as_str() == *killer)) {
            lost.push(format!(
                "every test that caught `{}` changed or went: {}",
                mutant["name"].as_str().unwrap_or("?"),
                killers.join(", ")
            ));
        }
    }
    lost
}

#[test]
fn a_killing_tests_digest_is_the_one_report_py_records() {
    let root = repo_root();
    let tracked = tracked_files(&root).unwrap();
    let tests = [
        "tests/src/lib.rs::code_digest::tests::a_test_function_is_read_to_its_closing_brace",
        "tests/tests/mutation_scope.rs::a_killing_tests_digest_is_the_one_report_py_records",
        "driver/src/lib.rs::no::such::test",
    ];
    for test in tests {
        let python = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys; sys.path.insert(0, 'tests/mutation'); import report; print(report.test_hash(sys.argv[1]))",
                test,
            ])
            .current_dir(&root)
            .output()
            .expect("python3 runs");
        assert!(python.status.success(), "{}", String::from_utf8_lossy(&python.stderr));
        assert_eq!(String::from_utf8_lossy(&python.stdout).trim(), test_digest(&root, &tracked, test), "{test}");
    }
    assert_ne!(
        test_digest(&root, &tracked, tests[0]),
        test_digest(&root, &tracked, tests[2]),
        "a test found is not the digest of nothing"
    );
}

#[test]
fn a_mutant_whose_every_killer_changed_is_no_longer_known_caught() {
    let root = repo_root();
    let tracked = tracked_files(&root).unwrap();
    let changed = "tests/tests/mutation_scope.rs::a_killing_tests_digest_is_the_one_report_py_records";
    let kept = "tests/src/lib.rs::code_digest::tests::a_test_function_is_read_to_its_closing_brace";
    let outcomes = serde_json::json!({
        "tests": {changed: "the digest of an older text", kept: test_digest(&root, &tracked, kept)},
        "mutants": [
            {"name": "killed by the changed test alone", "outcome": "caught", "killed_by": [changed]},
            {"name": "killed by both", "outcome": "caught", "killed_by": [changed, kept]},
            {"name": "killed by no test named (a crash)", "outcome": "caught"},
        ],
    });
    let lost = mutants_no_longer_known_caught(&root, &outcomes);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(lost[0].contains("killed by the changed test alone"), "{lost:?}");
}
