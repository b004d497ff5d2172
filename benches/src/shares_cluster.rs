//! A real control plane set up as the shares benchmarks need it: the driver's CRDs and RBAC as
//! shipped, the read-grants controller running (in this process, as its shipped
//! ServiceAccount) so that the driver may read what shares name, and the apiserver and etcd
//! pinned to their own core.

use std::path::Path;
use std::time::{Duration, Instant};

use inline_guard_tests::apply::{apply, objects};
use inline_guard_tests::cluster::Cluster;
use inline_guard_tests::repo_root;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

/// The driver's identity in `config/deploy/driver/rbac.yaml`.
pub const DRIVER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-csi-driver";
/// The groups every service account has, which the driver's requests carry.
pub const DRIVER_GROUPS: [&str; 3] =
    ["system:serviceaccounts", "system:serviceaccounts:inline-guard-driver", "system:authenticated"];
/// The read-grants controller's identity in `config/deploy/driver/read-grants.yaml`.
const READ_GRANTS: &str = "system:serviceaccount:inline-guard-driver:sharedresource-read-grants";

/// POSTs `object` to `path` as `admin`.
pub async fn post(admin: &kube::Client, path: &str, object: serde_json::Value) -> Result<(), String> {
    let request = hyper::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&object).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    admin.request_text(request).await.map(drop).map_err(|e| format!("POST {path}: {e}"))
}

/// Applies the shipped namespaces (the admission side's and the driver's), CRDs, driver RBAC and read-grants RBAC, waits until the CRDs
/// are served, and starts the read-grants controller; it runs until the returned task is
/// aborted or the runtime ends.
pub async fn install_driver(cluster: &Cluster, admin: &kube::Client) -> Result<tokio::task::JoinHandle<()>, String> {
    install_driver_answering(cluster, admin, true).await
}

/// [`install_driver`], its access-notices controller answering the nodes' access questions
/// (`answers`, as shipped) or not (each node asks its own after every notice: the design before).
pub async fn install_driver_answering(
    cluster: &Cluster,
    admin: &kube::Client,
    answers: bool,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let deploy = repo_root().join("config/deploy");
    let mut setup = objects(&deploy.join("namespace.yaml"))?;
    setup.extend(objects(&deploy.join("driver/namespace.yaml"))?);
    setup.extend(objects(&deploy.join("driver/crds.yaml"))?);
    setup.extend(objects(&deploy.join("driver/rbac.yaml"))?);
    // Its Deployment is this process's task below: no node here runs pods.
    let read_grants = objects(&deploy.join("driver/read-grants.yaml"))?;
    setup.extend(read_grants.into_iter().filter(|object| object["kind"] != "Deployment"));
    apply(admin, &setup, false).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let shares = kube::api::Api::<kube::api::DynamicObject>::all_with(
        admin.clone(),
        &kube::api::ApiResource {
            group: "sharedresource.inlineguard.dev".into(),
            version: "v1alpha1".into(),
            api_version: "sharedresource.inlineguard.dev/v1alpha1".into(),
            kind: "SharedSecret".into(),
            plural: "sharedsecrets".into(),
        },
    );
    while shares.list(&Default::default()).await.is_err() {
        if Instant::now() > deadline {
            return Err("the SharedSecret CRD was not served within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let controller = cluster.client_as(READ_GRANTS, &[]).await?;
    let driver = sharedresource_csi_driver::controllers::read_grants::plan::DriverAccount::parse(
        "inline-guard-driver/sharedresource-csi-driver",
    )?;
    // The read-grants program runs the access notices beside the grants, as shipped.
    let notices = sharedresource_csi_driver::controllers::access_notices::controller::NoticeSettings {
        lease: sharedresource_api::node_view::LeaseRef::parse(sharedresource_api::node_view::DEFAULT_LEASE)?,
        timeout: Duration::from_secs(10),
        answers,
    };
    let grants = sharedresource_csi_driver::controllers::read_grants::controller::run(
        controller.clone(),
        driver,
        Duration::from_secs(10),
    );
    let notices = sharedresource_csi_driver::controllers::access_notices::controller::run(controller, notices);
    Ok(tokio::spawn(async move {
        futures_util::future::join(grants, notices).await;
    }))
}

/// Waits until `driver` may read Secret `namespace/name` (the read-grants controller granted it).
pub async fn wait_readable(driver: &kube::Client, namespace: &str, name: &str) -> Result<(), String> {
    let secrets = Api::<Secret>::namespaced(driver.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(60);
    while secrets.get_metadata(name).await.is_err() {
        if Instant::now() > deadline {
            return Err(format!("the driver could not read Secret {namespace}/{name} within 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Pins every process running one of `programs` to CPU 0 and this process to CPU 1; says what
/// it did (on a machine with one core, nothing).
pub fn pin(programs: &[&Path]) -> String {
    // The machine's cores, not this process's: after a first run pinned it, it sees one.
    let cores = nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN).ok().flatten().unwrap_or(1);
    if cores < 2 {
        return "one core: nothing pinned".into();
    }
    let mut pinned = 0;
    for pid in pids_of(programs) {
        let ok = std::process::Command::new("taskset").args(["-a", "-p", "-c", "0", &pid.to_string()]).output();
        pinned += usize::from(ok.is_ok_and(|o| o.status.success()));
    }
    let me =
        std::process::Command::new("taskset").args(["-a", "-p", "-c", "1", &std::process::id().to_string()]).output();
    let me = if me.is_ok_and(|o| o.status.success()) { "this process on CPU 1" } else { "this process not pinned" };
    format!("{pinned} server processes (apiserver, etcd, peers) on CPU 0, {me}")
}

/// The processes running one of `programs`.
pub fn pids_of(programs: &[&Path]) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let exe = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
        if programs.iter().any(|p| exe == *p) {
            pids.push(pid);
        }
    }
    pids
}
