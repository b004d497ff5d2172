//! Running a helper program: as its provider's user and group (by default `nobody`, with no
//! supplementary group, and so, set from root, no capability), no shell, an empty environment
//! but `PATH`, standard input closed, its own process group (so that whatever it starts is
//! killed with it), a time limit, and a limit on what it may print. The driver's process gains
//! no privilege by executing a file ([`no_new_privileges`], set at its start and inherited by
//! every helper), so a setuid program a helper runs stays its user's; and the driver's program
//! starts it behind a seccomp filter (`helper_confinement`). A failure carries the
//! helper's standard error, cut to 4 KiB, never what it printed on standard output (that is file
//! content).

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::helper_confinement;
use super::provider::HelperUser;

/// The `PATH` a helper runs with.
const HELPER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How much of a helper's standard error a failure carries.
pub const MAX_STDERR_BYTES: usize = 4096;

/// Why a helper call failed.
#[derive(Debug, thiserror::Error)]
pub enum HelperFailure {
    /// The program could not be started.
    #[error("could not be started: {0}")]
    Start(#[source] std::io::Error),
    /// It exited with a failure.
    #[error("{status}{}", said(stderr))]
    Exit {
        /// How it exited.
        status: std::process::ExitStatus,
        /// The start of its standard error.
        stderr: String,
    },
    /// It did not finish in time; its process group was killed.
    #[error("did not finish within {} s and was killed{}", timeout.as_secs_f64(), said(stderr))]
    Timeout {
        /// The limit.
        timeout: Duration,
        /// The start of its standard error.
        stderr: String,
    },
    /// It printed more than allowed; its process group was killed.
    #[error("printed more than {limit} bytes and was killed{}", said(stderr))]
    TooLarge {
        /// The limit.
        limit: u64,
        /// The start of its standard error.
        stderr: String,
    },
    /// Reading its output failed.
    #[error("its output could not be read: {0}")]
    Read(#[source] std::io::Error),
}

fn said(stderr: &str) -> String {
    if stderr.trim().is_empty() { String::new() } else { format!("; it said: {}", stderr.trim_end()) }
}

/// How often a start refused because the helper's file is open for writing is tried again.
const BUSY_RETRIES: u32 = 12;

/// `command` started. A helper whose file some process still holds open for writing cannot be
/// executed (ETXTBSY): a helper being replaced in place, or, in a process that starts programs
/// from several threads, a child forked while another thread was writing a file, which holds
/// the file open until it execs. Both pass within moments, so such a start is tried again a
/// few times, a little later each time, before it counts as failed.
async fn spawn(command: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(error) if error.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32) && tries < BUSY_RETRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20 * u64::from(tries))).await;
            }
            started => return started,
        }
    }
}

/// Makes this process, and every program it starts from now on, unable to gain privileges by
/// executing a file (a setuid or file-capability program runs with its caller's). The driver
/// executes nothing but helpers, which must never run as more than their provider's user.
pub fn no_new_privileges() -> nix::Result<()> {
    nix::sys::prctl::set_no_new_privs()
}

/// Runs `helper` as `user` with `arguments`; its standard output when it exits 0 within
/// `timeout` having printed at most `max_output` bytes.
pub async fn run(
    helper: &Path,
    user: HelperUser,
    arguments: &[OsString],
    timeout: Duration,
    max_output: u64,
) -> Result<Vec<u8>, HelperFailure> {
    // Through the launcher when the process confines its helpers (`helper_confinement`): it
    // installs the helper's seccomp filter and executes the helper in its place.
    let mut command = match helper_confinement::launcher() {
        Some(launcher) => {
            let mut command = tokio::process::Command::new(launcher);
            command.args([OsString::from(helper_confinement::CONFINE_HELPER), "--".into(), helper.into()]);
            command
        }
        None => tokio::process::Command::new(helper),
    };
    // As the driver's own user (a driver not run as root, as in tests): nothing to change, and
    // changing it would be refused.
    if user != HelperUser::this_process() {
        // From root, setting the user also drops every supplementary group and capability.
        command.uid(user.uid).gid(user.gid);
    }
    command
        .args(arguments)
        .env_clear()
        .env("PATH", HELPER_PATH)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = spawn(&mut command).await.map_err(HelperFailure::Start)?;
    let group = HelperGroup(child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw));
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(HelperFailure::Read(std::io::Error::other("no pipes to the helper")));
    };
    let finished = tokio::time::timeout(timeout, async {
        let (output, errors, status) =
            tokio::join!(read_at_most(stdout, max_output), drain_keeping(stderr, MAX_STDERR_BYTES), child.wait());
        (output, errors, status)
    })
    .await;
    // Whatever it left running in its group goes with it, in every case.
    drop(group);
    let Ok((output, errors, status)) = finished else {
        let _ = child.wait().await;
        return Err(HelperFailure::Timeout { timeout, stderr: String::new() });
    };
    let stderr = errors.map(|bytes| text_of(&bytes)).unwrap_or_default();
    let (output, overflowed) = output.map_err(HelperFailure::Read)?;
    if overflowed {
        return Err(HelperFailure::TooLarge { limit: max_output, stderr });
    }
    let status = status.map_err(HelperFailure::Read)?;
    if !status.success() {
        return Err(HelperFailure::Exit { status, stderr });
    }
    Ok(output)
}

