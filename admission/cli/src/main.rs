//! The `csi-volume-admission` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = csi_volume_admission::cli::run(
        std::env::args_os(),
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(code)
}
