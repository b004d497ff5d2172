//! The `csi-volume-admission` command as a library, so tests run it in process with their own
//! standard streams.
//!
//! Subcommands: `check` (the chain offline, on manifests) and `serve` (the chain as an HTTPS
//! webhook). The live-cluster report (`audit`) comes with the apiserver-backed cache.

pub mod check;
pub mod cli;
pub mod serve;
