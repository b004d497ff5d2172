//! The `csi-volume-admission` command as a library, so tests run it in process with their own
//! standard streams.
//!
//! Subcommands: `check` (the chain offline, on manifests), `serve` (the chain as an HTTPS
//! webhook), `audit` (the chain over everything a live cluster runs), `webhooks` (the webhook
//! configurations that route the apiserver to `serve`) and `certificate` (its serving
//! certificate, for clusters without cert-manager).

pub mod audit;
pub mod certificate;
pub mod check;
pub mod cli;
pub mod serve;
