//! What a restarted driver keeps of its records: finished volumes whose target still holds the
//! driver's own tmpfs. Everything else is taken back, but only what the record says the driver
//! made: a record whose target is gone (the pod was deleted while the driver was down) or no
//! longer mounted (the node rebooted) is dropped, with the directories it created removed while
//! empty; a publish the driver was killed in (its record still incomplete) has its own tmpfs
//! unmounted too. A mount the driver did not make, a directory it did not create or one that is
//! not empty is left exactly as it is. kubelet publishes again whatever it still wants.
//!
//! A lazy volume is kept only when the previous process handed it over (`volume::handover`:
//! this process holds its connection now). Any other lazy volume's FUSE session ended with the
//! process that served it (a crash, SIGKILL, an OOM kill, a stop without a successor), so its
//! mount is detached and its record dropped. A container that already had it keeps a dead mount
//! (reads fail with ENOTCONN) until its pod is restarted; kubelet's next publish of the volume
//! (a new pod, or the CSIDriver's republish) serves it again.

use std::collections::HashSet;
use std::path::Path;

use crate::quote::{quote, quote_path};
use crate::volume::mounter::Mounter;
use crate::volume::ownership::{Ownership, ownership};
use crate::volume::published::PublishedVolume;
use crate::volume::store::{VolumeRecord, VolumeStore};
use crate::volume::target_dir;
use crate::volume::target_path::TargetPath;

