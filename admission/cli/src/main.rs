//! The `csi-volume-admission` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Unlocked handles: `serve` logs from worker threads, which must not wait on a lock this
    // thread holds for the life of the process.
    let code = csi_volume_admission::cli::run(
        std::env::args_os(),
        &mut std::io::stdin(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    ExitCode::from(code)
}
