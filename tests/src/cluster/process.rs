//! A child process the suites own: its output goes to a log file in the run directory, and it is
//! killed when dropped (a test that panics still unwinds through the drop) or, through `setpriv
//! --pdeathsig`, when the test process itself dies without unwinding.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};

/// What starts every child with its parent-death signal set.
const SETPRIV: &str = "/usr/bin/setpriv";

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
        // SIGKILL when the process that started it dies, so no apiserver outlives a killed run.
        // Without setpriv that promise would silently not hold: refuse instead (tests/run
        // installs util-linux on a machine that lacks it).
        if !Path::new(SETPRIV).exists() {
            return Err(format!(
                "starting {name}: {SETPRIV} is missing (util-linux), and without it a killed run would leave {name} running"
            ));
        }
        let mut command = Command::new(SETPRIV);
        command.args(["--pdeathsig", "KILL", "--"]).arg(program);
        command.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        for (key, value) in env {
            command.env(key, value);
        }
        let child =
            spawn_from_lasting_thread(command).map_err(|e| format!("starting {name} ({}): {e}", program.display()))?;
        Ok(ChildProcess { name: name.to_string(), child, log })
    }

    /// Its resident memory now (`VmRSS` of `/proc/<pid>/status`; setpriv execs the program, so
    /// the pid is the program's own).
    pub fn resident_bytes(&self) -> Result<u64, String> {
        self.status_bytes("VmRSS:")
    }

    /// The most it was ever resident (`VmHWM` of `/proc/<pid>/status`).
    pub fn peak_resident_bytes(&self) -> Result<u64, String> {
        self.status_bytes("VmHWM:")
    }

    /// The size `/proc/<pid>/status` gives after `field`, in bytes.
    fn status_bytes(&self, field: &str) -> Result<u64, String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .map_err(|e| format!("reading the status of {}: {e}", self.name))?;
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|number| number.trim().parse::<u64>().ok())
            .ok_or_else(|| format!("{} has no {field}", self.name))?;
        Ok(kib * 1024)
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

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and its exit status once it exits within `bound` (SIGKILL and an error naming
    /// it otherwise).
    pub fn terminate(&mut self, bound: std::time::Duration) -> Result<std::process::ExitStatus, String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).map_err(|e| format!("{}: {e}", self.name))?;
        let deadline = std::time::Instant::now() + bound;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Ok(None) => {
                    self.kill();
                    return Err(format!(
                        "{} did not exit within {bound:?} of its SIGTERM\n{}",
                        self.name,
                        self.log_tail(30)
                    ));
                }
                Err(e) => return Err(format!("{}: {e}", self.name)),
            }
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

/// Starts `command` from one thread that lives as long as the test process. `--pdeathsig` fires
/// when the *thread* that forked the child exits, not the process: a child started from a
/// scenario's thread (a driver or webhook restarted mid-scenario) would otherwise be killed as
/// soon as that scenario ended, under the scenarios after it.
fn spawn_from_lasting_thread(command: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for (mut command, reply) in queue {
                let _ = reply.send(command.spawn());
            }
        });
        Mutex::new(jobs)
    });
    let (reply, answer) = mpsc::channel();
    let gone = || std::io::Error::other("the spawning thread is gone");
    spawner.lock().unwrap_or_else(|p| p.into_inner()).send((command, reply)).map_err(|_| gone())?;
    answer.recv().map_err(|_| gone())?
}

/// A loopback port free at the time of asking. Another process could take it before it is used;
/// on this single-tenant test machine that race is accepted.
pub fn free_port() -> Result<u16, String> {
    free_ports::<1>().map(|[port]| port)
}

/// `N` loopback ports free at the time of asking, all different: each listener is held until
/// every port is chosen (asked one after another, the kernel may give the one just released
/// again, and a process given one port twice fails to listen on the second).
pub fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
        *port = listener.local_addr().map_err(|e| format!("finding a free port: {e}"))?.port();
        listeners.push(listener);
    }
    Ok(ports)
}
