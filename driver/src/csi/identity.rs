//! The CSI Identity service: who the plugin is, that it has no controller service, and whether
//! its content source is ready.

use std::collections::HashMap;
use std::sync::Arc;

use inline_guard_proto::csi::v1::identity_server::Identity;
use inline_guard_proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::DRIVER_NAME;
use crate::content::ContentSource;

/// The Identity service. Probe asks the content source each time, so readiness follows it.
#[derive(Clone)]
pub struct IdentityService {
    content: Arc<dyn ContentSource>,
}

impl IdentityService {
    /// Reports readiness from `content`.
    pub fn new(content: Arc<dyn ContentSource>) -> IdentityService {
        IdentityService { content }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: HashMap::new(),
        }))
    }

    /// A node-only plugin: no CONTROLLER_SERVICE, no topology.
    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(self.content.ready()) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn names_itself_and_reports_readiness() {
        let dir = tempfile::tempdir().unwrap();
        let shares = dir.path().join("shares");
        let service = IdentityService::new(Arc::new(crate::content::StaticDirSource::new(shares.clone())));
        let info = service.get_plugin_info(Request::new(GetPluginInfoRequest {})).await.unwrap().into_inner();
        assert_eq!(info.name, "sharedresource.csi.inlineguard.dev");
        assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
        let capabilities =
            service.get_plugin_capabilities(Request::new(GetPluginCapabilitiesRequest {})).await.unwrap().into_inner();
        assert!(capabilities.capabilities.is_empty(), "no controller service");
        assert_eq!(service.probe(Request::new(ProbeRequest {})).await.unwrap().into_inner().ready, Some(false));
        std::fs::create_dir(&shares).unwrap();
        assert_eq!(service.probe(Request::new(ProbeRequest {})).await.unwrap().into_inner().ready, Some(true));
    }
}
