//! The one directory a test process keeps everything it makes on the machine under, and the sweep
//! that removes what a run left there: its processes, its containers, its mounts, the directory.
//!
//! The directory is `$TMPDIR/igr-XXXXXX` (short: kubelet's plugin sockets live below it, and a
//! unix socket's path has 107 bytes), holding an `owner` file with the owner's process id and
//! start time (in clock ticks since boot, from `/proc/<pid>/stat`): a later run tells a live run's
//! directory from a dead one's without trusting a pid that may have been reused, and sweeps only
//! the dead. The directory is made under a hidden name, given its owner file, then renamed into
//! place, so no sweep ever sees one without its owner. Every `tempfile` directory of the process
//! lands inside it ([`claim`] overrides the process's temporary directory), so the control plane,
//! the node, and each scenario's own directories are all the owner's, and provably the suite's.
//!
//! A run ends in one of three ways, and each leaves the machine as it found it:
//! - finished: the suites drop what they started, then [`finish`] sweeps the directory and fails
//!   the run if a mount or a process was still there (a scenario that leaks is a failed one);
//! - interrupted (SIGINT, SIGTERM, SIGHUP): a thread [`claim`] started sweeps the directory, then
//!   the process exits with 128 + the signal;
//! - killed (SIGKILL, a CI timeout's kill): the next [`claim`] sweeps it.
//!
//! A process that cannot claim itself whole (the driver's tests, run side by side by libtest)
//! makes an [`OwnedDir`] per test instead: the same kind of directory, swept when its value is
//! dropped, or by the next run if the process was killed first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod bounded;
pub mod cgroups;
mod owned_dir;

use bounded::output_within;
pub use owned_dir::OwnedDir;

/// What every run directory's name starts with.
pub const PREFIX: &str = "igr-";

/// The file in a run directory naming its owner: `<pid> <start time>`.
const OWNER: &str = "owner";

/// Where the node's containerd tells runc to keep its containers' state (`runc --root`), below the
/// node's own directory, so that a sweep can find the containers of a run whose containerd is gone.
pub const RUNC_ROOT: &str = "runc";

static CLAIMED: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Sweeps what dead runs left, makes this process's run directory, points `tempfile` at it, and
/// starts the thread that tears it down on SIGINT, SIGTERM or SIGHUP. `after_sweep` removes what
/// runs share outside their directories (the end-to-end node's bridge): it is called after the
/// dead runs are swept if no live run is left, and after the teardown on a signal. Idempotent:
/// the first call decides. Returns the directory.
pub fn claim(after_sweep: fn()) -> Result<PathBuf, String> {
    CLAIMED.get_or_init(|| claim_once(after_sweep)).clone()
}

fn claim_once(after_sweep: fn()) -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    let dead = sweep_dead_runs(&base);
    for (dir, swept) in &dead.swept {
        eprintln!("run_root: swept what a killed run left in {}: {}", dir.display(), swept.describe());
    }
    if !dead.live && !dead.swept.is_empty() {
        after_sweep();
    }
    let dir = make_owned(&base)?;
    tempfile::env::override_temp_dir(&dir)
        .map_err(|set| format!("the temporary directory was set to {} before the run claimed it", set.display()))?;
    tear_down_on_signal(dir.clone(), after_sweep)?;
    Ok(dir)
}

