//! A provider of secrets kept outside Kubernetes, on the real apiserver: the shipped example
//! helper (config/examples/exec-helper.sh) over a directory standing in for a vault, served by
//! the driver running as its ServiceAccount with real tmpfs mounts. Access is RBAC, asked as for
//! shares: granted, the pod reads the files its own identity picks; not granted, PERMISSION_DENIED
//! naming the provider; the grant deleted, the volume is emptied through the driver's watches.

pub mod lazy;
pub mod secrets_store;

use std::path::{Path, PathBuf};

use inline_guard_proto::csi::v1::node_client::NodeClient;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use sharedresource_csi_driver::content::external::provider::{ProviderConfig, check_providers};
use sharedresource_csi_driver::content::external::providers::Providers;
use tonic::Code;

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::shares::{InProcessDriver, create_object, files, unpublish_as_kubelet, use_grant, wait_for_view};
use crate::support::{
    Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_namespace, create_service_account, pods_path,
};

const NAMESPACE: &str = "providers-e2e";

/// The node's providers when `config` (one entry of `driver.yaml`'s `providers:`) is the only
/// one, at most 4 helpers at once. An `exec` provider's helper runs as root (`runAsUser: 0`):
/// the suite's helpers and vaults live in the run's private directory, which the default user,
/// `nobody`, cannot enter. That default is proven by `helper_run`'s unit test (the user, groups,
/// capabilities and `no_new_privs` a helper runs with) and by the deploy scenario, whose
/// DaemonSet runs the shipped example helper as `nobody`.
pub fn one_provider(mut config: Value) -> Result<Providers, String> {
    if config["kind"] == "exec" {
        config["runAsUser"] = 0.into();
        config["runAsGroup"] = 0.into();
    }
    let configured: ProviderConfig = serde_json::from_value(config).map_err(|e| e.to_string())?;
    Ok(Providers::new(check_providers(&[configured])?, 4))
}

/// The shipped example helper, reading `root` instead of its own ROOT.
fn example_helper(dir: &Path, root: &Path) -> Result<PathBuf, String> {
    let example = std::fs::read_to_string(inline_guard_tests::repo_root().join("config/examples/exec-helper.sh"))
        .map_err(|e| e.to_string())?;
    let helper = example.replace("ROOT=/var/lib/inline-guard/example-vault", &format!("ROOT={}", root.display()));
    if helper == example {
        return Err("the example helper no longer names its ROOT".into());
    }
    let path = dir.join("exec-helper.sh");
    std::fs::write(&path, helper).map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    Ok(path)
}

/// The shipped example helper reading `root`, wrapped to log each call's first two arguments
/// (`mount TARGET`, `get PATH`) to `dir/calls` and its seccomp mode (`/proc/self/status`'s
/// `Seccomp:` line, 2 behind a filter) to `dir/confinement`: the wrapper's path.
pub fn logging_example_helper(dir: &Path, root: &Path) -> Result<PathBuf, String> {
    let example = example_helper(dir, root)?;
    let wrapper = dir.join("logging-helper");
    let script = format!(
        "#!/bin/sh\necho \"$1 $2\" >> {}\ngrep '^Seccomp:' /proc/self/status > {}\nexec {} \"$@\"\n",
        dir.join("calls").display(),
        dir.join("confinement").display(),
        example.display()
    );
    std::fs::write(&wrapper, script).map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    Ok(wrapper)
}

/// The seccomp line [`logging_example_helper`] wrote in `dir` at its last call.
pub fn helper_confinement(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("confinement")).unwrap_or_default().trim().to_string()
}

/// The calls [`logging_example_helper`] logged in `dir` so far.
pub fn helper_calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls")).unwrap_or_default().lines().map(String::from).collect()
}

/// A pod of `service_account` with volume `vault` of provider `provider`.
pub fn pod_of_provider(provider: &str, name: &str, service_account: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "serviceAccountName": service_account,
            "containers": [{"name": "app", "image": "registry.invalid/app:1", "volumeMounts": [{"name": "vault", "mountPath": "/vault"}]}],
            "volumes": [{"name": "vault", "csi": {"driver": SHARED_RESOURCE_DRIVER, "readOnly": true, "volumeAttributes": {"provider": provider}}}]
        }
    })
}

fn provider_pod(name: &str, service_account: &str) -> Value {
    pod_of_provider("example", name, service_account)
}

