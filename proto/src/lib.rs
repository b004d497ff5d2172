//! The wire protocols of the shared-resource CSI driver, generated at build time from `proto/`:
//! CSI v1 (Identity and Node), kubelet's plugin registration, and the Secrets Store CSI Driver's
//! provider API.

/// CSI v1: `csi.v1.Identity` and `csi.v1.Node`.
pub mod csi {
    /// Package `csi.v1`.
    #[allow(missing_docs, clippy::all, reason = "generated code")]
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

/// kubelet's plugin registration: package `pluginregistration`.
#[allow(missing_docs, clippy::all, reason = "generated code")]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// The Secrets Store CSI Driver's provider API: package `v1alpha1`, service `CSIDriverProvider`
/// (the driver is its client; the server is generated for tests' providers).
#[allow(missing_docs, clippy::all, reason = "generated code")]
pub mod secretsstore {
    tonic::include_proto!("v1alpha1");
}
