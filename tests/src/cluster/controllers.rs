//! The control plane's controllers: kube-controller-manager, running only the controllers the
//! suites rely on, and (for the scenarios that need pods placed) kube-scheduler, each
//! authenticating with a client certificate of its own
//! bootstrap identity (`system:kube-controller-manager`, `system:kube-scheduler`) as a kubeadm
//! cluster does, the controller-manager's controllers then acting as their own ServiceAccounts.

use std::path::Path;

use super::ChildProcess;

/// The controllers, and why each runs:
/// - `serviceaccount`: every namespace's `default` ServiceAccount, which the ServiceAccount
///   admission plugin requires before it admits a pod there;
/// - `root-ca-certificate-publisher`: `kube-root-ca.crt` in every namespace, which every pod's
///   token volume (`kube-api-access-*`) carries;
/// - `daemonset`, `deployment`, `replicaset`: the shipped DaemonSet and Deployment;
/// - `garbage-collector`: a deleted DaemonSet's or ReplicaSet's pods go (`kubectl delete`);
/// - `namespace`: a deleted namespace's contents go, then the namespace;
/// - `endpoints`, `endpointslice`: a Service's endpoints, which the apiserver dials for webhooks
///   (`--enable-aggregator-routing`: no kube-proxy runs);
/// - `disruption`: the PodDisruptionBudget's status;
/// - `node-lifecycle`: removes the `node.kubernetes.io/not-ready` taint kubelet registers its
///   Node with, once the Node is Ready; the scheduler places nothing on the node before.
const CONTROLLERS: &str = "serviceaccount-controller,root-ca-certificate-publisher-controller,daemonset-controller,\
deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,endpoints-controller,\
endpointslice-controller,disruption-controller,node-lifecycle-controller";

/// kube-controller-manager, and kube-scheduler when asked for, running.
pub struct Controllers {
    manager: ChildProcess,
    scheduler: Option<ChildProcess>,
}

/// What the controllers are given.
pub struct ControllerFiles<'a> {
    /// kube-controller-manager's kubeconfig.
    pub manager_kubeconfig: &'a Path,
    /// kube-scheduler's kubeconfig, when it runs.
    pub scheduler_kubeconfig: Option<&'a Path>,
    /// The ServiceAccount token signing key (the controllers' own tokens are signed with it).
    pub service_account_key: &'a Path,
    /// The CA of the apiserver's serving certificate, published as `kube-root-ca.crt`.
    pub root_ca: &'a Path,
}

impl Controllers {
    /// Starts the controller-manager, and the scheduler when `files` has its kubeconfig,
    /// logging into `dir`.
    pub fn start(manager: &Path, scheduler: &Path, files: &ControllerFiles, dir: &Path) -> Result<Controllers, String> {
        let path = |p: &Path| p.display().to_string();
        let manager = ChildProcess::spawn(
            "kube-controller-manager",
            manager,
            &[
                format!("--kubeconfig={}", path(files.manager_kubeconfig)),
                format!("--controllers={CONTROLLERS}"),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", path(files.service_account_key)),
                format!("--root-ca-file={}", path(files.root_ca)),
                // One instance: nothing to elect. Nothing scrapes it: no serving port.
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ],
            &[],
            dir,
        )?;
        let scheduler = match files.scheduler_kubeconfig {
            Some(kubeconfig) => Some(ChildProcess::spawn(
                "kube-scheduler",
                scheduler,
                &[
                    format!("--kubeconfig={}", path(kubeconfig)),
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                ],
                &[],
                dir,
            )?),
            None => None,
        };
        Ok(Controllers { manager, scheduler })
    }

    /// Fails with a log tail if either has exited.
    pub fn ensure_running(&mut self) -> Result<(), String> {
        self.manager.ensure_running()?;
        self.scheduler.as_mut().map_or(Ok(()), ChildProcess::ensure_running)
    }

    /// The last lines of both logs.
    pub fn log_tails(&self, lines: usize) -> String {
        let scheduler = self.scheduler.as_ref().map(|s| s.log_tail(lines)).unwrap_or_default();
        format!("{}\n{scheduler}", self.manager.log_tail(lines))
    }
}
