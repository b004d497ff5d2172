//! A lazy `exec` provider on the real apiserver: the shipped example helper, wrapped to log its
//! calls, served by the in-process driver through a real FUSE mount at the target kubelet names.
//! Nothing is fetched at publish but the helper's `mount`; a file is fetched when first opened
//! (read by a user other than root, as a container's would be), then served from memory within
//! the cache's TTL; a service account without `use` is refused; the grant deleted, the files no
//! longer open (EACCES) through the driver's watches; unpublish leaves nothing.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;

use inline_guard_proto::csi::v1::node_client::NodeClient;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use sharedresource_csi_driver::volume::mounter::listed_in_mountinfo;

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::providers::{
    helper_calls, logging_example_helper, one_provider, pod_of_provider, provider_scene, refused_use, unpublished,
};
use crate::shares::{InProcessDriver, wait_for_view};
use crate::support::{Outcome, Suite};

const NAMESPACE: &str = "providers-lazy-e2e";
const PROVIDER: &str = "example-lazy";
const NOBODY: u32 = 65534;

fn lazy_pod(name: &str, service_account: &str) -> Value {
    pod_of_provider(PROVIDER, name, service_account)
}

/// `cat PATH` as nobody: what it printed, or the start of its complaint.
fn read_as_nobody(path: &Path) -> Result<String, String> {
    let output = Command::new("cat").arg(path).uid(NOBODY).gid(NOBODY).output().map_err(|e| e.to_string())?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&output.stderr).trim().to_string()),
    }
}

/// Lets any user walk from the driver's root to the target, as a container's bind mount would
/// (the driver makes kubelet's directories 0750).
fn open_the_way(root: &Path, target: &Path) -> Outcome {
    use std::os::unix::fs::PermissionsExt as _;
    let mut dir = target.parent();
    while let Some(here) = dir.filter(|d| d.starts_with(root)) {
        std::fs::set_permissions(here, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
        dir = here.parent();
    }
    Ok(())
}

pub async fn a_lazy_exec_provider_fetches_each_file_when_first_opened(suite: &Suite) -> Outcome {
    let stored = provider_scene(suite, NAMESPACE, PROVIDER, lazy_pod).await?;
    let vault = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = vault.path().join("root");
    let kept = root.join(NAMESPACE).join("web");
    std::fs::create_dir_all(&kept).map_err(|e| e.to_string())?;
    std::fs::write(kept.join("db-password"), "s3cret-of-web").map_err(|e| e.to_string())?;
    std::fs::write(kept.join("api-key"), "k3y-of-web").map_err(|e| e.to_string())?;
    let wrapper = logging_example_helper(vault.path(), &root)?;
    let calls = || helper_calls(vault.path());
    let providers =
        one_provider(json!({"name": PROVIDER, "kind": "exec", "helper": wrapper, "mode": "lazy", "cacheTTL": "1h"}))?;
    let driver = InProcessDriver::start_with(suite, providers).await?;
    let mut node = NodeClient::new(channel(driver.socket.clone()).await?);

    let result = async {
        let target = driver.dir.path().join("pods/web/volumes/kubernetes.io~csi/vault/mount");
        let request = kubelet_request(&stored[0], "vault", &target)?;
        publish_as_kubelet(&mut node, &request)
            .await
            .map_err(|e| format!("publish allowed by the RoleBinding: {e}"))?;
        if !listed_in_mountinfo(&target).map_err(|e| e.to_string())? {
            return Err("the published lazy volume is not mounted at its target".into());
        }
        open_the_way(driver.dir.path(), &target)?;
        let listed: Vec<String> = std::fs::read_dir(target.join("secrets"))
            .map_err(|e| format!("listing the volume: {e}"))?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        let mount_call = format!("mount {}", target.display());
        if calls() != [mount_call.clone()] {
            return Err(format!("before any read the helper was called {:?}; expected only {mount_call:?}", calls()));
        }
        let mut sorted = listed.clone();
        sorted.sort();
        if sorted != ["api-key", "db-password"] {
            return Err(format!("the volume lists {listed:?}, expected the helper's two files"));
        }

        let file = target.join("secrets/db-password");
        for round in 0..3 {
            let read = read_as_nobody(&file)?;
            if read != "s3cret-of-web" {
                return Err(format!("read {round} as nobody gave {read:?}"));
            }
        }
        let expected = [mount_call.clone(), "get secrets/db-password".to_string()];
        if calls() != expected {
            return Err(format!("three reads made the helper calls {:?}; expected {expected:?}", calls()));
        }

        refused_use(&mut node, &driver, &stored[1], "vault", PROVIDER).await?;

        // The grant deleted: the driver's watch of bindings withdraws the files (the periodic
        // refresh is an hour away), and an open is refused.
        Api::<RoleBinding>::namespaced(suite.admin.clone(), NAMESPACE)
            .delete(&format!("reader-uses-{PROVIDER}"), &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let view = |target: &Path| match read_as_nobody(&target.join("secrets/db-password")) {
            Err(complaint) if complaint.ends_with("Permission denied") => "EACCES".to_string(),
            Err(complaint) => complaint,
            Ok(content) => format!("read {content:?}"),
        };
        let took = wait_for_view(&target, "revoked", view, &"EACCES".to_string(), |seen| seen.clone()).await?;
        println!("lazy provider use revoked: the files stopped opening after {took:?}");
        unpublished(&mut node, &request, &target).await?;
        if listed_in_mountinfo(&target).map_err(|e| e.to_string())? {
            return Err("the unpublished lazy volume is still mounted".into());
        }
        Ok(())
    }
    .await;
    // The scenario's failure first; a driver failure or a leftover mount otherwise.
    result.and(driver.stop().await)
}
