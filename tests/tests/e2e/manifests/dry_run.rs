//! Everything in `config/` that is a Kubernetes object, checked by the apiserver itself with a
//! server-side dry-run apply: the deployment manifests, and the examples `check` reads.

use inline_guard_tests::apply::{Applied, apply, objects};
use inline_guard_tests::repo_root;

use inline_guard_policy::Labels;
use inline_guard_policy::namespace_policy::NamespacePolicy;
use inline_guard_policy::settings::Defaults;
use serde_json::Value;

use crate::support::{Outcome, Suite};

/// The example namespace whose Pod Security labels are invalid on purpose.
const INVALID_LABELS: &str = "invalid-labels";

/// Kinds that need an operator this control plane does not run; reported, not failed.
const NEEDS_OPERATOR: &[&str] = &["cert-manager.io/"];

/// The `.yaml` files of `dir`, in name order.
fn yaml_files(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

fn report(file: &str, applied: &[Applied]) -> Outcome {
    for outcome in applied {
        match outcome {
            Applied::Accepted(what) => println!("{file}: {what} accepted"),
            Applied::NotServed(what) if NEEDS_OPERATOR.iter().any(|group| what.contains(group)) => {
                println!("{file}: {what} NOT CHECKED: its CRDs come with cert-manager, which this control plane lacks")
            }
            Applied::NotServed(what) => return Err(format!("{file}: {what}: no such kind on this apiserver")),
        }
    }
    Ok(())
}

/// `config/deploy/*.yaml`: everything kustomization lists, plus the cert-manager certificate and
/// the PodMonitors.
pub async fn deploy_manifests_pass_dry_run(suite: &Suite) -> Outcome {
    // The PodMonitors' kind, as the Prometheus Operator defines it (generated from its API
    // types), so that they are checked against its schema rather than reported unserved.
    apply(&suite.admin, &objects(&suite.peers.pod_monitor_crd)?, false).await?;
    crate::support::wait_established(&suite.admin, "podmonitors.monitoring.coreos.com").await?;
    let mut files = yaml_files(&repo_root().join("config/deploy"))?;
    files.extend(yaml_files(&repo_root().join("config/deploy/driver"))?);
    for path in &files {
        let file = path.strip_prefix(repo_root()).unwrap_or(path).display().to_string();
        let applied = apply(&suite.admin, &objects(path)?, true).await?;
        report(&file, &applied)?;
    }
    Ok(())
}

/// `config/examples/`: the cluster state is created for real (so the manifests' namespaces
/// exist), then every example manifest passes a dry-run.
///
/// One example object cannot exist in a cluster that runs Pod Security Admission: the namespace
/// with invalid Pod Security labels (such labels survive only from before PSA was enabled). The
/// apiserver must refuse it, and its reasons must read exactly as CSIVolumeAdmission's own
/// `namespace-label-errors`, which copy PSA's wording.
pub async fn examples_pass_dry_run(suite: &Suite) -> Outcome {
    let examples = repo_root().join("config/examples");
    let (refused, state): (Vec<Value>, Vec<Value>) = objects(&examples.join("cluster-state.yaml"))?
        .into_iter()
        .partition(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == INVALID_LABELS);
    report("config/examples/cluster-state.yaml", &apply(&suite.admin, &state, false).await?)?;
    let Some(namespace) = refused.first() else {
        return Err(format!("config/examples/cluster-state.yaml no longer has the {INVALID_LABELS} namespace"));
    };
    let refusal = match apply(&suite.admin, &refused, true).await {
        Ok(_) => return Err(format!("the apiserver accepted namespace {INVALID_LABELS}")),
        Err(error) => error,
    };
    let labels: Labels = serde_json::from_value(namespace["metadata"]["labels"].clone()).map_err(|e| e.to_string())?;
    let (_, ours) = NamespacePolicy::from_labels(&labels, &Defaults::default());
    if ours.is_empty() {
        return Err(format!(
            "namespace {INVALID_LABELS} no longer has an invalid label: the comparison proves nothing"
        ));
    }
    for error in &ours {
        if !refusal.contains(&error.to_string()) {
            return Err(format!("PSA's refusal does not contain our label error {error}:\n{refusal}"));
        }
    }
    println!(
        "config/examples/cluster-state.yaml: Namespace {INVALID_LABELS} refused by Pod Security Admission, in our words: {} errors",
        ours.len()
    );

    for path in &yaml_files(&examples.join("manifests"))? {
        let file = path.strip_prefix(repo_root()).unwrap_or(path).display().to_string();
        // AdmissionReviews are requests for `check`, not objects an apiserver stores; objects in
        // the refused namespace have nowhere to go.
        let (stored, homeless): (Vec<_>, Vec<_>) = objects(path)?
            .into_iter()
            .filter(|o| o["kind"] != "AdmissionReview")
            .partition(|o| o["metadata"]["namespace"] != INVALID_LABELS);
        for object in homeless {
            println!(
                "{file}: {} {} not checked: its namespace {INVALID_LABELS} cannot exist here",
                object["kind"], object["metadata"]["name"]
            );
        }
        let applied = apply(&suite.admin, &stored, true).await?;
        report(&file, &applied)?;
    }
    Ok(())
}