/// A helper's process group, killed when this is dropped: at the run's end, at its timeout, and
/// when the run itself is given up unfinished (its future dropped: a publish abandoned, the
/// driver stopping), where `kill_on_drop` alone kills only the helper and leaves what it
/// started (a `cat` blocked on a pipe, a `sleep`) running for ever.
struct HelperGroup(Option<Pid>);

impl Drop for HelperGroup {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}

/// Reads `reader` to its end, keeping at most `limit` bytes; whether there was more. Stops
/// reading at the first byte over the limit (the helper then meets a closed pipe).
async fn read_at_most(reader: impl AsyncRead + Unpin, limit: u64) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let read = reader.take(limit + 1).read_to_end(&mut kept).await?;
    let over = read as u64 > limit;
    kept.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok((kept, over))
}

/// Reads `reader` to its end, keeping its first `limit` bytes: standard error is drained whole,
/// so that a helper saying much there never blocks on a full pipe.
async fn drain_keeping(mut reader: impl AsyncRead + Unpin, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        let read = reader.read(&mut buffer).await?;
        if read == 0 {
            return Ok(kept);
        }
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..read.min(room)]);
    }
}

/// A helper's standard error as text for a message: lossy UTF-8, escaped so that a control
/// character cannot forge a log line.
fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim_end().escape_debug().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    async fn run_sh(script: &str, timeout: Duration, max: u64) -> Result<Vec<u8>, HelperFailure> {
        run(Path::new("/bin/sh"), HelperUser::this_process(), &sh(script), timeout, max).await
    }

    #[tokio::test]
    async fn a_helper_runs_as_its_user_with_no_other_group_no_capability_and_no_way_to_gain_privileges() {
        use std::os::unix::fs::PermissionsExt as _;
        assert!(nix::unistd::geteuid().is_root(), "changing a helper's user needs root: run the test command as root");
        // A helper every user may run, in a directory every user may enter.
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let helper = dir.path().join("helper");
        let script =
            "#!/bin/sh\nid -u; id -g; id -G; grep -E '^(CapPrm|CapEff|CapAmb|NoNewPrivs):' /proc/self/status\n";
        std::fs::write(&helper, script).unwrap();
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Inherited from here on by whatever this test process starts, as by the driver's helpers.
        no_new_privileges().unwrap();
        let as_root = run(&helper, HelperUser::ROOT, &[], Duration::from_secs(30), 4096).await.unwrap();
        let as_root = String::from_utf8(as_root).unwrap();
        assert!(as_root.starts_with("0\n0\n"), "the positive control: root when said: {as_root}");
        assert!(!as_root.contains("CapEff:\t0000000000000000"), "root keeps its capabilities: {as_root}");
        let output = run(&helper, HelperUser::NOBODY, &[], Duration::from_secs(30), 4096).await.unwrap();
        assert_eq!(
            String::from_utf8(output).unwrap(),
            "65534\n65534\n65534\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
             CapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"
        );
        // Its directory's files: what a helper as nobody cannot read, it cannot print.
        std::fs::write(dir.path().join("private"), "s3cret").unwrap();
        std::fs::set_permissions(dir.path().join("private"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let private = [OsString::from("-c"), OsString::from(format!("cat {}/private", dir.path().display()))];
        let error = run(Path::new("/bin/sh"), HelperUser::NOBODY, &private, Duration::from_secs(30), 4096).await;
        assert!(
            matches!(&error, Err(HelperFailure::Exit { stderr, .. }) if stderr.contains("Permission denied")),
            "{error:?}"
        );
        let read = run(Path::new("/bin/sh"), HelperUser::ROOT, &private, Duration::from_secs(30), 4096).await.unwrap();
        assert_eq!(read, b"s3cret", "the positive control: root reads it");
    }

    #[tokio::test]
    async fn a_helper_still_open_for_writing_is_started_once_the_writer_lets_go_and_not_before() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let helper = dir.path().join("helper");
        std::fs::write(&helper, "#!/bin/sh\nprintf started\n").unwrap();
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let args: [OsString; 0] = [];

        // Held open for writing for good: every try is refused, and the last refusal is the answer.
        let writer = std::fs::OpenOptions::new().write(true).open(&helper).unwrap();
        let error = run(&helper, HelperUser::this_process(), &args, Duration::from_secs(30), 100).await.unwrap_err();
        let HelperFailure::Start(cause) = &error else { panic!("{error:?}") };
        assert_eq!(cause.raw_os_error(), Some(nix::errno::Errno::ETXTBSY as i32), "{cause}");

        // Let go of while the first tries are refused: started.
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(writer);
        });
        let writer_again = std::fs::OpenOptions::new().write(true).open(&helper).unwrap();
        let closer_again = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(writer_again);
        });
        assert_eq!(
            run(&helper, HelperUser::this_process(), &args, Duration::from_secs(30), 100).await.unwrap(),
            b"started"
        );
        closer.join().unwrap();
        closer_again.join().unwrap();
    }

    #[tokio::test]
    async fn output_of_a_helper_that_succeeds() {
        let output = run_sh("printf 'a file'", Duration::from_secs(30), 100).await.unwrap();
        assert_eq!(output, b"a file");
    }

    #[tokio::test]
    async fn the_environment_is_empty_but_path() {
        // A variable the driver has (HOME, KUBECONFIG, ...) is not the helper's.
        let output = run_sh("env | sort", Duration::from_secs(30), 10_000).await.unwrap();
        let text = String::from_utf8(output).unwrap();
        let names: Vec<&str> = text
            .lines()
            .map(|line| line.split('=').next().unwrap())
            .filter(|n| *n != "PWD" && *n != "SHLVL" && *n != "_")
            .collect();
        assert_eq!(names, ["PATH"], "{text}");
    }

    #[tokio::test]
    async fn a_failure_carries_the_start_of_stderr_and_never_stdout() {
        let error = run_sh("echo s3cret-content; echo 'no such secret' >&2; exit 3", Duration::from_secs(30), 100)
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "exit status: 3; it said: no such secret");
        let error =
            run_sh("head -c 10000 /dev/zero | tr '\\0' x >&2; exit 1", Duration::from_secs(30), 100).await.unwrap_err();
        let HelperFailure::Exit { stderr, .. } = error else { panic!("{error:?}") };
        assert_eq!(stderr.len(), MAX_STDERR_BYTES);
        // Far more than a pipe holds: drained, so the helper exits and its failure is its own.
        let error = run_sh("head -c 1000000 /dev/zero | tr '\\0' y >&2; exit 2", Duration::from_secs(60), 100)
            .await
            .unwrap_err();
        assert!(matches!(&error, HelperFailure::Exit { stderr, .. } if stderr.len() == MAX_STDERR_BYTES), "{error:?}");
    }

    #[tokio::test]
    async fn output_over_the_limit_is_refused() {
        let error = run_sh("head -c 5000 /dev/zero", Duration::from_secs(30), 4096).await.unwrap_err();
        assert!(matches!(error, HelperFailure::TooLarge { limit: 4096, .. }), "{error:?}");
        let exact = run_sh("head -c 4096 /dev/zero", Duration::from_secs(30), 4096).await.unwrap();
        assert_eq!(exact.len(), 4096, "the limit itself is allowed");
    }

    #[tokio::test]
    async fn a_helper_past_its_time_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        // The helper starts a child in its group, says which, and waits for it for ever.
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
        let error = run_sh(&script, Duration::from_secs(5), 100).await.unwrap_err();
        assert!(matches!(error, HelperFailure::Timeout { .. }), "{error:?}");
        let pid = std::fs::read_to_string(&pid_file).expect("the helper started its child").trim().to_string();
        // Killed with the group: gone, or a zombie waiting for init, within moments.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            let dead = state
                .as_deref()
                .is_none_or(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')));
            if dead {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the helper's child {pid} outlived it: {state:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether process `pid` is gone, or a zombie waiting for init.
    fn dead(pid: &str) -> bool {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        state
            .as_deref()
            .is_none_or(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
    }

    #[tokio::test]
    async fn a_helper_whose_run_is_given_up_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
        let mut running = Box::pin(run_sh(&script, Duration::from_secs(600), 100));
        // Run until the helper has started its child (bounded: a helper that never starts fails).
        let started = std::time::Instant::now();
        let pid = loop {
            tokio::select! {
                ended = &mut running => panic!("the helper ended: {ended:?}"),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            if let Some(pid) = std::fs::read_to_string(&pid_file).ok().filter(|text| text.ends_with('\n')) {
                break pid.trim().to_string();
            }
            assert!(started.elapsed() < Duration::from_secs(60), "the helper never started its child");
        };
        assert!(!dead(&pid), "the positive control: its child runs");
        drop(running);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !dead(&pid) {
            assert!(std::time::Instant::now() < deadline, "the helper's child {pid} outlived its run");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_missing_helper_is_named_as_not_started() {
        let error = run(Path::new("/nonexistent/helper"), HelperUser::this_process(), &[], Duration::from_secs(1), 10)
            .await
            .unwrap_err();
        assert!(error.to_string().starts_with("could not be started: "), "{error}");
    }
}
