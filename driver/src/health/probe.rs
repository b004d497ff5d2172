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

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::health::{Health, bind, bind_probe_socket, serve_probes};
    use crate::metrics::Metrics;

    /// What the probe command prints and exits with, asking for `path` of the driver on `port`.
    async fn probed(port: u16, path: &str) -> String {
        let args = ["probe", "--port", &port.to_string(), path].map(OsString::from);
        let code = tokio::task::spawn_blocking(move || main(args)).await.unwrap();
        format!("{code:?}")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_probe_exits_zero_only_when_the_driver_answers_200() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("shares")).unwrap();
        let health = Arc::new(Health {
            serving: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
            content: Arc::new(crate::content::StaticDirSource::new(dir.path().join("shares"))),
            metrics: Arc::new(Metrics::new()),
        });
        // A port number no other test's probe socket is named by: one held bound on loopback.
        let held = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let port = held.local_addr().unwrap().port();
        tokio::spawn(serve_probes(bind_probe_socket(port).unwrap(), health.clone(), std::future::pending()));
        let (success, failure) = (format!("{:?}", ExitCode::SUCCESS), format!("{:?}", ExitCode::from(1)));
        assert_eq!(probed(port, "/healthz").await, success, "alive");
        assert_eq!(probed(port, "/readyz").await, failure, "not serving yet: a 503");
        health.serving.store(true, Ordering::SeqCst);
        assert_eq!(probed(port, "/readyz").await, success, "ready");
        // No health port is ever bound at port 0, so no probe socket is named by it.
        assert_eq!(probed(0, "/readyz").await, failure, "no driver on that socket");
        drop(held);
    }
}
