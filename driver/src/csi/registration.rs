//! kubelet's plugin registration, built in: kubelet finds `<driver>-reg.sock` in its registry
//! directory, asks who is there, and learns where the CSI socket is — no node-driver-registrar
//! sidecar needed (running with one stays possible: it simply serves this same API).

use std::path::PathBuf;

use inline_guard_proto::pluginregistration::registration_server::Registration;
use inline_guard_proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use tonic::{Request, Response, Status};
use tracing::{error, info};

use crate::DRIVER_NAME;

/// The CSI versions this driver speaks, as kubelet wants them listed.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// Answers kubelet's registration questions.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    csi_socket: PathBuf,
}

impl RegistrationService {
    /// Tells kubelet the CSI socket is at `csi_socket`.
    pub fn new(csi_socket: PathBuf) -> RegistrationService {
        RegistrationService { csi_socket }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: DRIVER_NAME.into(),
            endpoint: self.csi_socket.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            info!("registered with kubelet");
        } else {
            error!(error = %crate::quote::Logged(&status.error), "kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
