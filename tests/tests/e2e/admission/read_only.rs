//! Read-only forcing through the apiserver: the pod that comes back from a create has
//! `readOnly: true` on the shared-resource volume and on every mount of it, and nothing else is
//! touched (the ServiceAccount admission plugin's token mount is read-only by its own doing).

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;

use crate::support::{
    Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_csi_driver, create_namespace, pod, pods_path,
};

/// A pod with a shared-resource volume mounted writable by an init container and two containers
/// (one says `readOnly: false` outright), and a second driver's volume that must stay writable.
pub async fn forced_on_every_mount(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let namespace = "read-only";
    create_namespace(admin, namespace, "shared", &[]).await?;
    let other = "writable.read-only.e2e.inlineguard.dev";
    create_csi_driver(admin, other, Some("restricted")).await?;

    let mut object = pod("forced", &[("shared", SHARED_RESOURCE_DRIVER), ("scratch", other)]);
    let app = object["spec"]["containers"][0].clone();
    let mut sidecar = app.clone();
    sidecar["name"] = json!("sidecar");
    sidecar["volumeMounts"][0]["readOnly"] = json!(false);
    let mut init = app.clone();
    init["name"] = json!("init");
    object["spec"]["containers"] = json!([app, sidecar]);
    object["spec"]["initContainers"] = json!([init]);

    let answer = create(admin, &pods_path(namespace), &object, false).await?;
    if answer.status != 201 {
        return Err(format!("create answered {}: {}", answer.status, answer.message()));
    }
    // Read back what was stored, not just what the create answered.
    let stored: Pod = Api::namespaced(admin.clone(), namespace).get("forced").await.map_err(|e| e.to_string())?;
    let spec = stored.spec.ok_or("the stored pod has no spec")?;
    let volumes = spec.volumes.unwrap_or_default();
    let csi_read_only = |name: &str| volumes.iter().find(|v| v.name == name).and_then(|v| v.csi.as_ref()?.read_only);
    let mut wrong = Vec::new();
    if csi_read_only("shared") != Some(true) {
        wrong.push(format!("volume shared: csi.readOnly = {:?}", csi_read_only("shared")));
    }
    if csi_read_only("scratch").is_some() {
        wrong.push(format!("volume scratch (not a read-only driver) was changed: {:?}", csi_read_only("scratch")));
    }
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    for container in containers {
        for mount in container.volume_mounts.iter().flatten() {
            let token = mount.name.starts_with("kube-api-access-");
            let expected = (mount.name == "shared" || token).then_some(true);
            if mount.read_only != expected {
                wrong.push(format!(
                    "{} mount {}: readOnly = {:?}, expected {expected:?}",
                    container.name, mount.name, mount.read_only
                ));
            }
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(wrong.join("\n")) }
}
