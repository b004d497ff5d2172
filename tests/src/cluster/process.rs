//! A child process the suites own: its output goes to a log file in the run directory, and it is
//! killed when dropped (a test that panics still unwinds through the drop) or, through `setpriv
//! --pdeathsig`, when the test process itself dies without unwinding.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running child, killed on drop.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    log: PathBuf,
}

impl ChildProcess {
    /// Starts `program ARGS` with `env`, logging to `log_dir/NAME.log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log_dir: &Path,
    ) -> Result<ChildProcess, String> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
        // SIGKILL when the thread that started it goes away, so no apiserver outlives a killed run.
        let mut command = if Path::new("/usr/bin/setpriv").exists() {
            let mut command = Command::new("/usr/bin/setpriv");
            command.args(["--pdeathsig", "KILL", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        command.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().map_err(|e| format!("starting {name} ({}): {e}", program.display()))?;
        Ok(ChildProcess { name: name.to_string(), child, log })
    }

    /// The last `lines` lines of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        format!("--- last lines of {} ---\n{}", self.log.display(), all[all.len().saturating_sub(lines)..].join("\n"))
    }

    /// Fails with the log tail if it has exited.
    pub fn ensure_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited ({status})\n{}", self.name, self.log_tail(30))),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port free at the time of asking. Another process could take it before it is used;
/// on this single-tenant test machine that race is accepted.
pub fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    listener.local_addr().map(|address| address.port()).map_err(|e| format!("finding a free port: {e}"))
}
