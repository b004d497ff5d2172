//! `sharedresource-csi-driver probe [--port N] PATH`: the DaemonSet's exec probes. It asks the
//! driver of its own pod for `PATH` (`/healthz`, `/readyz`) over the abstract unix socket of
//! health port `N` (`super::probe_socket_name`), which lives in the pod's network namespace: no
//! other pod can reach it, so none can crowd kubelet's probes out, as a flood of the TCP port's
//! connection slots can. Exits 0 when the driver answers 200, 1 otherwise, printing the answer's
//! first line (or why there was none).

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// The health port the shipped configuration serves (`healthAddress: 0.0.0.0:9808`).
const SHIPPED_PORT: u16 = 9808;
/// How long the probe waits for the driver in all (kubelet's `timeoutSeconds` is above it).
const PATIENCE: Duration = Duration::from_secs(4);
/// The most of an answer read: a status line and headers, and the start of a body.
const MOST_READ: u64 = 16 << 10;

#[derive(Parser)]
#[command(name = "sharedresource-csi-driver probe", about = "Asks this pod's driver for PATH over its probe socket")]
struct ProbeFlags {
    /// The health port of the driver asked (its `healthAddress`).
    #[arg(long, default_value_t = SHIPPED_PORT)]
    port: u16,
    /// What to ask: /healthz or /readyz.
    #[arg(value_parser = ["/healthz", "/readyz"])]
    path: String,
}

/// Runs the probe with `args` (`probe` first); its exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let flags = match ProbeFlags::try_parse_from(args) {
        Ok(flags) => flags,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(2);
        }
    };
    match ask(flags.port, &flags.path) {
        Ok(status_line) if status_line.split(' ').nth(1) == Some("200") => {
            println!("{status_line}");
            ExitCode::SUCCESS
        }
        Ok(status_line) => {
            println!("{status_line}");
            ExitCode::from(1)
        }
        Err(error) => {
            println!("no answer from the driver's probe socket @{}: {error}", super::probe_socket_name(flags.port));
            ExitCode::from(1)
        }
    }
}

/// The status line of the driver's answer to `GET path` on the probe socket of `port`.
pub fn ask(port: u16, path: &str) -> std::io::Result<String> {
    use std::os::linux::net::SocketAddrExt as _;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(super::probe_socket_name(port).as_bytes())?;
    let mut stream = std::os::unix::net::UnixStream::connect_addr(&address)?;
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.set_write_timeout(Some(PATIENCE))?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut answer = Vec::new();
    stream.take(MOST_READ).read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let status_line = text.lines().next().unwrap_or_default();
    if status_line.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the driver closed without an answer"));
    }
    Ok(crate::quote::cut(status_line, 200).to_string())
}
