//! What a restarted driver keeps of its records: volumes whose target is still a mount point.
//! A record whose target is gone (the pod was deleted while the driver was down) or no longer
//! mounted (the node rebooted) is dropped; kubelet publishes again whatever it still wants. A
//! publish the driver was killed in (its record still incomplete) is undone: unmounted, its target
//! removed, its record dropped. No half volume survives a restart.

use crate::mounter::Mounter;
use crate::volume_store::{VolumeRecord, VolumeStore};

/// Keeps the records still backed by a mount, forgets the others, and returns what was kept
/// along with a line for each record dropped.
pub fn recover(
    records: Vec<VolumeRecord>,
    mounter: &dyn Mounter,
    store: &dyn VolumeStore,
) -> (Vec<VolumeRecord>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for record in records {
        let mounted = record.target_path.exists() && mounter.is_mount_point(&record.target_path).unwrap_or(false);
        if !record.complete {
            if mounted {
                let _ = mounter.unmount(&record.target_path);
            }
            let _ = std::fs::remove_dir_all(&record.target_path);
            let _ = store.remove(&record.volume_id);
            dropped.push(format!(
                "volume {}: publish to {} was interrupted; undone",
                record.volume_id,
                record.target_path.display()
            ));
            continue;
        }
        if mounted {
            kept.push(record);
            continue;
        }
        let why = if record.target_path.exists() { "is no longer mounted" } else { "is gone" };
        match store.remove(&record.volume_id) {
            Ok(()) => dropped.push(format!(
                "volume {}: target {} {why}; record dropped",
                record.volume_id,
                record.target_path.display()
            )),
            Err(error) => dropped.push(format!(
                "volume {}: target {} {why}; dropping the record failed: {error}",
                record.volume_id,
                record.target_path.display()
            )),
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::mounter::FakeMounter;
    use crate::publish_request::PodInfo;
    use crate::volume_store::FileVolumeStore;

    fn record(id: &str, target: PathBuf) -> VolumeRecord {
        VolumeRecord {
            volume_id: id.into(),
            target_path: target,
            pod: PodInfo { name: "p".into(), namespace: "n".into(), uid: "u".into(), service_account: "s".into() },
            attributes: Default::default(),
            host_read_only: false,
            complete: true,
        }
    }

    #[test]
    fn only_mounted_volumes_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileVolumeStore::open(dir.path().join("state")).unwrap();
        let mounter = FakeMounter::default();
        let mounted = dir.path().join("mounted");
        let unmounted = dir.path().join("unmounted");
        std::fs::create_dir_all(&mounted).unwrap();
        std::fs::create_dir_all(&unmounted).unwrap();
        mounter.mount_tmpfs(&mounted, 1, false).unwrap();
        let records =
            vec![record("kept", mounted), record("stale", unmounted), record("gone", dir.path().join("missing"))];
        for r in &records {
            store.put(r, true).unwrap();
        }
        let (kept, dropped) = recover(records, &mounter, &store);
        assert_eq!(kept.iter().map(|r| r.volume_id.as_str()).collect::<Vec<_>>(), ["kept"]);
        assert_eq!(dropped.len(), 2);
        assert!(
            dropped[0].starts_with("volume stale: target")
                && dropped[0].ends_with("is no longer mounted; record dropped")
        );
        assert_eq!(store.load_all().unwrap().0.len(), 1);
    }

    #[test]
    fn a_publish_interrupted_by_a_crash_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileVolumeStore::open(dir.path().join("state")).unwrap();
        let mounter = FakeMounter::default();
        let target = dir.path().join("half");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("partial"), "x").unwrap();
        mounter.mount_tmpfs(&target, 1, false).unwrap();
        let half = VolumeRecord { complete: false, ..record("half", target.clone()) };
        store.put(&half, true).unwrap();
        let (kept, dropped) = recover(vec![half], &mounter, &store);
        assert!(kept.is_empty());
        assert!(dropped[0].ends_with("was interrupted; undone"), "{}", dropped[0]);
        assert!(!mounter.is_mount_point(&target).unwrap(), "unmounted");
        assert!(!target.exists(), "the target is removed");
        assert!(store.load_all().unwrap().0.is_empty(), "the record is dropped");
    }
}
