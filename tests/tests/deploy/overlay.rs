//! The suite's overlay of the shipped manifests (`config/deploy` and `config/deploy/driver`),
//! changing only what this node makes differ from a production one, each change with its reason
//! written into the overlay itself; and the serving certificate, from
//! `csi-volume-admission certificate` (no cert-manager runs here).

use std::path::Path;

/// What the overlay points the manifests at.
pub struct Overlay<'a> {
    /// kubelet's `--root-dir`.
    pub kubelet_root: &'a Path,
    /// Where the driver keeps its records on the host.
    pub state_dir: &'a Path,
    /// The host's directory of Secrets Store CSI provider sockets.
    pub providers_dir: &'a Path,
    /// The apiserver's address on the pod network (`HOST:PORT`).
    pub apiserver: (&'a str, u16),
    /// The host directory the example helper serves from (its stand-in for a vault).
    pub example_vault: &'a Path,
    /// A tag for every image other than the shipped one (an upgrade).
    pub image_tag: Option<&'a str>,
    /// The source tree whose `config/deploy` is installed: this checkout, or a release's own
    /// (`images::previous_release_manifests`).
    pub manifests: &'a Path,
}

/// The shipped values the overlay replaces; `test` operations check them first, so a change to
/// the shipped DaemonSet fails the patch instead of being silently overwritten.
const KUBELET: &str = "/var/lib/kubelet";
const STATE: &str = "/var/lib/inline-guard/sharedresource";
const SOCKET_DIR: &str = "plugins/sharedresource.csi.inlineguard.dev";
const PROVIDERS: &str = "/var/run/secrets-store-csi-providers";
/// The DaemonSet's volume (and volumeMount) of the providers' directory.
const PROVIDERS_INDEX: usize = 5;
/// The provider the scenario runs on the node, as an operator names one in `driver.yaml`: its
/// socket is the default, `PROVIDERS/e2e.sock`, inside the driver's container.
/// And the example `exec` provider in mode lazy, its helper installed by the example-providers
/// Component (a fetched file served for 1 s before the helper is asked again, so a change in
/// its vault shows within seconds).
pub const PROVIDER_CONFIG: &str = "providers:\n- {name: e2e, kind: secrets-store, timeout: 10s}\n\
    - {name: example, kind: exec, helper: /usr/libexec/inline-guard/exec-helper.sh, mode: lazy, cacheTTL: 1s}\n";
/// The example-providers Component, and the host directory it mounts for the example helper.
const EXAMPLE_PROVIDERS: &str = "config/deploy/driver/example-providers";
const EXAMPLE_VAULT: &str = "/var/lib/inline-guard/example-vault";
/// The opt-in files of `config/deploy/driver` the overlay takes: restarting labelled workloads
/// when a share they mount changes, and the startup taint.
const OPT_INS: [&str; 2] = ["rollout-on-change.yaml", "startup-taint.yaml"];

