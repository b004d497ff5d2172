//! The files of one volume of a lazy `exec` provider: laid out from the helper's answer to
//! `mount` (its enabled directories, and the files it lists, if any), and each fetched with `get`
//! only when software in the container first opens it, then served from memory for the
//! provider's `cacheTTL`, so that reads, opens and stats within it never run the helper. An
//! enabled directory whose files the helper does not list shows a file for any name looked up in
//! it, as the FUSE flexVolume design does: the helper decides, at `get`, whether it exists.
//!
//! What the volume layer serves through FUSE asks here, by path; nothing here knows FUSE. Access
//! withdrawn (the refresher's access check) makes every open fail and drops what was cached.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use crate::fair_slots::FairSlots;

use super::helper_protocol::MountReply;
use super::helper_run;
use super::provider::ExecProvider;
use crate::content::error::{Error, Result};
use crate::content::lazy::{EntryKind, Fetched, HandedFiles, LazyFiles, MemoryCharge};
use crate::content::payload::check_key;
use crate::quote::quote;
use crate::unpoisoned::UnpoisonedMutex;

/// The most files one lazy volume keeps in memory at once: as many as a helper may list, so a
/// container looking up ever new names in an open directory cannot grow the driver without end.
pub const MAX_CACHED_FILES: usize = super::helper_protocol::MAX_LISTED_FILES;

/// The most `get`s one lazy volume runs at once: a container opening ever new names cannot take
/// the node's whole bound on helpers (`helperConcurrency`) from the other volumes.
pub const GETS_PER_VOLUME: usize = 2;

/// The node's helper slots and the namespace a volume's gets are counted against.
pub type HelperSlots = (Arc<FairSlots>, String);

/// A directory of the volume.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Directory {
    /// What it lists, by name.
    children: BTreeMap<String, EntryKind>,
    /// An enabled directory whose files the helper does not list: any name looked up is a file.
    open: bool,
}

/// The tree the helper's answer to `mount` describes: directories by path (`""` is the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyLayout {
    directories: BTreeMap<String, Directory>,
}

impl LazyLayout {
    /// The tree of `reply`. A path that is both a listed file and a directory is refused.
    pub fn of(reply: &MountReply) -> std::result::Result<LazyLayout, String> {
        let mut layout = LazyLayout { directories: BTreeMap::from([(String::new(), Directory::default())]) };
        for dir in &reply.enable_dirs {
            layout.add(dir, EntryKind::Directory)?;
            let listed = reply.files.contains_key(dir);
            if let Some(directory) = layout.directories.get_mut(dir.as_str()) {
                directory.open |= !listed;
            }
        }
        for path in reply.listed_paths() {
            layout.add(&path, EntryKind::File)?;
        }
        Ok(layout)
    }

    /// Adds `path` as `kind`, with every directory on the way to it.
    fn add(&mut self, path: &str, kind: EntryKind) -> std::result::Result<(), String> {
        let mut parent = String::new();
        let components: Vec<&str> = path.split('/').collect();
        for (index, name) in components.iter().enumerate() {
            let here = if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") };
            let wanted = if index + 1 == components.len() { kind } else { EntryKind::Directory };
            let siblings = &mut self.directories.entry(parent.clone()).or_default().children;
            match siblings.insert(name.to_string(), wanted) {
                Some(was) if was != wanted => {
                    return Err(format!("{} is both a file and a directory", quote(&here)));
                }
                _ => {}
            }
            if wanted == EntryKind::Directory {
                self.directories.entry(here.clone()).or_default();
            }
            parent = here;
        }
        Ok(())
    }

    /// What `path` is (`""`: the root), or `None` when the volume has nothing there.
    pub fn kind(&self, path: &str) -> Option<EntryKind> {
        if self.directories.contains_key(path) {
            return Some(EntryKind::Directory);
        }
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        let directory = self.directories.get(parent)?;
        match directory.children.get(name) {
            Some(kind) => Some(*kind),
            None if directory.open && check_key(path).is_ok() => Some(EntryKind::File),
            None => None,
        }
    }

    /// What directory `path` lists, by name; `None` when it is no directory. An open
    /// directory lists nothing of its own: its files appear when looked up by name.
    pub fn listing(&self, path: &str) -> Option<impl Iterator<Item = (&str, EntryKind)>> {
        let directory = self.directories.get(path)?;
        Some(directory.children.iter().map(|(name, kind)| (name.as_str(), *kind)))
    }
}

