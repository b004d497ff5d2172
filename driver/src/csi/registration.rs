//! kubelet's plugin registration, built in: kubelet finds `<driver>-reg.sock` in its registry
//! directory, asks who is there, and learns where the CSI socket is — no node-driver-registrar
//! sidecar needed (running with one stays possible: it simply serves this same API).

use std::path::PathBuf;
use std::sync::Arc;

use inline_guard_proto::pluginregistration::registration_server::Registration;
use inline_guard_proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{error, info};

use crate::DRIVER_NAME;

/// The CSI versions this driver speaks, as kubelet wants them listed.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// Answers kubelet's registration questions.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    csi_socket: PathBuf,
    registered: Arc<watch::Sender<bool>>,
}

impl RegistrationService {
    /// Tells kubelet the CSI socket is at `csi_socket`, and `registered` when kubelet says it
    /// registered the driver (the startup taint waits for that).
    pub fn new(csi_socket: PathBuf, registered: Arc<watch::Sender<bool>>) -> RegistrationService {
        RegistrationService { csi_socket, registered }
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
            self.registered.send_replace(true);
        } else {
            error!(error = %crate::quote::Logged(&status.error), "kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn kubelets_notice_of_a_registration_is_told_a_refusal_is_not() {
        let (sender, receiver) = watch::channel(false);
        let service = RegistrationService::new(PathBuf::from("/csi.sock"), Arc::new(sender));
        let refused = RegistrationStatus { plugin_registered: false, error: "versions".into() };
        service.notify_registration_status(Request::new(refused)).await.unwrap();
        assert!(!*receiver.borrow(), "a refused registration is not a registration");
        let registered = RegistrationStatus { plugin_registered: true, error: String::new() };
        service.notify_registration_status(Request::new(registered)).await.unwrap();
        assert!(*receiver.borrow());
    }
}
