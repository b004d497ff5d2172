//! The shared-resource CSI node plugin `sharedresource.csi.inlineguard.dev`.
//!
//! It serves inline ephemeral volumes only, read-only only: a per-volume tmpfs filled by the
//! atomic writer from a content source, recorded so that a restart keeps what is mounted and
//! undoes what was interrupted. It owns only what it creates: targets are reached without
//! following symlinks, and records say which directories and mounts the driver made, so undo
//! and unpublish remove exactly those. `plugin` assembles the services on their sockets; the
//! rooms are the request check, target paths and their walk, the node and identity services,
//! the writer, the mounter, the records, recovery, the state lock, registration (and the
//! `:authority` rewrite kubelet needs), sockets, the health port and its metrics, and the
//! content sources: `shares` (SharedSecret and SharedConfigMap of the cluster, access-checked,
//! watched) and a directory of static shares for demos. `read_grants` is the small controller
//! that lets the driver read exactly what shares name.

pub mod apiserver_client;
pub mod atomic_writer;
pub mod authority_rewrite;
pub mod changes;
pub mod cli;
pub mod config;
pub mod content;
pub mod dir_tree;
pub mod error;
pub mod health;
pub mod identity;
pub mod metrics;
pub mod mounter;
pub mod node;
pub mod object_name;
pub mod plugin;
pub mod projection;
pub mod publish_request;
pub mod quote;
pub mod read_grants;
pub mod recovery;
pub mod refresh;
pub mod registration;
pub mod shares;
pub mod socket;
pub mod state_lock;
pub mod target_dir;
pub mod target_path;
#[cfg(feature = "test-util")]
pub mod test_client;
pub mod volume_store;

/// The driver's registered name.
pub const DRIVER_NAME: &str = "sharedresource.csi.inlineguard.dev";
