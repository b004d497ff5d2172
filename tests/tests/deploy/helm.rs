//! Installed with Helm, as users of our peers install: the chart's last release (its package in
//! `tests/fixtures/charts/`) installed with the real `helm` on the same node and control plane
//! once the kustomize install is gone, its values changing only what this node makes differ
//! (the values file says which); a pod reads a share through it; `helm upgrade` to this
//! checkout's chart (`config/helm/inline-guard`) with new image tags rolls the driver while the
//! pod reads on; `helm uninstall` leaves nothing but the CRDs it keeps by default, and nothing
//! once they are deleted as NOTES says.

use std::path::Path;
use std::time::{Duration, Instant};

use inline_guard_tests::chart::{chart_dir, chart_metadata, helm, last_release};
use inline_guard_tests::cluster::POD_NETWORK_GATEWAY;
use inline_guard_tests::node::delete_and_wait;
use serde_json::{Value, json};

use super::workload::{self, CONSUMER, wait_for_content};
use super::{DRIVER_NAMESPACE, Installation, Outcome, path};

const RELEASE: &str = "inline-guard";
/// Where Helm keeps the release's record (the chart's objects name their own namespaces).
const RELEASE_NAMESPACE: &str = "default";
const CRDS: [&str; 4] = [
    "sharedsecrets.sharedresource.inlineguard.dev",
    "sharedconfigmaps.sharedresource.inlineguard.dev",
    "sharedprojections.sharedresource.inlineguard.dev",
    "sharedresourcenodes.sharedresource.inlineguard.dev",
];

