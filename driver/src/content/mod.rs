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
pub mod share_entries;
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

/// Why a volume is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A new publish: its attributes are checked in full, and a lazy provider's volume is
    /// opened as lazy files.
    Publish,
    /// A refresh (within a pass when given): the files as they are now. The attributes are not
    /// checked again, so a volume published before a rule was added keeps its content (only
    /// what it names decides that).
    Refresh(Option<PassId>),
}

/// What a volume shows.
pub enum Shown {
    /// Files laid out in full.
    Files(Payload),
    /// Files fetched when opened (a lazy provider's).
    Lazy(std::sync::Arc<dyn lazy::LazyFiles>),
}

/// A volume as its source opened it: what it shows, and what the source answered that the
/// volume's record keeps and sends back in its next ask.
pub struct Opened {
    /// What the volume shows.
    pub shown: Shown,
    /// What its provider answered, by object (a Secrets Store provider's object versions);
    /// empty for other sources.
    pub versions: std::collections::BTreeMap<String, String>,
    /// What it lacks of what it marks optional (objects that do not exist), each said in
    /// words its pod is told; the volume layer tells the pod when an absence begins.
    pub absent: Vec<String>,
}

impl Opened {
    /// Files laid out in full, with no versions.
    pub fn files(payload: Payload) -> Opened {
        Opened { shown: Shown::Files(payload), versions: Default::default(), absent: Vec::new() }
    }

    /// The files laid out in full, or why the volume shows lazy files.
    pub fn into_files(self) -> Result<Payload> {
        match self.shown {
            Shown::Files(payload) => Ok(payload),
            Shown::Lazy(_) => Err(error::Error::Internal("a lazy volume has no files laid out in full".into())),
        }
    }
}

/// Which volumes are gone, for a source to drop what it kept for them alone.
#[derive(Debug, Clone, Copy)]
pub enum Gone<'a> {
    /// This one was unpublished.
    Volume(&'a str),
    /// Every volume but these, the ones published now (told every few seconds): what the
    /// source kept for a volume missing from two of these in a row may go (a refresh that ended
    /// just after an unpublish noted it again; a publish not yet in the table is spared by the
    /// second look).
    AllBut(&'a std::collections::HashSet<String>),
}

/// Produces the files of a volume.
pub trait ContentSource: Send + Sync {
    /// True once the source can serve (Probe reports it).
    fn ready(&self) -> bool;
    /// What `ask`'s volume shows now, opened for `opening`, or why it may not have it. Within a
    /// refresh pass, answers may be shared with the other volumes of the pass (one access check
    /// per service account and share, not per volume).
    fn open(&self, ask: &VolumeAsk, opening: Opening) -> Result<Opened>;
    /// Where the source notes what changed, so a refresh need not wait for its interval and
    /// covers only the volumes touched; `None` for a source that cannot tell.
    fn changes(&self) -> Option<std::sync::Arc<crate::content::changes::Changes>> {
        None
    }
    /// Refresh pass `pass` starts.
    fn start_pass(&self, pass: PassId) {
        let _ = pass;
    }
    /// Refresh pass `pass` is over: its shared answers are dropped, what it saw is reported,
    /// and this node's entries in the shares' status are written where they differ from
    /// `entries` (what the node's volumes' refreshes say now; `None`: the pass says nothing of
    /// them, and what was wanted before stands).
    fn end_pass(&self, pass: PassId, entries: Option<share_entries::ShareEntries>) {
        let _ = (pass, entries);
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
    /// Volumes are gone: whatever the source kept for them alone may go.
    fn gone(&self, gone: Gone<'_>) {
        let _ = gone;
    }
}
