//! A file the README or docs/ name is a file of the tree: a move or a rename that leaves the
//! reference pages pointing at nothing fails here, not in a reader's hands. Paths are read as
//! written from the repository's root (`driver/src/volume/refresh.rs`); a glob (`dir/**`) or a
//! missing path with a placeholder segment in capitals (`outcomes/PIECE.json`) names no one
//! file and is excused.

use std::path::Path;

use inline_guard_tests::repo_root;

/// The top folders a cited path starts with.
const TOPS: [&str; 8] = ["admission/", "driver/", "proto/", "config/", "benches/", "tests/", "images/", "docs/"];
/// The endings of a cited file.
const ENDINGS: [&str; 9] = [".rs", ".py", ".yaml", ".md", ".toml", ".tsv", ".json", ".proto", ".sh"];

/// The file paths `text` cites, with their line numbers.
fn cited(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        for (at, _) in line.char_indices() {
            let rest = &line[at..];
            let before = line[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
                || !TOPS.iter().any(|top| rest.starts_with(top))
            {
                continue;
            }
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '*' | '~'))
                .collect();
            let path = path.trim_end_matches('.');
            if ENDINGS.iter().any(|ending| path.ends_with(ending)) && !path.contains('*') {
                found.push((index + 1, path.to_string()));
            }
        }
    }
    found
}

/// Whether `path` has a segment in capitals that stands for any name (`PIECE`), as a missing
/// path's excuse: `README.md` and `REPORT.md` exist and are read like any other.
fn placeholder(path: &str) -> bool {
    path.split(['/', '.']).any(|segment| segment.len() > 1 && segment.chars().all(|c| c.is_ascii_uppercase()))
}

#[test]
fn every_file_the_readme_and_docs_name_exists() {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs")).unwrap().map(|e| e.unwrap().path()).collect();
    docs.sort();
    pages.extend(docs.into_iter().filter(|p| p.extension().is_some_and(|e| e == "md")));
    let mut read = 0;
    let mut missing = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (line, path) in cited(&text) {
            read += 1;
            if !Path::new(&root).join(&path).exists() && !placeholder(&path) {
                missing.push(format!("{}:{line}: {path}", page.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    // Positive control: the pages cite many files, and the reading found them.
    assert!(read > 50, "only {read} cited paths read");
    assert!(missing.is_empty(), "cited files that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn paths_are_read_as_written_and_placeholders_and_globs_are_not() {
    let text = "the refresher (`driver/src/volume/refresh.rs`), its tests in driver/src/volume/refresh/tests.rs.\n\
                see tests/mutation/outcomes/PIECE.json and `driver/src/volume/service/**`; not my-driver/src/x.rs";
    assert_eq!(
        cited(text),
        [
            (1, "driver/src/volume/refresh.rs".to_string()),
            (1, "driver/src/volume/refresh/tests.rs".to_string()),
            (2, "tests/mutation/outcomes/PIECE.json".to_string())
        ]
    );
    assert!(placeholder("tests/mutation/outcomes/PIECE.json"));
}
