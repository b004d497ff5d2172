//! What a measurement was made of, told apart without git's history: the sha256 of each tracked
//! file's code. A mutation piece's outcomes (`tests/mutation/`) and a benchmark area's results
//! (`benches/results/`) record these digests when they are made; a later checkout, shallow or
//! not, compares them with its own files to say which results are older than their code.

use std::collections::BTreeMap;
use std::path::Path;

/// Whether the tracked `file` is one `pattern` names: `dir/**` everything below `dir`, `dir/*`
/// the files directly in `dir`, anything else exactly that path (cargo-mutants reads `**` the
/// same way).
pub fn path_matches(pattern: &str, file: &str) -> bool {
    if let Some(dir) = pattern.strip_suffix("**") {
        return file.starts_with(dir);
    }
    if let Some(dir) = pattern.strip_suffix('*') {
        return file.strip_prefix(dir).is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
    }
    file == pattern
}

/// Whether the tracked `file` is a Rust file's tests kept beside it (`mod tests;` in a sibling
/// `tests.rs`, as large test modules are): no code, as a trailing test module is none.
pub fn is_test_file(file: &str) -> bool {
    file == "tests.rs" || file.ends_with("/tests.rs")
}

/// A Rust file's code: `text` above a trailing `#[cfg(test)] mod tests`, so that a change to a
/// file's tests alone leaves its results standing (`tests/mutation/report.py` reads it alike;
/// a sibling `tests.rs` is no code at all: [`is_test_file`]). Any other file is all code.
pub fn code_of(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    for number in 0..lines.len().saturating_sub(1) {
        if lines[number].trim() == "#[cfg(test)]" && lines[number + 1].starts_with("mod tests") {
            return lines[..number].join("\n");
        }
    }
    text.to_string()
}

