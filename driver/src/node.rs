//! The CSI Node service: publish builds a per-volume tmpfs at the target and fills it through
//! the atomic writer; unpublish takes it down. Both are idempotent; a publish that fails part-way
//! undoes what it did, so no mount, directory or record is left behind.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use inline_guard_proto::csi::v1::node_server::Node;
use inline_guard_proto::csi::v1::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
};
use tonic::{Request, Response, Status};

use crate::atomic_writer::{AtomicWriter, check_key};
use crate::content::ContentSource;
use crate::error::{Error, Result};
use crate::mounter::Mounter;
use crate::publish_request::{PublishRequest, check};
use crate::volume_store::{VolumeRecord, VolumeStore};

/// How volumes are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeSettings {
    /// The size limit of each volume's tmpfs.
    pub tmpfs_bytes: u64,
    /// Mount the tmpfs read-only on the host too (kubelet's bind mount into the container is
    /// read-only either way, since readonly is required).
    pub host_read_only: bool,
}

/// The Node service.
pub struct NodeService {
    node_id: String,
    settings: VolumeSettings,
    mounter: Arc<dyn Mounter>,
    store: Arc<dyn VolumeStore>,
    content: Arc<dyn ContentSource>,
    volumes: Mutex<HashMap<String, VolumeRecord>>,
    // Targets with an operation under way: a second one is told to retry (ABORTED), as the
    // specification asks, instead of racing the first.
    busy: Mutex<HashSet<PathBuf>>,
}

impl NodeService {
    /// A Node service for `node_id` over the given parts, remembering `records` as published.
    pub fn new(
        node_id: String,
        settings: VolumeSettings,
        mounter: Arc<dyn Mounter>,
        store: Arc<dyn VolumeStore>,
        content: Arc<dyn ContentSource>,
        records: Vec<VolumeRecord>,
    ) -> NodeService {
        let volumes = records.into_iter().map(|r| (r.volume_id.clone(), r)).collect();
        NodeService { node_id, settings, mounter, store, content, volumes: Mutex::new(volumes), busy: Mutex::default() }
    }

    fn claim(&self, target: &Path) -> Result<TargetClaim<'_>> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if !busy.insert(target.to_path_buf()) {
            return Err(Error::Aborted(format!("an operation on {} is in progress", target.display())));
        }
        Ok(TargetClaim { service: self, target: target.to_path_buf() })
    }

    fn record(&self, volume_id: &str) -> Option<VolumeRecord> {
        self.volumes.lock().unwrap_or_else(|p| p.into_inner()).get(volume_id).cloned()
    }

    /// Publishes a checked request.
    pub fn publish(&self, request: &PublishRequest) -> Result<()> {
        let _claim = self.claim(&request.target_path)?;
        let wanted = VolumeRecord {
            volume_id: request.volume_id.clone(),
            target_path: request.target_path.clone(),
            pod: request.pod.clone(),
            attributes: request.attributes.clone(),
            host_read_only: self.settings.host_read_only,
            complete: true,
        };
        if let Some(existing) = self.record(&request.volume_id) {
            if existing != wanted {
                return Err(Error::AlreadyExists(format!(
                    "volume {} is already published with other arguments",
                    request.volume_id
                )));
            }
            if self.mounter.is_mount_point(&request.target_path)? {
                return Ok(());
            }
        }
        let other = self
            .volumes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|r| r.target_path == request.target_path && r.volume_id != request.volume_id);
        if other {
            return Err(Error::AlreadyExists(format!(
                "{} already holds another volume",
                request.target_path.display()
            )));
        }

        let payload = self.content.content(request)?;
        // A hostile key is refused before anything is created or mounted.
        for key in payload.keys() {
            check_key(key)?;
        }
        let mut undo = Undo::default();
        let target = &request.target_path;
        let result = (|| {
            // Recorded as incomplete first: if the driver dies mid-publish, start-up undoes it.
            // Not waited for: should it be lost in a crash, the mount it would have marked is
            // replaced by the next publish to the target, or removed by the unpublish.
            self.store.put(&VolumeRecord { complete: false, ..wanted.clone() }, false)?;
            undo.recorded = Some(wanted.volume_id.clone());
            if !target.exists() {
                fs::create_dir_all(target)
                    .map_err(|e| Error::Internal(format!("creating {}: {e}", target.display())))?;
                undo.created_dir = Some(target.clone());
            }
            // A mount without a record is what an interrupted publish leaves: replace it.
            if self.mounter.is_mount_point(target)? {
                self.mounter.unmount(target)?;
            }
            self.mounter.mount_tmpfs(target, self.settings.tmpfs_bytes, false)?;
            undo.mounted = Some(target.clone());
            AtomicWriter::new(target).write(&payload)?;
            if self.settings.host_read_only {
                self.mounter.remount(target, true)?;
            }
            // Durable before answering: kubelet will treat the volume as published from here on.
            self.store.put(&wanted, true)
        })();
        match result {
            Ok(()) => {
                self.volumes.lock().unwrap_or_else(|p| p.into_inner()).insert(wanted.volume_id.clone(), wanted);
                Ok(())
            }
            Err(error) => {
                if undo.recorded.is_some() {
                    self.volumes.lock().unwrap_or_else(|p| p.into_inner()).remove(&wanted.volume_id);
                }
                undo.run(self.mounter.as_ref(), self.store.as_ref());
                Err(error)
            }
        }
    }

    /// Re-reads every published volume's content and rewrites what changed (the atomic writer
    /// makes an unchanged volume a no-op). A volume whose content may no longer be had (the share
    /// is gone, access was withdrawn) is emptied, not left serving stale data. Returns, per
    /// volume, whether it changed.
    pub fn refresh_all(&self) -> Vec<(String, Result<bool>)> {
        let records: Vec<VolumeRecord> =
            self.volumes.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        records
            .into_iter()
            .map(|record| {
                let result = self.claim(&record.target_path).and_then(|_claim| self.refresh(&record));
                (record.volume_id, result)
            })
            .collect()
    }

    fn refresh(&self, record: &VolumeRecord) -> Result<bool> {
        let request = PublishRequest {
            volume_id: record.volume_id.clone(),
            target_path: record.target_path.clone(),
            pod: record.pod.clone(),
            attributes: record.attributes.clone(),
            mount_flags: Vec::new(),
        };
        let payload = match self.content.content(&request) {
            Ok(payload) => payload,
            Err(Error::InvalidArgument(_)) => Default::default(),
            Err(other) => return Err(other),
        };
        let writer = AtomicWriter::new(&record.target_path);
        if record.host_read_only {
            self.mounter.remount(&record.target_path, false)?;
            let written = writer.write(&payload);
            self.mounter.remount(&record.target_path, true)?;
            written
        } else {
            writer.write(&payload)
        }
    }

    /// Unpublishes; an unknown volume or a missing target is already done.
    pub fn unpublish(&self, volume_id: &str, target: &Path) -> Result<()> {
        if volume_id.is_empty() {
            return Err(Error::InvalidArgument("volume_id is required".into()));
        }
        if target.as_os_str().is_empty() {
            return Err(Error::InvalidArgument("target_path is required".into()));
        }
        let _claim = self.claim(target)?;
        if self.mounter.is_mount_point(target)? {
            self.mounter.unmount(target)?;
        }
        match fs::remove_dir(target) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(Error::Internal(format!("removing {}: {error}", target.display()))),
        }
        self.store.remove(volume_id)?;
        self.volumes.lock().unwrap_or_else(|p| p.into_inner()).remove(volume_id);
        Ok(())
    }
}

