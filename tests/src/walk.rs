//! The recursive walks of a directory the suites share, in a stable order: every file below it
//! as it lies (so that a test reading "every page of docs/" or "every Rust file of a crate"
//! reads the same files on every machine), and every file a container sees in a volume the
//! driver wrote (its visible names are links into the current version, followed).

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

/// The deepest a volume's visible tree is walked: deeper is a loop of links, not a volume.
const VISIBLE_DEPTH: usize = 16;

/// Every file a container would see below `target`, a volume laid out by the driver's atomic
/// writer, as (path below `target`, its metadata through links), sorted by path: the writer's
/// own `..`-named entries skipped, the visible names followed into the current version.
pub fn visible_files_under(target: &Path) -> Vec<(String, std::fs::Metadata)> {
    let mut found = Vec::new();
    let mut next = vec![(target.to_path_buf(), 0)];
    while let Some((at, depth)) = next.pop() {
        for entry in std::fs::read_dir(&at).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with("..") {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if meta.is_dir() && depth < VISIBLE_DEPTH {
                next.push((path, depth + 1));
            } else if meta.is_file() {
                found.push((path.strip_prefix(target).unwrap_or(&path).to_string_lossy().into_owned(), meta));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
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

    #[test]
    fn a_volumes_visible_files_are_its_links_followed_and_the_writers_own_entries_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path();
        // The atomic writer's layout: a version directory, `..data` naming it, visible links.
        std::fs::create_dir_all(target.join("..2026_v1/sub")).unwrap();
        std::fs::write(target.join("..2026_v1/a"), "one").unwrap();
        std::fs::write(target.join("..2026_v1/sub/b"), "two").unwrap();
        std::os::unix::fs::symlink("..2026_v1", target.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a", target.join("a")).unwrap();
        std::os::unix::fs::symlink("..data/sub", target.join("sub")).unwrap();
        // A loop of links is walked no deeper than the bound, and ends.
        std::os::unix::fs::symlink(".", target.join("..2026_v1/sub/loop")).unwrap();
        let names: Vec<String> = visible_files_under(target).into_iter().map(|(name, _)| name).collect();
        assert_eq!(names[..2], ["a".to_string(), "sub/b".to_string()], "{names:?}");
        assert!(names.iter().all(|name| !name.contains("..")), "{names:?}");
        assert_eq!(names.len(), 2 + VISIBLE_DEPTH - 1, "the loop followed to the bound: {names:?}");
    }
}