/// Writes `dir/kustomization.yaml`; the certificate Component must be in `dir/tls`.
pub fn write(dir: &Path, overlay: &Overlay) -> Result<(), String> {
    let root = overlay.kubelet_root.display().to_string();
    let state = overlay.state_dir.display().to_string();
    let (host, port) = overlay.apiserver;
    // The DaemonSet's paths, in the order of its volumeMounts and volumes (pods, socket,
    // registry, state).
    let paths = [
        (format!("{KUBELET}/pods"), format!("{root}/pods")),
        (format!("{KUBELET}/{SOCKET_DIR}"), format!("{root}/{SOCKET_DIR}")),
        (format!("{KUBELET}/plugins_registry"), format!("{root}/plugins_registry")),
        (STATE.to_string(), state.clone()),
    ];
    let mut operations = vec![
        json_op(
            "test",
            "/spec/template/spec/containers/0/args/0",
            &format!("--endpoint=unix://{KUBELET}/{SOCKET_DIR}/csi.sock"),
        ),
        json_op(
            "replace",
            "/spec/template/spec/containers/0/args/0",
            &format!("--endpoint=unix://{root}/{SOCKET_DIR}/csi.sock"),
        ),
    ];
    for (index, (shipped, here)) in paths.iter().enumerate() {
        for field in [format!("containers/0/volumeMounts/{index}/mountPath"), format!("volumes/{index}/hostPath/path")]
        {
            let path = format!("/spec/template/spec/{field}");
            operations.push(json_op("test", &path, shipped));
            operations.push(json_op("replace", &path, here));
        }
    }
    // The providers' directory: the container's path stays (the driver dials the default
    // socket there), the host's moves to the run's directory.
    let providers = format!("/spec/template/spec/containers/0/volumeMounts/{PROVIDERS_INDEX}/mountPath");
    operations.push(json_op("test", &providers, PROVIDERS));
    let providers = format!("/spec/template/spec/volumes/{PROVIDERS_INDEX}/hostPath/path");
    operations.push(json_op("test", &providers, PROVIDERS));
    operations.push(json_op("replace", &providers, &overlay.providers_dir.display().to_string()));
    let shipped = shipped_config(overlay.manifests, &root, &state)?;
    if shipped.contains("startupTaint") {
        return Err("the shipped driver.yaml now sets startupTaint: the overlay must follow it".into());
    }
    let config = shipped + "startupTaint: true\n" + PROVIDER_CONFIG;
    let environment = |kind: &str, namespace: &str, name: &str, container: &str| {
        format!(
            "  - patch: |\n      apiVersion: apps/v1\n      kind: {kind}\n      metadata: {{name: {name}, namespace: {namespace}}}\n      spec:\n        template:\n          spec:\n            containers:\n              - name: {container}\n                env:\n                  - {{name: KUBERNETES_SERVICE_HOST, value: \"{host}\"}}\n                  - {{name: KUBERNETES_SERVICE_PORT, value: \"{port}\"}}\n"
        )
    };
    let images = match overlay.image_tag {
        Some(tag) => inline_guard_tests::images::IMAGE_NAMES.iter().fold("images:\n".to_string(), |text, name| {
            text + &format!("  - name: ghcr.io/inline-guard/{name}\n    newTag: {tag}\n")
        }),
        None => String::new(),
    };
    // The Component's vault, by volume name (the Component's volumes come after the
    // DaemonSet's, in an order kustomize chooses); the shipped path checked here instead.
    let component = std::fs::read_to_string(overlay.manifests.join(EXAMPLE_PROVIDERS).join("kustomization.yaml"))
        .map_err(|e| format!("{EXAMPLE_PROVIDERS}: {e}"))?;
    if !component.contains(&format!("path: {EXAMPLE_VAULT}\n")) {
        return Err(format!("{EXAMPLE_PROVIDERS} no longer mounts {EXAMPLE_VAULT}: the overlay must follow it"));
    }
    let vault = format!(
        "  - patch: |\n      apiVersion: apps/v1\n      kind: DaemonSet\n      metadata: {{name: sharedresource-csi-driver, namespace: inline-guard-driver}}\n      spec:\n        template:\n          spec:\n            volumes:\n              - {{name: example-vault, hostPath: {{path: {}, type: Directory}}}}\n",
        overlay.example_vault.display()
    );
    let mut text = String::from(
        "# The suite's overlay: the shipped manifests, changed only where this node differs.
# - kubelet's root directory: the suite's kubelet keeps it under the run's own directory, never
#   the machine's /var/lib/kubelet (a real node's kubelet may be using it), so the driver's host
#   paths follow it, and its records go to the run's directory as well; so do the host's
#   directory of Secrets Store provider sockets and the example helper's vault.
# - driver.yaml names the suite's Secrets Store provider (upstream's provider API) and the
#   example exec provider, as an operator configures them; the example-providers Component
#   installs the example's helper.
# - the apiserver's address: no kube-proxy runs here, so the `kubernetes` Service's ClusterIP,
#   which in-cluster clients dial, leads nowhere; they dial its endpoint instead.
# - the serving certificate: `csi-volume-admission certificate` (no cert-manager runs here).
# - opt-ins, as an operator takes them: rollout-on-change.yaml copied here, and the read-grants
#   controller given --rollout-on-change; startup-taint.yaml copied here, and `startupTaint: true`
#   in driver.yaml (this node's kubelet registers with the taint).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
",
    );
    // Kustomize takes no absolute path for a base: up to `/` from here, then down to it.
    let up = dir.components().filter(|c| matches!(c, std::path::Component::Normal(_))).count();
    let deploy = format!(
        "{}{}",
        "../".repeat(up),
        overlay.manifests.join("config/deploy").display().to_string().trim_start_matches('/')
    );
    // Opt-in files, copied beside the overlay: kustomize loads no file from outside its root.
    for opt_in in OPT_INS {
        let from = overlay.manifests.join("config/deploy/driver").join(opt_in);
        std::fs::copy(&from, dir.join(opt_in)).map_err(|e| format!("{}: {e}", from.display()))?;
    }
    text += &format!(
        "resources:\n  - {deploy}\n  - {deploy}/driver\n  - {}\ncomponents:\n  - tls\n  - {deploy}/driver/example-providers\n",
        OPT_INS.join("\n  - ")
    );
    text += &images;
    text += "patches:\n  - target: {kind: DaemonSet, name: sharedresource-csi-driver}\n    patch: |\n";
    for operation in &operations {
        text += &format!("      {operation}\n");
    }
    text += "  - target: {kind: Deployment, name: sharedresource-read-grants}\n    patch: |\n";
    text += "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: \"--rollout-on-change\"}\n";
    text += "  - target: {kind: ConfigMap, name: sharedresource-csi-driver}\n    patch: |\n";
    text += &format!(
        "      - op: replace\n        path: /data/driver.yaml\n        value: {}\n",
        serde_json::to_string(&config).map_err(|e| e.to_string())?
    );
    text += &vault;
    text += &environment("DaemonSet", "inline-guard-driver", "sharedresource-csi-driver", "driver");
    text += &environment("Deployment", "inline-guard-system", "csi-volume-admission", "webhook");
    text += &environment("Deployment", "inline-guard-driver", "sharedresource-read-grants", "controller");
    let path = dir.join("kustomization.yaml");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The shipped ConfigMap's `driver.yaml` with kubelet's root and the state directory moved: every
/// other setting stays as shipped.
fn shipped_config(manifests: &Path, root: &str, state: &str) -> Result<String, String> {
    let objects = inline_guard_tests::apply::objects(&manifests.join("config/deploy/driver/daemonset.yaml"))?;
    let shipped = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .and_then(|o| o["data"]["driver.yaml"].as_str())
        .ok_or("config/deploy/driver/daemonset.yaml has no ConfigMap with driver.yaml")?;
    for path in [KUBELET, STATE] {
        if !shipped.contains(path) {
            return Err(format!("the shipped driver.yaml no longer names {path}: the overlay must follow it"));
        }
    }
    Ok(shipped.replace(STATE, state).replace(KUBELET, root))
}

/// One JSON-patch operation as a YAML flow mapping (JSON is YAML).
fn json_op(op: &str, path: &str, value: &str) -> String {
    format!("- {}", serde_json::json!({"op": op, "path": path, "value": value}))
}

/// Writes the serving certificate's Component to `dir/tls`, as the README's no-cert-manager
/// path does.
pub fn write_certificate(dir: &Path) -> Result<String, String> {
    let out_dir = dir.join("tls");
    let args = ["csi-volume-admission", "certificate", "--out-dir", out_dir.to_str().ok_or("non-UTF-8 path")?];
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let code = csi_volume_admission::cli::run(args, &mut std::io::empty(), &mut stdout, &mut stderr);
    if code != 0 {
        return Err(format!("certificate exited {code}: {}", String::from_utf8_lossy(&stderr)));
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}