/// The sha256 of `code`, in hexadecimal, as `tests/mutation/report.py` writes it.
pub fn code_hash(code: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, code.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The files git tracks in the checkout at `root` (a shallow clone's too).
pub fn tracked_files(root: &Path) -> Result<Vec<String>, String> {
    let output = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("git ls-files in {}: {e}", root.display()))?;
    if !output.status.success() {
        return Err(format!(
            "git ls-files in {}: {}",
            root.display(),
            String::from_utf8_lossy(&output.stderr).chars().take(300).collect::<String>()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).split('\0').filter(|f| !f.is_empty()).map(str::to_string).collect())
}

/// `{file: digest of its code}` for every tracked file one of `patterns` names, as the files are
/// now in the checkout at `root`.
pub fn code_digests(root: &Path, patterns: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut digests = BTreeMap::new();
    for file in tracked_files(root)? {
        if !is_test_file(&file) && patterns.iter().any(|pattern| path_matches(pattern, &file)) {
            // A tracked file deleted but not yet committed is no code: it is absent.
            let Ok(text) = std::fs::read_to_string(root.join(&file)) else { continue };
            digests.insert(file.clone(), code_hash(&code_of(&text)));
        }
    }
    Ok(digests)
}

/// The files whose code differs between a `recorded` set of digests and `now`: changed, added or
/// removed, sorted. Test files a record names (records made before they were told apart) are
/// not code on either side.
pub fn changed_files(recorded: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    let mut changed: Vec<String> =
        now.iter().filter(|(f, d)| !is_test_file(f) && recorded.get(*f) != Some(*d)).map(|(f, _)| f.clone()).collect();
    changed.extend(recorded.keys().filter(|f| !is_test_file(f) && !now.contains_key(*f)).cloned());
    changed.sort();
    changed
}

/// The digest of a test that killed a mutant, `TARGET::TEST` as `tests/mutation/report.py`
/// records it (TARGET: `driver/src/lib.rs` for a crate's unit tests, `driver/tests/binary.rs`
/// for an integration test; TEST: libtest's full name): the text of every function of that name
/// in the files the target's tests may be in, in path order (`tracked`: the checkout's files).
/// A test deleted is the digest of nothing.
pub fn test_digest(root: &Path, tracked: &[String], test: &str) -> String {
    let (target, name) = test.split_once("::").unwrap_or((test, ""));
    let function = name.rsplit("::").next().unwrap_or(name);
    let below = match (target.rfind("/src/"), target.rfind("/tests/")) {
        (Some(at), _) => format!("{}/src/", &target[..at]),
        (None, Some(at)) => format!("{}/tests/", &target[..at]),
        (None, None) => return code_hash(""),
    };
    let mut files: Vec<&String> = tracked.iter().filter(|f| f.starts_with(&below) && f.ends_with(".rs")).collect();
    files.sort();
    let mut texts = Vec::new();
    for file in files {
        let source = String::from_utf8_lossy(&std::fs::read(root.join(file)).unwrap_or_default()).into_owned();
        let text = function_text(&source, function);
        if !text.is_empty() {
            texts.push(text);
        }
    }
    code_hash(&texts.join("\n"))
}

/// The text of every `fn NAME` in `source` as rustfmt writes it: from its `fn` line to the first
/// line after it that closes at the same indentation; the texts joined by newlines.
pub fn function_text(source: &str, name: &str) -> String {
    let lines: Vec<&str> = source.split('\n').collect();
    let mut texts = Vec::new();
    for (number, line) in lines.iter().enumerate() {
        let Some(indent) = fn_line_indent(line, name) else { continue };
        let closing = format!("{indent}}}");
        let end = (number + 1..lines.len()).find(|&i| lines[i] == closing).unwrap_or(lines.len() - 1);
        texts.push(lines[number..=end].join("\n"));
    }
    texts.join("\n")
}

/// The indentation of `line` when it starts `fn NAME(` or `fn NAME<` (after `pub`, `pub(crate)`,
/// `async`), as report.py's pattern reads it.
fn fn_line_indent<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = line.trim_start();
    let indent = &line[..line.len() - rest.len()];
    if let Some(after) = rest.strip_prefix("pub") {
        let after = match after.strip_prefix('(') {
            Some(inside) => {
                let close = inside.find(')')?;
                let scope = &inside[..close];
                if scope.is_empty() || !scope.chars().all(|c| c.is_ascii_lowercase()) {
                    return None;
                }
                &inside[close + 1..]
            }
            None => after,
        };
        rest = after.strip_prefix(' ')?;
    }
    rest = rest.strip_prefix("async ").unwrap_or(rest);
    let rest = rest.strip_prefix("fn ")?.strip_prefix(name)?.trim_start();
    (rest.starts_with('(') || rest.starts_with('<')).then_some(indent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_what_they_say() {
        assert!(path_matches("driver/src/**", "driver/src/volume/live.rs"));
        assert!(!path_matches("driver/src/**", "driver/tests/binary.rs"));
        assert!(path_matches("benches/src/*", "benches/src/floor.rs"));
        assert!(!path_matches("benches/src/*", "benches/src/bin/bench-report/main.rs"), "`*` stays in its directory");
        assert!(path_matches("Cargo.lock", "Cargo.lock"));
        assert!(!path_matches("Cargo.lock", "driver/Cargo.lock"));
    }

    #[test]
    fn code_of_drops_only_a_trailing_test_module() {
        let file = "fn f() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";
        assert_eq!(code_of(file), "fn f() {}\n");
        assert_eq!(code_of("fn f() {}\n"), "fn f() {}\n", "no test module: all of it is code");
        assert_eq!(code_of(file), code_of(&file.replace("fn t()", "fn u()")), "a test's change is no code change");
        assert_ne!(code_of(file), code_of(&file.replace("fn f()", "fn g()")), "a code change is one");
    }

    #[test]
    fn changed_files_names_changed_added_and_removed_files() {
        let digests = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(f, d)| (f.to_string(), d.to_string())).collect()
        };
        let recorded = digests(&[("a.rs", "1"), ("b.rs", "2"), ("gone.rs", "3")]);
        let now = digests(&[("a.rs", "1"), ("b.rs", "9"), ("new.rs", "4")]);
        assert_eq!(changed_files(&recorded, &now), ["b.rs", "gone.rs", "new.rs"]);
        assert!(changed_files(&now, &now).is_empty());
        // A sibling tests.rs, changed, recorded and gone or new, is no code.
        let recorded = digests(&[("a.rs", "1"), ("a/tests.rs", "2"), ("b/tests.rs", "3")]);
        let now = digests(&[("a.rs", "1"), ("a/tests.rs", "9"), ("c/tests.rs", "4")]);
        assert!(changed_files(&recorded, &now).is_empty());
        assert!(is_test_file("driver/src/volume/lazy/handover/tests.rs") && !is_test_file("driver/src/tests_util.rs"));
    }

    #[test]
    fn a_test_function_is_read_to_its_closing_brace() {
        let source = "mod tests {\n    #[test]\n    fn kills() {\n        if x {\n        }\n    }\n\n    fn kills_more() {}\n}\n";
        assert_eq!(function_text(source, "kills"), "    fn kills() {\n        if x {\n        }\n    }");
        assert_eq!(function_text(source, "gone"), "");
        assert_eq!(function_text("pub(crate) async fn t<T>() {\n}\n", "t"), "pub(crate) async fn t<T>() {\n}");
        assert_eq!(function_text("fn tt() {}\n", "t"), "", "a longer name is another function");
    }
}
