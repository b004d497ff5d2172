//! The driver's program as the launcher of a helper (`confine-helper`): the helper it executes
//! runs behind the seccomp filter, refused what no helper needs (a user namespace, a mount), and
//! the same program run without it is not (the control: what is refused is the filter's doing).

use std::process::Command;

const DRIVER: &str = env!("CARGO_BIN_EXE_sharedresource-csi-driver");

/// What `/bin/sh -c SCRIPT` prints, run through the launcher or not.
fn shell(script: &str, confined: bool) -> (Option<i32>, String, String) {
    let mut command = if confined {
        let mut command = Command::new(DRIVER);
        command.args(["confine-helper", "--", "/bin/sh", "-c", script]);
        command
    } else {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", script]);
        command
    };
    let output = command.output().expect("running the shell");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Each line tries one thing a helper never needs and says whether the kernel let it: a user
/// namespace, and (as root, which the test runs as) a tmpfs mounted on `dir`, then unmounted.
fn tries(dir: &std::path::Path) -> String {
    format!(
        "grep '^Seccomp:' /proc/self/status
unshare --user true 2>/dev/null && echo 'user namespace: made' || echo 'user namespace: refused'
mount -t tmpfs confined-probe {dir} 2>/dev/null && umount {dir} && echo 'mount: made' || echo 'mount: refused'
echo 'still running'",
        dir = dir.display()
    )
}

#[test]
fn a_helper_started_through_the_driver_is_refused_namespaces_and_mounts_and_runs_otherwise() {
    assert!(nix::unistd::geteuid().is_root(), "this test mounts: run it as root, as tests/run does");
    // Its own directory: a run killed with a helper inside is swept by the next one.
    let dir = sharedresource_csi_driver::test_util::mounted_dir::MountedDir::new();
    let script = tries(dir.path());
    let (code, free, _) = shell(&script, false);
    assert_eq!(code, Some(0), "{free}");
    // The control: on this machine, the same shell outside the filter makes both.
    assert!(free.contains("Seccomp:\t0"), "{free}");
    assert!(
        free.contains("user namespace: made"),
        "unshare --user must work here for the test to mean anything: {free}"
    );
    assert!(free.contains("mount: made"), "{free}");

    let (code, confined, stderr) = shell(&script, true);
    assert_eq!(code, Some(0), "{confined}{stderr}");
    assert!(confined.contains("Seccomp:\t2"), "{confined}");
    assert!(confined.contains("user namespace: refused"), "{confined}");
    assert!(confined.contains("mount: refused"), "{confined}");
    // What a helper does (run programs, read files, print) still works.
    assert!(confined.contains("still running"), "{confined}");
}

#[test]
fn the_launcher_passes_arguments_through_and_says_when_the_helper_cannot_start() {
    let output = Command::new(DRIVER)
        .args(["confine-helper", "--", "/bin/echo", "get", "secrets/a b", "--", "ns"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "get secrets/a b -- ns\n");

    let output = Command::new(DRIVER).args(["confine-helper", "--", "/nonexistent/helper", "mount"]).output().unwrap();
    assert_eq!(output.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("confine-helper: \"/nonexistent/helper\" could not be started: No such file"), "{stderr}");

    // Without `--` and a program: a usage error, nothing run.
    for args in [&["confine-helper"][..], &["confine-helper", "/bin/true"], &["confine-helper", "--"]] {
        let output = Command::new(DRIVER).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("usage:"), "{args:?}");
    }
}
