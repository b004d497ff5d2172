//! The webhook's decisions on the real apiserver: the profile tables, workloads, match
//! conditions, read-only forcing, relabelling, a cold cache, a killed webhook, a flood of its
//! port's connections, shared-resource refusals at creation, the audit command, and the native
//! policies deciding as the webhook.

pub mod audit_command;
pub mod cold_cache;
pub mod connection_flood;
pub mod match_conditions;
pub mod native_policies;
pub mod read_only;
pub mod relabel;
pub mod shared_admission;
pub mod tables;
pub mod webhook_restart;
pub mod workloads;
