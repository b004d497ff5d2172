//! The `csi-volume-admission` command as a library, so tests run it in process with their own
//! standard streams.
//!
//! Subcommands: `check` (the chain offline, on manifests), `serve` (the chain as an HTTPS
//! webhook), `audit` (the chain over everything a live cluster runs) and `webhooks` (the webhook
//! configurations that route the apiserver to `serve`).

pub mod audit;
pub mod check;
pub mod cli;
pub mod serve;
