//! The `sharedresource-read-grants` binary; everything it does is `controllers::program`'s.

fn main() -> std::process::ExitCode {
    sharedresource_csi_driver::controllers::program::main(std::env::args_os())
}