/// Makes a directory `PREFIX…` under `base` owned by this process: made under a hidden name,
/// given its owner file, then renamed into place, so no sweep ever sees one without its owner.
fn make_owned(base: &Path) -> Result<PathBuf, String> {
    let pid = std::process::id();
    let start = start_time(pid).ok_or("reading this process's start time from /proc/self/stat")?;
    let making = tempfile::Builder::new()
        .prefix(".igr-making-")
        .tempdir_in(base)
        .map_err(|e| format!("a run directory in {}: {e}", base.display()))?;
    std::fs::write(making.path().join(OWNER), format!("{pid} {start}\n"))
        .map_err(|e| format!("{}: {e}", making.path().display()))?;
    let name = making.path().file_name().and_then(|n| n.to_str()).ok_or("a run directory name")?;
    let dir = base.join(name.replacen(".igr-making-", PREFIX, 1));
    std::fs::rename(making.keep(), &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// [`claim`] for a process that only reports a leak (a benchmark): the directory is swept when
/// the returned guard is dropped, and what was still there is said on standard error.
pub fn claim_until_dropped(after_sweep: fn()) -> Result<Claimed, String> {
    claim(after_sweep).map(|_| Claimed)
}

/// Sweeps the run directory when dropped ([`claim_until_dropped`]).
pub struct Claimed;

impl Drop for Claimed {
    fn drop(&mut self) {
        if let Err(leak) = finish() {
            eprintln!("run_root: {leak}");
        }
    }
}

/// The run directory of the live test process `pid`, if it has claimed one.
pub fn dir_of(pid: u32) -> Option<PathBuf> {
    dirs_of(pid).into_iter().next()
}

/// Every directory under the temporary directory that the process `pid` owns: its run directory
/// or its [`OwnedDir`]s.
pub fn dirs_of(pid: u32) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| {
            dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with(PREFIX))
                && owner(dir).is_some_and(|(owner, _)| owner == pid)
        })
        .collect()
}

/// Sweeps this process's run directory after the suite has dropped everything it started: a
/// mount or a process still there is a leak, named in the error (and removed all the same).
pub fn finish() -> Result<(), String> {
    let Some(Ok(dir)) = CLAIMED.get() else { return Ok(()) };
    let swept = sweep(dir);
    if swept.mounts.is_empty() && swept.processes.is_empty() && swept.containers.is_empty() {
        Ok(())
    } else {
        Err(format!("the run left these behind (now removed): {}", swept.describe()))
    }
}

/// What one sweep of a run directory found and removed.
#[derive(Debug, Default)]
pub struct Swept {
    /// Processes whose command line named the directory: `pid command line`.
    pub processes: Vec<String>,
    /// Containers runc still held under the directory.
    pub containers: Vec<String>,
    /// Mount points at or below the directory.
    pub mounts: Vec<String>,
    /// Cgroups the run's containers had, left behind empty.
    pub cgroups: Vec<String>,
    /// Whether the directory itself was there to remove.
    pub directory: bool,
}

impl Swept {
    /// One line for a log or an error.
    pub fn describe(&self) -> String {
        let sample = |items: &[String]| {
            let shown: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
            let more = if items.len() > 5 { format!(" and {} more", items.len() - 5) } else { String::new() };
            format!("{} [{}{more}]", items.len(), shown.join("; "))
        };
        format!(
            "{} processes {}, {} containers {}, {} mounts {}, {} cgroups {}, directory {}",
            self.processes.len(),
            sample(&self.processes),
            self.containers.len(),
            sample(&self.containers),
            self.mounts.len(),
            sample(&self.mounts),
            self.cgroups.len(),
            sample(&self.cgroups),
            if self.directory { "removed" } else { "absent" }
        )
    }
}

/// What [`sweep_dead_runs`] did.
#[derive(Debug, Default)]
pub struct DeadRuns {
    /// Each dead run's directory and what its sweep removed.
    pub swept: Vec<(PathBuf, Swept)>,
    /// Whether a live run's directory was seen (and left alone).
    pub live: bool,
}

/// Sweeps every run directory under `base` whose owner is no longer running.
pub fn sweep_dead_runs(base: &Path) -> DeadRuns {
    let Ok(entries) = std::fs::read_dir(base) else { return DeadRuns::default() };
    let mut live = false;
    let mut swept = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let dir = entry.path();
        if owner(&dir).is_some_and(|(pid, start)| start_time(pid) == Some(start)) {
            live = true;
            continue;
        }
        swept.push((dir.clone(), sweep(&dir)));
    }
    DeadRuns { swept, live }
}

