//! Rollout on change, opt-in: a workload labelled to be restarted when a share its pods mount
//! changes gets its pod template annotated, as `kubectl rollout restart` does, once per change
//! and never for a revocation. `plan` is the pure rule, `content_version` what a change is,
//! `record_key` the key versions are made with, `workloads` what is kept of the workloads
//! followed, `controller` the watches and patches (run by
//! `sharedresource-read-grants --rollout-on-change`).

pub mod content_version;
pub mod controller;
pub mod plan;
pub mod record_key;
pub mod workloads;
