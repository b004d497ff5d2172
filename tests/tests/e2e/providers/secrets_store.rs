//! A Secrets Store CSI provider behind the driver, on the real apiserver: the e2e provider built
//! from the upstream driver's own provider API module (tests/peers/secretsstore), served by
//! grpc-go on its unix socket as Vault's or AWS's provider is. Access is RBAC, as for every
//! provider; the provider is sent upstream's Mount (the pod's keys, permission 420, the target)
//! and gets back, at each refresh, the object versions it answered last; the volume follows the
//! provider's content; a provider that goes away leaves the volume as it was.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_tests::cluster::ChildProcess;
use serde_json::{Value, json};

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::providers::one_provider;
use crate::shares::{InProcessDriver, files, wait_for_view};
use crate::support::{Outcome, SHARED_RESOURCE_DRIVER, Suite};

const NAMESPACE: &str = "secrets-store-e2e";

/// What the pod asks of the provider: its SecretProviderClass-style `objects` parameter.
const OBJECTS: &str =
    "array:\n  - |\n    objectName: db-password\n  - |\n    objectName: api-key\n    objectAlias: keys/api\n";

fn pod(name: &str, service_account: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "serviceAccountName": service_account,
            "containers": [{"name": "app", "image": "registry.invalid/app:1", "volumeMounts": [{"name": "store", "mountPath": "/store"}]}],
            "volumes": [{"name": "store", "csi": {"driver": SHARED_RESOURCE_DRIVER, "readOnly": true,
                "volumeAttributes": {"provider": "e2e", "objects": OBJECTS}}}]
        }
    })
}

/// The volume's files, its `keys/` directory's included, as a container would read them.
fn shown(target: &Path) -> Vec<(String, String)> {
    let mut shown: Vec<(String, String)> = files(target).into_iter().filter(|(name, _)| name != "keys").collect();
    shown.extend(files(&target.join("keys")).into_iter().map(|(name, content)| (format!("keys/{name}"), content)));
    shown
}

