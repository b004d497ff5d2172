//! Directory trees walked, created and removed level by level: no recursion (a key may be a
//! 2 000-level path, deeper than a thread's stack allows for recursive calls in a debug build)
//! and one directory open at a time (a directory's entries are read whole, and it is closed,
//! before going on), so depth costs neither stack nor descriptors. Symlinks are never followed.

use std::fs::{self, FileType};
use std::io;
use std::path::{Path, PathBuf};

/// The entries of `dir` with their types (not following symlinks), the directory closed again.
fn entries(dir: &Path) -> io::Result<Vec<(PathBuf, FileType)>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        found.push((entry.path(), entry.file_type()?));
    }
    Ok(found)
}

/// Everything below `dir` that is not a directory (files, symlinks, others), with its type.
pub fn non_directories_below(dir: &Path) -> io::Result<Vec<(PathBuf, FileType)>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for (path, kind) in entries(&dir)? {
            if kind.is_dir() {
                pending.push(path);
            } else {
                found.push((path, kind));
            }
        }
    }
    Ok(found)
}

/// Removes `dir` and everything below it (std's `remove_dir_all` keeps a descriptor open per
/// level). A symlink is removed as itself.
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    let mut dirs = vec![dir.to_path_buf()];
    let mut next = 0;
    while let Some(current) = dirs.get(next).cloned() {
        next += 1;
        for (path, kind) in entries(&current)? {
            if kind.is_dir() {
                dirs.push(path);
            } else {
                fs::remove_file(&path)?;
            }
        }
    }
    // Found parents first, so removed in reverse: every directory after its children.
    for dir in dirs.iter().rev() {
        fs::remove_dir(dir)?;
    }
    Ok(())
}

/// Creates `dir` and its missing parents below `root` (std's `create_dir_all` recurses once
/// per level).
pub fn create_dirs(root: &Path, dir: &Path) -> io::Result<()> {
    let relative = dir.strip_prefix(root).unwrap_or(dir);
    let mut path = root.to_path_buf();
    for component in relative.components() {
        path.push(component);
        match fs::create_dir(&path) {
            Err(error) if error.kind() != io::ErrorKind::AlreadyExists => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_2000_level_tree_is_made_listed_and_removed_without_following_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "outside").unwrap();
        let root = dir.path().join("tree");
        let deep = root.join(std::iter::repeat_n("a", 2000).collect::<PathBuf>());
        create_dirs(dir.path(), &deep).unwrap();
        std::fs::write(deep.join("f"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        let found: Vec<PathBuf> = non_directories_below(&root).unwrap().into_iter().map(|(p, _)| p).collect();
        assert_eq!(found.len(), 2, "the file and the link, seen before removal: {}", found.len());
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert_eq!(std::fs::read_to_string(outside.path().join("keep")).unwrap(), "outside", "not followed");
    }
}
