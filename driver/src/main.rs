//! The `sharedresource-csi-driver` binary. The driver's image holds it under a second name too,
//! `sharedresource-read-grants` (a link): started by that name it is the read-grants controller
//! (`cli::main_by_name`), so the image carries one program, not two.

fn main() -> std::process::ExitCode {
    sharedresource_csi_driver::cli::main_by_name(std::env::args_os().collect())
}
