//! What every program of the driver's image shares (the node plugin, `cli`; the control-plane
//! program, `controllers::program`): flags parsed, logging started, the open-files limit
//! raised, an error printed with exit code 2.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

/// A program of the driver's image: `args` parsed into `F` (help and version printed, a usage
/// error is exit code 2), logging started, then `run`; its error is printed after `name`, with
/// exit code 2.
pub fn run_program<F: Parser>(
    name: &str,
    args: impl IntoIterator<Item = OsString>,
    run: fn(F) -> Result<(), Box<dyn std::error::Error>>,
) -> ExitCode {
    let flags = match F::try_parse_from(args) {
        Ok(flags) => flags,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    init_logging();
    match run(flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name}: {error}");
            ExitCode::from(2)
        }
    }
}

/// Logs to standard error, in colour only on a terminal.
fn init_logging() {
    use std::io::IsTerminal as _;
    // RUST_LOG as usual (`info` when unset or invalid).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Standard error that swallows write failures: tracing-subscriber panics when it cannot report a
/// failed write, and a closed log pipe must not take the node plugin down. Written twice, here
/// and in the admission server's `serve`: the two binaries share only the shares' API crate,
/// which has no business carrying a logger, and a crate of its own for twelve lines would cost
/// more to follow than the copy.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Raises the soft limit of open files to the hard limit, as Go's runtime does at start: the
/// driver holds a socket per client and a descriptor per watch, and a container's default soft
/// limit (often 1024) is no bound the node chose for it.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(%error, soft, hard, "could not raise the open-files limit");
    }
}
