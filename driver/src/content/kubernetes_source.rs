//! The content source of a cluster: a volume names one thing in its attributes (a share, a
//! projection or a provider, by the vocabulary's rules), and this file sends its ask to that
//! thing's source, each reading the cluster through the one [`Cluster`] handle: a share's
//! (`shares::source`), a projection's (`projection::fetch`, which reads shares through the
//! shares' source), a provider's (`external::provider_volume`). The only place the three meet.

use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::client::ApiserverClients;
use crate::content::ask::VolumeAsk;
use crate::content::changes::{Absence, Changes};
use crate::content::cluster::node_view::VolumeReads;
use crate::content::cluster::{Cluster, NoticeSettings};
use crate::content::error::Result;
use crate::content::external::provider_volume;
use crate::content::external::providers::Providers;
use crate::content::lazy::{HandedFiles, LazyFiles};
use crate::content::payload::Payload;
use crate::content::projection::fetch::{self, ProjectionOptions};
use crate::content::shares;
use crate::content::shares::source::ShareFiles;
use crate::content::{ContentSource, PassId};
use crate::metrics::Metrics;
use sharedresource_api::node_view::NoticedObject;
use sharedresource_api::volume_attributes::{OPTIONAL_ATTRIBUTE, selection};
use sharedresource_api::{Selection, VolumeAttributes};

mod absences;

use absences::Absences;

/// Shares, projections and providers' volumes, read from the cluster.
pub struct KubernetesSource {
    cluster: Cluster,
    projections: ProjectionOptions,
    /// The providers of secrets kept outside Kubernetes this node runs.
    providers: Providers,
    /// What each volume lacks of what it marks optional.
    absences: Absences,
}

impl KubernetesSource {
    /// A source asking the cluster `clients` talk to (requests on one client, watches on the
    /// other), on `runtime`, counting into `metrics`, whose watches start now. Each request is
    /// given up after 10 s ([`KubernetesSource::with_request_timeout`] changes it).
    pub fn new(
        clients: impl Into<ApiserverClients>,
        runtime: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
    ) -> KubernetesSource {
        KubernetesSource {
            cluster: Cluster::new(clients, runtime, metrics),
            projections: ProjectionOptions { pod_metadata: false, content_limit: u64::MAX },
            providers: Providers::default(),
            absences: Absences::default(),
        }
    }

    /// The same source, refusing a projection whose files would hold more than `bytes` (the
    /// volume's tmpfsSize) before composing further.
    pub fn with_content_limit(mut self, bytes: u64) -> KubernetesSource {
        self.projections.content_limit = bytes;
        self
    }

    /// The same source as node `node`: reporting in the shares' status the volumes of this node
    /// that could not take an update, and hearing of grant changes through its own object as
    /// `notices` says.
    pub fn with_node(mut self, node: String, notices: NoticeSettings) -> KubernetesSource {
        self.cluster = self.cluster.with_node(node, notices);
        self
    }

    /// The same source, giving up each request after `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> KubernetesSource {
        self.cluster = self.cluster.with_request_timeout(timeout);
        self
    }

    /// The same source, holding an access answer for about `recheck` (±10%) unless a grant's
    /// change concerns it first (`accessRecheckSeconds`; 600 s unless changed).
    pub fn with_access_recheck(mut self, recheck: Duration) -> KubernetesSource {
        self.cluster = self.cluster.with_access_recheck(recheck);
        self
    }

    /// The same source, reading pods for projections that show their labels or annotations
    /// when `allowed` (off unless asked: it needs `get pods` cluster-wide).
    pub fn with_pod_metadata(mut self, allowed: bool) -> KubernetesSource {
        self.projections.pod_metadata = allowed;
        self
    }

    /// The same source, serving volumes that name one of `providers`.
    pub fn with_providers(mut self, providers: Providers) -> KubernetesSource {
        self.providers = providers;
        self
    }

    /// Where the source notes what changed.
    #[cfg(test)]
    pub(crate) fn change_log(&self) -> &Changes {
        self.cluster.changes()
    }

    /// The files of `request`'s volume, from the source of what it names; what it began to lack
    /// of what it marks optional is told to its pod (through the changes, to the refresher).
    async fn payload(&self, request: &VolumeAsk, pass: Option<PassId>) -> Result<Payload> {
        let cluster = &self.cluster;
        let selection = volume_of(request)?;
        // Before any access is asked or anything read: a grant change, or a change of what it
        // reads, from now on reaches this volume.
        let object = match &selection {
            Selection::Share(kind, share) => Some(NoticedObject::Share(*kind, share.as_str().to_string())),
            Selection::Projection(name) => {
                Some(NoticedObject::Projection(request.pod.namespace.clone(), name.as_str().to_string()))
            }
            Selection::Provider(_) => None,
        };
        cluster.node_view().note(&request.volume_id, VolumeReads::of(&request.pod, object));
        let (files, absent) = match selection {
            Selection::Share(kind, share) => {
                let optional = request.attributes.get(OPTIONAL_ATTRIBUTE).is_some_and(|value| value == "true");
                match shares::source::payload(cluster, &request.pod, kind, &share, optional, pass).await? {
                    ShareFiles::Read(files) => (files, Vec::new()),
                    ShareFiles::Absent(what) => (Payload::new(), vec![what]),
                }
            }
            Selection::Projection(name) => fetch::payload(cluster, &self.projections, request, &name, pass).await?,
            Selection::Provider(name) => {
                (provider_volume::payload(cluster, &self.providers, request, &name, pass).await?, Vec::new())
            }
        };
        let begun = self.absences.note(&request.volume_id, absent);
        if !begun.is_empty() {
            cluster.changes().absent(Absence {
                pod: request.pod.clone(),
                volume_name: request.volume_name.clone(),
                attributes: request.attributes.clone(),
                absent: begun,
            });
        }
        Ok(files)
    }
}

