//! Where a benchmark's processes run and what they cost: pinning to one core, and the CPU time a
//! process has used, read from the kernel's per-process CPU clock (nanoseconds on the CPU, over
//! all its threads) rather than estimated by the load generator.

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

/// CPU time used so far by process `pid`, all its threads together, those that have exited
/// included: the kernel's per-process CPU clock, in nanoseconds. (Summing the live threads'
/// `/proc/PID/task/*/schedstat` loses the time of every thread that exits, such as a runtime's
/// idle blocking threads, and can even go backwards between two readings.)
pub fn cpu_time(pid: u32) -> Result<Duration, String> {
    let raw = i32::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(raw))
        .map_err(|e| format!("CPU clock of process {pid}: {e}"))?;
    let now = nix::time::clock_gettime(clock).map_err(|e| format!("reading the CPU clock of process {pid}: {e}"))?;
    Ok(Duration::from(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_of_threads_that_exited_still_counts() {
        let pid = std::process::id();
        let before = cpu_time(pid).unwrap();
        // Spins until the thread itself has used 30 ms of CPU, however busy the machine (a
        // wall-clock spin can be descheduled for most of its time).
        std::thread::spawn(|| {
            let used =
                || Duration::from(nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap());
            while used() < Duration::from_millis(30) {
                std::hint::black_box(0u64.wrapping_add(1));
            }
        })
        .join()
        .unwrap();
        let after = cpu_time(pid).unwrap();
        assert!(after >= before + Duration::from_millis(20), "{before:?} then {after:?}");
    }

    #[test]
    fn another_process_can_be_read() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let time = cpu_time(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(time.unwrap() < Duration::from_secs(1));
    }

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
