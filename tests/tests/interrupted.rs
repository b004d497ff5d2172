//! A run of the node scenarios stopped mid-way leaves nothing once the next run is done: the
//! end-to-end suite's binary is run twice on one node scenario. The first run is SIGKILLed while
//! its pod runs (what a CI timeout does: no handler runs, so it does leave things, and this test
//! first sees them); the second sweeps them when it starts, and is interrupted with SIGINT while
//! its own pod runs (what Ctrl-C does: its handler tears it down). Afterwards the machine holds
//! no mount, process, network device, network namespace or directory that it did not hold
//! before the first run.
//!
//! A binary of its own: cargo runs test binaries one after another, so no other node is up.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use inline_guard_tests::node::runtime::BRIDGE;
use inline_guard_tests::run_root::{PREFIX, dir_of, mounts_under, processes_mentioning};

/// A node scenario whose pod runs for seconds with a published volume.
const SCENARIO: &str = "node::container_reads_sees_updates_cannot_write_and_nothing_is_left";

/// From start to a running pod, cold: the control plane, the node, the images, the pod.
const TO_MID_WAY: Duration = Duration::from_secs(400);

#[test]
fn a_killed_run_and_an_interrupted_one_leave_nothing_once_the_next_run_is_done() {
    let e2e = e2e_binary().unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().expect("a directory for the runs' output");
    let before = Machine::observe();

    // The first run, SIGKILLed with its pod running: it leaves its node behind.
    let (mut first, first_log) = start_run(&e2e, &logs.path().join("first.log"));
    let first_dir = wait_mid_way(&mut first, &first_log);
    let _ = first.kill();
    let _ = first.wait();
    let left_by_first = mounts_under(&first_dir);
    let shims_of_first = processes_mentioning(&first_dir.to_string_lossy());
    assert!(
        !left_by_first.is_empty() && !shims_of_first.is_empty() && first_dir.exists(),
        "a SIGKILLed run left nothing to sweep (mounts {left_by_first:?}, processes {shims_of_first:?}): \
         this test would prove nothing"
    );

    // The second run sweeps it before it starts anything, then is interrupted with its pod running.
    let (mut second, second_log) = start_run(&e2e, &logs.path().join("second.log"));
    let second_dir = wait_mid_way(&mut second, &second_log);
    let still = (mounts_under(&first_dir), processes_mentioning(&first_dir.to_string_lossy()), first_dir.exists());
    assert!(
        still.0.is_empty() && still.1.is_empty() && !still.2,
        "the next run did not sweep the killed one's {}: mounts {:?}, processes {:?}, directory there: {}",
        first_dir.display(),
        still.0,
        still.1,
        still.2
    );
    let status = interrupt(&mut second);
    assert_eq!(
        status.code(),
        Some(130),
        "the interrupted run exited {status}, not as SIGINT's teardown does (130)\n{}",
        tail(&second_log)
    );
    assert!(
        !second_dir.exists(),
        "the interrupted run left its directory {}\n{}",
        second_dir.display(),
        tail(&second_log)
    );

    // A network namespace is destroyed by the kernel after its last user is gone, not at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    let new = loop {
        let new = Machine::observe().minus(&before);
        if new.is_empty() || Instant::now() > deadline {
            break new;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(new.is_empty(), "the two runs left these behind: {new:?}\n{}", tail(&second_log));
    println!(
        "killed run: {} mounts and {} processes left, swept by the next; interrupted run: exit 130, nothing left",
        left_by_first.len(),
        shims_of_first.len()
    );
}

/// What the machine holds that a run of the node could leave.
#[derive(Debug, Default, PartialEq)]
struct Machine {
    mounts: BTreeSet<String>,
    processes: BTreeSet<String>,
    links: BTreeSet<String>,
    namespaces: BTreeSet<String>,
    run_dirs: BTreeSet<String>,
}

impl Machine {
    fn observe() -> Machine {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mounts = mountinfo.lines().filter_map(|l| l.split(' ').nth(4)).map(str::to_string).collect();
        // The suite's processes name its run directories; its containers' run `/pause` or
        // busybox, which name nothing of the run.
        let mut processes: BTreeSet<String> =
            processes_mentioning(&std::env::temp_dir().join(PREFIX).to_string_lossy())
                .into_iter()
                .map(|(pid, cmdline)| format!("{pid} {cmdline}"))
                .collect();
        processes.extend(
            processes_mentioning("/pause")
                .into_iter()
                .chain(processes_mentioning("containerd-shim"))
                .map(|(pid, cmdline)| format!("{pid} {cmdline}")),
        );
        let links = Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_string())
            .collect();
        let namespaces = ["/var/run/netns", "/run/netns"]
            .iter()
            .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
            .map(|e| e.path().display().to_string())
            .collect();
        let run_dirs = std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(PREFIX))
            .collect();
        Machine { mounts, processes, links, namespaces, run_dirs }
    }

    /// What `self` holds that `before` did not.
    fn minus(&self, before: &Machine) -> Machine {
        let new = |now: &BTreeSet<String>, then: &BTreeSet<String>| now.difference(then).cloned().collect();
        Machine {
            mounts: new(&self.mounts, &before.mounts),
            processes: new(&self.processes, &before.processes),
            links: new(&self.links, &before.links),
            namespaces: new(&self.namespaces, &before.namespaces),
            run_dirs: new(&self.run_dirs, &before.run_dirs),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Machine::default()
    }
}

