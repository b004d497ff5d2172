//! The controllers: loops that keep cluster objects as a rule computes them. Most run in the
//! control-plane program `sharedresource-read-grants` (`program`, one Deployment for the
//! cluster, one replica leading: `leader`): the read grants (`read_grants`), the access notices
//! every node is told by (`access_notices`) and the opt-in rollout on a share's change
//! (`rollout`). One runs in the node plugin: the startup taint it removes from its own Node
//! (`startup_taint`). They keep objects in memory one way (`follow`) and pace their passes one
//! way (`pacing`).

pub mod access_notices;
pub mod follow;
pub mod leader;
pub mod pacing;
pub mod program;
pub mod read_grants;
pub mod rollout;
pub mod startup_taint;
