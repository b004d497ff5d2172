//! The CSIVolumeAdmission webhook server: the admission chain behind HTTPS `POST /validate` and
//! `POST /mutate`, with health, readiness and metrics on a plain-HTTP port, serving certificates
//! reloaded from disk, and graceful shutdown.

pub mod body_budget;
pub mod cache;
pub mod drain;
pub mod fair_share;
pub mod health;
pub mod held_answers;
pub mod label_store;
pub mod listener;
pub mod log_text;
pub mod metrics;
pub mod reload;
pub mod server;
pub mod share_lookup;
pub mod standalone;
pub mod tls;
pub mod webhook;
