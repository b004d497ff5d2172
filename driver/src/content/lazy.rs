//! A lazy volume as the volume layer sees it: files fetched only when software in the container
//! first opens them ([`LazyFiles`]), which the volume layer serves through FUSE. What a source
//! hands the volume layer for such a volume is this face; which source made the files (today a
//! lazy `exec` provider's helper, in `external::lazy_files`) stays behind it. Also here: what a
//! path is ([`EntryKind`]), a file's content as fetched ([`Fetched`]), where its memory is
//! counted besides the volume's own bound ([`MemoryCharge`]), and the files as they travel to a
//! successor process at a planned restart ([`HandedFiles`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Map, Value};

use crate::content::error::Result;

/// The files of one lazy volume.
pub trait LazyFiles: Send + Sync + std::fmt::Debug {
    /// What `path` is (`""`: the root), or `None` when the volume has nothing there.
    fn kind(&self, path: &str) -> Option<EntryKind>;
    /// What directory `path` lists, by name; `None` when it is no directory. A directory may
    /// list nothing and still show a file for a name looked up in it (an open directory).
    fn listing(&self, path: &str) -> Option<Vec<(String, EntryKind)>>;
    /// How long content is served before it is fetched again (and how long the kernel may keep
    /// what it was told of names and sizes).
    fn cache_ttl(&self) -> Duration;
    /// Where reads run their fetches.
    fn runtime(&self) -> &tokio::runtime::Handle;
    /// The size of `path` and how long it stays fresh, when its content is cached and fresh.
    fn cached(&self, path: &str) -> Option<(u64, Duration)>;
    /// The content of `path` when it is cached, fresh and not withdrawn, without waiting;
    /// `None` otherwise (then [`LazyFiles::read`]).
    fn cached_content(&self, path: &str) -> Option<Fetched>;
    /// The content of the file at `path`, from the cache while fresh, otherwise fetched.
    /// Withdrawn: `Denied`; no such file: `Missing`; the fetch failing: `Unavailable`, for this
    /// file only.
    fn read<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Fetched>>;
    /// Withdraws the volume's files (`true`: access was lost) or gives them back; whether that
    /// changed anything. Withdrawn, every open fails and nothing stays cached.
    fn set_withdrawn(&self, withdrawn: bool) -> bool;
    /// Counts the content held in memory in `charge` too from now on (once: a later charge is
    /// ignored). Content held before is not counted there.
    fn charge_to(&self, charge: Arc<dyn MemoryCharge>);
    /// Content `id`, as the process that served the volume before named it, of `bytes`: the
    /// content of a file it handed over open, counted as the volume's; the ids given from now
    /// on come after it.
    fn adopt(&self, id: u64, bytes: Vec<u8>) -> Fetched;
    /// What a successor process needs to serve these files as this one does, without asking
    /// for them again.
    fn handed(&self) -> HandedFiles;
}

/// Where a lazy volume's content in memory is also counted, besides its own bound: the node's
/// content budget, for the volume's namespace (given by the volume layer, which keeps it).
pub trait MemoryCharge: Send + Sync {
    /// Counts `bytes` more; refused (nothing counted) when that would exceed the budget, saying
    /// which.
    fn grow(&self, bytes: u64) -> std::result::Result<(), String>;
    /// Counts `bytes` fewer.
    fn shrink(&self, bytes: u64);
}

/// What a path of the volume is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory (the root, an enabled directory, or one on the way to either).
    Directory,
    /// A file.
    File,
}

/// A file's content as a fetch had it. Its `id` names the content: a later fetch that brings
/// the same bytes keeps the id, so whoever keeps an id (the kernel's page cache of the file)
/// knows whether content is unchanged without keeping the content itself. Its bytes count
/// against their volume's bound for as long as anything (the cache, an open file) holds them.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Unique in its volume per distinct content had.
    pub id: u64,
    held: Arc<Held>,
}

/// Bytes in memory, counted in their volume's `live` (and its charge, when it has one) while
/// they are.
struct Held {
    bytes: Box<[u8]>,
    live: Arc<AtomicU64>,
    charge: Option<Arc<dyn MemoryCharge>>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.bytes.len())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.live.fetch_sub(self.bytes.len() as u64, Ordering::Relaxed);
        if let Some(charge) = &self.charge {
            charge.shrink(self.bytes.len() as u64);
        }
    }
}

impl Fetched {
    /// Content `id` of `bytes`, already counted in `live` (and in `charge`, when given): both
    /// are given back when the last holder of the content lets it go.
    pub fn counted(id: u64, bytes: Box<[u8]>, live: Arc<AtomicU64>, charge: Option<Arc<dyn MemoryCharge>>) -> Fetched {
        Fetched { id, held: Arc::new(Held { bytes, live, charge }) }
    }

    /// Content `id` of `bytes`, counted in no volume: for tests of what keeps contents.
    #[cfg(test)]
    pub fn detached(id: u64, bytes: &[u8]) -> Fetched {
        let live = Arc::new(AtomicU64::new(bytes.len() as u64));
        Fetched::counted(id, bytes.into(), live, None)
    }
}

impl std::ops::Deref for Fetched {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.held.bytes
    }
}

/// The files of a lazy volume as they travel to a successor process (see
/// [`LazyFiles::handed`]): whose they are, and what that source needs to serve them again, in
/// its own form. That state may hold the pod's tokens: never printed.
#[derive(Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HandedFiles {
    /// The provider's name.
    pub provider: String,
    /// The namespace whose share of the node's fetches the volume's reads take.
    pub namespace: String,
    /// What the provider's source keeps to serve the files again; beside the two fields above
    /// on the wire, so a predecessor and a successor of different versions read each other.
    #[serde(flatten)]
    pub state: Map<String, Value>,
}

impl std::fmt::Debug for HandedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HandedFiles(provider {}, namespace {})", self.provider, self.namespace)
    }
}

#[cfg(test)]
impl HandedFiles {
    /// The files of provider `vault` serving directory `secrets` for namespace `team-a`,
    /// passing a token on each get.
    pub fn example() -> HandedFiles {
        let state = Map::from_iter([
            ("enable_dirs".to_string(), serde_json::json!(["secrets"])),
            ("mount_param".to_string(), serde_json::json!(["token"])),
            ("files".to_string(), serde_json::json!({})),
            ("rooted".to_string(), Value::Bool(false)),
            ("options".to_string(), serde_json::json!({"token": "t0ken"})),
            ("withdrawn".to_string(), Value::Bool(false)),
        ]);
        HandedFiles { provider: "vault".into(), namespace: "team-a".into(), state }
    }
}
