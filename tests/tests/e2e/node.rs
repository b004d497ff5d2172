//! The real node: kubelet and containerd running pods that read the driver's volumes, each
//! outcome observed from inside the container (what it wrote to its log) or as a client sees
//! the pod (its events). The content is the cluster's: SharedSecrets of a Secret in another
//! namespace, granted to the pod's service account by a RoleBinding, the driver running as its
//! ServiceAccount with the shipped RBAC.

pub mod fat_bindings;
pub mod lazy_provider;
pub mod projection;
pub mod secrets_store;

use std::time::{Duration, Instant};

use inline_guard_tests::node::Node;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::support::{
    Outcome, SHARED_RESOURCE_DRIVER, Suite, allowed, create, create_csi_driver, create_namespace,
    create_service_account, created_or_existing, denied_by, pods_path, violation,
};

pub fn node(suite: &Suite) -> Result<&Node, String> {
    suite.node.as_ref().map_err(|error| format!("the node did not start: {error}"))
}

/// Scenario 1: kubelet found the driver's registration socket, asked who it is, and registered it: the
/// CSINode object lists the driver with this node's id.
pub async fn kubelet_registers_the_driver(suite: &Suite) -> Outcome {
    let node = node(suite)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let drivers = node.csi_node_drivers(&suite.admin).await?;
        if drivers.contains(&(SHARED_RESOURCE_DRIVER.to_string(), node.name().to_string())) {
            println!("CSINode {}: {drivers:?}", node.name());
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("CSINode {} lists {drivers:?} after 30 s\n{}", node.name(), node.log_tails()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// kubelet acts as its node, and the Node authorizer holds it there: the audit log shows its
/// requests made as `system:node:NAME`, and with the same credentials a Secret no pod of the node
/// uses is Forbidden, while the admin reads it (the control: it exists).
pub async fn kubelet_is_held_to_its_node(suite: &Suite) -> Outcome {
    let node = node(suite)?;
    let user = format!("system:node:{}", node.name());
    // kubelet starts watching its pods a moment after the Node is Ready.
    let deadline = Instant::now() + Duration::from_secs(60);
    let as_node = loop {
        let events = suite.cluster.audit_events()?;
        let as_node = events
            .iter()
            .filter(|e| e.user.username == user && e.object_ref.as_ref().is_some_and(|o| o.resource == "pods"))
            .count();
        if as_node > 0 {
            break as_node;
        }
        if Instant::now() > deadline {
            let users: std::collections::BTreeSet<&str> = events.iter().map(|e| e.user.username.as_str()).collect();
            return Err(format!(
                "no request of kubelet's as {user} about pods in the audit log after 60 s; users seen: {users:?}\n{}",
                node.log_tails()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    create_namespace(&suite.admin, "node-authz", "none", &[]).await?;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated", "namespace": "node-authz"}, "stringData": {"k": "v"}});
    let answer = create(&suite.admin, "/api/v1/namespaces/node-authz/secrets", &secret, false).await?;
    if answer.status != 201 {
        return Err(format!("creating the Secret: {} {}", answer.status, answer.message()));
    }
    let admin_reads = allowed(Api::<Secret>::namespaced(suite.admin.clone(), "node-authz").get("unrelated").await)?;
    let node_client = suite.cluster.node_client(node.name()).await?;
    let node_reads = allowed(Api::<Secret>::namespaced(node_client, "node-authz").get("unrelated").await)?;
    if !admin_reads || node_reads {
        return Err(format!(
            "admin reads the Secret: {admin_reads}; the node reads it: {node_reads} (want true, false)"
        ));
    }
    println!("kubelet: {as_node} requests about pods as {user}; a Secret no pod of it uses is Forbidden to it");
    Ok(())
}

/// One node scenario at a time: one of them kills the driver, and kubelet's retry backoff after
/// a failed mount would slow any other scenario publishing meanwhile.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What each reader container does: print once the per-mount options of its view of the volume,
/// then every second print the share's file, try to write into the volume and print how that went.
/// (The write runs in a subshell whose error output is captured: the shell reports a failed
/// redirection on the stderr it had before that command's own redirections.)
const READER: &str = r#"echo "mount: $(grep ' /shared ' /proc/self/mountinfo | cut -d' ' -f6)"; while true; do echo "content: $(cat /shared/ca.crt)"; if (echo x > /shared/probe) 2>/tmp/error; then echo "write: succeeded"; else echo "write: $(cat /tmp/error)"; fi; sleep 1; done"#;

/// The line a reader prints when the volume refuses its write.
const READ_ONLY_REFUSAL: &str = "can't create /shared/probe: Read-only file system";

/// A pod on the node whose container runs [`READER`] on an inline volume of share `share`;
/// `read_only` is the csi volume's `readOnly` (absent when `None`). The container's mount
/// (`volumeMounts`) does not ask for read-only; kubelet makes it read-only all the same when the
/// csi volume's `readOnly` is true.
fn share_reader_on(node: &Node, name: &str, share: &str, read_only: Option<bool>) -> Value {
    let mut csi = json!({"driver": SHARED_RESOURCE_DRIVER, "volumeAttributes": {"sharedSecret": share}});
    if let Some(read_only) = read_only {
        csi["readOnly"] = json!(read_only);
    }
    pod_on_node(node, name, READER, csi, "/shared")
}

/// A pod on the node (named, not scheduled): see [`reader_pod`](inline_guard_tests::node::reader_pod).
pub fn pod_on_node(node: &Node, name: &str, script: &str, csi: Value, mount_path: &str) -> Value {
    let mut pod = inline_guard_tests::node::reader_pod(name, script, csi, mount_path);
    pod["spec"]["nodeName"] = json!(node.name());
    pod
}

/// The namespace the node scenarios' shared Secrets live in.
const OWNER: &str = "node-shares";

/// Makes `name` a SharedSecret of a Secret holding `ca.crt` = `content` (created, or updated when
/// it exists), usable by the service account `reader` of `namespace`: what a platform team and a
/// namespace owner do in a cluster.
async fn share(suite: &Suite, namespace: &str, name: &str, content: &str) -> Outcome {
    share_object(suite, name, content).await?;
    grant(suite, namespace, name).await
}

/// The SharedSecret `name` of a Secret holding `ca.crt` = `content`, granted to no one.
pub async fn share_object(suite: &Suite, name: &str, content: &str) -> Outcome {
    let admin = &suite.admin;
    created_or_existing(
        create(
            admin,
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OWNER}}),
            false,
        )
        .await?,
    )?;
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), OWNER);
    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"ca.crt": content}});
    secrets
        .patch(name, &kube::api::PatchParams::apply("inline-guard-e2e").force(), &kube::api::Patch::Apply(&secret))
        .await
        .map_err(|e| format!("Secret {OWNER}/{name}: {e}"))?;
    let shared = json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": name},
        "spec": {"secretRef": {"namespace": OWNER, "name": name}}
    });
    created_or_existing(
        create(admin, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets", &shared, false).await?,
    )
}

