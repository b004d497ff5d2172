//! The access notices: the one place that watches the cluster's RBAC, shares and projections,
//! and tells each node, through its own `SharedResourceNode`, when a grant of a namespace it
//! serves may have changed, or a share or projection its volumes read did, with the answers to
//! its volumes' access questions asked after the change (`answers`). `notices` is what a change
//! concerns and what is gathered of it, `plan` the pure rule, `controller` the RBAC watches and
//! the writes, `objects` the watches of shares and projections, `gathering` what both kinds of
//! watches feed, `status_patch` the write that makes a node's status say it, `lease` what tells
//! nodes it runs, `waiting_pods` the pods a node's driver registered late was waited for by. It
//! runs in the `sharedresource-read-grants` program, on the control plane.

pub mod answers;
pub mod controller;
pub mod gathering;
pub mod lease;
pub mod notices;
pub mod objects;
pub mod plan;
pub mod status_patch;
pub mod waiting_pods;