/// What a request's volume mounts: the one thing it names, by the vocabulary's rules. The other
/// attributes are checked at publish ([`ContentSource::check_attributes`]), not at each refresh.
fn volume_of(request: &VolumeAsk) -> Result<Selection> {
    Ok(selection(&request.attributes)?)
}

impl ContentSource for KubernetesSource {
    fn ready(&self) -> bool {
        true
    }

    fn content(&self, request: &VolumeAsk) -> Result<Payload> {
        self.cluster.runtime().block_on(self.payload(request, None))
    }

    fn check_attributes(&self, request: &VolumeAsk) -> Result<()> {
        VolumeAttributes::parse(&request.attributes)?;
        Ok(())
    }

    fn content_in_pass(&self, request: &VolumeAsk, pass: PassId) -> Result<Payload> {
        self.cluster.runtime().block_on(self.payload(request, Some(pass)))
    }

    fn lazy(&self, request: &VolumeAsk) -> Result<Option<Arc<dyn LazyFiles>>> {
        let reads = VolumeReads::of(&request.pod, None);
        self.cluster.node_view().note(&request.volume_id, reads);
        let lazy = provider_volume::lazy_files(&self.cluster, &self.providers, request);
        self.cluster.runtime().block_on(lazy)
    }

    fn lazy_handed(&self, handed: HandedFiles) -> Result<Arc<dyn LazyFiles>> {
        // On the source's runtime: the files' gets run there.
        let _entered = self.cluster.runtime().enter();
        Ok(Arc::new(self.providers.lazy_handed(handed)?))
    }

    fn changes(&self) -> Option<Arc<Changes>> {
        Some(self.cluster.changes().clone())
    }

    fn refresh_ended(
        &self,
        volume_id: &str,
        attributes: &std::collections::BTreeMap<String, String>,
        why: Option<&str>,
    ) {
        // A share's volume only: a projection's failure may be the projection's, not a share's.
        if let Ok(Selection::Share(kind, share)) = selection(attributes) {
            let share = (kind, share.as_str().to_string());
            let now = std::time::SystemTime::now();
            self.cluster.update_failures().refreshed(volume_id, share, why.map(str::to_string), now);
        }
    }

    fn live_volumes(&self, volume_ids: &std::collections::HashSet<String>) {
        self.absences.retain_live(volume_ids);
        self.cluster.update_failures().retain_live(volume_ids);
        self.cluster.node_view().retain_live(volume_ids);
    }

    fn released(&self, volume_id: &str) {
        self.providers.release(volume_id);
        self.absences.forget(volume_id);
        self.cluster.update_failures().released(volume_id);
        self.cluster.node_view().released(volume_id);
    }

    fn object_versions(&self, volume_id: &str) -> std::collections::BTreeMap<String, String> {
        self.providers.object_versions(volume_id)
    }

    fn start_pass(&self, pass: PassId) {
        self.cluster.start_pass(pass);
    }

    fn end_pass(&self, pass: PassId) {
        self.cluster.end_pass(pass);
    }
}

#[cfg(test)]
mod tests;
