//! The control plane as upstream's version skew policy allows it: the kube-controller-manager
//! the suite runs beside an apiserver is of that apiserver's release, never newer (on the oldest
//! minor, 1.33's, built from `tests/peers/oldest`). Read from the binary the cluster started and
//! from the apiserver's own `/version`.

use crate::support::{Outcome, Suite};

pub async fn the_controller_manager_is_of_the_apiservers_release(s: &Suite) -> Outcome {
    let binary = &s.peers.kube_controller_manager;
    let output = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| format!("{} --version: {e}", binary.display()))?;
    // `Kubernetes v1.33.5`
    let reported = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let served = s.admin.apiserver_version().await.map_err(|e| format!("the apiserver's /version: {e}"))?;
    println!("version skew: kube-controller-manager says {reported:?}, the apiserver {:?}", served.git_version);
    if reported.strip_prefix("Kubernetes ") != Some(served.git_version.as_str()) {
        return Err(format!(
            "the controller-manager ({reported:?}, {}) is not of the apiserver's release ({})",
            binary.display(),
            served.git_version
        ));
    }
    Ok(())
}