/// The Mount calls the provider logged, one JSON object each.
fn mounts_logged(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn write(path: &Path, content: &str) -> Outcome {
    std::fs::write(path, content).map_err(|e| format!("{}: {e}", path.display()))
}

pub async fn a_secrets_store_provider_serves_its_objects_to_whom_rbac_grants_use(suite: &Suite) -> Outcome {
    let stored = crate::providers::provider_scene(suite, NAMESPACE, "e2e", pod).await?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (objects, socket, log) =
        (work.path().join("objects"), work.path().join("e2e.sock"), work.path().join("mounts.log"));
    std::fs::create_dir_all(&objects).map_err(|e| e.to_string())?;
    write(&objects.join("db-password"), "v1-pass")?;
    write(&objects.join("api-key"), "key-1")?;
    let arguments = [("--socket", &socket), ("--objects", &objects), ("--log", &log)]
        .map(|(flag, path)| format!("{flag}={}", path.display()));
    let mut provider =
        ChildProcess::spawn("e2e-provider", &suite.peers.secrets_store_provider, &arguments, &[], work.path())?;

    let providers = one_provider(json!({"name": "e2e", "kind": "secrets-store", "socket": socket, "timeout": "5s"}))?;
    // Refreshed every 2 s, so the provider's new content (and the versions sent back) arrive.
    let driver = InProcessDriver::start_refreshing(suite, providers, 2).await?;
    let mut node = NodeClient::new(channel(driver.socket.clone()).await?);

    let result = async {
        let target = driver.dir.path().join("pods/web/volumes/kubernetes.io~csi/store/mount");
        let mut request = kubelet_request(&stored[0], "store", &target)?;
        // As kubelet passes a volume's nodePublishSecretRef.
        request.secrets = [("clientSecret".to_string(), "from-a-secret".to_string())].into();
        publish_as_kubelet(&mut node, &request)
            .await
            .map_err(|e| format!("publish allowed by the RoleBinding: {e}"))?;
        let view =
            |v1: &str| vec![("db-password".to_string(), v1.to_string()), ("keys/api".to_string(), "key-1".to_string())];
        wait_for_view(&target, "published", shown, &view("v1-pass"), |f| format!("{f:?}")).await?;
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(target.join("keys/api")).map_err(|e| e.to_string())?.permissions().mode() & 0o777;
        if mode != 0o644 {
            return Err(format!("the provider's file has mode {mode:o}, not the 644 it was given"));
        }
        let first = mounts_logged(&log).first().cloned().ok_or("the provider logged no Mount")?;
        let expected = json!({
            "pod": format!("{NAMESPACE}/web"), "serviceAccount": "reader", "permission": "420",
            "targetPath": target.display().to_string(), "currentObjectVersion": {}, "secretKeys": ["clientSecret"],
            "tokenAudiences": [],
            "attributeKeys": ["csi.storage.k8s.io/ephemeral", "csi.storage.k8s.io/pod.name",
                "csi.storage.k8s.io/pod.namespace", "csi.storage.k8s.io/pod.uid",
                "csi.storage.k8s.io/serviceAccount.name", "objects"],
        });
        if first != expected {
            return Err(format!("the provider was sent {first}, expected {expected}"));
        }

        // The provider's content changes: a refresh brings it, and each refresh sends back the
        // versions the provider answered the time before.
        write(&objects.join("db-password"), "v2-pass")?;
        wait_for_view(&target, "rotated", shown, &view("v2-pass"), |f| format!("{f:?}")).await?;
        let sent_back = mounts_logged(&log)
            .iter()
            .skip(1)
            .any(|mount| mount["currentObjectVersion"].get("secret/db-password").is_some_and(Value::is_string));
        if !sent_back {
            return Err(format!("no refresh sent the object versions back: {:?}", mounts_logged(&log)));
        }
        // Recorded with the volume, so a restarted driver sends them back too.
        let recorded = std::fs::read_dir(driver.dir.path().join("state"))
            .map_err(|e| e.to_string())?
            .flatten()
            .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
            .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
            .any(|record| record["object_versions"]["secret/db-password"].is_string());
        if !recorded {
            return Err("the volume's record does not hold the provider's object versions".into());
        }

        by_class(suite, &mut node, &driver, &stored[0], &log).await?;

        // No grant: PERMISSION_DENIED naming the provider, and the provider never asked.
        let asked = mounts_logged(&log).len();
        crate::providers::refused_use(&mut node, &driver, &stored[1], "store", "e2e").await?;
        if mounts_logged(&log).iter().skip(asked).any(|mount| mount["pod"] == format!("{NAMESPACE}/intruder")) {
            return Err("the provider was asked for a pod that may not use it".into());
        }

        // The provider goes away: refreshes fail, and the volume keeps what it showed. In its
        // place, a socket that accepts and hangs up counts the driver's attempts itself (not
        // the driver's own counter): each is a refresh that got no answer.
        provider.kill();
        let failed_before = failed_refreshes(&driver);
        let attempts = HangingUp::bind(&socket)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while attempts.count() < 2 {
            if Instant::now() > deadline {
                return Err(format!(
                    "the driver tried the dead provider's socket {} times within 60 s (refreshes every 2 s)",
                    attempts.count()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if shown(&target) != view("v2-pass") {
            return Err(format!("the provider's death changed the volume: {:?}", shown(&target)));
        }
        // The driver's count agrees that refreshes failed.
        if failed_refreshes(&driver) == failed_before {
            return Err("refreshes got no answer, and the driver counts no failed refresh".into());
        }
        crate::providers::unpublished(&mut node, &request, &target).await
    }
    .await;
    // The scenario's failure first; a driver failure or a leftover mount otherwise.
    result.map_err(|e| format!("{e}\n{}", provider.log_tail(20))).and(driver.stop().await)
}

/// A volume naming a SecretProviderClass (upstream's CRD, installed from the upstream module;
/// the driver's opt-in RBAC to read classes applied): the provider is sent the class's
/// parameters, not the volume's; a class for another provider is INVALID_ARGUMENT and a class
/// that does not exist NOT_FOUND, each naming it.
async fn by_class(
    suite: &Suite,
    node: &mut NodeClient<tonic::transport::Channel>,
    driver: &InProcessDriver,
    pod: &k8s_openapi::api::core::v1::Pod,
    log: &Path,
) -> Outcome {
    let crd = inline_guard_tests::apply::objects(&suite.peers.secret_provider_class_crd)?;
    inline_guard_tests::apply::apply(&suite.admin, &crd, false).await?;
    crate::support::wait_established(&suite.admin, "secretproviderclasses.secrets-store.csi.x-k8s.io").await?;
    crate::shares::apply_file(suite, "config/deploy/driver/secret-provider-classes.yaml").await?;
    let classes = format!("/apis/secrets-store.csi.x-k8s.io/v1/namespaces/{NAMESPACE}/secretproviderclasses");
    for (name, provider) in [("api-key-only", "e2e"), ("for-vault", "vault")] {
        let class = json!({"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
            "metadata": {"name": name},
            "spec": {"provider": provider, "parameters": {"objects": "array:\n  - |\n    objectName: api-key\n"}}});
        crate::shares::create_object(suite, &classes, class).await?;
    }
    let target = driver.dir.path().join("pods/web/volumes/kubernetes.io~csi/by-class/mount");
    let with_class = |class: &str| -> Result<inline_guard_proto::csi::v1::NodePublishVolumeRequest, String> {
        let mut request = kubelet_request(pod, "store", &target)?;
        request.volume_id = format!("{}-{class}", request.volume_id);
        request.volume_context.remove("objects");
        request.volume_context.insert("secretProviderClass".into(), class.into());
        Ok(request)
    };
    let request = with_class("api-key-only")?;
    publish_as_kubelet(node, &request).await.map_err(|e| format!("publish naming a SecretProviderClass: {e}"))?;
    let expected = vec![("api-key".to_string(), "key-1".to_string())];
    wait_for_view(&target, "published by class", shown, &expected, |f| format!("{f:?}")).await?;
    let sent = mounts_logged(log).last().cloned().ok_or("the provider logged no Mount")?;
    let keys = &sent["attributeKeys"];
    if !keys.as_array().is_some_and(|k| k.contains(&json!("objects")) && !k.contains(&json!("secretProviderClass"))) {
        return Err(format!("with a class the provider was sent {sent}: expected the class's objects parameter"));
    }
    crate::providers::unpublished(node, &request, &target).await?;

    for (class, code, message) in [
        (
            "for-vault",
            tonic::Code::InvalidArgument,
            format!(
                "SecretProviderClass {NAMESPACE}/\"for-vault\" is for provider \"vault\", not the volume's provider \"e2e\""
            ),
        ),
        (
            "absent",
            tonic::Code::NotFound,
            format!(
                "SecretProviderClass {NAMESPACE}/\"absent\" does not exist (or the Secrets Store CSI Driver's CRD is not installed)"
            ),
        ),
    ] {
        let refused =
            node.node_publish_volume(with_class(class)?).await.err().ok_or(format!("class {class} was published"))?;
        if refused.code() != code || refused.message() != message {
            return Err(format!("class {class}: expected {code:?} {message:?}, got {refused:?}"));
        }
    }
    Ok(())
}

/// A unix socket where a provider was, accepting each connection and hanging up at once: what
/// the driver meets when a provider dies and its socket is left to a process that does not
/// speak gRPC. Counts the connections.
struct HangingUp {
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl HangingUp {
    fn bind(path: &Path) -> Result<HangingUp, String> {
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path).map_err(|e| format!("{}: {e}", path.display()))?;
        // Polled, so that dropping the stand-in ends its thread.
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (accepted, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (counter, stopped) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((connection, _)) => {
                        counter.fetch_add(1, Ordering::SeqCst);
                        drop(connection);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(HangingUp { accepted, stop })
    }

    fn count(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for HangingUp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// `sharedresource_csi_driver_refreshes_total{result="failed"}` as the driver counts it now.
fn failed_refreshes(driver: &InProcessDriver) -> u64 {
    driver
        .metrics
        .encode()
        .lines()
        .find(|line| line.starts_with("sharedresource_csi_driver_refreshes_total{result=\"failed\"}"))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}
