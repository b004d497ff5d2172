//! The CSI Identity service: who the plugin is, that it has no controller service, and whether
//! its content source is ready.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use inline_guard_proto::csi::v1::identity_server::Identity;
use inline_guard_proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::DRIVER_NAME;

/// The Identity service. `ready` turns true once the content source can serve volumes.
#[derive(Debug, Clone)]
pub struct IdentityService {
    ready: Arc<AtomicBool>,
}

impl IdentityService {
    /// Reports readiness from `ready`.
    pub fn new(ready: Arc<AtomicBool>) -> IdentityService {
        IdentityService { ready }
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
        Ok(Response::new(ProbeResponse { ready: Some(self.ready.load(Ordering::Acquire)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn names_itself_and_reports_readiness() {
        let ready = Arc::new(AtomicBool::new(false));
        let service = IdentityService::new(ready.clone());
        let info = service.get_plugin_info(Request::new(GetPluginInfoRequest {})).await.unwrap().into_inner();
        assert_eq!(info.name, "sharedresource.csi.inlineguard.dev");
        assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
        let capabilities =
            service.get_plugin_capabilities(Request::new(GetPluginCapabilitiesRequest {})).await.unwrap().into_inner();
        assert!(capabilities.capabilities.is_empty(), "no controller service");
        assert_eq!(service.probe(Request::new(ProbeRequest {})).await.unwrap().into_inner().ready, Some(false));
        ready.store(true, Ordering::Release);
        assert_eq!(service.probe(Request::new(ProbeRequest {})).await.unwrap().into_inner().ready, Some(true));
    }
}
