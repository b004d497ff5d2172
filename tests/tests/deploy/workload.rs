//! What a platform team and a namespace owner do once inline-guard is installed: share a Secret,
//! grant its use to a namespace's service account, and run a pod that reads it; and how the
//! scenario reads what that pod sees.

use std::path::Path;
use std::time::Duration;

use inline_guard_tests::cluster::{ChildProcess, namespace_defaults};
use inline_guard_tests::node::Node;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

/// The namespace the shared Secret lives in.
pub const OWNER: &str = "deploy-owner";
/// The namespace whose service account `reader` may use the share.
pub const CONSUMER: &str = "deploy-consumer";
/// The SharedSecret.
pub const SHARE: &str = "deploy-ca";
/// The driver.
pub const DRIVER: &str = "sharedresource.csi.inlineguard.dev";

/// The object the node's Secrets Store provider serves, and its content.
const PROVIDER_OBJECT_NAME: &str = "db-password";
pub const PROVIDER_OBJECT: &str = "from-the-provider";

/// Every second: the provider's object, and a write that must fail, with how it failed (the
/// subshell's error output is captured: the shell reports a failed redirection on the stderr it
/// had before that command's own redirections).
const PROVIDER_READER: &str = r#"while true; do echo "content: $(cat /store/db-password)"; if (echo x > /store/probe) 2>/tmp/error; then echo "write: succeeded"; else echo "write: $(cat /tmp/error)"; fi; sleep 1; done"#;

/// Every second: the share's file (empty when the volume is emptied), and a write that must fail,
/// with how it failed.
const READER: &str = r#"while true; do echo "content: $(cat /shared/ca.crt)"; if (echo x > /shared/probe) 2>/tmp/error; then echo "write: succeeded"; else echo "write: $(cat /tmp/error)"; fi; sleep 1; done"#;

/// How every write into a volume must fail: the mount is read-only. (Not merely "failed": the
/// reader runs as uid 1000 on a root-owned 0755 tmpfs, so a writable mount refuses it too, with
/// EACCES.)
const READ_ONLY_REFUSAL: &str = ": Read-only file system";

/// Server-side applies `object` as the admin.
pub async fn apply(admin: &kube::Client, object: Value) -> Result<(), String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let namespace = object["metadata"]["namespace"].as_str();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, kind));
    let api: Api<kube::core::DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(admin.clone(), namespace, &resource),
        None => Api::all_with(admin.clone(), &resource),
    };
    api.patch(&name, &PatchParams::apply("inline-guard-deploy").force(), &Patch::Apply(&object))
        .await
        .map(drop)
        .map_err(|e| format!("applying {kind} {name}: {e}"))
}

/// The namespaces (with their default ServiceAccount), the service account `reader`, the Secret
/// holding `content`, the SharedSecret, and a Role + RoleBinding granting `use` of it.
pub async fn share_and_grant(admin: &kube::Client, content: &str) -> Result<(), String> {
    for namespace in [OWNER, CONSUMER] {
        apply(admin, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})).await?;
        namespace_defaults(admin, namespace, Duration::from_secs(60)).await?;
    }
    apply(
        admin,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": CONSUMER}}),
    )
    .await?;
    set_content(admin, content).await?;
    make_share(admin).await?;
    apply(
        admin,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-ca", "namespace": CONSUMER},
            "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "resourceNames": [SHARE], "verbs": ["use"]}]
        }),
    )
    .await?;
    grant(admin).await
}

/// The RoleBinding that lets `reader` use the share.
pub async fn grant(admin: &kube::Client) -> Result<(), String> {
    bind_reader(admin, "reader-uses-ca", "use-ca").await
}

/// RoleBinding `name` of `reader` to Role `role`, in the consumer's namespace.
async fn bind_reader(admin: &kube::Client, name: &str, role: &str) -> Result<(), String> {
    apply(
        admin,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": CONSUMER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": CONSUMER}]
        }),
    )
    .await
}

/// Deletes the SharedSecret (its Secret stays): the volume must be emptied.
pub async fn delete_share(admin: &kube::Client) -> Result<(), String> {
    let resource = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "sharedresource.inlineguard.dev",
        "v1alpha1",
        "SharedSecret",
    ));
    Api::<kube::core::DynamicObject>::all_with(admin.clone(), &resource)
        .delete(SHARE, &DeleteParams::default())
        .await
        .map(drop)
        .map_err(|e| format!("deleting the SharedSecret: {e}"))
}

