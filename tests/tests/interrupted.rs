//! Runs stopped mid-way leave nothing once the next run is done, for each test program that
//! makes things on the machine:
//! - the end-to-end suite and the deploy scenario: the binary is run twice. The first run is
//!   SIGKILLed mid-way (what a CI timeout does: no handler runs, so it does leave things, and
//!   the test first sees them); the second sweeps them when it starts, and is interrupted with
//!   SIGINT mid-way (what Ctrl-C does: its handler tears it down).
//! - the driver crate's tests, which mount tmpfs and FUSE and start drivers: a run is SIGKILLed
//!   while a test holds a mount and a driver under its directory; the next run of any of them
//!   sweeps it.
//!
//! Afterwards the machine holds no mount, process, network device, network namespace, container
//! cgroup or directory that it did not hold before the first run.
//!
//! A binary of its own, its cases one at a time: cargo runs test binaries one after another, so
//! no other node is up.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use inline_guard_tests::node::runtime::BRIDGE;
use inline_guard_tests::run_root::{PREFIX, dir_of, dirs_of, mounts_under, processes_mentioning};

/// The cases share the machine they observe: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// From start to mid-way, cold: the control plane, the node, the images, the pod.
const TO_MID_WAY: Duration = Duration::from_secs(400);

/// A test program of the `tests` crate run on one test, and when it is mid-way.
struct Program {
    /// The test binary's name, as cargo names it in `deps/` before its hash.
    binary: &'static str,
    /// The one test it runs.
    test: &'static str,
    /// Whether the run directory shows it mid-way: things made that a kill would leave.
    mid_way: fn(&Path) -> bool,
}

/// A node scenario whose pod runs for seconds with a published volume: mid-way when the pod
/// runs with its volume published (a CSI mount and a pod network namespace under its run
/// directory, a veth on the pods' bridge, a shim naming its directory).
const E2E: Program = Program {
    binary: "e2e",
    test: "node::container_reads_sees_updates_cannot_write_and_nothing_is_left",
    mid_way: |dir| {
        let mounts = mounts_under(dir);
        let volume = mounts.iter().any(|m| m.contains("kubernetes.io~csi"));
        let netns = mounts.iter().any(|m| m.contains("/netns/"));
        let shim = processes_mentioning(&dir.to_string_lossy()).iter().any(|(_, c)| c.contains("containerd-shim"));
        volume && netns && shim && veth_on_bridge()
    },
};

/// The deploy scenario: mid-way once its control plane and its node run (the apiserver, etcd,
/// containerd and kubelet name its run directory), before its images are needed.
const DEPLOY: Program = Program {
    binary: "deploy",
    test: "installed_as_shipped_serves_survives_restarts_rolls_upgrades_and_leaves_nothing",
    mid_way: |dir| {
        let running = processes_mentioning(&dir.to_string_lossy());
        ["kube-apiserver", "etcd", "containerd", "kubelet"]
            .iter()
            .all(|name| running.iter().any(|(_, command)| command.contains(name)))
    },
};

#[test]
fn a_killed_end_to_end_run_and_an_interrupted_one_leave_nothing_once_the_next_run_is_done() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    killed_then_interrupted(&E2E);
}

#[test]
fn a_killed_deploy_run_and_an_interrupted_one_leave_nothing_once_the_next_run_is_done() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    killed_then_interrupted(&DEPLOY);
}

fn killed_then_interrupted(program: &Program) {
    let binary = test_binary(program.binary, program.test).unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().expect("a directory for the runs' output");
    let before = Machine::observe();

    // The first run, SIGKILLed mid-way: it leaves its run behind.
    let (mut first, first_log) = start_run(&binary, program.test, &logs.path().join("first.log"));
    let first_dir = wait_mid_way(&mut first, &first_log, program);
    let _ = first.kill();
    let _ = first.wait();
    let left_by_first = mounts_under(&first_dir);
    let processes_of_first = processes_mentioning(&first_dir.to_string_lossy());
    // Its node's processes die with it (they are started with a parent-death signal), some a
    // moment later; its pods' shims do not, and its mounts stay.
    assert!(
        (!left_by_first.is_empty() || !processes_of_first.is_empty()) && first_dir.exists(),
        "a SIGKILLed run left nothing to sweep (mounts {left_by_first:?}, processes {processes_of_first:?}): \
         this test would prove nothing"
    );

    // The second run sweeps it before it starts anything, then is interrupted mid-way.
    let (mut second, second_log) = start_run(&binary, program.test, &logs.path().join("second.log"));
    let second_dir = wait_mid_way(&mut second, &second_log, program);
    assert_swept(&first_dir);
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
    let new = nothing_new_since(&before);
    assert!(new.is_empty(), "the two runs left these behind: {new:?}\n{}", tail(&second_log));
    println!(
        "{}: killed run: {} mounts and {} processes left, swept by the next; interrupted run: exit 130, nothing left",
        program.binary,
        left_by_first.len(),
        processes_of_first.len()
    );
}

/// The driver crate's test program that starts drivers as processes on real mounts.
const DRIVER_TESTS: &str = "binary";
/// A test of it that makes an owned directory and nothing more: what a next run does first.
const QUICK_DRIVER_TEST: &str = "a_relative_endpoint_is_refused";

