//! The Node service on the wire: each call checked (`request`), then handed to the volume
//! layer's [`NodeService`] on the blocking pool, and its answer counted.

use std::sync::Arc;

use inline_guard_proto::csi::v1::node_server::Node;
use inline_guard_proto::csi::v1::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
};
use tonic::{Request, Response, Status};

use crate::csi::error::Error;
use crate::csi::request::{check, check_unpublish};
use crate::fair_slots::FairSlots;
use crate::metrics::CallResult;
use crate::volume::service::NodeService;

/// How many publishes build their content at once: each holds its volume's content in memory
/// (up to its tmpfsSize) until it is written. One namespace's pods hold at most half of them, so
/// a tenant starting many pods of slow or large volumes at once never holds up another's.
/// Unpublishes take no slot: they only give memory back.
pub const CONCURRENT_PUBLISHES: usize = 8;

/// The Node service on the wire. Publish and unpublish mount, write and fsync: they run on the
/// blocking pool, never on the async workers that serve every other call.
#[derive(Clone)]
pub struct NodeGrpc {
    service: Arc<NodeService>,
    publishes: Arc<FairSlots>,
}

impl NodeGrpc {
    /// Serves `service`.
    pub fn new(service: Arc<NodeService>) -> NodeGrpc {
        NodeGrpc { service, publishes: FairSlots::halved(CONCURRENT_PUBLISHES) }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&NodeService) -> crate::volume::error::Result<T> + Send + 'static,
    ) -> crate::csi::error::Result<T> {
        let service = self.service.clone();
        Ok(tokio::task::spawn_blocking(move || work(&service)).await??)
    }
}

#[tonic::async_trait]
impl Node for NodeGrpc {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> std::result::Result<Response<NodePublishVolumeResponse>, Status> {
        let started = std::time::Instant::now();
        let answer = match check(request.get_ref(), self.service.kubelet_dir()) {
            Ok(checked) => {
                let _slot = self.publishes.acquire(&checked.ask.pod.namespace).await;
                self.blocking(move |service| service.publish(&checked)).await
            }
            Err(error) => Err(error),
        };
        let error_type = answer.as_ref().err().map(Error::error_type);
        let answer = answer.map_err(Status::from);
        let result = CallResult::of(answer.as_ref().err().map(Status::code));
        self.service.metrics().publish(result, error_type, started.elapsed().as_secs_f64());
        answer?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> std::result::Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let answer = match check_unpublish(request.get_ref(), self.service.kubelet_dir()) {
            Ok(checked) => self.blocking(move |service| service.unpublish(&checked)).await,
            Err(error) => Err(error),
        };
        let error_type = answer.as_ref().err().map(Error::error_type);
        let answer = answer.map_err(Status::from);
        self.service.metrics().unpublish(CallResult::of(answer.as_ref().err().map(Status::code)), error_type);
        answer?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    /// No staging, no stats, no expansion: publish and unpublish only. VOLUME_MOUNT_GROUP makes
    /// kubelet pass the pod's fsGroup with each publish, for the driver to give the files to.
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> std::result::Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use inline_guard_proto::csi::v1::NodeServiceCapability;
        use inline_guard_proto::csi::v1::node_service_capability::{Rpc, Type, rpc};
        let mount_group =
            NodeServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: rpc::Type::VolumeMountGroup as i32 })) };
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities: vec![mount_group] }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> std::result::Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.service.node_id().to_string(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests;
