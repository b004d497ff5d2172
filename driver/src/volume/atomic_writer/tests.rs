//! The writer on a real directory: layout, updates, no-op rewrites, hostile keys, and a reader
//! racing the writer that must never see two versions at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::content::error::Error as ContentError;

fn payload(pairs: &[(&str, &str)]) -> Payload {
    pairs.iter().map(|(k, v)| (k.to_string(), FileContent::new(v.as_bytes()))).collect()
}

fn read(dir: &Path, key: &str) -> String {
    fs::read_to_string(dir.join(key)).unwrap()
}

#[test]
fn content_is_visible_through_links_into_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path());
    assert!(writer.write(&payload(&[("ca.crt", "one"), ("nested/dir/key", "two")])).unwrap());
    assert_eq!(read(dir.path(), "ca.crt"), "one");
    assert_eq!(read(dir.path(), "nested/dir/key"), "two");
    assert_eq!(fs::read_link(dir.path().join("ca.crt")).unwrap(), Path::new("..data/ca.crt"));
    let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(dir.path().join("ca.crt")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o644);
}

#[test]
fn with_the_pods_fs_group_files_and_directories_belong_to_it_and_it_may_read_them() {
    use std::os::unix::fs::MetadataExt as _;
    assert!(nix::unistd::geteuid().is_root(), "giving files to another group needs root: run the test command as root");
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path()).with_group(Some(2000));
    let mut content = payload(&[("nested/dir/key", "two")]);
    content.insert("private".into(), FileContent { data: b"one".to_vec(), mode: 0o400 });
    let above = |path: &Path| {
        let meta = fs::metadata(path).unwrap();
        (meta.gid(), meta.mode())
    };
    let (root_before, parent_before) = (above(dir.path()), above(dir.path().parent().unwrap()));
    assert!(writer.write(&content).unwrap());
    // Only the version's own directories are given: never the volume's root, nor above it.
    assert_eq!(above(dir.path()), root_before);
    assert_eq!(above(dir.path().parent().unwrap()), parent_before);
    let of = |path: &Path| {
        let meta = fs::metadata(path).unwrap();
        (meta.gid(), meta.mode() & 0o7777)
    };
    assert_eq!(of(&dir.path().join("private")), (2000, 0o440), "the group may read a file only its owner could");
    assert_eq!(of(&dir.path().join("nested/dir/key")), (2000, 0o644));
    for directory in ["nested", "nested/dir", "..data"] {
        let (gid, mode) = of(&dir.path().join(directory));
        assert_eq!((gid, mode & 0o2050), (2000, 0o2050), "{directory}: group-owned, searchable, set-group-id");
    }
    let plain = tempfile::tempdir().unwrap();
    AtomicWriter::new(plain.path()).write(&content).unwrap();
    assert_eq!(of(&plain.path().join("private")), (0, 0o400), "without fsGroup nothing is added");
    for directory in ["nested", "nested/dir", "..data"] {
        let (with, without) = (of(&dir.path().join(directory)).1, of(&plain.path().join(directory)).1);
        assert_eq!(with, without | 0o2050, "{directory}: only the group's bits are added, the rest stays as made");
    }
}

#[test]
fn directories_made_in_a_set_group_id_directory_stay_set_group_id() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = tempfile::tempdir().unwrap();
    // Directories made in it are set-group-id from birth (the kernel's rule), before the
    // writer gives them to the group.
    fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o2755)).unwrap();
    let writer = AtomicWriter::new(dir.path()).with_group(Some(2000));
    assert!(writer.write(&payload(&[("nested/dir/key", "two")])).unwrap());
    for directory in ["nested", "nested/dir", "..data"] {
        let mode = fs::metadata(dir.path().join(directory)).unwrap().mode();
        assert_eq!(mode & 0o2050, 0o2050, "{directory}: still set-group-id and searchable by the group");
    }
}

