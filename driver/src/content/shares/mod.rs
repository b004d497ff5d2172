//! Shares backed by the cluster (their API types are `sharedresource_api::shares`): the access
//! check a pod's service account must pass, the content source that reads a share's backing
//! Secret or ConfigMap, and the watches that make a change apply at once.

pub mod apiserver;
pub mod cache;
pub mod grant_watch;
pub mod grants;
pub mod held_answers;
pub mod kind;
pub mod source;
pub mod status;
pub mod watch;