/// Makes the SharedSecret again.
pub async fn make_share(admin: &kube::Client) -> Result<(), String> {
    apply(
        admin,
        json!({
            "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": SHARE},
            "spec": {"secretRef": {"namespace": OWNER, "name": SHARE}}
        }),
    )
    .await
}

/// Deletes the RoleBinding: the volume must be emptied.
pub async fn revoke(admin: &kube::Client) -> Result<(), String> {
    Api::<RoleBinding>::namespaced(admin.clone(), CONSUMER)
        .delete("reader-uses-ca", &DeleteParams::default())
        .await
        .map(drop)
        .map_err(|e| format!("deleting the RoleBinding: {e}"))
}

/// Sets the shared Secret's `ca.crt`.
pub async fn set_content(admin: &kube::Client, content: &str) -> Result<(), String> {
    apply(
        admin,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SHARE, "namespace": OWNER}, "stringData": {"ca.crt": content}}),
    )
    .await
}

/// A pod reading the share, as a namespace owner writes it: no node named (the scheduler places
/// it), no `readOnly` (the mutating webhook adds it), restricted-compliant.
pub fn share_reader(name: &str) -> Value {
    let csi = json!({"driver": DRIVER, "volumeAttributes": {"sharedSecret": SHARE}});
    inline_guard_tests::node::reader_pod(name, READER, csi, "/shared")
}

/// Waits until `pod`'s reader has printed `content: WANTED` after its first `after` lines, and a
/// write attempt after it; returns the number of lines it had then. Every write it ever tried
/// must have failed as read-only (EROFS).
pub async fn wait_for_content(node: &Node, pod: &str, wanted: &str, after: usize) -> Result<usize, String> {
    let line = format!("content: {wanted}");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let log = node.container_log(CONSUMER, pod, "reader");
        if let Some(write) = log.iter().find(|l| l.starts_with("write: ") && !l.ends_with(READ_ONLY_REFUSAL)) {
            return Err(format!("{CONSUMER}/{pod}: a write into its volume did not fail as read-only: {write:?}"));
        }
        let found = log.iter().skip(after).position(|l| *l == line);
        if found.is_some_and(|at| log.iter().skip(after + at).any(|l| l.starts_with("write: "))) {
            println!("deploy: {CONSUMER}/{pod} printed {line:?} after line {after} (of {})", log.len());
            return Ok(log.len());
        }
        if std::time::Instant::now() > deadline {
            let tail: Vec<_> = log.iter().rev().take(5).collect();
            return Err(format!(
                "{CONSUMER}/{pod} never printed {line:?} after line {after} in 90 s; last lines {tail:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Starts the suite's Secrets Store provider on `dir/providers/e2e.sock`, serving
/// [`PROVIDER_OBJECT`] as its one object.
pub fn start_provider(program: &Path, dir: &Path) -> Result<ChildProcess, String> {
    let (providers, objects) = (dir.join("providers"), dir.join("provider-objects"));
    for made in [&providers, &objects] {
        std::fs::create_dir_all(made).map_err(|e| format!("{}: {e}", made.display()))?;
    }
    std::fs::write(objects.join(PROVIDER_OBJECT_NAME), PROVIDER_OBJECT).map_err(|e| e.to_string())?;
    let arguments = [
        format!("--socket={}", providers.join("e2e.sock").display()),
        format!("--objects={}", objects.display()),
        format!("--log={}", dir.join("provider-mounts.log").display()),
    ];
    ChildProcess::spawn("e2e-provider", program, &arguments, &[], dir)
}

/// A Role and RoleBinding that let `reader` use `provider`.
pub async fn grant_provider(admin: &kube::Client, provider: &str) -> Result<(), String> {
    let role = format!("use-{provider}");
    apply(
        admin,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": role, "namespace": CONSUMER},
            "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["providers"], "resourceNames": [provider], "verbs": ["use"]}]
        }),
    )
    .await?;
    bind_reader(admin, &format!("reader-uses-{provider}"), &role).await
}

/// A pod reading the provider's object, written like [`share_reader`]'s (no `readOnly`, no node).
pub fn provider_reader(name: &str) -> Value {
    let objects = format!("array:\n  - |\n    objectName: {PROVIDER_OBJECT_NAME}\n");
    let csi = json!({"driver": DRIVER, "volumeAttributes": {"provider": "e2e", "objects": objects}});
    inline_guard_tests::node::reader_pod(name, PROVIDER_READER, csi, "/store")
}
