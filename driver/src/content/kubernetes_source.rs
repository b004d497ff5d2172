//! The content source of a cluster: a volume names one thing in its attributes (a share, a
//! projection or a provider, by the vocabulary's rules), and this file sends its ask to that
//! thing's source, each reading the cluster through the one [`Cluster`] handle: a share's
//! (`shares::source`), a projection's (`projection::fetch`, which reads shares through the
//! shares' source), a provider's (`external::provider_volume`). The only place the three meet.

use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::client::ApiserverClients;
use crate::content::ask::VolumeAsk;
use crate::content::changes::Changes;
use crate::content::cluster::node_view::VolumeReads;
use crate::content::cluster::{Cluster, NoticeSettings};
use crate::content::error::Result;
use crate::content::external::provider_volume;
use crate::content::external::providers::Providers;
use crate::content::lazy::{HandedFiles, LazyFiles};
use crate::content::payload::Payload;
use crate::content::projection::fetch::{self, ProjectionOptions};
use crate::content::share_entries::ShareEntries;
use crate::content::shares;
use crate::content::shares::source::ShareFiles;
use crate::content::{ContentSource, Gone, Opened, Opening, PassId, Shown};
use crate::metrics::Metrics;
use sharedresource_api::node_view::NoticedObject;
use sharedresource_api::volume_attributes::{OPTIONAL_ATTRIBUTE, selection};
use sharedresource_api::{Selection, VolumeAttributes};

/// Shares, projections and providers' volumes, read from the cluster.
pub struct KubernetesSource {
    cluster: Cluster,
    projections: ProjectionOptions,
    /// The providers of secrets kept outside Kubernetes this node runs.
    providers: Providers,
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

    /// What `request`'s volume shows, from the source of what it names (the one dispatch),
    /// with what it lacks of what it marks optional.
    async fn opened(&self, request: &VolumeAsk, opening: Opening) -> Result<Opened> {
        let cluster = &self.cluster;
        let selection = match opening {
            Opening::Publish => VolumeAttributes::parse(&request.attributes)?.selection,
            Opening::Refresh(_) => volume_of(request)?,
        };
        let pass = match opening {
            Opening::Publish => None,
            Opening::Refresh(pass) => pass,
        };
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
        let (opened, absent) = match selection {
            Selection::Share(kind, share) => {
                let optional = request.attributes.get(OPTIONAL_ATTRIBUTE).is_some_and(|value| value == "true");
                match shares::source::payload(cluster, &request.pod, kind, &share, optional, pass).await? {
                    ShareFiles::Read(files) => (Opened::files(files), Vec::new()),
                    ShareFiles::Absent(what) => (Opened::files(Payload::new()), vec![what]),
                }
            }
            Selection::Projection(name) => {
                let (files, absent) = fetch::payload(cluster, &self.projections, request, &name, pass).await?;
                (Opened::files(files), absent)
            }
            Selection::Provider(name) if opening == Opening::Publish && self.providers.is_lazy(name.as_str()) => {
                let files = provider_volume::lazy_files(cluster, &self.providers, request, &name).await?;
                (Opened { shown: Shown::Lazy(files), versions: Default::default(), absent: Vec::new() }, Vec::new())
            }
            Selection::Provider(name) => {
                let (files, versions) =
                    provider_volume::payload(cluster, &self.providers, request, &name, pass).await?;
                (Opened { shown: Shown::Files(files), versions, absent: Vec::new() }, Vec::new())
            }
        };
        Ok(Opened { absent, ..opened })
    }
}

/// What a request's volume mounts: the one thing it names, by the vocabulary's rules. The other
/// attributes are checked at publish only.
fn volume_of(request: &VolumeAsk) -> Result<Selection> {
    Ok(selection(&request.attributes)?)
}

impl ContentSource for KubernetesSource {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, request: &VolumeAsk, opening: Opening) -> Result<Opened> {
        self.cluster.runtime().block_on(self.opened(request, opening))
    }

    fn lazy_handed(&self, handed: HandedFiles) -> Result<Arc<dyn LazyFiles>> {
        // On the source's runtime: the files' gets run there.
        let _entered = self.cluster.runtime().enter();
        Ok(Arc::new(self.providers.lazy_handed(handed)?))
    }

    fn changes(&self) -> Option<Arc<Changes>> {
        Some(self.cluster.changes().clone())
    }

    fn gone(&self, gone: Gone<'_>) {
        match gone {
            Gone::Volume(volume_id) => self.cluster.node_view().released(volume_id),
            Gone::AllBut(live) => self.cluster.node_view().retain_live(live),
        }
    }

    fn start_pass(&self, pass: PassId) {
        self.cluster.start_pass(pass);
    }

    fn end_pass(&self, pass: PassId, entries: Option<ShareEntries>) {
        self.cluster.end_pass(pass, entries);
    }
}

#[cfg(test)]
mod tests;