/// Keeps the finished records still backed by their own mount, and the lazy ones in `handed`
/// (handed over by the previous process, not yet served here), takes back the others' own creations, and returns what was kept along with a
/// line for each record dropped.
pub fn recover(
    records: Vec<VolumeRecord>,
    mounter: &dyn Mounter,
    store: &dyn VolumeStore,
    kubelet_dir: &Path,
    handed: &HashSet<String>,
) -> (Vec<PublishedVolume>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for record in records {
        let volume = quote(&record.volume_id);
        let target = quote_path(&record.target_path);
        let mut lines = Vec::new();
        // A lazy volume handed over is served by nobody until this process takes it over:
        // looking at its target now would wait on a request only this process can answer. Its
        // predecessor served it until the handover, so it is mounted; it is kept unseen.
        if record.lazy && handed.contains(&record.volume_id) {
            match TargetPath::parse(&record.target_path.to_string_lossy(), kubelet_dir) {
                Ok(path) => {
                    kept.push(PublishedVolume { record, target: path });
                    continue;
                }
                Err(error) => lines.push(error.to_string()),
            }
        }
        // A target that is no longer kubelet's (the configuration changed) is not walked at all.
        let own_mount = TargetPath::parse(&record.target_path.to_string_lossy(), kubelet_dir).and_then(|path| {
            let Some(opened) = target_dir::open(kubelet_dir, &path)? else { return Ok(None) };
            Ok(match ownership(mounter, &opened, &record.volume_id, record.device)? {
                Ownership::Own => Some((true, opened, path)),
                Ownership::Foreign(_) => Some((false, opened, path)),
                Ownership::Unmounted => None,
            })
        });
        let state = match own_mount {
            Ok(Some((true, opened, target))) if record.complete && !record.lazy => {
                drop(opened);
                kept.push(PublishedVolume { record, target });
                continue;
            }
            // Its FUSE filesystem was served by the previous run and ended with it: nothing in
            // it opens any more (ENOTCONN), and nothing holds its connection to take it over.
            Ok(Some((true, opened, _))) if record.lazy => match mounter.unmount(&opened.target) {
                Ok(()) => "was served lazily by the driver's previous run, whose FUSE session ended with it; unmounted",
                Err(error) => {
                    lines.push(error.to_string());
                    "was served lazily by the driver's previous run; its dead FUSE mount could not be unmounted"
                }
            },
            Ok(Some((true, opened, _))) => match mounter.unmount(&opened.target) {
                Ok(()) => "was interrupted; its tmpfs is unmounted",
                Err(error) => {
                    lines.push(error.to_string());
                    "was interrupted; its tmpfs could not be unmounted"
                }
            },
            Ok(Some((false, _, _))) => "holds a mount the driver did not make, left alone",
            Ok(None) if !record.complete => "was interrupted",
            Ok(None) if record.target_path.exists() => "is no longer mounted",
            Ok(None) => "is gone",
            Err(error) => {
                lines.push(error.to_string());
                "cannot be inspected"
            }
        };
        lines.extend(target_dir::remove_created(kubelet_dir, &record.target_path, &record.created_dirs));
        if let Err(error) = store.remove(&record.volume_id) {
            lines.push(format!("dropping the record failed: {error}"));
        }
        let mut line = format!("volume {volume}: target {target} {state}; record dropped");
        for extra in lines {
            line.push_str("; ");
            line.push_str(&extra);
        }
        dropped.push(line);
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::content::ask::PodInfo;
    use crate::volume::mounter::{FakeMounter, MountSource};
    use crate::volume::ownership::mount_tag;
    use crate::volume::store::FileVolumeStore;

    fn target(root: &Path, uid: &str) -> PathBuf {
        root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/v/mount"))
    }

    fn record(id: &str, target: PathBuf, created: &[&Path]) -> VolumeRecord {
        VolumeRecord {
            volume_id: id.into(),
            target_path: target,
            pod: PodInfo { name: "p".into(), namespace: "n".into(), uid: "u".into(), service_account: "s".into() },
            attributes: Default::default(),
            host_read_only: false,
            created_dirs: created.iter().map(|p| p.to_path_buf()).collect(),
            device: None,
            complete: true,
            object_versions: Default::default(),
            lazy: false,
            mount_group: None,
        }
    }

    fn open(root: &Path, target: &Path) -> crate::volume::target_dir::OpenTarget {
        let path = TargetPath::parse(target.to_str().unwrap(), root).unwrap();
        target_dir::open(root, &path).unwrap().unwrap()
    }

    struct Fixture {
        dir: tempfile::TempDir,
        store: Arc<FileVolumeStore>,
        mounter: FakeMounter,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileVolumeStore::open(dir.path().join("state")).unwrap());
        std::fs::create_dir_all(dir.path().join("kubelet")).unwrap();
        Fixture { dir, store, mounter: FakeMounter::default() }
    }

    #[test]
    fn only_finished_volumes_on_their_own_mount_are_kept() {
        let f = fixture();
        let root = f.dir.path().join("kubelet");
        let (kept_at, stale_at, gone_at) = (target(&root, "a"), target(&root, "b"), target(&root, "c"));
        for t in [&kept_at, &stale_at] {
            std::fs::create_dir_all(t).unwrap();
        }
        f.mounter.mount_tmpfs(&open(&root, &kept_at).target, 1, &mount_tag("kept")).unwrap();
        let records = vec![
            record("kept", kept_at.clone(), &[&kept_at]),
            record("stale", stale_at.clone(), &[&stale_at]),
            record("gone", gone_at, &[]),
        ];
        for r in &records {
            f.store.put(r, true).unwrap();
        }
        let (kept, dropped) = recover(records, &f.mounter, f.store.as_ref(), &root, &Default::default());
        assert_eq!(kept.iter().map(|v| v.record.volume_id.as_str()).collect::<Vec<_>>(), ["kept"]);
        assert_eq!(
            dropped,
            [
                format!("volume \"stale\": target {stale_at:?} is no longer mounted; record dropped"),
                format!("volume \"gone\": target {:?} is gone; record dropped", target(&root, "c")),
            ]
        );
        assert!(!stale_at.exists(), "the empty target it created is removed");
        assert_eq!(f.store.load_all().unwrap().0.len(), 1);
    }

    #[test]
    fn an_interrupted_publish_is_undone_but_only_what_it_made() {
        let f = fixture();
        let root = f.dir.path().join("kubelet");
        let target = target(&root, "u");
        // The target existed before (someone else's, with content): it is not removed.
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("precious"), "x").unwrap();
        f.mounter.mount_tmpfs(&open(&root, &target).target, 1, &mount_tag("half")).unwrap();
        let half = VolumeRecord { complete: false, ..record("half", target.clone(), &[]) };
        f.store.put(&half, true).unwrap();
        let (kept, dropped) = recover(vec![half], &f.mounter, f.store.as_ref(), &root, &Default::default());
        assert!(kept.is_empty());
        assert!(dropped[0].ends_with("was interrupted; its tmpfs is unmounted; record dropped"), "{}", dropped[0]);
        assert!(!f.mounter.is_mounted(&target), "its own tmpfs is unmounted");
        assert_eq!(std::fs::read_to_string(target.join("precious")).unwrap(), "x", "nothing else is touched");
        assert!(f.store.load_all().unwrap().0.is_empty(), "the record is dropped");
    }

    #[test]
    fn a_publish_killed_before_its_mount_says_it_was_interrupted_and_takes_back_its_directories() {
        let f = fixture();
        let root = f.dir.path().join("kubelet");
        let target = target(&root, "early");
        // Killed after making the target, before mounting: the target exists and is empty.
        std::fs::create_dir_all(&target).unwrap();
        let early = VolumeRecord { complete: false, ..record("early", target.clone(), &[&target]) };
        f.store.put(&early, true).unwrap();
        let (kept, dropped) = recover(vec![early], &f.mounter, f.store.as_ref(), &root, &Default::default());
        assert!(kept.is_empty());
        assert_eq!(dropped, [format!("volume \"early\": target {target:?} was interrupted; record dropped")]);
        assert!(!target.exists(), "the target it created is removed");
        assert!(f.store.load_all().unwrap().0.is_empty(), "the record is dropped");
    }

    #[test]
    fn a_mount_it_did_not_make_and_a_directory_with_content_survive_any_record() {
        let f = fixture();
        let root = f.dir.path().join("kubelet");
        let target = target(&root, "u");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("theirs"), "x").unwrap();
        let foreign = MountSource { fs_type: "ext4".into(), source: "/dev/sdb1".into() };
        f.mounter.mount_foreign(&target, foreign);
        // A hostile or stale record claiming the whole pod directory and the root.
        let claims: Vec<&Path> = vec![&target, target.parent().unwrap(), root.as_path(), Path::new("/etc")];
        let hostile = VolumeRecord { complete: false, ..record("hostile", target.clone(), &claims) };
        let (kept, dropped) = recover(vec![hostile], &f.mounter, f.store.as_ref(), &root, &Default::default());
        assert!(kept.is_empty());
        assert!(dropped[0].contains("holds a mount the driver did not make, left alone"), "{}", dropped[0]);
        assert!(f.mounter.is_mounted(&target), "the foreign mount stays");
        assert!(f.mounter.actions().iter().all(|a| !matches!(a, crate::volume::mounter::MountAction::Unmount { .. })));
        assert_eq!(std::fs::read_to_string(target.join("theirs")).unwrap(), "x");
    }
}
