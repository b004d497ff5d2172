//! The access notices: the one place that watches the cluster's RBAC and tells each node, through
//! its own `SharedResourceNode`, when a grant of a namespace it serves may have changed. `plan`
//! is the pure rule, `controller` the watches and writes, `lease` what tells nodes it runs. It
//! runs in the `sharedresource-read-grants` program, on the control plane.

pub mod controller;
pub mod lease;
pub mod plan;
