//! A lazy provider's file read through the driver's FUSE server once it is cached, beside the
//! same 4 KiB read from a tmpfs (the floor: what an eager volume serves), in the same run,
//! alternating rounds. One read is what a program does to read a small file: open, read to the
//! end, close. Target: < 50 µs per read through FUSE. A second floor is measured with them: one
//! byte sent to a thread pinned where the FUSE session is and back, the one round trip between
//! the cores that no FUSE open can do without (the kernel asks the server at every open).
//!
//! The FUSE session and the runtime its opens run on are pinned to CPU 0, the reader to CPU 1.
//! `SAME_CORE=1` keeps the reader on CPU 0 with them: a diagnosis, not the measure (it shows
//! what the cross-core wake-ups of each FUSE round trip cost). Needs root (mounts). Not a test:
//! nothing fails on a number.
//!
//! `cargo bench -p inline-guard-benches --bench lazy_read [-- --json FILE]`

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inline_guard_benches::lazy_bench::{FILE_BYTES, MOUNT_REPLY, lazy_provider, online_cores, pin_to};
use inline_guard_benches::percentile;
use sharedresource_csi_driver::content::ask::{PodInfo, VolumeAsk};
use sharedresource_csi_driver::content::external::helper_protocol::{MountReply, mount_options};
use sharedresource_csi_driver::content::external::lazy_files::HelperFiles;
use sharedresource_csi_driver::volume::lazy::LazyMount;
use sharedresource_csi_driver::volume::mounter::{LinuxMounter, Mounter};
use sharedresource_csi_driver::volume::target_dir;
use sharedresource_csi_driver::volume::target_path::TargetPath;

const READS: usize = 5000;
const ROUNDS: usize = 5;
/// Open, read to the end, close: `READS` times; each one's duration.
fn reads(path: &Path) -> Result<Vec<Duration>, String> {
    let mut buffer = Vec::with_capacity(2 * FILE_BYTES);
    let mut took = Vec::with_capacity(READS);
    for _ in 0..READS {
        buffer.clear();
        let started = Instant::now();
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut buffer)).map_err(|e| e.to_string())?;
        took.push(started.elapsed());
        if buffer.len() != FILE_BYTES {
            return Err(format!("read {} bytes of {}, expected {FILE_BYTES}", buffer.len(), path.display()));
        }
    }
    Ok(took)
}

/// A thread, on the calling thread's CPUs, that sends back each byte it is sent.
fn echo_thread() -> Result<UnixStream, String> {
    let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        let mut theirs = theirs;
        let mut byte = [0u8];
        while theirs.read_exact(&mut byte).is_ok() && theirs.write_all(&byte).is_ok() {}
    });
    Ok(ours)
}

/// One byte to the echo thread and back: `READS` times; each one's duration.
fn round_trips(echo: &mut UnixStream) -> Result<Vec<Duration>, String> {
    let mut took = Vec::with_capacity(READS);
    let mut byte = [7u8];
    for _ in 0..READS {
        let started = Instant::now();
        echo.write_all(&byte).and_then(|()| echo.read_exact(&mut byte)).map_err(|e| e.to_string())?;
        took.push(started.elapsed());
    }
    Ok(took)
}

fn ask(mount_point: &Path) -> VolumeAsk {
    VolumeAsk {
        volume_id: "bench-lazy".into(),
        volume_name: "v".into(),
        mount_point: mount_point.to_path_buf(),
        pod: PodInfo { name: "p".into(), namespace: "n".into(), uid: "u".into(), service_account: "s".into() },
        attributes: [("provider".to_string(), "bench".to_string())].into(),
        tokens: Default::default(),
        secrets: Default::default(),
        object_versions: Default::default(),
    }
}