#[test]
fn an_update_swaps_versions_and_removes_what_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path());
    writer.write(&payload(&[("a", "1"), ("b", "1")])).unwrap();
    let first = fs::read_link(dir.path().join(DATA_LINK)).unwrap();
    writer.write(&payload(&[("a", "2"), ("c", "2")])).unwrap();
    assert_eq!(read(dir.path(), "a"), "2");
    assert_eq!(read(dir.path(), "c"), "2");
    assert!(fs::symlink_metadata(dir.path().join("b")).is_err(), "b's link is gone");
    assert!(!dir.path().join(&first).exists(), "the previous version is removed");
    let versions = fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("..") && name != DATA_LINK
        })
        .count();
    assert_eq!(versions, 1, "exactly one version directory remains");
}

#[test]
fn rewriting_the_same_content_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path());
    let content = payload(&[("a", "1")]);
    assert!(writer.write(&content).unwrap());
    let version = fs::read_link(dir.path().join(DATA_LINK)).unwrap();
    assert!(!writer.write(&content).unwrap());
    assert_eq!(fs::read_link(dir.path().join(DATA_LINK)).unwrap(), version);
    let mut changed_mode = content.clone();
    changed_mode.get_mut("a").unwrap().mode = 0o600;
    assert!(writer.write(&changed_mode).unwrap(), "a mode change is a change");
}

#[test]
fn hostile_keys_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path());
    for (key, why) in [
        ("../x", "names starting with \"..\" are reserved"),
        ("a/../../x", "it has a \".\" or \"..\" component"),
        ("/etc/passwd", "it is an absolute path"),
        ("", "it is empty"),
        ("a//b", "it has an empty path component"),
        ("a/./b", "it has a \".\" or \"..\" component"),
        ("..data", "names starting with \"..\" are reserved"),
        ("a\0b", "it contains a NUL byte"),
    ] {
        let error = writer.write(&payload(&[("good", "1"), (key, "evil")])).unwrap_err();
        let expected = format!("key {key:?} is refused: {why}");
        assert!(matches!(&error, Error::Content(ContentError::Invalid(message)) if *message == expected), "{error:?}");
    }
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "no partial write");
}

#[test]
fn keys_and_their_components_may_reach_the_limits_but_not_pass_them() {
    let component = "c".repeat(255);
    let long_directory = "d".repeat(254);
    let longest = [long_directory.as_str(); 16].join("/") + "/" + &"k".repeat(16);
    assert_eq!(longest.len(), 4096);
    for key in [component.clone(), longest.clone(), format!("a/{component}")] {
        assert_eq!(check_key(&key), Ok(()), "{} bytes", key.len());
    }
    let too_long = longest + "k";
    let refused = check_key(&too_long).unwrap_err().to_string();
    assert!(refused.ends_with("is refused: it is longer than 4096 bytes"), "{refused}");
    for key in [format!("{component}c"), format!("a/{component}c/b")] {
        let refused = check_key(&key).unwrap_err().to_string();
        assert!(refused.ends_with("is refused: a path component is longer than 255 bytes"), "{refused}");
    }
}

#[test]
fn content_prints_its_size_and_mode_never_its_bytes() {
    let content = FileContent { data: b"s3cr3t".to_vec(), mode: 0o640 };
    assert_eq!(format!("{content:?}"), "FileContent(6 bytes, mode 640)");
}

#[test]
fn a_concurrent_reader_never_sees_a_mix_of_versions() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path());
    writer.write(&payload(&[("a", "0"), ("b", "0")])).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let data = dir.path().join(DATA_LINK);
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                // Resolve ..data once, as a reader holding a consistent view does.
                let Ok(version) = fs::canonicalize(&data) else { continue };
                let (Ok(a), Ok(b)) = (fs::read_to_string(version.join("a")), fs::read_to_string(version.join("b")))
                else {
                    continue; // the version was removed after a newer one replaced it
                };
                assert_eq!(a, b, "a reader saw two versions at once");
                reads += 1;
            }
            reads
        })
    };
    for version in 1..300 {
        let v = version.to_string();
        writer.write(&payload(&[("a", &v), ("b", &v)])).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0, "the reader read something");
}

