//! A file the README or docs/ name is a file of the tree: a move or a rename that leaves the
//! reference pages pointing at nothing fails here, not in a reader's hands. Paths are read as
//! written from the repository's root (`driver/src/volume/refresh.rs`), but a link's target
//! (`[state](driver/state.md)`) from its page's folder, as a reader's browser reads it; a glob (`dir/**`) or a
//! missing path with a placeholder segment in capitals (`outcomes/PIECE.json`) names no one
//! file and is excused.

use std::path::Path;

use inline_guard_tests::repo_root;

/// The top folders a cited path starts with.
const TOPS: [&str; 8] = ["admission/", "driver/", "proto/", "config/", "benches/", "tests/", "images/", "docs/"];
/// The endings of a cited file.
const ENDINGS: [&str; 9] = [".rs", ".py", ".yaml", ".md", ".toml", ".tsv", ".json", ".proto", ".sh"];

/// The file paths `text` cites, with their line numbers and whether each is a link's target
/// (read from the page's folder).
fn cited(text: &str) -> Vec<(usize, String, bool)> {
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
                found.push((index + 1, path.to_string(), line[..at].ends_with("](")));
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
    let pages = inline_guard_tests::walk::doc_pages(&root);
    // Positive control: the pages below docs/'s folders are read too.
    assert!(pages.iter().any(|page| page.starts_with("docs/driver/")), "{pages:?}");
    let mut read = 0;
    let mut missing = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        let folder = Path::new(page).parent().unwrap_or(Path::new(""));
        for (line, path, link) in cited(&text) {
            read += 1;
            let file = if link { root.join(folder).join(&path) } else { root.join(&path) };
            if !file.exists() && !placeholder(&path) {
                missing.push(format!("{page}:{line}: {path}"));
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
            (1, "driver/src/volume/refresh.rs".to_string(), false),
            (1, "driver/src/volume/refresh/tests.rs".to_string(), false),
            (2, "tests/mutation/outcomes/PIECE.json".to_string(), false)
        ]
    );
    // A link's target is read from its page's folder; its text, as written.
    assert_eq!(
        cited("see [docs/driver/state.md](driver/state.md#the-lock)"),
        [(1, "docs/driver/state.md".to_string(), false), (1, "driver/state.md".to_string(), true)]
    );
    assert!(placeholder("tests/mutation/outcomes/PIECE.json"));
}
