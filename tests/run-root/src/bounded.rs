//! Running a child process to completion within a bound: a hung peer (csi-sanity, a Go build,
//! the CLI under test) fails the run with a message instead of stalling it until CI's limit.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `command` with piped output; kills it and fails, naming `what`, after `bound`.
pub fn output_within(command: &mut Command, bound: Duration, what: &str) -> Result<Output, String> {
    let mut child =
        command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("running {what}: {e}"))?;
    // Drained on their own threads, so a chatty child cannot block on a full pipe.
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out = std::thread::spawn(move || read_all(stdout));
    let err = std::thread::spawn(move || read_all(stderr));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("waiting for {what}: {e}"))? {
            break status;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not finish within {bound:?}; killed"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() })
}

/// [`output_within`], and the child's stdout when it succeeded; else its exit status and (at
/// most 2000 characters of) its stderr, naming `what`.
pub fn stdout_within(command: &mut Command, bound: Duration, what: &str) -> Result<String, String> {
    let output = output_within(command, bound, what)?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).chars().take(2000).collect::<String>();
        return Err(format!("{what} failed ({}): {stderr}", output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn read_all(stream: Option<impl Read>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut stream) = stream {
        let _ = stream.read_to_end(&mut bytes);
    }
    bytes
}
