//! Secrets kept outside Kubernetes (a vault, a KMS, a file server), fetched on the node by a
//! provider the node's configuration names, with the pod's identity passed along for the
//! provider's own auditing and authorization. Which service accounts may use a provider is RBAC
//! (verb `use` on `providers`, asked as for shares, through the cluster floor in
//! `provider_volume`, which also reads a SecretProviderClass's parameters, `provider_class`).
//!
//! The configuration checked into typed providers (`provider`), the node's providers by name
//! (`providers`), and the two kinds: helper programs speaking the FUSE flexVolume design's
//! protocol (`helper_protocol`), run bounded and isolated (`helper_run`) behind a seccomp filter
//! (`helper_confinement`), in `eager` mode
//! (`exec`: every listed file fetched at publish and at each refresh) or `lazy` mode
//! (`lazy_files`: each file fetched when first opened, which the volume layer serves through
//! FUSE); and the Secrets Store CSI Driver's providers over their gRPC API (`secrets_store`).

#[cfg(test)]
pub(crate) mod concurrency_probe;
#[cfg(test)]
pub(crate) mod design_helper;
pub mod exec;
pub mod helper_confinement;
pub mod helper_protocol;
pub mod helper_run;
pub mod lazy_files;
#[cfg(any(test, feature = "test-util"))]
pub mod lazy_only;
pub mod provider;
pub mod provider_class;
pub mod provider_volume;
pub mod providers;
pub mod secrets_store;
