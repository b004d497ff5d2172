//! The shared-resource CSI node plugin `sharedresource.csi.inlineguard.dev`.
//!
//! Built so far: the Identity service, the NodePublishVolume request check (the fixed validation
//! order and the readonly refusal), the atomic writer that lays out volume content, the mounter
//! (Linux and a recording fake), the volume records, and the one place errors become gRPC
//! statuses. Still to come (see the CSI driver issue): the Node service that ties them together,
//! restart recovery, the unix socket server and kubelet registration, the content sources.

pub mod atomic_writer;
pub mod config;
pub mod content;
pub mod error;
pub mod identity;
pub mod mounter;
pub mod node;
pub mod plugin;
pub mod publish_request;
pub mod recovery;
pub mod registration;
pub mod socket;
pub mod volume_store;

/// The driver's registered name.
pub const DRIVER_NAME: &str = "sharedresource.csi.inlineguard.dev";