/// Marks a target busy for the life of an operation.
struct TargetClaim<'a> {
    service: &'a NodeService,
    target: PathBuf,
}

impl Drop for TargetClaim<'_> {
    fn drop(&mut self) {
        self.service.busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.target);
    }
}

/// What a failed publish must take back, last step first.
#[derive(Default)]
struct Undo {
    recorded: Option<String>,
    created_dir: Option<PathBuf>,
    mounted: Option<PathBuf>,
}

impl Undo {
    fn run(self, mounter: &dyn Mounter, store: &dyn VolumeStore) {
        if let Some(target) = self.mounted {
            let _ = mounter.unmount(&target);
        }
        if let Some(dir) = self.created_dir {
            let _ = fs::remove_dir_all(dir);
        }
        if let Some(volume_id) = self.recorded {
            let _ = store.remove(&volume_id);
        }
    }
}

/// The Node service on the wire. Publish and unpublish mount, write and fsync: they run on the
/// blocking pool, never on the async workers that serve every other call.
#[derive(Clone)]
pub struct NodeGrpc {
    service: Arc<NodeService>,
}

impl NodeGrpc {
    /// Serves `service`.
    pub fn new(service: Arc<NodeService>) -> NodeGrpc {
        NodeGrpc { service }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&NodeService) -> Result<T> + Send + 'static,
    ) -> std::result::Result<T, Status> {
        let service = self.service.clone();
        match tokio::task::spawn_blocking(move || work(&service)).await {
            Ok(result) => result.map_err(Status::from),
            Err(error) => Err(Status::internal(format!("the operation failed: {error}"))),
        }
    }
}

#[tonic::async_trait]
impl Node for NodeGrpc {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> std::result::Result<Response<NodePublishVolumeResponse>, Status> {
        let checked = check(request.get_ref())?;
        self.blocking(move |service| service.publish(&checked)).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> std::result::Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        self.blocking(move |service| service.unpublish(&request.volume_id, Path::new(&request.target_path))).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    /// No staging, no stats, no expansion: publish and unpublish only.
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> std::result::Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> std::result::Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.service.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

#[cfg(test)]
mod tests;
