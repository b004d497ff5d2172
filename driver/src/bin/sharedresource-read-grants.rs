//! The `sharedresource-read-grants` binary; everything it does is `read_grants::cli`'s.

fn main() -> std::process::ExitCode {
    sharedresource_csi_driver::controllers::program::main(std::env::args_os())
}
