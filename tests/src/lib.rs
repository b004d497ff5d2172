//! Test support shared by the suites in `tests/tests/`: running the command in process, comparing
//! output against checked-in golden files, and, for the end-to-end suite, the real Kubernetes
//! peers ([`peers`]), a control plane on loopback ([`cluster`]) and the webhook as a separate
//! process registered with it ([`webhook`]).

pub mod apply;
pub mod bench_areas;
pub mod chart;
pub mod cluster;
pub mod code_digest;
pub mod images;
pub mod node;
pub mod peers;
pub mod policy_equivalence;
pub mod run_root;
pub mod walk;
pub mod webhook;

pub use inline_guard_run_root::bounded;

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// What one in-process run of `csi-volume-admission` produced.
#[derive(Debug)]
pub struct Run {
    /// Exit code.
    pub code: u8,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `csi-volume-admission ARGS` in process, with `stdin` as standard input.
pub fn run(args: &[&str], stdin: &str) -> Run {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let argv = std::iter::once("csi-volume-admission").chain(args.iter().copied());
    let code = csi_volume_admission::cli::run(argv, &mut stdin.as_bytes(), &mut out, &mut err);
    Run { code, stdout: String::from_utf8_lossy(&out).into_owned(), stderr: String::from_utf8_lossy(&err).into_owned() }
}

/// A line on the real standard error: libtest captures `eprintln!` of passing tests, and a
/// rewritten golden file must never go unnoticed.
fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Compares `actual` with the golden file `tests/golden/NAME`; with `UPDATE_GOLDEN=1` rewrites it
/// instead (saying so on standard error, file by file). Drift fails with both texts shown.
pub fn assert_golden(name: &str, actual: &str) {
    let path = repo_root().join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        let before = std::fs::read_to_string(&path).ok();
        if before.as_deref() == Some(actual) {
            say(&format!("UPDATE_GOLDEN: {} unchanged", path.display()));
            return;
        }
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        say(&format!("UPDATE_GOLDEN: REWROTE {} (review the diff before committing)", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1 to create it)", path.display()));
    assert!(
        expected == actual,
        "{} drifted (UPDATE_GOLDEN=1 regenerates it after review)\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}
