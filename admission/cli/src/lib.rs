//! The `csi-volume-admission` command as a library, so tests run it in process with their own
//! standard streams.
//!
//! Subcommands: `check` (the chain offline, on manifests). The webhook server (`serve`) and the
//! live-cluster report (`audit`) come with the admission-server work.

pub mod check;
pub mod cli;
