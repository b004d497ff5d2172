//! A flat `perf` profile of a server process while it is loaded: where its CPU goes, by shared
//! object and by symbol, so a report that misses a target can show what bounds it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// Symbols below this share of the samples are left out of the report.
const PERCENT_LIMIT: &str = "1.5";

/// A running `perf record` on one process.
pub struct Recording {
    child: std::process::Child,
    data: std::path::PathBuf,
    /// The process's executable file name, as perf names its object, and what to call it instead.
    rename: Option<(String, String)>,
}

/// Starts sampling process `pid` into `dir/perf.data`, its own executable to be called `label` in
/// the summary; `None` when `perf` is not installed or cannot attach (the caller reports the run
/// as not profiled).
pub fn start(pid: u32, label: &str, dir: &Path) -> Option<Recording> {
    let executable = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let rename = executable
        .and_then(|path| path.file_name().map(|name| name.to_string_lossy().into_owned()))
        .map(|name| (name, label.to_string()));
    let data = dir.join("perf.data");
    let child = Command::new("perf")
        .args(["record", "-F", "999", "-p", &pid.to_string(), "-o"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // perf needs a moment to attach to every thread before the load begins.
    std::thread::sleep(Duration::from_millis(300));
    Some(Recording { child, data, rename })
}

impl Recording {
    /// Stops sampling (SIGINT, as at a terminal) and summarises the profile: the share of
    /// samples per shared object and the top symbols.
    pub fn finish(mut self) -> Option<Value> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).ok()?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).ok()?;
        // perf writes its data on SIGINT and then exits with the signal's status (130).
        self.child.wait().ok()?;
        if !self.data.exists() {
            return None;
        }
        let rename = self.rename.as_ref().map(|(from, to)| (from.as_str(), to.as_str()));
        let objects = report(&self.data, "dso", rename)?;
        let symbols = report(&self.data, "dso,symbol", rename)?;
        Some(json!({"objects": objects, "symbols": symbols}))
    }
}

/// `perf report` sorted by `keys`, as `[{"percent", "entry"}]` above the limit.
fn report(data: &Path, keys: &str, rename: Option<(&str, &str)>) -> Option<Value> {
    let output = Command::new("perf")
        .args(["report", "--stdio", "--no-children", "--sort", keys, "--percent-limit", PERCENT_LIMIT, "-i"])
        .arg(data)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    Some(Value::Array(entries(&String::from_utf8_lossy(&output.stdout), rename)))
}

/// The `NN.NN%  rest` lines of a `perf report --stdio`, comments and blank lines skipped, the
/// empty trailing columns (`-`) dropped and the profiled executable renamed.
fn entries(text: &str, rename: Option<(&str, &str)>) -> Vec<Value> {
    text.lines()
        .filter_map(|line| {
            let (percent, rest) = line.trim_start().split_once('%')?;
            let percent: f64 = percent.parse().ok()?;
            let mut words: Vec<&str> = rest.split_whitespace().collect();
            while words.last() == Some(&"-") {
                words.pop();
            }
            if let (Some(first), Some((from, to))) = (words.first_mut(), rename)
                && *first == from
            {
                *first = to;
            }
            Some(json!({"percent": percent, "entry": words.join(" ")}))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_become_entries() {
        let text = "# Samples: 12K\n#\n    17.43%  https_pinned-ad49  [.] serde_json::read::SliceRead::skip_to_escape  -  -\n     8.14%  libc.so.6  [.] __memmove\n\n";
        assert_eq!(
            entries(text, Some(("https_pinned-ad49", "webhook"))),
            vec![
                json!({"percent": 17.43, "entry": "webhook [.] serde_json::read::SliceRead::skip_to_escape"}),
                json!({"percent": 8.14, "entry": "libc.so.6 [.] __memmove"}),
            ]
        );
    }
}
