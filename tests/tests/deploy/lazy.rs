//! A lazy volume of the example `exec` provider, its helper installed from an image of its own
//! by the example-providers Component: a pod reads its file five times a second while the
//! DaemonSet rolls (an upgrade, a `kubectl rollout restart`). Each roll starts the new driver
//! beside the old one, which hands the volume's FUSE connection over before kubelet stops it:
//! no read may fail. After each roll the value in the helper's vault changes and the pod must
//! read the new one: only the new driver is left to run the helper's `get`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inline_guard_tests::node::Node;
use serde_json::{Value, json};

use crate::workload::{CONSUMER, DRIVER};

/// The provider, as the overlay's driver.yaml names it.
pub const PROVIDER: &str = "example";
/// The reading pod, in [`CONSUMER`].
pub const POD: &str = "lazy-reader";
/// Five reads a second, each numbered, with what `cat` said when it failed.
const READER: &str =
    r#"n=0; while true; do n=$((n+1)); echo "read $n: $(cat /vault/secrets/db-password 2>&1)"; sleep 0.2; done"#;

/// The pod, written like the other readers (no `readOnly`: the webhook adds it).
pub fn pod() -> Value {
    let csi = json!({"driver": DRIVER, "volumeAttributes": {"provider": PROVIDER}});
    inline_guard_tests::node::reader_pod(POD, READER, csi, "/vault")
}

/// The pod's file in the example helper's vault, and every value it has held.
pub struct LazyFile {
    file: PathBuf,
    values: Vec<String>,
}

impl LazyFile {
    /// Puts `first` in `vault/CONSUMER/POD/db-password`, where the example helper looks for the
    /// pod's files.
    pub fn new(vault: &Path, first: &str) -> Result<Self, String> {
        let dir = vault.join(CONSUMER).join(POD);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut file = LazyFile { file: dir.join("db-password"), values: Vec::new() };
        file.set(first)?;
        Ok(file)
    }

    /// Replaces the value, whole (written beside, then renamed: the helper never reads half).
    pub fn set(&mut self, value: &str) -> Result<(), String> {
        let partial = self.file.with_extension("partial");
        std::fs::write(&partial, value).map_err(|e| format!("{}: {e}", partial.display()))?;
        std::fs::rename(&partial, &self.file).map_err(|e| format!("{}: {e}", self.file.display()))?;
        self.values.push(value.to_string());
        Ok(())
    }

    /// Waits until the pod has read the last value set in a read numbered above `after`;
    /// returns its last read's number. Every read it ever made must have given one of the
    /// values set: anything else (ENOTCONN from a FUSE connection nobody serves, EIO, an empty
    /// file) is a failed read.
    pub async fn read_after(&self, node: &Node, after: u64) -> Result<u64, String> {
        let wanted = self.values.last().ok_or("no value set")?;
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let log = node.container_log(CONSUMER, POD, "reader");
            let reads: Vec<(u64, &str)> = log.iter().filter_map(|line| read(line)).collect();
            if let Some((number, failed)) = reads.iter().find(|(_, value)| !self.values.iter().any(|v| v == value)) {
                return Err(format!("{CONSUMER}/{POD}: read {number} gave {failed:?}, not one of {:?}", self.values));
            }
            if reads.iter().any(|(number, value)| *number > after && value == wanted) {
                let last = reads.last().map_or(0, |(number, _)| *number);
                println!("deploy: {CONSUMER}/{POD} read {wanted:?} after read {after}; {last} reads, none failed");
                return Ok(last);
            }
            if Instant::now() > deadline {
                let tail: Vec<_> = log.iter().rev().take(5).collect();
                return Err(format!(
                    "{CONSUMER}/{POD} never read {wanted:?} after read {after} in 90 s; last lines {tail:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// `read N: VALUE` as its number and value (an empty read is an empty value, its line's
/// trailing space trimmed or not).
fn read(line: &str) -> Option<(u64, &str)> {
    let (number, value) = line.strip_prefix("read ")?.split_once(':')?;
    Some((number.parse().ok()?, value.strip_prefix(' ').unwrap_or(value)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_read_line_gives_its_number_and_what_was_read() {
        assert_eq!(super::read("read 12: lazy-first"), Some((12, "lazy-first")));
        let failed = "read 3: cat: can't open '/vault/secrets/db-password': Transport endpoint is not connected";
        assert_eq!(
            super::read(failed),
            Some((3, "cat: can't open '/vault/secrets/db-password': Transport endpoint is not connected"))
        );
        assert_eq!(super::read("read 4: "), Some((4, "")));
        assert_eq!(super::read("read 4:"), Some((4, "")), "a log line's trailing space trimmed");
        assert_eq!(super::read("started"), None);
    }
}
