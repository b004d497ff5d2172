//! The two halves of the read-only guarantee meeting: pods created through the apiserver, then
//! NodePublishVolume sent to the driver over its socket, built by this test from the stored pod
//! following kubelet 1.35's rules (`pkg/volume/csi`: the volume handle
//! `csi-<sha256(pod UID + volume name)>`, `readonly` from the pod's `csi.readOnly`, the volume
//! attributes plus the pod information). An imitation, and it says so: it always adds the pod
//! information without reading the CSIDriver, and bind-mounts into no container. A real kubelet
//! is the real-node issue's.
//!
//! A pod admitted through the mutating webhook publishes and receives the share's files; a pod
//! in a namespace the webhook does not cover keeps `readOnly` unset and the driver refuses it.
//! The content here comes from the static-directory source; the cluster's shares and their
//! access checks are `shares.rs`'s and `node.rs`'s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use inline_guard_proto::csi::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::test_util::client::unix_channel;
use tonic::transport::Channel;

use inline_guard_tests::repo_root;

use crate::support::{
    Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_namespace, create_service_account, pod, pods_path,
};

/// CSI `SINGLE_NODE_WRITER`: what kubelet sends for an inline volume (ReadWriteOnce).
const SINGLE_NODE_WRITER: i32 = 1;

/// The NodePublishVolumeRequest kubelet sends for `volume` of a stored `pod` whose CSIDriver has
/// `podInfoOnMount: true`.
pub fn kubelet_request(pod: &Pod, volume: &str, target: &Path) -> Result<NodePublishVolumeRequest, String> {
    let uid = pod.metadata.uid.clone().ok_or("the stored pod has no uid")?;
    let spec = pod.spec.as_ref().ok_or("the stored pod has no spec")?;
    let csi =
        spec.volumes.iter().flatten().find(|v| v.name == volume).and_then(|v| v.csi.clone()).ok_or("no csi volume")?;
    let mut context: HashMap<String, String> = csi.volume_attributes.clone().unwrap_or_default().into_iter().collect();
    for (key, value) in [
        ("csi.storage.k8s.io/pod.name", pod.metadata.name.clone().unwrap_or_default()),
        ("csi.storage.k8s.io/pod.namespace", pod.metadata.namespace.clone().unwrap_or_default()),
        ("csi.storage.k8s.io/pod.uid", uid.clone()),
        ("csi.storage.k8s.io/serviceAccount.name", spec.service_account_name.clone().unwrap_or_default()),
        ("csi.storage.k8s.io/ephemeral", "true".into()),
    ] {
        context.insert(key.into(), value);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, format!("{uid}{volume}").as_bytes());
    let handle: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Ok(NodePublishVolumeRequest {
        volume_id: format!("csi-{handle}"),
        target_path: target.display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: csi.fs_type.clone().unwrap_or_default(),
                ..Default::default()
            })),
            access_mode: Some(AccessMode { mode: SINGLE_NODE_WRITER }),
        }),
        readonly: csi.read_only.unwrap_or(false),
        volume_context: context,
        ..Default::default()
    })
}

pub async fn channel(socket: PathBuf) -> Result<Channel, String> {
    unix_channel(socket, Duration::from_secs(10)).await
}

/// A pod as a user writes it: the volume is not marked read-only, the mount is.
fn user_pod(name: &str) -> serde_json::Value {
    let mut object = pod(name, &[("ca", SHARED_RESOURCE_DRIVER)]);
    object["spec"]["serviceAccountName"] = json!("reader");
    object["spec"]["volumes"][0]["csi"]["volumeAttributes"] = json!({"sharedConfigMap": "cluster-ca"});
    object["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(true);
    object
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status.lines().any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"))
    })
}

pub async fn admitted_pod_publishes_unguarded_pod_is_refused(suite: &Suite) -> Outcome {
    if !nix_is_root() {
        return Err("publishing real mounts needs root: run the test command as root".into());
    }
    let admin = &suite.admin;
    let (guarded, unguarded) = ("kubelet-guarded", "kubelet-unguarded");
    create_namespace(admin, guarded, "shared", &[]).await?;
    // Routed to no webhook: as in a cluster where the mutating webhook is not deployed.
    create_namespace(admin, unguarded, "none", &[]).await?;
    let mut stored = Vec::new();
    for namespace in [guarded, unguarded] {
        create_service_account(admin, namespace, "reader").await?;
        let answer = create(admin, &pods_path(namespace), &user_pod("reader"), false).await?;
        if answer.status != 201 {
            return Err(format!("{namespace}: create answered {} {}", answer.status, answer.message()));
        }
        stored.push(Api::<Pod>::namespaced(admin.clone(), namespace).get("reader").await.map_err(|e| e.to_string())?);
    }

    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let share = repo_root().join("config/examples/shares/cluster-ca");
    let shares = dir.path().join("shares/cluster-ca");
    std::fs::create_dir_all(&shares).map_err(|e| e.to_string())?;
    for file in ["ca.crt", "registry-url"] {
        std::fs::copy(share.join(file), shares.join(file)).map_err(|e| format!("{file}: {e}"))?;
    }
    let socket = dir.path().join("csi.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Plugin::in_directory(dir.path(), socket.clone()).run(async {
        let _ = stopped.await;
    }));
    let mut node = NodeClient::new(channel(socket).await?);

    let result = async {
        let target = dir.path().join("pods/guarded/volumes/kubernetes.io~csi/ca/mount");
        let request = kubelet_request(&stored[0], "ca", &target)?;
        if !request.readonly {
            return Err("the mutating webhook did not set csi.readOnly on the admitted pod".to_string());
        }
        node.node_publish_volume(request.clone()).await.map_err(|e| format!("publish of the admitted pod: {e}"))?;
        for file in ["ca.crt", "registry-url"] {
            let served = std::fs::read(target.join(file)).map_err(|e| format!("{file} in the volume: {e}"))?;
            if served != std::fs::read(share.join(file)).map_err(|e| e.to_string())? {
                return Err(format!("{file} in the volume differs from the share"));
            }
        }
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: request.volume_id,
            target_path: request.target_path,
        })
        .await
        .map_err(|e| format!("unpublish: {e}"))?;

        let target = dir.path().join("pods/unguarded/volumes/kubernetes.io~csi/ca/mount");
        let refused = node.node_publish_volume(kubelet_request(&stored[1], "ca", &target)?).await;
        match refused {
            Err(status)
                if status.code() == tonic::Code::InvalidArgument && status.message().contains("readOnly: true") =>
            {
                println!("unguarded pod refused by the driver: {}", status.message());
                Ok(())
            }
            other => Err(format!("the driver did not refuse a writable publish: {other:?}")),
        }
    }
    .await;
    let _ = stop.send(());
    running.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    result
}

/// NodePublishVolume as kubelet sends it for a new pod: retried while the driver answers
/// UNAVAILABLE (kubelet retries with backoff; the suite every 200 ms), for at most
/// [`crate::shares::WITHIN`]. A share created a moment ago is such a case: its backing object
/// becomes readable to the driver when the read-grants controller has granted it.
pub async fn publish_as_kubelet(
    node: &mut NodeClient<tonic::transport::Channel>,
    request: &NodePublishVolumeRequest,
) -> Result<(), tonic::Status> {
    let started = std::time::Instant::now();
    loop {
        match node.node_publish_volume(request.clone()).await {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == tonic::Code::Unavailable && started.elapsed() < crate::shares::WITHIN => {
                println!("publish retried as kubelet would: {}", status.message());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => return Err(status),
        }
    }
}
