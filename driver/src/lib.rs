//! The shared-resource CSI node plugin `sharedresource.csi.inlineguard.dev`.
//!
//! It serves inline ephemeral volumes only, read-only only: a per-volume tmpfs filled by the
//! atomic writer from a content source, recorded so that a restart keeps what is mounted and
//! undoes what was interrupted. It owns only what it creates: targets are reached without
//! following symlinks, and records say which directories and mounts the driver made, so undo
//! and unpublish remove exactly those.
//!
//! Three layers, whose imports run one way, csi → volume → content:
//! - [`csi`]: the wire (the Identity and Node services, the ordered check of a publish request,
//!   kubelet's registration and the `:authority` rewrite it needs, the sockets);
//! - [`volume`]: a volume's life on the node (publish and unpublish, refresh, target paths and
//!   their symlink-free walk, the mounter, the atomic writer, records, recovery, the state lock);
//! - [`content`]: what a volume holds (the content sources: shares and projections of the
//!   cluster, a directory of static shares for demos; what changed and whom it concerns).
//!
//! Under them, the ground every floor may stand on: `apiserver` (the client, the rate every
//! request takes a token of, holding back while the apiserver is overloaded, the one way a
//! request is made), `metrics`, `quote` (bounded quoting of input), `units` (sizes and
//! durations as configuration writes them), `unpoisoned` (locks that outlive a panicking
//! holder), `dir_tree` and `fair_slots` (pools no one namespace can hold whole: publishes,
//! refreshes, helpers).
//!
//! Around them, the process: `cli` (the node plugin's command line and start) and `plugin`
//! (the services assembled on their sockets, the node taken over from a predecessor), `program`
//! (what every program of the image shares), `config`, `error` (why the process could not start
//! or stopped serving), `health`; and `controllers`, the loops that keep cluster objects: the
//! control-plane program `sharedresource-read-grants` (read grants, access notices, the opt-in
//! rollout on a share's change) and the node's startup taint. `driver/tests/layers.rs` holds
//! the imports to these floors, and refuses any two modules that reach each other.

pub mod apiserver;
pub mod cli;
pub mod config;
pub mod content;
pub mod controllers;
pub mod csi;
pub mod dir_tree;
pub mod error;
pub mod fair_slots;
pub mod health;
pub mod metrics;
pub mod plugin;
pub mod program;
pub mod quote;
#[cfg(feature = "test-util")]
pub mod test_util;
pub mod units;
pub mod unpoisoned;
pub mod volume;

/// The driver's registered name.
pub const DRIVER_NAME: &str = "sharedresource.csi.inlineguard.dev";