/// The scene of a provider scenario: namespace `namespace` with service accounts `reader`
/// (granted `use` of provider `provider`) and `stranger` (not), and the pods `web` of `reader`
/// and `intruder` of `stranger` made by `pod(name, service_account)`, as the apiserver stored them.
pub async fn provider_scene(
    suite: &Suite,
    namespace: &str,
    provider: &str,
    pod: fn(&str, &str) -> Value,
) -> Result<Vec<Pod>, String> {
    let admin = &suite.admin;
    crate::shares::apply_file(suite, "config/deploy/driver/rbac.yaml").await?;
    create_namespace(admin, namespace, "none", &[]).await?;
    for account in ["reader", "stranger"] {
        create_service_account(admin, namespace, account).await?;
    }
    let names = (format!("use-{provider}"), format!("reader-uses-{provider}"));
    let (role, binding) = use_grant(namespace, "providers", provider, (&names.0, &names.1));
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"), role).await?;
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"), binding)
        .await?;
    let mut stored = Vec::new();
    for (name, account) in [("web", "reader"), ("intruder", "stranger")] {
        let answer = create(admin, &pods_path(namespace), &pod(name, account), false).await?;
        if answer.status != 201 {
            return Err(format!("creating pod {name}: {} {}", answer.status, answer.message()));
        }
        stored.push(serde_json::from_value::<Pod>(answer.body).map_err(|e| e.to_string())?);
    }
    Ok(stored)
}

/// Publishes volume `volume` of `pod`, whose service account `stranger` may not use
/// `provider`, as kubelet would: PERMISSION_DENIED with the driver's exact message, and nothing
/// left at the target.
pub async fn refused_use(
    node: &mut NodeClient<tonic::transport::Channel>,
    driver: &InProcessDriver,
    pod: &Pod,
    volume: &str,
    provider: &str,
) -> Outcome {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let target = driver.dir.path().join(format!("pods/{name}/volumes/kubernetes.io~csi/{volume}/mount"));
    let denied = node
        .node_publish_volume(kubelet_request(pod, volume, &target)?)
        .await
        .err()
        .ok_or("a pod whose service account may not use the provider was published")?;
    let message = format!(
        "service account {namespace}/stranger may not use provider \"{provider}\": grant it the verb \"use\" on providers.sharedresource.inlineguard.dev \"{provider}\" (a Role and RoleBinding in namespace {namespace})"
    );
    if denied.code() != Code::PermissionDenied || denied.message() != message {
        return Err(format!("expected PERMISSION_DENIED {message:?}, got {denied:?}"));
    }
    if target.exists() {
        return Err("a refused publish left its target".into());
    }
    Ok(())
}

/// Unpublishes `request`'s volume as kubelet would, and sees its target gone.
pub async fn unpublished(
    node: &mut NodeClient<tonic::transport::Channel>,
    request: &inline_guard_proto::csi::v1::NodePublishVolumeRequest,
    target: &Path,
) -> Outcome {
    unpublish_as_kubelet(node, request.volume_id.clone(), request.target_path.clone()).await?;
    if target.exists() {
        return Err("the unpublished target is still there".into());
    }
    Ok(())
}

/// The files under the volume's `secrets` directory, as a container would read them.
fn secrets(target: &Path) -> Vec<(String, String)> {
    files(&target.join("secrets"))
}

pub async fn an_exec_provider_serves_the_pods_own_files_to_whom_rbac_grants_use(suite: &Suite) -> Outcome {
    let stored = provider_scene(suite, NAMESPACE, "example", provider_pod).await?;
    let vault = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = vault.path().join("root");
    for (pod, content) in [("web", "s3cret-of-web"), ("intruder", "s3cret-of-intruder")] {
        std::fs::create_dir_all(root.join(NAMESPACE).join(pod)).map_err(|e| e.to_string())?;
        std::fs::write(root.join(NAMESPACE).join(pod).join("db-password"), content).map_err(|e| e.to_string())?;
    }
    let helper = example_helper(vault.path(), &root)?;
    let providers = one_provider(json!({"name": "example", "kind": "exec", "helper": helper}))?;
    let driver = InProcessDriver::start_with(suite, providers).await?;
    let mut node = NodeClient::new(channel(driver.socket.clone()).await?);

    let result = async {
        let target = driver.dir.path().join("pods/web/volumes/kubernetes.io~csi/vault/mount");
        let request = kubelet_request(&stored[0], "vault", &target)?;
        publish_as_kubelet(&mut node, &request)
            .await
            .map_err(|e| format!("publish allowed by the RoleBinding: {e}"))?;
        let expected = vec![("db-password".to_string(), "s3cret-of-web".to_string())];
        wait_for_view(&target, "published", secrets, &expected, |files| format!("{files:?}")).await?;

        // No grant: PERMISSION_DENIED naming the provider, and nothing left behind.
        refused_use(&mut node, &driver, &stored[1], "vault", "example").await?;

        // The grant deleted: the driver's watch of bindings empties the volume (its periodic
        // refresh is an hour away).
        Api::<RoleBinding>::namespaced(suite.admin.clone(), NAMESPACE)
            .delete("reader-uses-example", &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let took = wait_for_view(&target, "revoked", secrets, &Vec::new(), |files| format!("{files:?}")).await?;
        println!("provider use revoked: the volume was emptied after {took:?}");
        unpublished(&mut node, &request, &target).await
    }
    .await;
    // The scenario's failure first; a driver failure or a leftover mount otherwise.
    result.and(driver.stop().await)
}
