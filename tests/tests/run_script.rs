//! `tests/run` itself, with a stand-in `cargo` first on its PATH (every other tool the real
//! one): a SIGTERM to its pid alone, as a CI runner sends one, stops the cargo command it is
//! running (SIGINT to that command's session) rather than leaving it to run on; a SIGKILL, which
//! no script can catch, leaves its sessions to the next run, which stops them; and a run that
//! ends prints each step's time and each test binary's.
//!
//! The stand-in answers `fmt` and `clippy` at once, blocks on `build` (the background images
//! build, killed by tests/run's end), and for `test` either waits to be interrupted (writing
//! its pid, then what ended it) or prints what cargo and libtest print for two binaries.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The stand-in `cargo`. `FAKE_TEST` says what its `test` does: `wait` or `pass`.
const FAKE_CARGO: &str = r#"#!/bin/sh
case "$1" in
fmt | clippy) exit 0 ;;
build) exec sleep 3600 ;;
test)
    if [ "$FAKE_TEST" = wait ]; then
        echo $$ > "$FAKE_DIR/test.pid"
        trap 'echo SIGINT > "$FAKE_DIR/test.ended"; exit 130' INT
        while :; do sleep 0.1; done
    fi
    for arg in "$@"; do
        case $arg in
        installed_as_shipped_* | the_images_build_*) echo "test $arg ... ok" ;;
        esac
    done
    # The deploy binary runs two rounds, as the end-to-end suite does (the oldest minor's
    # after the newest's), two seconds apart: its time runs to its last result.
    case " $* " in
    *" --test deploy "*)
        echo "     Running tests/deploy.rs (target/debug/deps/deploy-0123)"
        echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s"
        sleep 2
        echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s"
        ;;
    *)
        echo "     Running tests/quick.rs (target/debug/deps/quick-0123)"
        echo "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s"
        ;;
    esac
    ;;
*) echo "stand-in cargo: unexpected $*" >&2; exit 2 ;;
esac
"#;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// `tests/run` started with the stand-in cargo in `dir`, its `test` doing `mode`.
fn start(dir: &Path, mode: &str) -> Child {
    let cargo = dir.join("cargo");
    fs::write(&cargo, FAKE_CARGO).expect("writing the stand-in cargo");
    fs::set_permissions(&cargo, fs::Permissions::from_mode(0o755)).expect("making it executable");
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut command = Command::new(repo_root().join("tests/run"));
    // What cargo test sets for this test would reach the stand-in only; UPDATE_* would make
    // tests/run refuse (it is not set here, or this test's own run would have refused).
    command
        .env("PATH", path)
        .env("FAKE_DIR", dir)
        .env("FAKE_TEST", mode)
        .stdin(Stdio::null())
        .stdout(fs::File::create(dir.join("run.log")).expect("the run's log"))
        .stderr(fs::File::create(dir.join("run.err")).expect("the run's errors"));
    command.spawn().expect("starting tests/run")
}

fn wait_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(status) = child.try_wait().expect("waiting for tests/run") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn output(dir: &Path) -> String {
    let read = |name: &str| fs::read_to_string(dir.join(name)).unwrap_or_default();
    format!("stdout:\n{}\nstderr:\n{}", read("run.log"), read("run.err"))
}

/// Waits until `run`'s stand-in cargo test (in mode `wait`) has written its pid; the pid file.
fn wait_for_cargo_test(run: &mut Child, dir: &Path) -> PathBuf {
    let pid_file = dir.join("test.pid");
    let started = Instant::now();
    while !pid_file.exists() {
        if let Some(status) = run.try_wait().expect("waiting for tests/run") {
            panic!("tests/run ended ({status}) before its cargo test started:\n{}", output(dir));
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no cargo test within 120 s:\n{}", output(dir));
        std::thread::sleep(Duration::from_millis(100));
    }
    pid_file
}

#[test]
fn a_sigterm_to_the_script_alone_stops_the_cargo_command_it_runs() {
    let dir = tempfile::tempdir().expect("a directory for the stand-in");
    let mut run = start(dir.path(), "wait");
    let pid_file = wait_for_cargo_test(&mut run, dir.path());
    std::thread::sleep(Duration::from_millis(200));
    let test_pid: i32 = fs::read_to_string(&pid_file).unwrap().trim().parse().expect("the stand-in's pid");
    assert!(alive(test_pid), "the stand-in cargo test is not running: this test would prove nothing");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM to tests/run");
    let status = wait_within(&mut run, Duration::from_secs(90));
    let ended = fs::read_to_string(dir.path().join("test.ended")).unwrap_or_default();
    let still = alive(test_pid);
    if still {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(test_pid), nix::sys::signal::Signal::SIGKILL);
    }
    if status.is_none() {
        let _ = run.kill();
    }
    assert_eq!(status.and_then(|s| s.code()), Some(143), "tests/run's exit:\n{}", output(dir.path()));
    assert!(!still, "the cargo test tests/run was running outlived it");
    assert_eq!(ended.trim(), "SIGINT", "the cargo test was not interrupted as Ctrl-C would:\n{}", output(dir.path()));
}

