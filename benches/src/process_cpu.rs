//! Where a benchmark's processes run and what they cost: pinning to one core, and the CPU time a
//! process has used, read from the kernel's scheduler statistics (nanoseconds on the CPU, summed
//! over its threads) rather than estimated by the load generator.

use std::path::Path;
use std::time::Duration;

/// The cores the benchmark uses: servers on one, the load generator on another, when the machine
/// has two or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The core every server is pinned to.
    pub server: usize,
    /// The core the load generator is pinned to; `None` when the machine has one core and both
    /// share it.
    pub generator: Option<usize>,
}

impl Placement {
    /// Servers on core 0 and the generator on core 1, or everything on core 0 with one core.
    pub fn for_this_machine() -> Placement {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Placement { server: 0, generator: (cores >= 2).then_some(1) }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        match self.generator {
            Some(generator) => format!("servers pinned to CPU {}, load generator to CPU {generator}", self.server),
            None => format!("one core: servers and load generator share CPU {}", self.server),
        }
    }

    /// Pins the calling process (and the threads it starts from now on) to the generator's core.
    pub fn pin_generator(&self) -> Result<(), String> {
        let Some(core) = self.generator else { return Ok(()) };
        let mut set = nix::sched::CpuSet::new();
        set.set(core).map_err(|e| format!("CPU {core}: {e}"))?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
            .map_err(|e| format!("pinning to CPU {core}: {e}"))
    }

    /// `program args` as a command pinned to the servers' core (through `taskset`).
    pub fn server_command(&self, program: &Path) -> std::process::Command {
        let mut command = std::process::Command::new("taskset");
        command.arg("-c").arg(self.server.to_string()).arg(program);
        command
    }
}

/// CPU time used so far by process `pid`, all its threads together.
pub fn cpu_time(pid: u32) -> Result<Duration, String> {
    let tasks = format!("/proc/{pid}/task");
    let mut total = 0u64;
    for task in std::fs::read_dir(&tasks).map_err(|e| format!("{tasks}: {e}"))? {
        let path = task.map_err(|e| e.to_string())?.path().join("schedstat");
        // A thread that exited between the listing and the read has nothing left to count.
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let on_cpu: u64 = text
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("{}: unexpected content {text:?}", path.display()))?;
        total += on_cpu;
    }
    Ok(Duration::from_nanos(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_cpu_time_that_grows_with_work() {
        let pid = std::process::id();
        let before = cpu_time(pid).unwrap();
        // Spin until 20 ms of CPU are counted; a loaded machine may take longer in wall time,
        // but a reading that never grows fails.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cpu_time(pid).unwrap() - before < Duration::from_millis(20) {
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_millis(1) {
                std::hint::black_box(0u64.wrapping_add(1));
            }
            assert!(std::time::Instant::now() < deadline, "10 s of spinning never counted 20 ms of CPU");
        }
    }
}