/// Removes everything of the run under `dir`, in the order that lets each step succeed: the
/// processes that name it (kubelet, containerd and its shims, the driver, the control plane),
/// then the containers runc holds there (their processes name nothing of the run), then every
/// mount at or below it, deepest first, then the files.
pub fn sweep(dir: &Path) -> Swept {
    let needle = dir.to_string_lossy().into_owned();
    // Read first: runc forgets a container once deleted.
    let ids = cgroups::container_ids_under(dir);
    let processes = kill_processes_mentioning(&needle);
    let containers = delete_containers_under(dir);
    let mut mounts = Vec::new();
    // Stacked mounts on one point come off one per pass.
    for _ in 0..4 {
        let points = mounts_under(dir);
        if points.is_empty() {
            break;
        }
        for point in points {
            let unmounted = Command::new("umount").arg(&point).output().is_ok_and(|o| o.status.success())
                || Command::new("umount").arg("-l").arg(&point).output().is_ok_and(|o| o.status.success());
            if unmounted && !mounts.contains(&point) {
                mounts.push(point);
            }
        }
    }
    let cgroups = cgroups::remove_container_cgroups(&ids);
    let directory = dir.exists();
    let _ = std::fs::remove_dir_all(dir);
    Swept { processes, containers, mounts, cgroups, directory }
}

/// Mount points at or below `dir`, deepest first, from this process's mount table.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().into_owned();
    let mut mounts: Vec<String> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| point.replace("\\040", " "))
        .filter(|point| point == &prefix || point.starts_with(&format!("{prefix}/")))
        .collect();
    mounts.sort_by_key(|point| std::cmp::Reverse(point.len()));
    mounts.dedup();
    mounts
}

/// Processes (other than this one) whose command line contains `needle`: `(pid, command line)`.
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) && pid != std::process::id() {
            found.push((pid, cmdline.trim_end().chars().take(160).collect()));
        }
    }
    found
}