#[test]
fn a_finished_run_prints_each_steps_time_and_each_test_binarys() {
    let dir = tempfile::tempdir().expect("a directory for the stand-in");
    let mut run = start(dir.path(), "pass");
    let status = wait_within(&mut run, Duration::from_secs(180));
    if status.is_none() {
        let _ = run.kill();
    }
    let out = output(dir.path());
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{out}");
    let times = out.split("==> times").nth(1).unwrap_or_else(|| panic!("no times printed:\n{out}"));
    for step in ["rustfmt --check", "clippy -D warnings", "cargo test"] {
        assert!(times.lines().any(|line| line.trim_end().ends_with(&format!("s  {step}"))), "{step}: {times}");
    }
    // Each binary's seconds, from its `Running` line to its last result: the deploy binary's
    // two rounds two seconds apart (at least 2 s, however busy the machine), the quick one's
    // listed after it.
    let seconds_of = |binary: &str| {
        times
            .lines()
            .position(|line| {
                line.trim_end().ends_with(&format!(" s  tests/{binary}.rs (target/debug/deps/{binary}-0123)"))
            })
            .map(|at| {
                let line = times.lines().nth(at).unwrap_or_default();
                (at, line.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
            })
    };
    let (deploy, quick) = (seconds_of("deploy"), seconds_of("quick"));
    assert!(matches!(deploy, Some((_, Some(s))) if s >= 2), "the deploy binary's time, to its last result: {times}");
    assert!(
        matches!((deploy, quick), (Some((d, _)), Some((q, Some(_)))) if d < q),
        "the binaries' times, longest first: {times}"
    );
    assert!(out.contains("tests: 4 passed, 0 failed"), "{out}");
    // What cargo test printed is printed as it runs, not only kept in the run's log.
    let before_times = out.split("==> times").next().unwrap_or_default();
    assert!(before_times.contains("     Running tests/quick.rs (target/debug/deps/quick-0123)"), "{out}");
}

/// The sessions `tests/target/.tests-run-sessions` records for the run `owner`.
fn sessions_of(owner: u32) -> Vec<i32> {
    let record = fs::read_to_string(repo_root().join("target/.tests-run-sessions")).unwrap_or_default();
    record
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.first() == Some(&owner.to_string().as_str())).then(|| fields.get(2)?.parse().ok()).flatten()
        })
        .collect()
}

/// The scratch directory of the run `owner` (`inline-guard-run.PID-START` in the temporary
/// directory), if there is one.
fn scratch_of(owner: u32) -> Option<PathBuf> {
    let prefix = format!("inline-guard-run.{owner}-");
    fs::read_dir(std::env::temp_dir())
        .ok()?
        .flatten()
        .find(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
}

fn group_alive(session: i32) -> bool {
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(session), None).is_ok()
}

#[test]
fn a_sigkilled_runs_cargo_command_and_background_build_are_stopped_by_the_next_run() {
    let dir = tempfile::tempdir().expect("a directory for the stand-in");
    let mut run = start(dir.path(), "wait");
    wait_for_cargo_test(&mut run, dir.path());
    // The background build and the cargo test, each a session of its own: the cargo test's is
    // recorded as it starts, which may be a moment after its stand-in wrote its pid.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (sessions, running) = loop {
        let sessions = sessions_of(run.id());
        let running: Vec<i32> = sessions.iter().copied().filter(|s| group_alive(*s)).collect();
        if running.len() >= 2 || Instant::now() > deadline {
            break (sessions, running);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if running.len() < 2 {
        // Not left running past this test's failure.
        let _ = run.kill();
    }
    assert!(
        running.len() >= 2,
        "tests/run recorded sessions {sessions:?}, {running:?} running: wanted the build's and cargo test's\n{}",
        output(dir.path())
    );
    // Its scratch directory (its logs, the background build's output), named after it.
    let scratch = scratch_of(run.id());
    assert!(scratch.is_some(), "no scratch directory of the run {} under {}", run.id(), std::env::temp_dir().display());
    run.kill().expect("SIGKILL to tests/run");
    run.wait().expect("waiting for the killed run");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        running.iter().all(|s| group_alive(*s)),
        "the SIGKILLed run's sessions ended with it: this test would prove nothing"
    );

    // The next run stops them before it starts anything; nothing else would (a sleep of an
    // hour, a loop without end).
    let next_dir = tempfile::tempdir().expect("a directory for the next run");
    let mut next = start(next_dir.path(), "pass");
    let status = wait_within(&mut next, Duration::from_secs(180));
    if status.is_none() {
        let _ = next.kill();
    }
    // Killed processes are gone once reaped, a moment after the kill.
    let deadline = Instant::now() + Duration::from_secs(30);
    while running.iter().any(|s| group_alive(*s)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<i32> = running.iter().copied().filter(|s| group_alive(*s)).collect();
    for session in &left {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(*session), nix::sys::signal::Signal::SIGKILL);
    }
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", output(next_dir.path()));
    assert_eq!(scratch_of(run.id()), None, "the next run left the killed run's scratch directory");
    assert!(
        left.is_empty(),
        "the next run left the killed run's sessions {left:?} running:\n{}",
        output(next_dir.path())
    );
    // Which run stopped them is not asked: this binary's other tests start runs of their own
    // meanwhile, and the first to start does it (its standard error says so).
    assert!(sessions_of(run.id()).is_empty(), "the killed run's sessions are still recorded");
}