fn main() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("lazy_read mounts FUSE and tmpfs: run it as root".into());
    }
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped()?;
    let json = std::env::args().skip_while(|a| a != "--json").nth(1);
    let cores = online_cores();
    let pinned = cores >= 2;
    let same_core = std::env::var_os("SAME_CORE").is_some();
    if pinned {
        pin_to(0)?;
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let provider = lazy_provider(dir.path())?;

    // Made while this thread is on CPU 0: the runtime's and the session's threads stay there.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let target_text = dir.path().join("pods/u/volumes/kubernetes.io~csi/lazy/mount");
    let target = TargetPath::parse(target_text.to_str().unwrap_or_default(), dir.path()).map_err(|e| e.to_string())?;
    let opened = target_dir::create(dir.path(), &target, &mut Vec::new()).map_err(|e| e.to_string())?;
    let reply = MountReply::parse(MOUNT_REPLY)?;
    let options = mount_options(&ask(&target_text)).map_err(|e| e.to_string())?;
    let permits = (sharedresource_csi_driver::fair_slots::FairSlots::halved(4), "bench".to_string());
    let files = Arc::new(
        HelperFiles::new(provider, permits, reply, options, runtime.handle().clone()).map_err(|e| e.to_string())?,
    );
    let device = LinuxMounter.mount_fuse(&opened.target, "inline-guard:bench-lazy").map_err(|e| e.to_string())?;
    let mount = LazyMount::serve("bench-lazy", device, files.clone(), None).map_err(|e| e.to_string())?;

    let floor_text = dir.path().join("pods/u/volumes/kubernetes.io~csi/eager/mount");
    let floor = TargetPath::parse(floor_text.to_str().unwrap_or_default(), dir.path()).map_err(|e| e.to_string())?;
    let floor_opened = target_dir::create(dir.path(), &floor, &mut Vec::new()).map_err(|e| e.to_string())?;
    LinuxMounter.mount_tmpfs(&floor_opened.target, 1 << 20, "inline-guard:bench-eager").map_err(|e| e.to_string())?;
    std::fs::write(floor_text.join("f"), vec![b'x'; FILE_BYTES]).map_err(|e| e.to_string())?;

    let mut echo = echo_thread()?;
    if pinned && !same_core {
        pin_to(1)?;
    }
    let lazy_file = target_text.join("s/f");
    let first = Instant::now();
    std::fs::read(&lazy_file).map_err(|e| e.to_string())?;
    let first = first.elapsed();
    let (mut lazy, mut tmpfs, mut trips) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        lazy.extend(reads(&lazy_file)?);
        tmpfs.extend(reads(&floor_text.join("f"))?);
        trips.extend(round_trips(&mut echo)?);
    }
    let gets = files.gets();

    let cleanup = [&target_text, &floor_text]
        .map(|path| nix::mount::umount2(path.as_path(), nix::mount::MntFlags::MNT_DETACH).map_err(|e| e.to_string()));
    drop(mount);
    for done in cleanup {
        done?;
    }

    lazy.sort();
    tmpfs.sort();
    trips.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (lazy_p50, lazy_p99, floor_p50, floor_p99) =
        (percentile(&lazy, 0.5), percentile(&lazy, 0.99), percentile(&tmpfs, 0.5), percentile(&tmpfs, 0.99));
    let machine = format!(
        "{cores} cores; {}",
        match (pinned, same_core) {
            (false, _) => "one core: nothing pinned",
            (true, false) => "FUSE session and runtime on CPU 0, reader on CPU 1",
            (true, true) => "SAME_CORE: FUSE session, runtime and reader all on CPU 0 (a diagnosis)",
        }
    );
    println!(
        "lazy read of a cached {FILE_BYTES}-byte file (open, read, close), {} reads each, {ROUNDS} alternating rounds; {machine}",
        READS * ROUNDS
    );
    println!("  through FUSE: p50 {:.1} µs, p99 {:.1} µs (target: < 50 µs)", us(lazy_p50), us(lazy_p99));
    println!("  from tmpfs:   p50 {:.1} µs, p99 {:.1} µs", us(floor_p50), us(floor_p99));
    let (trip_p50, trip_p99) = (percentile(&trips, 0.5), percentile(&trips, 0.99));
    println!(
        "  one round trip to the session's CPU (a socket echo): p50 {:.1} µs, p99 {:.1} µs",
        us(trip_p50),
        us(trip_p99)
    );
    println!("  ratio FUSE/tmpfs at p50: {:.1}x", us(lazy_p50) / us(floor_p50));
    println!("  ratio FUSE/round trip at p50: {:.2}x", us(lazy_p50) / us(trip_p50));
    println!("  the first read (the helper's get): {:.1} ms; gets in all: {gets}", first.as_secs_f64() * 1e3);
    if let Some(path) = json {
        let result = serde_json::json!({
            "machine": machine, "file_bytes": FILE_BYTES, "reads": READS * ROUNDS,
            "fuse_p50_us": us(lazy_p50), "fuse_p99_us": us(lazy_p99),
            "tmpfs_p50_us": us(floor_p50), "tmpfs_p99_us": us(floor_p99), "gets": gets,
            "round_trip_p50_us": us(trip_p50), "round_trip_p99_us": us(trip_p99),
        });
        std::fs::write(&path, result.to_string()).map_err(|e| e.to_string())?;
    }
    Ok(())
}