/// `use` of the SharedSecret `name` for the service account `reader` of `namespace`: a Role and
/// a RoleBinding there.
pub async fn grant(suite: &Suite, namespace: &str, name: &str) -> Outcome {
    let admin = &suite.admin;
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": format!("use-{name}")},
        "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "resourceNames": [name], "verbs": ["use"]}]
    });
    created_or_existing(
        create(admin, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"), &role, false)
            .await?,
    )?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": format!("reader-uses-{name}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("use-{name}")},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]
    });
    created_or_existing(
        create(
            admin,
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"),
            &binding,
            false,
        )
        .await?,
    )
}

/// Creates the pod, and first its service account `reader` when missing: kubelet asks for that
/// account's token, which the shipped CSIDriver's `tokenRequests` names, before any publish.
pub async fn create_pod(suite: &Suite, namespace: &str, pod: &Value) -> Result<Pod, String> {
    create_service_account(&suite.admin, namespace, "reader").await?;
    let answer = create(&suite.admin, &pods_path(namespace), pod, false).await?;
    if answer.status != 201 {
        return Err(format!("creating the pod answered {}: {}", answer.status, answer.message()));
    }
    serde_json::from_value(answer.body).map_err(|e| e.to_string())
}

/// Waits (up to 60 s) until the `reader` container's log has a line for which `wanted` holds;
/// returns the log.
pub async fn wait_for_log(
    node: &Node,
    namespace: &str,
    pod: &str,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<String>, String> {
    node.wait_for_log((namespace, pod, "reader"), what, wanted, Duration::from_secs(60)).await
}

/// Waits (up to 60 s) for an event of pod `namespace/pod` whose message contains `wanted`;
/// returns that message.
async fn wait_for_event(suite: &Suite, namespace: &str, pod: &str, wanted: &str) -> Result<String, String> {
    let events = Api::<Event>::namespaced(suite.admin.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
            .await
            .map_err(|e| e.to_string())?;
        if let Some(message) = listed.items.iter().filter_map(|e| e.message.clone()).find(|m| m.contains(wanted)) {
            return Ok(message);
        }
        if Instant::now() > deadline {
            let seen: Vec<_> = listed.items.iter().map(|e| (e.reason.clone(), e.message.clone())).collect();
            return Err(format!("no event of {namespace}/{pod} said {wanted:?} within 60 s: {seen:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Deletes the pod and waits until it is gone: kubelet deletes it only once its volumes are
/// unpublished.
pub async fn delete_and_wait(suite: &Suite, namespace: &str, name: &str) -> Outcome {
    inline_guard_tests::node::delete_and_wait(&suite.admin, namespace, name).await
}

/// See [`Node::volume_present`].
pub fn volume_present(node: &Node, uid: &str) -> Outcome {
    node.volume_present(uid)
}

/// See [`Node::nothing_left`].
pub fn nothing_left(node: &Node, uid: &str) -> Outcome {
    node.nothing_left(uid)
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The per-mount options of pod `uid`'s inline volume on the host (the driver's tmpfs at kubelet's
/// target path) and in the container (its `mount:` line in `log`), in that order.
fn host_and_container_mount_options(node: &Node, uid: &str, log: &[String]) -> Result<(String, String), String> {
    let target = node
        .pod_mounts()
        .into_iter()
        .find(|m| m.contains(uid) && m.ends_with("/volumes/kubernetes.io~csi/shared/mount"))
        .ok_or_else(|| format!("no target path of pod {uid} is mounted: {:?}", node.pod_mounts()))?;
    let host = node.mount_options(&target).ok_or_else(|| format!("{target} is not in the mount table"))?;
    let container = log
        .iter()
        .find_map(|l| l.strip_prefix("mount: "))
        .filter(|options| !options.is_empty())
        .ok_or_else(|| format!("the container did not print its mount of /shared: {log:?}"))?;
    Ok((host, container.to_string()))
}

/// True when the per-mount options `options` say read-only.
fn read_only_mount(options: &str) -> bool {
    options.split(',').any(|o| o == "ro")
}

/// Scenarios 2 and 4: a pod with a read-only inline volume starts; the container reads the share's file,
/// and its write into the volume fails with EROFS; the share changes and the container sees the
/// new content after the refresh; the pod is deleted, the driver unpublishes, nothing is left.
///
/// What the refused write proves: kubelet honoured the csi volume's `readOnly: true` (which the
/// driver demands, scenario 3) by binding the volume read-only into the container. The driver's
/// tmpfs on the host is writable here (`hostReadOnly: false`, the shipped default, so a runtime
/// can relabel it), and the scenario checks both: host `rw`, container `ro`.
/// [`host_read_only_makes_the_drivers_own_mount_read_only`] proves the driver's own part.
pub async fn container_reads_sees_updates_cannot_write_and_nothing_is_left(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let namespace = "node-reader";
    create_namespace(&suite.admin, namespace, "none", &[]).await?;
    share(suite, namespace, "node-reader", "first version").await?;
    let pod = create_pod(suite, namespace, &share_reader_on(node, "reader", "node-reader", Some(true))).await?;
    let writes = first_content_and_refused_writes(node, namespace, "reader", "content: first version").await?;
    let (host, container) = host_and_container_mount_options(node, &uid(&pod), &writes.1)?;
    if read_only_mount(&host) || !read_only_mount(&container) {
        return Err(format!(
            "expected a writable host mount and a read-only container mount: host {host}, container {container}"
        ));
    }
    share(suite, namespace, "node-reader", "second version").await?;
    wait_for_log(node, namespace, "reader", "the updated content", |l| l == "content: second version").await?;
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, namespace, "reader").await?;
    nothing_left(node, &uid(&pod))?;
    println!(
        "container read, was refused its write ({}) on its {container} mount of the host's {host} tmpfs, saw the update; unpublished cleanly",
        writes.0
    );
    Ok(())
}

/// Waits until pod `namespace/pod`'s reader has printed `content` and tried a write; every write
/// it tried must have been refused as read-only. Returns a refused write's line and the log.
async fn first_content_and_refused_writes(
    node: &Node,
    namespace: &str,
    pod: &str,
    content: &str,
) -> Result<(String, Vec<String>), String> {
    let log = wait_for_log(node, namespace, pod, "the share's content", |l| l == content).await?;
    let log = if log.iter().any(|l| l.starts_with("write: ")) {
        log
    } else {
        wait_for_log(node, namespace, pod, "a write attempt", |l| l.starts_with("write: ")).await?
    };
    let writes: Vec<&String> = log.iter().filter(|l| l.starts_with("write: ")).collect();
    if !writes.iter().all(|l| l.ends_with(READ_ONLY_REFUSAL)) {
        return Err(format!("a write into the volume did not fail with EROFS: {writes:?}"));
    }
    Ok((writes[0].clone(), log))
}

/// Puts the node's driver back on its own configuration when dropped, even when the scenario
/// that changed it failed.
pub struct DriverConfigured<'a>(pub &'a Node);

impl Drop for DriverConfigured<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.0.restart_driver_with("") {
            eprintln!("the driver was not restored to the node's configuration: {error}");
        }
    }
}

/// The driver's own read-only part: with `hostReadOnly: true` the driver remounts its tmpfs
/// read-only once it has written the content, so the volume is read-only on the host itself, not
/// only in the container's view; the container still reads (and sees an update, which the driver
/// writes through a brief writable remount) and is refused its write.
pub async fn host_read_only_makes_the_drivers_own_mount_read_only(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    node.restart_driver_with("hostReadOnly: true\n")?;
    let _restore = DriverConfigured(node);
    let namespace = "node-host-read-only";
    create_namespace(&suite.admin, namespace, "none", &[]).await?;
    share(suite, namespace, "node-host-read-only", "read-only on the host").await?;
    let pod =
        create_pod(suite, namespace, &share_reader_on(node, "host-ro", "node-host-read-only", Some(true))).await?;
    let (write, log) =
        first_content_and_refused_writes(node, namespace, "host-ro", "content: read-only on the host").await?;
    let (host, container) = host_and_container_mount_options(node, &uid(&pod), &log)?;
    if !read_only_mount(&host) || !read_only_mount(&container) {
        return Err(format!(
            "expected read-only mounts on the host and in the container: host {host}, container {container}"
        ));
    }
    share(suite, namespace, "node-host-read-only", "updated under a read-only mount").await?;
    wait_for_log(node, namespace, "host-ro", "the updated content", |l| {
        l == "content: updated under a read-only mount"
    })
    .await?;
    let (host_after, _) = host_and_container_mount_options(node, &uid(&pod), &log)?;
    if !read_only_mount(&host_after) {
        return Err(format!("after the update the host mount is {host_after}, not read-only again"));
    }
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, namespace, "host-ro").await?;
    nothing_left(node, &uid(&pod))?;
    println!("hostReadOnly: host mount {host}, container mount {container}; write refused ({write}); update served");
    Ok(())
}

/// Scenario 3: a pod whose inline volume lacks readOnly, in a namespace no webhook covers, never starts:
/// its events carry the driver's INVALID_ARGUMENT message.
pub async fn pod_without_read_only_never_starts(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let namespace = "node-unguarded";
    create_namespace(&suite.admin, namespace, "none", &[]).await?;
    share(suite, namespace, "node-unguarded", "never served").await?;
    create_pod(suite, namespace, &share_reader_on(node, "writable", "node-unguarded", None)).await?;
    let wanted = "this driver only publishes read-only volumes: set readOnly: true on the pod's csi volume";
    let message = wait_for_event(suite, namespace, "writable", wanted).await?;
    let pod =
        Api::<Pod>::namespaced(suite.admin.clone(), namespace).get("writable").await.map_err(|e| e.to_string())?;
    let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
    if phase != "Pending" || !node.container_log(namespace, "writable", "reader").is_empty() {
        return Err(format!("the pod was not held back: phase {phase}"));
    }
    delete_and_wait(suite, namespace, "writable").await?;
    println!("pod held in Pending; event: {message}");
    Ok(())
}

/// Scenario 5: with the admission webhooks on: a pod in a restricted namespace using a privileged-profile
/// driver is refused at creation with the exact message; a pod using this driver without
/// readOnly is admitted with the read-only patch and runs, its writes refused.
pub async fn webhooks_refuse_one_pod_and_patch_another_that_runs(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let restricted = "node-restricted";
    create_namespace(&suite.admin, restricted, "shared", &[("pod-security.kubernetes.io/enforce", "restricted")])
        .await?;
    let privileged_driver = "privileged.node.e2e.inlineguard.dev";
    create_csi_driver(&suite.admin, privileged_driver, Some("privileged")).await?;
    create_service_account(&suite.admin, restricted, "reader").await?;
    let mut refused = share_reader_on(node, "refused", "none", Some(true));
    refused["spec"]["volumes"][0]["csi"]["driver"] = json!(privileged_driver);
    let answer = create(&suite.admin, &pods_path(restricted), &refused, false).await?;
    let expected = denied_by(
        "pods.csi-volume-admission.inlineguard.dev",
        &violation("refused", privileged_driver, restricted, "enforce", "privileged"),
    );
    if answer.status != 403 || answer.message() != expected {
        return Err(format!("expected 403 {expected:?}, got {} {:?}", answer.status, answer.message()));
    }

    let guarded = "node-guarded";
    create_namespace(&suite.admin, guarded, "shared", &[]).await?;
    share(suite, guarded, "node-guarded", "patched and served").await?;
    let pod = create_pod(suite, guarded, &share_reader_on(node, "patched", "node-guarded", None)).await?;
    let read_only =
        pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).and_then(|v| v[0].csi.as_ref()).and_then(|c| c.read_only);
    if read_only != Some(true) {
        return Err(format!("the stored pod's csi volume has readOnly {read_only:?}, not the webhook's true"));
    }
    wait_for_log(node, guarded, "patched", "the share's content", |l| l == "content: patched and served").await?;
    let log = wait_for_log(node, guarded, "patched", "a refused write", |l| l.ends_with(READ_ONLY_REFUSAL)).await?;
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, guarded, "patched").await?;
    nothing_left(node, &uid(&pod))?;
    println!("refused: {expected}; patched pod ran and read: {:?}", log.first());
    Ok(())
}