/// The whole Helm path: the last release's chart installed at the last release's images
/// (`released`: its `config/` extracted there, its images imported already), upgraded to this
/// chart and this build's images tagged `upgraded`.
pub async fn installed_upgraded_and_removed(this: &Installation, released: &Path, upgraded: &str) -> Outcome {
    let helm_binary = inline_guard_tests::peers::peers()?.helm;
    let kubeconfig = this.cluster.kubeconfig().to_path_buf();
    let run = |args: Vec<String>| {
        let (binary, kubeconfig) = (helm_binary.clone(), kubeconfig.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                helm(&binary, Some(&kubeconfig), &args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .await
            .map_err(|e| e.to_string())?
        }
    };
    let values = this.dir.join("helm-values.json");
    std::fs::write(&values, serde_json::to_string_pretty(&node_values(this)?).map_err(|e| e.to_string())?)
        .map_err(|e| format!("{}: {e}", values.display()))?;
    let (previous, chart) = (path(&last_release()?), path(&chart_dir()));
    // The package is the release's own chart, as a chart repository would serve it.
    let (tag, _) = inline_guard_tests::images::PREVIOUS_RELEASE;
    let released_chart = released.join("config/helm/inline-guard/Chart.yaml");
    let text = std::fs::read_to_string(&released_chart).map_err(|e| format!("{}: {e}", released_chart.display()))?;
    let released_version = chart_metadata(&text)?["version"].as_str().unwrap_or_default().to_string();
    if !previous.ends_with(&format!("/inline-guard-{released_version}.tgz")) {
        return Err(format!(
            "tests/fixtures/charts/ holds {previous}, not {tag}'s chart (version {released_version}): \
             package {tag}'s config/helm/inline-guard there"
        ));
    }
    let common = |verb: &str, chart: &str, tag: &str| -> Vec<String> {
        let args = [verb, RELEASE, chart, "--namespace", RELEASE_NAMESPACE, "-f", &path(&values)].map(String::from);
        // The images this run built: a release installs its own tag, which this node has not.
        [&args[..], &[format!("--set=driver.image.tag={tag}"), format!("--set=admission.image.tag={tag}")]].concat()
    };

    // The last release installed; the webhook's serving certificate is the Secret
    // `csi-volume-admission certificate` wrote (made once the chart has made its namespace), its
    // CA in the values.
    let started = Instant::now();
    let installed = run(common("install", &previous, tag)).await?;
    if !installed.contains("STATUS: deployed")
        || !installed.contains("rollout status daemonset/sharedresource-csi-driver")
    {
        return Err(format!("helm install said neither deployed nor how to check: {installed}"));
    }
    this.kubectl.run(&["apply", "-f", &path(&this.dir.join("overlay/tls/secret.yaml"))]).await?;
    this.wait_rolled_out().await?;
    this.wait_registered().await?;
    let image = this.driver_image().await?;
    if !image.ends_with(&format!(":{tag}")) {
        return Err(format!("after helm install of {tag}'s chart the driver runs {image}, not {tag}'s image"));
    }
    println!("deploy: helm install of {tag} to driver, webhook and read-grants Ready in {:?}", started.elapsed());
    let manifest =
        run(vec!["get".into(), "manifest".into(), RELEASE.into(), "-n".into(), RELEASE_NAMESPACE.into()]).await?;
    let objects = identities(&manifest)?;

    // A pod reads a share through it (patched read-only by the chart's webhook on the way).
    workload::make_share(&this.admin).await?;
    workload::set_content(&this.admin, "helm-first").await?;
    let pod = this.create_reader("helm-reader").await?;
    let mut seen = wait_for_content(&this.node, "helm-reader", "helm-first", 0).await?;

    // Upgraded to this checkout's chart: new image tags, and a value changed; the DaemonSet
    // rolls, the pod reads on.
    let before = this.driver_pod().await?;
    let mut upgrade = common("upgrade", &chart, upgraded);
    upgrade.push("--set=driver.refreshSeconds=30".to_string());
    let upgraded_said = run(upgrade).await?;
    if !upgraded_said.contains("REVISION: 2") {
        return Err(format!("helm upgrade did not make revision 2: {upgraded_said}"));
    }
    let history = run(["history", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json"].map(String::from).to_vec()).await?;
    let charts = charts_of(&history)?;
    let mut expected = Vec::new();
    for chart in [&previous, &chart] {
        expected.push(chart_name(chart, &run(["show", "chart", chart].map(String::from).to_vec()).await?)?);
    }
    if charts != expected {
        return Err(format!(
            "helm history lists the charts {charts:?}, not the last release then this one, {expected:?}"
        ));
    }
    this.wait_rolled_out().await?;
    this.wait_for_new_driver_pod(&before).await?;
    let image = this.driver_image().await?;
    if !image.ends_with(&format!(":{upgraded}")) {
        return Err(format!("after helm upgrade the driver runs {image}, not the {upgraded} image"));
    }
    let config = this
        .kubectl
        .run(&["get", "configmap", "sharedresource-csi-driver", "-n", DRIVER_NAMESPACE, "-o", "yaml"])
        .await?;
    if !config.contains("refreshSeconds: 30") {
        return Err(format!("helm upgrade did not change driver.yaml's refreshSeconds:\n{config}"));
    }
    seen = wait_for_content(&this.node, "helm-reader", "helm-first", seen).await?;
    workload::set_content(&this.admin, "helm-second").await?;
    wait_for_content(&this.node, "helm-reader", "helm-second", seen).await?;
    println!(
        "deploy: helm upgrade from {} to {} and {image}; the pod read on and saw the next change",
        expected[0], expected[1]
    );

    // Removed: the workload first, then the release.
    this.node.volume_present(&pod)?;
    delete_and_wait(&this.admin, CONSUMER, "helm-reader").await?;
    this.node.nothing_left(&pod)?;
    this.only_the_sockets_while_installed()?;
    this.grant_present().await?;
    let uninstall = ["uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout", "240s"];
    let said = run(uninstall.map(String::from).to_vec()).await?;
    if !said.contains("kept due to the resource policy") {
        return Err(format!("helm uninstall did not say it kept the CRDs: {said}"));
    }
    let removed = this.wait_gone(&objects, &CRDS).await?;
    // Kept, and the share with them (what keeping is for).
    for crd in CRDS {
        this.kubectl.run(&["get", "crd", crd]).await.map_err(|e| format!("{crd} was not kept: {e}"))?;
    }
    this.kubectl.run(&["get", "sharedsecrets", workload::SHARE]).await.map_err(|e| format!("the share went: {e}"))?;
    let mut delete = vec!["delete", "crd", "--wait=true", "--timeout=120s"];
    delete.extend(CRDS);
    this.kubectl.run(&delete).await?;
    this.node_left_clean("helm uninstall").await?;
    this.grants_gone("helm uninstall").await?;
    println!(
        "deploy: helm uninstall removed {removed} objects and kept the {} CRDs; deleting them left nothing",
        CRDS.len()
    );
    Ok(())
}

/// The values for this node, each with the reason it differs from the chart's default.
fn node_values(this: &Installation) -> Result<Value, String> {
    let port = this.cluster.url().rsplit(':').next().ok_or("the apiserver's port")?.to_string();
    // No kube-proxy runs here: in-cluster clients dial the kubernetes Service's endpoint.
    let environment = json!([
        {"name": "KUBERNETES_SERVICE_HOST", "value": POD_NETWORK_GATEWAY},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]);
    // The CA `csi-volume-admission certificate` wrote beside the Secret (its ca.crt).
    let secret = inline_guard_tests::apply::objects(&this.dir.join("overlay/tls/secret.yaml"))?;
    let ca = secret.first().and_then(|s| s["data"]["ca.crt"].as_str()).ok_or("no ca.crt in the tls Secret")?;
    Ok(json!({
        "admission": {"caBundle": ca, "extraEnv": environment},
        "driver": {
            // The suite's kubelet keeps its root, and so the driver its records and the
            // providers' sockets, under the run's directory.
            "kubeletDir": path(&this.node.kubelet_dirs.root),
            "stateDir": path(&this.node.plugin.state),
            "providersDir": path(&this.dir.join("providers")),
            "extraEnv": environment,
        },
        "readGrants": {"extraEnv": environment},
    }))
}

/// `helm history -o json`: the chart (`NAME-VERSION`) of each revision, oldest first.
fn charts_of(history: &str) -> Result<Vec<String>, String> {
    let revisions: Vec<Value> = serde_json::from_str(history).map_err(|e| format!("helm history: {e}: {history}"))?;
    Ok(revisions.iter().map(|revision| revision["chart"].as_str().unwrap_or_default().to_string()).collect())
}

/// `NAME-VERSION` of a chart (a directory or a package) from what `helm show chart` said of it.
fn chart_name(chart: &str, shown: &str) -> Result<String, String> {
    let metadata = chart_metadata(shown)?;
    let field = |name: &str| metadata[name].as_str().ok_or(format!("helm show chart {chart} names no {name}"));
    Ok(format!("{}-{}", field("name")?, field("version")?))
}

/// `kind namespace/name` of each object of a rendered manifest.
fn identities(manifest: &str) -> Result<Vec<(String, String, String)>, String> {
    let documents = inline_guard_config::read_documents(std::path::Path::new("helm get manifest"), manifest)
        .map_err(|e| e.to_string())?;
    let objects: Vec<(String, String, String)> = documents
        .into_iter()
        .map(|d| d.value)
        .filter(|v| !v.is_null())
        .map(|v| {
            let field = |value: &Value| value.as_str().unwrap_or_default().to_string();
            (field(&v["kind"]), field(&v["metadata"]["namespace"]), field(&v["metadata"]["name"]))
        })
        .collect();
    if objects.len() < 20 {
        return Err(format!("helm get manifest listed only {} objects", objects.len()));
    }
    Ok(objects)
}

impl Installation {
    /// Waits until every object of `objects` but those named in `kept` is gone; the number kept.
    async fn wait_gone(&self, objects: &[(String, String, String)], kept: &[&str]) -> Result<usize, String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut left = Vec::new();
            for (kind, namespace, name) in objects.iter().filter(|(_, _, name)| !kept.contains(&name.as_str())) {
                let mut args = vec!["get", kind.as_str(), name.as_str(), "--ignore-not-found", "-o", "name"];
                if !namespace.is_empty() {
                    args.extend(["-n", namespace.as_str()]);
                }
                if !self.kubectl.run(&args).await?.trim().is_empty() {
                    left.push(format!("{kind} {namespace}/{name}"));
                }
            }
            if left.is_empty() {
                return Ok(objects.len() - objects.iter().filter(|(_, _, n)| kept.contains(&n.as_str())).count());
            }
            if Instant::now() > deadline {
                return Err(format!("120 s after helm uninstall these are still there: {left:?}"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
