//! One record per published volume, so a restarted driver knows what it serves and what it made.
//! Each record is its own JSON file named by the SHA-256 of its volume id (so any id, however long
//! or strange, fits in a file name and none can name a path outside the store), written
//! atomically through a temporary file of its own (fsync, rename, fsync of the directory): a crash
//! leaves the old record or the new one, never half of one, and two writers never share a file.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::content::ask::PodInfo;
use crate::volume::error::{Error, Result};

/// What the driver remembers of a published volume. Never holds secrets or tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The volume.
    pub volume_id: String,
    /// Where it is mounted.
    pub target_path: PathBuf,
    /// Whose pod it is.
    pub pod: PodInfo,
    /// The pod's volume attributes.
    pub attributes: BTreeMap<String, String>,
    /// Whether the tmpfs is read-only on the host too.
    pub host_read_only: bool,
    /// The directories the driver created on the way to (and including) the target: the only
    /// ones it may remove, and only while empty. While a publish is incomplete, the ones it is
    /// about to create.
    #[serde(default)]
    pub created_dirs: Vec<PathBuf>,
    /// The device number of the volume's tmpfs once mounted: how the driver recognises its own
    /// mount without reading the mount table (the tag is the fallback).
    #[serde(default)]
    pub device: Option<u64>,
    /// False from the moment a publish starts until it has finished: a record still incomplete
    /// at start-up marks a publish the driver was killed in, to be undone.
    #[serde(default = "complete_by_default")]
    pub complete: bool,
    /// What the volume's provider answered last, by object (a Secrets Store provider's object
    /// versions): sent back at each refresh, by a restarted driver too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub object_versions: BTreeMap<String, String>,
    /// Whether the volume is served through FUSE by the driver itself (a lazy provider's),
    /// rather than laid out in a tmpfs: such a mount ends with the process that served it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
    /// The group the volume's files belong to (the pod's `fsGroup`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_group: Option<u32>,
}

fn complete_by_default() -> bool {
    true
}

impl VolumeRecord {
    /// True when `other` publishes the same volume the same way (what a repeated
    /// NodePublishVolume must match to be idempotent); what the driver made along the way does
    /// not count.
    pub fn same_publish(&self, other: &VolumeRecord) -> bool {
        self.volume_id == other.volume_id
            && self.target_path == other.target_path
            && self.pod == other.pod
            && self.attributes == other.attributes
            && self.host_read_only == other.host_read_only
            && self.mount_group == other.mount_group
    }
}

/// The lowercase hex SHA-256 of a volume id: its record's file name and its mounts' tag.
pub fn volume_digest(volume_id: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, volume_id.as_bytes());
    digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Where records live.
pub trait VolumeStore: Send + Sync {
    /// Saves (or replaces) a record; `durable` waits until it is on disk.
    fn put(&self, record: &VolumeRecord, durable: bool) -> Result<()>;
    /// Forgets a volume; forgetting an unknown volume is not an error.
    fn remove(&self, volume_id: &str) -> Result<()>;
    /// Every record, and a message for each file that could not be read as one.
    fn load_all(&self) -> Result<(Vec<VolumeRecord>, Vec<String>)>;
}

/// Records as files in a directory.
#[derive(Debug)]
pub struct FileVolumeStore {
    dir: PathBuf,
    // Makes each temporary file name unique within the process (the pid, across processes).
    writes: AtomicU64,
}

const SUFFIX: &str = ".json";
const TEMPORARY_SUFFIX: &str = ".tmp";
const MAX_RECORD_BYTES: u64 = 1 << 20;

impl FileVolumeStore {
    /// A store in `dir`, created if missing.
    pub fn open(dir: impl Into<PathBuf>) -> Result<FileVolumeStore> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| io_error("creating the state directory", &dir, e))?;
        Ok(FileVolumeStore { dir, writes: AtomicU64::new(0) })
    }

    /// The record file of a volume.
    fn path_of(&self, volume_id: &str) -> PathBuf {
        self.dir.join(volume_digest(volume_id) + SUFFIX)
    }
}