/// Share injection on the node: a pod with no volume at all, annotated
/// `sharedresource.inlineguard.dev/inject: sharedsecret/<share>:/shared`, is admitted with the
/// injected read-only volume and mount (its service account granted `use`), runs, reads the
/// share's file and is refused its write; deleted, nothing is left. This is also the issue's
/// "granted → admitted and Running": admission asked RBAC (SharedResourceAdmission) and the
/// driver asked again at mount.
pub async fn an_annotated_pod_gets_its_share_injected_and_reads_it(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let namespace = "node-injected";
    create_namespace(&suite.admin, namespace, "shared", &[]).await?;
    share(suite, namespace, "node-injected", "injected and read").await?;
    let mut pod = share_reader_on(node, "injected", "node-injected", Some(true));
    pod["spec"].as_object_mut().map(|spec| spec.remove("volumes"));
    pod["spec"]["containers"][0].as_object_mut().map(|container| container.remove("volumeMounts"));
    pod["metadata"]["annotations"] =
        json!({"sharedresource.inlineguard.dev/inject": "sharedsecret/node-injected:/shared"});
    let pod = create_pod(suite, namespace, &pod).await?;
    let spec = pod.spec.as_ref().ok_or("the stored pod has no spec")?;
    let volume = spec.volumes.iter().flatten().find(|v| v.name == "inject-secret-node-injected");
    let csi = volume.and_then(|v| v.csi.as_ref());
    let mount =
        spec.containers[0].volume_mounts.iter().flatten().find(|m| m.name == "inject-secret-node-injected").cloned();
    let injected = csi.is_some_and(|csi| {
        csi.driver == SHARED_RESOURCE_DRIVER
            && csi.read_only == Some(true)
            && csi.volume_attributes.as_ref().and_then(|a| a.get("sharedSecret")).map(String::as_str)
                == Some("node-injected")
    }) && mount.as_ref().is_some_and(|m| m.mount_path == "/shared" && m.read_only == Some(true));
    if !injected {
        return Err(format!("the stored pod lacks the injected volume or mount: volume {csi:?}, mount {mount:?}"));
    }
    let (write, _) =
        first_content_and_refused_writes(node, namespace, "injected", "content: injected and read").await?;
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, namespace, "injected").await?;
    nothing_left(node, &uid(&pod))?;
    println!("annotated pod: injected volume and mount stored, ran, read the share, write refused ({write})");
    Ok(())
}