/// A file's content, as fetched at one moment.
struct Cached {
    content: Fetched,
    fetched: Instant,
}

/// One path's cache entry: locked while its `get` runs, so that opens of one file at once run
/// the helper once.
type Slot = Arc<tokio::sync::Mutex<Option<Cached>>>;

/// What a successor needs of a helper's lazy volume besides its provider and namespace (see
/// [`HandedFiles`]): the helper's answer to `mount`, the options (tokens among them) each `get`
/// passes, and whether access is withdrawn (a successor must not give back what a revocation
/// took). Its field names are the handover's wire form: renaming one breaks upgrades.
#[derive(serde::Serialize, serde::Deserialize)]
struct HelperState {
    enable_dirs: Vec<String>,
    mount_param: Vec<String>,
    files: BTreeMap<String, Vec<String>>,
    rooted: bool,
    options: Map<String, Value>,
    withdrawn: bool,
}

impl HelperState {
    /// The state as the handover's JSON object.
    fn into_map(self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            // A struct of strings, lists, maps and booleans is always an object.
            _ => Map::new(),
        }
    }

    /// The state a predecessor handed over, or why it cannot be read: the field and the kind of
    /// fault only, never a value (the options hold tokens).
    fn from_map(map: Map<String, Value>) -> std::result::Result<HelperState, String> {
        serde_path_to_error::deserialize(Value::Object(map))
            .map_err(|error| format!("{} is not in this version's form ({:?})", error.path(), error.inner().classify()))
    }
}

/// The files of one lazy volume of an `exec` provider: each fetched by the helper's `get`.
pub struct HelperFiles {
    provider: ExecProvider,
    permits: HelperSlots,
    own_permits: Semaphore,
    reply: MountReply,
    options: Map<String, Value>,
    layout: LazyLayout,
    runtime: tokio::runtime::Handle,
    cache: Mutex<HashMap<String, Slot>>,
    // The bytes of content held in memory for the volume (by its cache and its open files), and
    // the most they may be: the driver's own memory, which no tmpfs bound covers. A `get` whose
    // answer would take them beyond fails.
    live_bytes: Arc<AtomicU64>,
    max_live_bytes: u64,
    charge: std::sync::OnceLock<Arc<dyn MemoryCharge>>,
    withdrawn: AtomicBool,
    gets: AtomicU64,
    contents: AtomicU64,
}

// The options carry the pod's tokens: never printed.
impl std::fmt::Debug for HelperFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HelperFiles(provider {}, {:?})", self.provider.name.as_str(), self.layout)
    }
}

impl HelperFiles {
    /// The files `reply` describes, fetched from `provider` with `options`' values for its
    /// `mount-param` keys, within the node's helper slots `permits` (the pool, and the namespace
    /// whose part the volume's gets take), on `runtime`.
    pub fn new(
        provider: ExecProvider,
        permits: HelperSlots,
        reply: MountReply,
        options: Map<String, Value>,
        runtime: tokio::runtime::Handle,
    ) -> Result<HelperFiles> {
        let name = quote(provider.name.as_str());
        let unservable = |why: String| Error::Unservable(format!("provider {name}: the helper's mount: {why}"));
        let layout = LazyLayout::of(&reply).map_err(unservable)?;
        // Every `get` needs the values of `mount-param`: a key the options lack fails here,
        // at publish, not at each open.
        reply.get_arguments("", &options).map_err(unservable)?;
        Ok(HelperFiles {
            provider,
            permits,
            own_permits: Semaphore::new(GETS_PER_VOLUME),
            reply,
            options,
            layout,
            runtime,
            cache: Mutex::default(),
            live_bytes: Arc::default(),
            max_live_bytes: u64::MAX,
            charge: std::sync::OnceLock::new(),
            withdrawn: AtomicBool::new(false),
            gets: AtomicU64::new(0),
            contents: AtomicU64::new(0),
        })
    }

    /// The same files, holding at most `bytes` of content in memory at once, cached or open
    /// (the volume's tmpfsSize: a lazy volume keeps no more in the driver's memory than an eager
    /// one may in its tmpfs).
    pub fn with_memory_limit(mut self, bytes: u64) -> HelperFiles {
        self.max_live_bytes = bytes;
        self
    }

    /// The bytes of content held in memory for the volume, cached or open.
    #[cfg(test)]
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// The tree of the volume.
    pub fn layout(&self) -> &LazyLayout {
        &self.layout
    }

