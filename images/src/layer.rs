//! A filesystem layer whose tar bytes depend only on what is in it: entries sorted by path, one
//! fixed time, owned by root, no user or group names, no host metadata. So the same files make
//! the same layer, and the same digest, on any machine and any day.

use std::collections::BTreeMap;

/// One entry of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir,
    /// A regular file with its permission bits and content.
    File {
        /// Permission bits (`0o755` for programs).
        mode: u32,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A symbolic link to `target` (relative to the link's directory).
    Symlink {
        /// What the link names.
        target: String,
    },
}

/// The entries of a layer by path (relative, no leading `/`).
#[derive(Debug, Default)]
pub struct Layer {
    entries: BTreeMap<String, Entry>,
}

impl Layer {
    /// Adds a file at `path` (absolute in the image) with its parent directories.
    pub fn add_file(&mut self, path: &str, mode: u32, data: Vec<u8>) {
        self.add(path, Entry::File { mode, data });
    }

    /// Adds a symbolic link at `path` (absolute in the image) naming `target`, with its parent
    /// directories.
    pub fn add_symlink(&mut self, path: &str, target: &str) {
        self.add(path, Entry::Symlink { target: target.to_string() });
    }

    fn add(&mut self, path: &str, entry: Entry) {
        let path = path.trim_start_matches('/');
        let mut parent = String::new();
        for part in path.split('/').take(path.split('/').count() - 1) {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            self.entries.entry(parent.clone()).or_insert(Entry::Dir);
        }
        self.entries.insert(path.to_string(), entry);
    }

    /// Adds an empty directory at `path` (absolute in the image).
    pub fn add_dir(&mut self, path: &str) {
        self.entries.entry(path.trim_start_matches('/').to_string()).or_insert(Entry::Dir);
    }

    /// The layer as a tar, every entry stamped with `mtime` (seconds since the epoch).
    pub fn to_tar(&self, mtime: u64) -> std::io::Result<Vec<u8>> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_ustar();
            header.set_mtime(mtime);
            header.set_uid(0);
            header.set_gid(0);
            match entry {
                Entry::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(if path == "tmp" { 0o1777 } else { 0o755 });
                    header.set_size(0);
                    tar.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { mode, data } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)?;
                }
            }
        }
        tar.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(tar: &[u8]) -> Vec<(String, u32, u64)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (e.path().unwrap().display().to_string(), h.mode().unwrap(), h.mtime().unwrap())
            })
            .collect()
    }

    #[test]
    fn entries_are_sorted_with_their_parents_and_one_time() {
        let mut layer = Layer::default();
        layer.add_file("/usr/local/bin/tool", 0o755, b"x".to_vec());
        layer.add_file("/etc/passwd", 0o644, b"root:x:0:0::/:/sbin/nologin\n".to_vec());
        layer.add_dir("/tmp");
        let tar = layer.to_tar(1_700_000_000).unwrap();
        assert_eq!(
            listing(&tar),
            [
                ("etc/".to_string(), 0o755, 1_700_000_000),
                ("etc/passwd".to_string(), 0o644, 1_700_000_000),
                ("tmp/".to_string(), 0o1777, 1_700_000_000),
                ("usr/".to_string(), 0o755, 1_700_000_000),
                ("usr/local/".to_string(), 0o755, 1_700_000_000),
                ("usr/local/bin/".to_string(), 0o755, 1_700_000_000),
                ("usr/local/bin/tool".to_string(), 0o755, 1_700_000_000),
            ]
        );
    }

    #[test]
    fn a_symlink_is_stored_as_one_naming_its_target() {
        let mut layer = Layer::default();
        layer.add_file("/usr/local/bin/tool", 0o755, b"x".to_vec());
        layer.add_symlink("/usr/local/bin/other-name", "tool");
        let tar = layer.to_tar(0).unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let links: Vec<(String, String)> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.header().entry_type() == tar::EntryType::Symlink)
            .map(|e| (e.path().unwrap().display().to_string(), e.link_name().unwrap().unwrap().display().to_string()))
            .collect();
        assert_eq!(links, [("usr/local/bin/other-name".to_string(), "tool".to_string())]);
    }

    #[test]
    fn the_same_files_added_in_another_order_make_the_same_bytes() {
        let mut one = Layer::default();
        one.add_file("/b", 0o644, b"2".to_vec());
        one.add_file("/a/x", 0o644, b"1".to_vec());
        let mut two = Layer::default();
        two.add_file("/a/x", 0o644, b"1".to_vec());
        two.add_file("/b", 0o644, b"2".to_vec());
        assert_eq!(one.to_tar(0).unwrap(), two.to_tar(0).unwrap());
        assert_ne!(one.to_tar(0).unwrap(), two.to_tar(1).unwrap(), "the time is in the bytes");
    }
}
