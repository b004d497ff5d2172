//! The one recursive walk of a directory the suites share: every file below it, in a stable
//! order, so that a test reading "every page of docs/" or "every Rust file of a crate" reads
//! the same files on every machine.

use std::path::{Path, PathBuf};

/// Every file below `dir` (links not followed), sorted by path; empty when `dir` cannot be
/// read. A caller that must see something checks that it did (a positive control).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut next = vec![dir.to_path_buf()];
    while let Some(at) = next.pop() {
        for entry in std::fs::read_dir(&at).into_iter().flatten().flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                next.push(entry.path());
            } else if kind.is_file() {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

/// The pages the docs' checks read, as paths from the repository's root: README.md first,
/// then every Markdown page below docs/, its folders' pages included.
pub fn doc_pages(root: &Path) -> Vec<String> {
    let mut pages = vec!["README.md".to_string()];
    pages.extend(
        files_under(&root.join("docs"))
            .into_iter()
            .filter(|path| path.extension().is_some_and(|e| e == "md"))
            .filter_map(|path| path.strip_prefix(root).ok().map(|p| p.to_string_lossy().to_string())),
    );
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_below_is_found_in_order_and_folders_are_not_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b/c")).unwrap();
        for file in ["a.md", "b/x.md", "b/c/y.rs"] {
            std::fs::write(dir.path().join(file), "").unwrap();
        }
        let found: Vec<_> =
            files_under(dir.path()).into_iter().map(|p| p.strip_prefix(dir.path()).unwrap().to_path_buf()).collect();
        assert_eq!(found, ["a.md", "b/c/y.rs", "b/x.md"].map(PathBuf::from));
        std::fs::create_dir_all(dir.path().join("docs/driver")).unwrap();
        std::fs::write(dir.path().join("docs/driver/state.md"), "").unwrap();
        std::fs::write(dir.path().join("docs/index.md"), "").unwrap();
        assert_eq!(doc_pages(dir.path()), ["README.md", "docs/driver/state.md", "docs/index.md"]);
    }
}
