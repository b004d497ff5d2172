//! The read grants: RBAC that lets the driver read the Secrets and ConfigMaps shares name, and
//! nothing else, kept current from the shares by a small controller of its own
//! (`sharedresource-read-grants`, one Deployment for the cluster). `plan` is the pure rule,
//! `controller` the watches and writes, `leader` the election among its replicas, `cli` its
//! command line.

pub mod cli;
pub mod controller;
pub mod leader;
pub mod plan;
