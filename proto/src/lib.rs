//! The wire protocols of the shared-resource CSI driver, generated at build time from `proto/`:
//! CSI v1 (Identity and Node) and kubelet's plugin registration.

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