/// The end-to-end suite's binary, built beside this one by the same `cargo test` (the newest if
/// several builds are there).
fn e2e_binary() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("this test's own path: {e}"))?;
    let deps = me.parent().ok_or("this test's binary has no directory")?;
    let newest = std::fs::read_dir(deps)
        .map_err(|e| format!("{}: {e}", deps.display()))?
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("e2e-") && !name.contains('.')
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    newest.map(|(_, path)| path).ok_or_else(|| {
        format!(
            "no e2e test binary in {}: build it first (`cargo test -p inline-guard-tests --no-run`)",
            deps.display()
        )
    })
}

/// Starts the suite's binary on [`SCENARIO`], its output to `log`.
fn start_run(e2e: &Path, log: &Path) -> (Child, PathBuf) {
    let out = File::create(log).expect("the run's log");
    let err = out.try_clone().expect("the run's log");
    let child = Command::new(e2e)
        .args(["--exact", SCENARIO, "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", e2e.display()));
    (child, log.to_path_buf())
}

/// Waits until `run`'s pod runs with its volume published (a CSI mount and a pod network
/// namespace under its run directory, a veth on the pods' bridge, a shim naming its directory),
/// and returns the run directory.
fn wait_mid_way(run: &mut Child, log: &Path) -> PathBuf {
    let deadline = Instant::now() + TO_MID_WAY;
    loop {
        if let Ok(Some(status)) = run.try_wait() {
            panic!("the run ended ({status}) before its pod was seen running\n{}", tail(log));
        }
        if let Some(dir) = dir_of(run.id()) {
            let mounts = mounts_under(&dir);
            let volume = mounts.iter().any(|m| m.contains("kubernetes.io~csi"));
            let netns = mounts.iter().any(|m| m.contains("/netns/"));
            let shim = processes_mentioning(&dir.to_string_lossy()).iter().any(|(_, c)| c.contains("containerd-shim"));
            if volume && netns && shim && veth_on_bridge() {
                return dir;
            }
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("the run's pod was not seen running within {TO_MID_WAY:?}\n{}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn veth_on_bridge() -> bool {
    Command::new("ip")
        .args(["-o", "link", "show", "master", BRIDGE])
        .output()
        .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).trim().is_empty())
}

/// SIGINT, then the exit status (bounded: a teardown that hangs fails the test).
fn interrupt(run: &mut Child) -> ExitStatus {
    let sent = Command::new("kill").args(["-INT", &run.id().to_string()]).status();
    assert!(sent.is_ok_and(|s| s.success()), "sending SIGINT failed");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(status)) = run.try_wait() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("the interrupted run did not exit within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!("--- last lines of {} ---\n{}", log.display(), lines[lines.len().saturating_sub(30)..].join("\n"))
}