impl VolumeStore for FileVolumeStore {
    fn put(&self, record: &VolumeRecord, durable: bool) -> Result<()> {
        let path = self.path_of(&record.volume_id);
        let write = self.writes.fetch_add(1, Ordering::Relaxed);
        let temporary = self.dir.join(format!(
            ".{}.{}.{write}{TEMPORARY_SUFFIX}",
            volume_digest(&record.volume_id),
            std::process::id()
        ));
        let json = serde_json::to_vec_pretty(record).map_err(|e| Error::local("encoding a record", e))?;
        let written = (|| {
            let mut file = fs::File::create_new(&temporary).map_err(|e| io_error("creating", &temporary, e))?;
            file.write_all(&json).map_err(|e| io_error("writing", &temporary, e))?;
            if durable {
                file.sync_all().map_err(|e| io_error("syncing", &temporary, e))?;
            }
            fs::rename(&temporary, &path).map_err(|e| io_error("renaming into place", &path, e))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        written?;
        if !durable {
            return Ok(());
        }
        // The rename is durable only once the directory is.
        fs::File::open(&self.dir).and_then(|dir| dir.sync_all()).map_err(|e| io_error("syncing", &self.dir, e))
    }

    fn remove(&self, volume_id: &str) -> Result<()> {
        let path = self.path_of(volume_id);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(io_error("removing", &path, error)),
        }
    }

    fn load_all(&self) -> Result<(Vec<VolumeRecord>, Vec<String>)> {
        let mut records = Vec::new();
        let mut problems = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| io_error("listing", &self.dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(TEMPORARY_SUFFIX) {
                // A write that never completed: the previous record, if any, is still in place.
                // (Only one driver runs on a state directory, so no write is under way now.)
                let _ = fs::remove_file(&path);
                continue;
            }
            if !name.ends_with(SUFFIX) {
                continue;
            }
            // Records are a few hundred bytes; anything far larger is not one of them.
            let too_large = entry.metadata().is_ok_and(|m| !m.is_file() || m.len() > MAX_RECORD_BYTES);
            let record =
                (if too_large { Err("not a record file (too large, or not a file)".to_string()) } else { Ok(()) })
                    .and_then(|()| fs::read(&path).map_err(|e| e.to_string()))
                    .and_then(|bytes| serde_json::from_slice::<VolumeRecord>(&bytes).map_err(|e| e.to_string()));
            let record = match record {
                Ok(record) => record,
                Err(error) => {
                    problems.push(format!("{}: {error}", crate::quote::quote_path(&path)));
                    continue;
                }
            };
            // A record under another name (an older layout, or put there by hand) is moved to
            // its own, so that dropping the volume later drops this file too.
            let own = self.path_of(&record.volume_id);
            if path != own {
                if own.exists() {
                    problems.push(format!(
                        "{}: a second record of volume {}; ignored",
                        crate::quote::quote_path(&path),
                        crate::quote::quote(&record.volume_id)
                    ));
                    continue;
                }
                if let Err(error) = fs::rename(&path, &own) {
                    problems.push(format!("{}: {error}", crate::quote::quote_path(&path)));
                    continue;
                }
            }
            records.push(record);
        }
        records.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok((records, problems))
    }
}

fn io_error(action: &str, path: &Path, error: std::io::Error) -> Error {
    Error::local(format!("{action} {}", crate::quote::quote_path(path)), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(volume_id: &str) -> VolumeRecord {
        VolumeRecord {
            volume_id: volume_id.into(),
            target_path: PathBuf::from("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount"),
            pod: PodInfo {
                name: "web".into(),
                namespace: "apps".into(),
                uid: "u".into(),
                service_account: "sa".into(),
            },
            attributes: [("sharedSecret".to_string(), "db".to_string())].into(),
            host_read_only: false,
            created_dirs: Vec::new(),
            device: None,
            complete: true,
            object_versions: BTreeMap::new(),
            lazy: false,
            mount_group: None,
        }
    }

    #[test]
    fn records_survive_a_reopen_and_removal_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileVolumeStore::open(dir.path().join("state")).unwrap();
        store.put(&record("csi-b"), true).unwrap();
        store.put(&record("csi-a"), false).unwrap();
        let mut changed = record("csi-a");
        changed.host_read_only = true;
        store.put(&changed, true).unwrap();

        let reopened = FileVolumeStore::open(dir.path().join("state")).unwrap();
        let (records, problems) = reopened.load_all().unwrap();
        assert_eq!(records, [changed, record("csi-b")]);
        assert!(problems.is_empty());
        reopened.remove("csi-a").unwrap();
        reopened.remove("csi-a").unwrap();
        assert_eq!(reopened.load_all().unwrap().0.len(), 1);
    }

    #[test]
    fn hostile_volume_ids_stay_inside_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileVolumeStore::open(dir.path().join("state")).unwrap();
        let long = "%/".repeat(64);
        for id in ["../escape", "/etc/passwd", ".hidden", "a/b", long.as_str()] {
            store.put(&record(id), true).unwrap();
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "nothing written beside the store");
        let ids: Vec<String> = store.load_all().unwrap().0.into_iter().map(|r| r.volume_id).collect();
        assert_eq!(ids, ["%/".repeat(64).as_str(), "../escape", ".hidden", "/etc/passwd", "a/b"]);
        assert!(
            fs::read_dir(dir.path().join("state")).unwrap().all(|e| e.unwrap().file_name().len() == 64 + 5),
            "every file is named by the digest of its id"
        );
        store.remove(&long).unwrap();
        assert_eq!(store.load_all().unwrap().0.len(), 4, "a long id is removed like any other");
    }

    #[test]
    fn a_record_under_another_name_is_moved_to_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileVolumeStore::open(dir.path()).unwrap();
        let json = serde_json::to_vec(&record("csi-hand")).unwrap();
        fs::write(dir.path().join("by-hand.json"), &json).unwrap();
        let (records, problems) = store.load_all().unwrap();
        assert_eq!((records, problems), (vec![record("csi-hand")], vec![]));
        store.remove("csi-hand").unwrap();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "dropping the volume dropped its file");
    }

    #[test]
    fn a_torn_write_and_a_corrupt_record_are_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileVolumeStore::open(dir.path()).unwrap();
        store.put(&record("csi-good"), true).unwrap();
        fs::write(dir.path().join(".0badc0de.1.0.tmp"), "{\"volume_id\":").unwrap();
        fs::write(dir.path().join("csi-bad.json"), "not json").unwrap();
        let (records, problems) = store.load_all().unwrap();
        assert_eq!(records, [record("csi-good")]);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("csi-bad.json\": expected ident"), "{}", problems[0]);
        assert!(!dir.path().join(".0badc0de.1.0.tmp").exists(), "the torn write is cleaned up");
    }
}