#[test]
fn a_killed_run_of_the_driver_crates_tests_leaves_nothing_once_the_next_run_is_done() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let binary = test_binary(DRIVER_TESTS, QUICK_DRIVER_TEST).unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().expect("a directory for the runs' output");
    let before = Machine::observe();

    // Its tests one after another, frozen and SIGKILLed the first time one of them holds a
    // mount and a driver process under its directory.
    let out = File::create(logs.path().join("first.log")).expect("the run's log");
    let err = out.try_clone().expect("the run's log");
    let mut first = Command::new(&binary)
        .arg("--test-threads=1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
    let (dir, mounts, processes) = kill_holding(&mut first, &logs.path().join("first.log"));

    // Any next run of the driver's tests sweeps it.
    let next = Command::new(&binary)
        .args(["--exact", QUICK_DRIVER_TEST])
        .output()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
    assert!(next.status.success(), "the next run failed: {}", String::from_utf8_lossy(&next.stdout));
    assert_swept(&dir);
    let new = nothing_new_since(&before);
    assert!(new.is_empty(), "the killed run and the next left these behind: {new:?}");
    println!(
        "driver tests: killed run: {} mounts and {} processes left, swept by the next run",
        mounts.len(),
        processes.len()
    );
}

/// Fails unless the killed run's directory `dir` is gone, with its mounts and processes.
fn assert_swept(dir: &Path) {
    let still = (mounts_under(dir), processes_mentioning(&dir.to_string_lossy()), dir.exists());
    assert!(
        still.0.is_empty() && still.1.is_empty() && !still.2,
        "the next run did not sweep the killed one's {}: mounts {:?}, processes {:?}, directory there: {}",
        dir.display(),
        still.0,
        still.1,
        still.2
    );
}

/// Polls `run`'s directories until one holds a mount and a process; freezes the run (SIGSTOP:
/// its tests cannot unmount or stop a driver meanwhile), and SIGKILLs it if that is still so, or
/// lets it go on. Returns the directory and what it held.
fn kill_holding(run: &mut Child, log: &Path) -> (PathBuf, Vec<String>, Vec<(u32, String)>) {
    let pid = run.id().to_string();
    let holding = |pid: u32| {
        dirs_of(pid).into_iter().find_map(|dir| {
            let mounts = mounts_under(&dir);
            let processes = processes_mentioning(&dir.to_string_lossy());
            (!mounts.is_empty() && !processes.is_empty()).then_some((dir, mounts, processes))
        })
    };
    let deadline = Instant::now() + TO_MID_WAY;
    loop {
        if let Ok(Some(status)) = run.try_wait() {
            panic!(
                "the run ended ({status}) before one of its tests was seen holding a mount and a process\n{}",
                tail(log)
            );
        }
        if holding(run.id()).is_some() {
            let _ = Command::new("kill").args(["-STOP", &pid]).status();
            if let Some(held) = holding(run.id()) {
                let _ = run.kill();
                let _ = run.wait();
                return held;
            }
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("no test of the run was seen holding a mount and a process within {TO_MID_WAY:?}\n{}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the machine holds now that it did not hold `before`, looked at until nothing is new or
/// 10 s have passed: a network namespace is destroyed by the kernel after its last user is gone,
/// not at once.
fn nothing_new_since(before: &Machine) -> Machine {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let new = Machine::observe().minus(before);
        if new.is_empty() || Instant::now() > deadline {
            return new;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the machine holds that a run of the node could leave.
#[derive(Debug, Default, PartialEq)]
struct Machine {
    mounts: BTreeSet<String>,
    processes: BTreeSet<String>,
    links: BTreeSet<String>,
    namespaces: BTreeSet<String>,
    run_dirs: BTreeSet<String>,
    /// Containers' cgroups (named by their ids), in every hierarchy.
    cgroups: BTreeSet<String>,
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
        let cgroups = inline_guard_run_root::cgroups::container_cgroups();
        Machine { mounts, processes, links, namespaces, run_dirs, cgroups }
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
            cgroups: new(&self.cgroups, &before.cgroups),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Machine::default()
    }
}

/// The test binary `name` built beside this one by the same `cargo test` that holds the test
/// `holding` (two crates may name a test program alike: the driver's and the CLI's `binary`),
/// the newest if several builds are there.
fn test_binary(name: &str, holding: &str) -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("this test's own path: {e}"))?;
    let deps = me.parent().ok_or("this test's binary has no directory")?;
    let holds = |path: &Path| {
        Command::new(path)
            .arg("--list")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|line| line == format!("{holding}: test")))
    };
    let newest = std::fs::read_dir(deps)
        .map_err(|e| format!("{}: {e}", deps.display()))?
        .flatten()
        .filter(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            file.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|hash| !hash.is_empty() && hash.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .filter(|e| holds(&e.path()))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    newest.map(|(_, path)| path).ok_or_else(|| {
        format!(
            "no {name} test binary holding {holding} in {}: build it first (`cargo test --workspace --no-run`)",
            deps.display()
        )
    })
}

/// Starts `binary` on `test` alone, its output to `log`.
fn start_run(binary: &Path, test: &str, log: &Path) -> (Child, PathBuf) {
    let out = File::create(log).expect("the run's log");
    let err = out.try_clone().expect("the run's log");
    let child = Command::new(binary)
        .args(["--exact", test, "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
    (child, log.to_path_buf())
}

/// Waits until `run` is mid-way as `program` tells, and returns its run directory.
fn wait_mid_way(run: &mut Child, log: &Path, program: &Program) -> PathBuf {
    let deadline = Instant::now() + TO_MID_WAY;
    loop {
        if let Ok(Some(status)) = run.try_wait() {
            panic!("the run ended ({status}) before it was seen mid-way\n{}", tail(log));
        }
        if let Some(dir) = dir_of(run.id())
            && (program.mid_way)(&dir)
        {
            return dir;
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("the run was not seen mid-way within {TO_MID_WAY:?}\n{}", tail(log));
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