/// Scenario 6: the driver is SIGKILLed while a pod runs: the container keeps reading its files; the
/// driver comes back, and the pod's deletion still unpublishes cleanly.
pub async fn driver_killed_under_a_running_pod_which_still_reads_and_unpublishes(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let namespace = "node-restart";
    create_namespace(&suite.admin, namespace, "none", &[]).await?;
    share(suite, namespace, "node-restart", "survives the driver").await?;
    let pod = create_pod(suite, namespace, &share_reader_on(node, "steady", "node-restart", Some(true))).await?;
    wait_for_log(node, namespace, "steady", "the share's content", |l| l == "content: survives the driver").await?;
    node.kill_driver();
    let before = node.container_log(namespace, "steady", "reader").len();
    let log = wait_for_log(node, namespace, "steady", "reads after the kill", |_| {
        node.container_log(namespace, "steady", "reader").len() >= before + 6
    })
    .await?;
    let after_kill: Vec<&String> = log[before..].iter().filter(|l| l.starts_with("content: ")).collect();
    if after_kill.is_empty() || !after_kill.iter().all(|l| *l == "content: survives the driver") {
        return Err(format!("reads after the driver's death: {after_kill:?}"));
    }
    node.restart_driver()?;
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, namespace, "steady").await?;
    nothing_left(node, &uid(&pod))?;
    println!("{} reads while the driver was dead; unpublished by the restarted driver", after_kill.len());
    Ok(())
}

