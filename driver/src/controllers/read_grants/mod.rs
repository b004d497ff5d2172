//! The read grants: RBAC that lets the driver read the Secrets and ConfigMaps shares name, and
//! nothing else, kept current from the shares by a small controller of its own (run by
//! `sharedresource-read-grants`, one Deployment for the cluster). `plan` is the pure rule,
//! `controller` the watches and writes.

pub mod controller;
pub mod plan;
