//! What a volume holds, and where it comes from. The face the volume layer sees: the trait every
//! source implements, what a volume asks of it ([`ask`], with the [`tokens`] kubelet passed), the
//! files it answers with ([`payload`]) or a lazy volume's files ([`lazy`]), why it could not
//! ([`error`]), and what changed and whom it concerns ([`changes`]). Behind it, the cluster's
//! source ([`kubernetes_source`], the one dispatcher) sends each volume to one source: the
//! cluster's shares ([`shares`]), projections of several sources ([`projection`]), or secrets
//! kept outside Kubernetes through the providers of the node's configuration ([`external`]);
//! each reads the cluster only through the floor below them ([`cluster`]). A directory of
//! static shares for demos is a source of its own ([`static_dir`]). Nothing here knows the CSI
//! wire, and nothing here writes where a volume is mounted; `driver/tests/layers.rs` holds the
//! imports to these floors.

pub mod ask;
pub mod changes;
pub mod cluster;
pub mod error;
pub mod external;
pub mod kubernetes_source;
pub mod lazy;
pub mod live_volumes;
pub mod payload;
pub mod projection;
pub mod shares;
pub mod static_dir;
pub mod tokens;

pub use ask::{PodInfo, VolumeAsk};
pub use kubernetes_source::KubernetesSource;
pub use payload::Payload;
pub use static_dir::StaticDirSource;

use crate::content::error::Result;

/// One refresh pass: the volumes a batch of changes touched. Answers may be shared between the
/// volumes of one pass, never between passes, so an answer from before a change can never serve
/// the pass that change started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PassId(pub u64);

/// Produces the files of a volume.
pub trait ContentSource: Send + Sync {
    /// True once the source can serve (Probe reports it).
    fn ready(&self) -> bool;
    /// The files for `ask` as they are now, or why it may not have them.
    fn content(&self, ask: &VolumeAsk) -> Result<Payload>;
    /// At a new publish only: whether the volume's attributes are all ones this source takes.
    /// Refreshes do not ask it again, so a volume published before a rule was added keeps its
    /// content (only what it names decides that).
    fn check_attributes(&self, ask: &VolumeAsk) -> Result<()> {
        let _ = ask;
        Ok(())
    }
    /// [`ContentSource::content`] within refresh pass `pass`: answers may be shared with the
    /// other volumes of the pass (one access check per service account and share, not per
    /// volume).
    fn content_in_pass(&self, ask: &VolumeAsk, pass: PassId) -> Result<Payload> {
        let _ = pass;
        self.content(ask)
    }
    /// Where the source notes what changed, so a refresh need not wait for its interval and
    /// covers only the volumes touched; `None` for a source that cannot tell.
    fn changes(&self) -> Option<std::sync::Arc<crate::content::changes::Changes>> {
        None
    }
    /// Refresh pass `pass` starts.
    fn start_pass(&self, pass: PassId) {
        let _ = pass;
    }
    /// Refresh pass `pass` is over: its shared answers are dropped (and what it saw reported).
    fn end_pass(&self, pass: PassId) {
        let _ = pass;
    }
    /// For a volume whose files are fetched only when opened (a lazy provider's), those files
    /// once the pod may have them; `None` for a volume whose content is laid out in full
    /// ([`ContentSource::content`]).
    fn lazy(&self, ask: &VolumeAsk) -> Result<Option<std::sync::Arc<dyn lazy::LazyFiles>>> {
        let _ = ask;
        Ok(None)
    }
    /// The files of a lazy volume a predecessor process served as `handed` (its handover, at
    /// a planned restart): laid out as they were, nothing fetched. A source without lazy
    /// volumes has none to take.
    fn lazy_handed(&self, handed: lazy::HandedFiles) -> Result<std::sync::Arc<dyn lazy::LazyFiles>> {
        Err(error::Error::Unservable(format!(
            "provider {}: this driver's content source serves no lazy volumes",
            crate::quote::quote(&handed.provider)
        )))
    }
    /// What the volume's provider answered last, by object (recorded with the volume and
    /// passed back in its ask); empty for sources without such versions.
    fn object_versions(&self, volume_id: &str) -> std::collections::BTreeMap<String, String> {
        let _ = volume_id;
        Default::default()
    }
    /// Volume `volume_id` was unpublished: whatever the source kept for it alone may go.
    fn released(&self, volume_id: &str) {
        let _ = volume_id;
    }
    /// The volumes published now, told every few seconds: what the source kept for a volume
    /// missing from two of these in a row may go (a refresh that ended just after an unpublish
    /// noted it again; a publish not yet in the table is spared by the second look).
    fn live_volumes(&self, volume_ids: &std::collections::HashSet<String>) {
        let _ = volume_ids;
    }
    /// A refresh of `volume_id` (with `attributes`) ended: it failed `why`, the volume serving
    /// its previous content, or succeeded (`None`). A share's source reports it in the share's
    /// status.
    fn refresh_ended(
        &self,
        volume_id: &str,
        attributes: &std::collections::BTreeMap<String, String>,
        why: Option<&str>,
    ) {
        let _ = (volume_id, attributes, why);
    }
}
