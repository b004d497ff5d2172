//! Shares backed by the cluster: the API types, the access check a pod's service account must
//! pass, and the content source that reads a share's backing Secret or ConfigMap.

pub mod access;
pub mod api;
pub mod source;
