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

/// A Rust file's code: `text` above a trailing `#[cfg(test)] mod tests`, so that a change to a
/// file's tests alone leaves its results standing (`tests/mutation/report.py` reads it alike).
/// Any other file is all code.
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
        if patterns.iter().any(|pattern| path_matches(pattern, &file)) {
            // A tracked file deleted but not yet committed is no code: it is absent.
            let Ok(text) = std::fs::read_to_string(root.join(&file)) else { continue };
            digests.insert(file.clone(), code_hash(&code_of(&text)));
        }
    }
    Ok(digests)
}

/// The files whose code differs between a `recorded` set of digests and `now`: changed, added or
/// removed, sorted.
pub fn changed_files(recorded: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    let mut changed: Vec<String> =
        now.iter().filter(|(f, d)| recorded.get(*f) != Some(*d)).map(|(f, _)| f.clone()).collect();
    changed.extend(recorded.keys().filter(|f| !now.contains_key(*f)).cloned());
    changed.sort();
    changed
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
    }
}