/// SIGKILLs every process whose command line contains `needle` (containerd's shims name its
/// state directory in their arguments) and waits until they are gone. Looks again after each
/// round: a process killed in one (containerd, a shim's starter) may have started another (a
/// pod's shim, which outlives it) between the round's look and its kill. Returns what it
/// killed.
pub fn kill_processes_mentioning(needle: &str) -> Vec<String> {
    let mut killed = Vec::new();
    let mut quiet = 0;
    for _ in 0..20 {
        let found = processes_mentioning(needle);
        if found.is_empty() {
            // A process being forked and exec'd shows no command line for a moment: nothing
            // is left only once two looks a moment apart find nothing.
            quiet += 1;
            if quiet == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
            continue;
        }
        quiet = 0;
        for (pid, _) in &found {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && found.iter().any(|(pid, _)| is_alive(*pid)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        killed.extend(found.into_iter().map(|(pid, cmdline)| format!("{pid} {cmdline}")));
    }
    killed
}

/// `runc delete --force` of every container in every runc root the run's containerd used
/// (`<node>/containerd/runc/<namespace>`): it kills the container's processes and removes its
/// cgroups, which nothing else of the run would.
fn delete_containers_under(dir: &Path) -> Vec<String> {
    let mut deleted = Vec::new();
    for root in runc_roots(dir, 3) {
        let listed =
            output_within(Command::new("runc").arg("--root").arg(&root).args(["list", "-q"]), BOUND, "runc list");
        let Ok(listed) = listed else { continue };
        for id in String::from_utf8_lossy(&listed.stdout).lines().filter(|l| !l.is_empty()) {
            let removed = output_within(
                Command::new("runc").arg("--root").arg(&root).args(["delete", "--force", id]),
                BOUND,
                "runc delete",
            );
            if removed.is_ok_and(|o| o.status.success()) {
                deleted.push(id.chars().take(12).collect());
            }
        }
    }
    deleted
}

const BOUND: Duration = Duration::from_secs(30);

/// The namespace directories of every `runc` root at most `depth` levels below `dir`.
fn runc_roots(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut roots = Vec::new();
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        if !kind.is_dir() {
            continue;
        }
        if entry.file_name() == RUNC_ROOT && entry.path().parent().is_some_and(|p| p.ends_with("containerd")) {
            let namespaces = std::fs::read_dir(entry.path()).into_iter().flatten().flatten();
            roots.extend(namespaces.map(|n| n.path()).filter(|p| p.is_dir()));
        } else if depth > 0 {
            roots.extend(runc_roots(&entry.path(), depth - 1));
        }
    }
    roots
}

/// The owner a run directory names: `(pid, start time)`; `None` if it names none readable.
fn owner(dir: &Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(dir.join(OWNER)).ok()?;
    let (pid, start) = text.trim().split_once(' ')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// A process's start time in clock ticks since boot: field 22 of `/proc/<pid>/stat`, counted
/// after the command name, which may itself hold spaces and parentheses.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

fn is_alive(pid: u32) -> bool {
    // A zombie has a stat but no command line; it is gone as far as the sweep cares.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

/// Starts the thread that, on SIGINT, SIGTERM or SIGHUP, sweeps `dir`, calls `after_sweep`, and
/// exits the process as the signal would have (128 + its number).
fn tear_down_on_signal(dir: PathBuf, after_sweep: fn()) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime for the signal handler: {e}"))?;
    // Registered here, before claim returns, so no signal between now and the thread's first
    // poll takes the default action.
    let (interrupt, terminate, hangup) = {
        let _entered = runtime.enter();
        let listen = |kind: SignalKind| signal(kind).map_err(|e| format!("listening for a signal: {e}"));
        (listen(SignalKind::interrupt())?, listen(SignalKind::terminate())?, listen(SignalKind::hangup())?)
    };
    std::thread::Builder::new()
        .name("run-root-signals".into())
        .spawn(move || {
            let (mut interrupt, mut terminate, mut hangup) = (interrupt, terminate, hangup);
            let (name, number) = runtime.block_on(async {
                tokio::select! {
                    _ = interrupt.recv() => ("SIGINT", 2),
                    _ = terminate.recv() => ("SIGTERM", 15),
                    _ = hangup.recv() => ("SIGHUP", 1),
                }
            });
            eprintln!("run_root: {name}: tearing down {}", dir.display());
            let swept = sweep(&dir);
            after_sweep();
            eprintln!("run_root: removed {}", swept.describe());
            // The scenarios' threads run on until the exit: one may have made a directory (or
            // started a child, which dies with this process) meanwhile. Swept again until a
            // look finds nothing.
            // A pod's shim whose start was under way outlives the containerd that started it
            // and names the directory after it is gone: looked for too.
            let needle = dir.to_string_lossy().into_owned();
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(200));
                if !dir.exists() && processes_mentioning(&needle).is_empty() {
                    break;
                }
                let again = sweep(&dir);
                eprintln!("run_root: removed what was made meanwhile: {}", again.describe());
            }
            std::process::exit(128 + number);
        })
        .map(drop)
        .map_err(|e| format!("starting the signal handler: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_live_only_while_the_process_it_names_runs() {
        let base = tempfile::tempdir().unwrap();
        let pid = std::process::id();
        let start = start_time(pid).expect("this process's start time");
        let live = base.path().join(format!("{PREFIX}live"));
        let dead = base.path().join(format!("{PREFIX}dead"));
        let ownerless = base.path().join(format!("{PREFIX}ownerless"));
        let other = base.path().join("not-a-run");
        for dir in [&live, &dead, &ownerless, &other] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(live.join(OWNER), format!("{pid} {start}\n")).unwrap();
        // The same pid, started at another time: the pid was reused.
        std::fs::write(dead.join(OWNER), format!("{pid} {}\n", start + 1)).unwrap();
        let swept: Vec<PathBuf> = sweep_dead_runs(base.path()).swept.into_iter().map(|(dir, _)| dir).collect();
        assert!(swept.contains(&dead) && swept.contains(&ownerless), "{swept:?}");
        assert!(!swept.contains(&live) && !swept.contains(&other), "{swept:?}");
        assert!(live.exists() && other.exists() && !dead.exists() && !ownerless.exists());
    }
}