/// Shares scenario on the node: a pod whose service account may not use the share never starts,
/// its events carrying PERMISSION_DENIED; granted access later, kubelet's retry mounts the volume
/// and the container reads it.
/// A pod on the node mounting a share marked optional whose Secret does not exist yet: it
/// starts with an empty volume and is told why, then reads the Secret once it is created.
pub async fn an_optional_share_reaches_a_running_container_once_its_secret_exists(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let (namespace, name) = ("node-optional", "node-optional-share");
    create_namespace(&suite.admin, namespace, "none", &[]).await?;
    let owner = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OWNER}});
    created_or_existing(create(&suite.admin, "/api/v1/namespaces", &owner, false).await?)?;
    // The share and its grant exist; the Secret it names does not yet.
    let shared = json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": name},
        "spec": {"secretRef": {"namespace": OWNER, "name": name}}
    });
    created_or_existing(
        create(&suite.admin, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets", &shared, false).await?,
    )?;
    grant(suite, namespace, name).await?;
    let csi = json!({"driver": SHARED_RESOURCE_DRIVER, "readOnly": true, "volumeAttributes": {"sharedSecret": name, "optional": "true"}});
    let pod = create_pod(suite, namespace, &pod_on_node(node, "optional", READER, csi, "/shared")).await?;
    let fail = |e: String| format!("{e}\n{}", node.log_tails());
    wait_for_log(node, namespace, "optional", "the empty volume", |l| l == "content: ").await.map_err(fail)?;
    let told = "is served without what it marks optional, until that exists: Secret node-shares/node-optional-share, shared by SharedSecret \"node-optional-share\", not found";
    wait_for_event(suite, namespace, "optional", told).await?;
    share_object(suite, name, "arrived late").await?;
    let created = Instant::now();
    wait_for_log(node, namespace, "optional", "the Secret created", |l| l == "content: arrived late")
        .await
        .map_err(fail)?;
    // The reader looks once a second: this includes up to a second of its own.
    println!("optional share on the node: the container read the Secret {:?} after its creation", created.elapsed());
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, namespace, "optional").await?;
    nothing_left(node, &uid(&pod))
}

pub async fn pod_without_access_waits_and_starts_once_granted(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let namespace = "node-stranger";
    create_namespace(&suite.admin, namespace, "none", &[]).await?;
    // The share exists, granted to no one.
    share_object(suite, "node-stranger-share", "granted late").await?;
    create_pod(suite, namespace, &share_reader_on(node, "stranger", "node-stranger-share", Some(true))).await?;
    let wanted = "service account node-stranger/reader may not use SharedSecret \"node-stranger-share\"";
    let message =
        wait_for_event(suite, namespace, "stranger", wanted).await.map_err(|e| format!("{e}\n{}", node.log_tails()))?;
    if !message.contains("code = PermissionDenied") {
        return Err(format!("the refusal is not PERMISSION_DENIED: {message}"));
    }
    if !node.container_log(namespace, "stranger", "reader").is_empty() {
        return Err("the container ran without access".into());
    }
    // Granted: kubelet retries the mount on its own.
    grant(suite, namespace, "node-stranger-share").await?;
    wait_for_log(node, namespace, "stranger", "the share after the grant", |l| l == "content: granted late").await?;
    delete_and_wait(suite, namespace, "stranger").await?;
    println!("refused ({message}), then mounted by kubelet's retry once granted");
    Ok(())
}