    /// How many `get`s this volume has run.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::Relaxed)
    }

    /// The cached content of `path` and how long it stays fresh, unless a fetch of it is under way.
    fn fresh(&self, path: &str) -> Option<(Fetched, Duration)> {
        let slot = self.cache.locked().get(path).cloned()?;
        let cached = slot.try_lock().ok()?;
        let cached = cached.as_ref()?;
        let fresh_for = self.cache_ttl().checked_sub(cached.fetched.elapsed()).filter(|left| !left.is_zero())?;
        Some((cached.content.clone(), fresh_for))
    }

    /// Whether the volume's files are withdrawn.
    pub fn withdrawn(&self) -> bool {
        self.withdrawn.load(Ordering::SeqCst)
    }

    /// The files a predecessor served as `handed`, served by `provider` (which must be the one
    /// `handed` names, in lazy mode) with this node's helper `slots`: laid out and checked as
    /// at publish, nothing fetched; withdrawn if they were.
    pub fn from_handed(
        handed: HandedFiles,
        provider: ExecProvider,
        slots: Arc<FairSlots>,
        runtime: tokio::runtime::Handle,
    ) -> Result<HelperFiles> {
        let state = HelperState::from_map(handed.state).map_err(|why| {
            Error::Unservable(format!("provider {}: the files handed over: {why}", quote(&handed.provider)))
        })?;
        let reply = MountReply {
            enable_dirs: state.enable_dirs,
            mount_param: state.mount_param,
            files: state.files,
            rooted: state.rooted,
        };
        let files = HelperFiles::new(provider, (slots, handed.namespace), reply, state.options, runtime)?;
        files.withdrawn.store(state.withdrawn, Ordering::SeqCst);
        Ok(files)
    }

    /// `bytes` under an id of its own, counted in the volume's memory; refused when the volume
    /// holds its bound already.
    fn new_content(&self, bytes: Vec<u8>) -> Result<Fetched> {
        let size = bytes.len() as u64;
        let live = self.live_bytes.fetch_add(size, Ordering::Relaxed).saturating_add(size);
        if live > self.max_live_bytes {
            self.live_bytes.fetch_sub(size, Ordering::Relaxed);
            return Err(Error::TooLarge(format!(
                "provider {}: the volume's files in memory (cached or open) would hold more than {} bytes, its \
                 size (tmpfsSize); close files it holds open",
                quote(self.provider.name.as_str()),
                self.max_live_bytes
            )));
        }
        let charge = self.charge.get().cloned();
        if let Some(charge) = &charge
            && let Err(refusal) = charge.grow(size)
        {
            self.live_bytes.fetch_sub(size, Ordering::Relaxed);
            return Err(Error::TooLarge(format!("provider {}: {refusal}", quote(self.provider.name.as_str()))));
        }
        let id = self.contents.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Fetched::counted(id, bytes.into_boxed_slice(), self.live_bytes.clone(), charge))
    }

    /// The cache entry of `path`, made if missing; `None` when the cache is full of fresh
    /// entries (the file is then fetched without being kept).
    fn slot(&self, path: &str) -> Option<Slot> {
        let mut cache = self.cache.locked();
        if let Some(slot) = cache.get(path) {
            return Some(slot.clone());
        }
        if cache.len() >= MAX_CACHED_FILES {
            let ttl = self.cache_ttl();
            // An entry being fetched is locked and kept; an expired one costs a `get` either way.
            cache.retain(|_, slot| {
                slot.try_lock().map_or(true, |c| c.as_ref().is_some_and(|c| c.fetched.elapsed() < ttl))
            });
            if cache.len() >= MAX_CACHED_FILES {
                return None;
            }
        }
        Some(cache.entry(path.to_string()).or_default().clone())
    }

    /// One `get` of `path`, once the node's bound lets it run.
    async fn get(&self, path: &str) -> Result<Vec<u8>> {
        let name = quote(self.provider.name.as_str());
        let arguments = self
            .reply
            .get_arguments(path, &self.options)
            .map_err(|why| Error::Unservable(format!("provider {name}: the helper's mount: {why}")))?;
        let arguments: Vec<OsString> = arguments.into_iter().map(OsString::from).collect();
        let closed = |_| Error::Internal("a bound on helpers running at once is closed".into());
        // The volume's own bound first: waiting for the node's, it holds none of the node's.
        let _own = self.own_permits.acquire().await.map_err(closed)?;
        let _permit = self.permits.0.acquire(&self.permits.1).await;
        self.gets.fetch_add(1, Ordering::Relaxed);
        let provider = &self.provider;
        helper_run::run(&provider.helper, provider.run_as, &arguments, provider.timeout, provider.max_file_bytes)
            .await
            .map_err(|failure| {
                Error::Unavailable(format!("provider {name}: the helper's get {} {failure}", quote(path)))
            })
    }

    /// The content of the file at `path`: from the cache within the TTL, otherwise from the
    /// helper's `get`. Withdrawn: [`Error::Denied`]; no such file: [`Error::Missing`]; the
    /// helper failing: [`Error::Unavailable`], for this file only.
    async fn read_now(&self, path: &str) -> Result<Fetched> {
        let name = quote(self.provider.name.as_str());
        if self.withdrawn() {
            return Err(Error::Denied(format!("provider {name}: access to the volume's files was withdrawn")));
        }
        if self.layout.kind(path) != Some(EntryKind::File) {
            return Err(Error::Missing(format!("provider {name}: no file {}", quote(path))));
        }
        let Some(slot) = self.slot(path) else {
            let bytes = self.get(path).await?;
            return self.new_content(bytes);
        };
        let mut cached = slot.lock().await;
        if let Some(fresh) = cached.as_ref().filter(|c| c.fetched.elapsed() < self.cache_ttl()) {
            return Ok(fresh.content.clone());
        }
        let bytes = self.get(path).await?;
        // A revocation while the helper ran: its answer is not kept, nor served.
        if self.withdrawn() {
            return Err(Error::Denied(format!("provider {name}: access to the volume's files was withdrawn")));
        }
        let content = match cached.take() {
            Some(before) if *before.content == *bytes => before.content,
            replaced => {
                // The old content leaves the cache first: what only the cache held is given
                // back before the new content is counted.
                drop(replaced);
                self.new_content(bytes)?
            }
        };
        *cached = Some(Cached { content: content.clone(), fetched: Instant::now() });
        Ok(content)
    }
}

