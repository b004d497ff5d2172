//! kubectl, built from the same Kubernetes release as the control plane, run as a user runs it
//! with the admin kubeconfig.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use inline_guard_tests::bounded::output_within;

/// kubectl against the suite's cluster.
#[derive(Clone)]
pub struct Kubectl {
    /// The binary.
    pub binary: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    /// `kubectl ARGS`, on a blocking thread; its stdout, or its stderr as the error.
    pub async fn run(&self, args: &[&str]) -> Result<String, String> {
        let this = self.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        tokio::task::spawn_blocking(move || this.run_blocking(&args)).await.map_err(|e| e.to_string())?
    }

    fn run_blocking(&self, args: &[String]) -> Result<String, String> {
        let mut command = Command::new(&self.binary);
        command.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        // A rollout status or a deletion that waits longer than this is a failure in itself.
        let output = output_within(&mut command, Duration::from_secs(300), "kubectl")?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(format!(
                "kubectl {} failed ({}):\n{stdout}\n{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(stdout)
    }
}
