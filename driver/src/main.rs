//! The `sharedresource-csi-driver` binary; everything it does is `cli`'s.

fn main() -> std::process::ExitCode {
    sharedresource_csi_driver::cli::main(std::env::args_os())
}