impl LazyFiles for HelperFiles {
    fn kind(&self, path: &str) -> Option<EntryKind> {
        self.layout.kind(path)
    }

    fn listing(&self, path: &str) -> Option<Vec<(String, EntryKind)>> {
        Some(self.layout.listing(path)?.map(|(name, kind)| (name.to_string(), kind)).collect())
    }

    fn charge_to(&self, charge: Arc<dyn MemoryCharge>) {
        let _ = self.charge.set(charge);
    }

    fn cache_ttl(&self) -> Duration {
        self.provider.cache_ttl
    }

    fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    fn cached(&self, path: &str) -> Option<(u64, Duration)> {
        self.fresh(path).map(|(content, fresh_for)| (content.len() as u64, fresh_for))
    }

    fn cached_content(&self, path: &str) -> Option<Fetched> {
        if self.withdrawn() {
            return None;
        }
        self.fresh(path).map(|(content, _)| content)
    }

    fn set_withdrawn(&self, withdrawn: bool) -> bool {
        let was = self.withdrawn.swap(withdrawn, Ordering::SeqCst);
        if withdrawn {
            self.cache.locked().clear();
        }
        was != withdrawn
    }

    fn read<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Fetched>> {
        Box::pin(self.read_now(path))
    }

    fn handed(&self) -> HandedFiles {
        let state = HelperState {
            enable_dirs: self.reply.enable_dirs.clone(),
            mount_param: self.reply.mount_param.clone(),
            files: self.reply.files.clone(),
            rooted: self.reply.rooted,
            options: self.options.clone(),
            withdrawn: self.withdrawn(),
        };
        HandedFiles {
            provider: self.provider.name.as_str().to_string(),
            namespace: self.permits.1.clone(),
            state: state.into_map(),
        }
    }

    fn adopt(&self, id: u64, bytes: Vec<u8>) -> Fetched {
        self.contents.fetch_max(id, Ordering::Relaxed);
        let size = bytes.len() as u64;
        self.live_bytes.fetch_add(size, Ordering::Relaxed);
        let charge = self.charge.get().cloned().filter(|charge| charge.grow(size).is_ok());
        Fetched::counted(id, bytes.into_boxed_slice(), self.live_bytes.clone(), charge)
    }
}

#[cfg(test)]
pub(crate) mod tests;