#[test]
fn a_data_link_pointing_outside_its_versions_is_never_removed() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("volume");
    let bystander = dir.path().join("bystander");
    fs::create_dir_all(&volume).unwrap();
    fs::create_dir_all(&bystander).unwrap();
    fs::write(bystander.join("keep"), "mine").unwrap();
    symlink("../bystander", volume.join(DATA_LINK)).unwrap();
    assert!(AtomicWriter::new(&volume).write(&payload(&[("a", "1")])).unwrap());
    assert_eq!(read(&bystander, "keep"), "mine", "what the link pointed at is untouched");
    assert_eq!(read(&volume, "a"), "1");

    // `..` alone looks like a version name with nothing after the dots: it is the parent.
    let parent_link = dir.path().join("parent-link");
    fs::create_dir_all(&parent_link).unwrap();
    fs::write(dir.path().join("keep"), "mine").unwrap();
    symlink("..", parent_link.join(DATA_LINK)).unwrap();
    assert!(AtomicWriter::new(&parent_link).write(&payload(&[("a", "1")])).unwrap());
    assert_eq!(read(dir.path(), "keep"), "mine", "the volume's parent is untouched");
    assert_eq!(read(&bystander, "keep"), "mine");
    assert_eq!(read(&parent_link, "a"), "1");
}

#[test]
fn content_that_fills_the_room_exactly_fits_and_one_page_more_does_not() {
    let page = PAGE_BYTES;
    assert!(Room::check(3 * page, 3 * page, 8 * page, false).is_ok());
    let refused = Room::check(3 * page, 2 * page, 8 * page, false).err().expect("refused");
    assert!(matches!(refused, Error::TooLarge(_)), "{refused:?}");
    assert_eq!(
        refused.to_string(),
        "the volume's content needs 12288 bytes but its tmpfs (tmpfsSize 32768 bytes) has 8192 bytes free: \
         tmpfsSize must be at least 12288 bytes; raise tmpfsSize in the driver's configuration"
    );
    assert!(Room::check(2 * page, 3 * page, 8 * page, true).is_ok());
}

#[test]
fn only_a_full_filesystem_is_resource_exhausted() {
    let path = Path::new("/volume/a");
    let full = io_error("writing", path, std::io::Error::from_raw_os_error(nix::libc::ENOSPC));
    assert!(matches!(full, Error::TooLarge(ref m) if m.starts_with("writing \"/volume/a\": ")), "{full:?}");
    let denied = io_error("writing", path, std::io::Error::from_raw_os_error(nix::libc::EACCES));
    assert!(matches!(denied, Error::Local { .. }), "{denied:?}");
}

/// A tmpfs of `bytes` at a fresh directory, unmounted when dropped.
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    fn mount(bytes: u64) -> SmallTmpfs {
        let dir = tempfile::tempdir().unwrap();
        let options = format!("size={bytes}");
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .expect("mounting a tmpfs needs root: run the test command as root");
        SmallTmpfs(dir)
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn content_too_large_for_the_tmpfs_is_refused_naming_the_size_and_what_is_needed() {
    let volume = SmallTmpfs::mount(64 << 10);
    let writer = AtomicWriter::new(volume.0.path());
    let files = |fill: &str, count: usize| -> Payload {
        (0..count).map(|i| (format!("f{i}"), FileContent::new(fill.repeat(16 << 10)))).collect()
    };
    // 80 KiB never fits 64 KiB.
    let error = writer.write(&files("a", 5)).unwrap_err();
    let Error::TooLarge(message) = &error else { panic!("{error:?}") };
    assert!(
        message.starts_with("the volume's content needs 81920 bytes but its tmpfs (tmpfsSize 65536 bytes) has "),
        "{message}"
    );
    assert!(message.ends_with("tmpfsSize must be at least 81920 bytes; raise tmpfsSize in the driver's configuration"));
    assert!(fs::read_dir(volume.0.path()).unwrap().next().is_none(), "nothing was left behind");
    // 48 KiB fits once, but an update needs the old and the new version at once.
    assert!(writer.write(&files("a", 3)).unwrap());
    let error = writer.write(&files("b", 3)).unwrap_err();
    let Error::TooLarge(message) = &error else { panic!("{error:?}") };
    assert!(message.contains("an update writes the new version beside the old one, so tmpfsSize must hold the content twice (at least 98304 bytes)"), "{message}");
    assert_eq!(read(volume.0.path(), "f0"), "a".repeat(16 << 10), "the old content is still served");
}
