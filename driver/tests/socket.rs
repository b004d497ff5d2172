//! The plugin as kubelet meets it: gRPC over a real unix socket, real tmpfs mounts in a temp
//! directory (as root), kubelet registration, and sockets removed on shutdown.

use std::path::{Path, PathBuf};

use inline_guard_proto::csi::v1::identity_client::IdentityClient;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_proto::csi::v1::{GetPluginInfoRequest, NodeUnpublishVolumeRequest, ProbeRequest};
use inline_guard_proto::pluginregistration::InfoRequest;
use inline_guard_proto::pluginregistration::registration_client::RegistrationClient;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::volume::mounter::listed_in_mountinfo;
use support::{channel, publish_request};
use tonic::Code;

mod support;

#[tokio::test]
async fn publish_and_unpublish_over_the_socket_with_real_mounts() {
    assert!(support::is_root(), "real mounts need root: run the test command as root");
    // Unmounts whatever is still mounted below it when the test ends, failed or not.
    let dir = support::NodeDir::new();
    let shares = dir.path().join("shares");
    std::fs::create_dir_all(shares.join("cluster-ca")).unwrap();
    std::fs::write(shares.join("cluster-ca/ca.crt"), "-----BEGIN CERTIFICATE-----").unwrap();
    let csi_socket = dir.path().join("plugins/csi.sock");
    let registry = dir.path().join("registry");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin =
        Plugin { register: true, node_id: "node-1".into(), ..Plugin::in_directory(dir.path(), csi_socket.clone()) };
    let running = tokio::spawn(plugin.run(async {
        let _ = stopped.await;
    }));

    let csi = channel(csi_socket.clone()).await;
    let mut identity = IdentityClient::new(csi.clone());
    let info = identity.get_plugin_info(GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.name, "sharedresource.csi.inlineguard.dev");
    assert_eq!(identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready, Some(true));

    // RPCs this plugin does not implement are UNIMPLEMENTED, as for undeclared capabilities.
    let mut grpc = tonic::client::Grpc::new(csi.clone());
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<ProbeRequest, ProbeRequest>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/csi.v1.Node/NodeStageVolume");
    let status = grpc.unary(tonic::Request::new(ProbeRequest {}), path, codec).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);

    let mut node = NodeClient::new(csi);
    let target = dir.path().join("pods/u-1/volumes/kubernetes.io~csi/shared/mount");
    let refused = node.node_publish_volume(publish_request("csi-1", &target, false)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(!target.exists(), "a refused publish creates nothing");

    node.node_publish_volume(publish_request("csi-1", &target, true)).await.unwrap();
    assert!(listed_in_mountinfo(&target).unwrap(), "a tmpfs is mounted at the target");
    assert_eq!(std::fs::read_to_string(target.join("ca.crt")).unwrap(), "-----BEGIN CERTIFICATE-----");
    node.node_publish_volume(publish_request("csi-1", &target, true)).await.unwrap();

    // What kubelet does next, since readOnly was required: a read-only bind mount into the
    // container. The content reads; nothing can be written.
    let container = dir.path().join("container/etc/shared");
    std::fs::create_dir_all(&container).unwrap();
    bind_read_only(&target, &container);
    assert_eq!(std::fs::read_to_string(container.join("ca.crt")).unwrap(), "-----BEGIN CERTIFICATE-----");
    let write = std::fs::write(container.join("ca.crt"), "tampered").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(30), "EROFS inside the container");
    nix::mount::umount2(&container, nix::mount::MntFlags::empty()).unwrap();

    // A share holding a name the writer reserves is refused as a hostile key, and nothing stays.
    std::fs::create_dir_all(dir.path().join("shares/hostile")).unwrap();
    std::fs::write(dir.path().join("shares/hostile/..data"), "x").unwrap();
    let hostile_target = dir.path().join("pods/u-2/volumes/kubernetes.io~csi/shared/mount");
    let mut hostile = publish_request("csi-2", &hostile_target, true);
    hostile.volume_context.insert("share".into(), "hostile".into());
    let refused = node.node_publish_volume(hostile).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(refused.message(), "key \"..data\" is refused: names starting with \"..\" are reserved");
    assert!(!dir.path().join("pods/u-2").exists(), "no mount or directory left behind");

    let mut registration =
        RegistrationClient::new(channel(registry.join("sharedresource.csi.inlineguard.dev-reg.sock")).await);
    let plugin_info = registration.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(plugin_info.endpoint, csi_socket.to_string_lossy());
    assert_eq!(plugin_info.r#type, "CSIPlugin");

    let unpublish =
        NodeUnpublishVolumeRequest { volume_id: "csi-1".into(), target_path: target.to_string_lossy().into_owned() };
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    assert!(!target.exists(), "unmounted and removed");
    assert!(!dir.path().join("pods").exists(), "with every directory the driver made on the way");
    node.node_unpublish_volume(unpublish).await.unwrap();

    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert!(!csi_socket.exists(), "the CSI socket is removed on exit");
    assert!(!registry.join("sharedresource.csi.inlineguard.dev-reg.sock").exists());
}

/// kubelet's read-only bind mount of a published volume into a container's filesystem.
fn bind_read_only(source: &Path, target: &Path) {
    use nix::mount::{MsFlags, mount};
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap();
}

fn plugin(dir: &Path, csi_socket: &Path) -> Plugin {
    Plugin::in_directory(dir, csi_socket.to_path_buf())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_publishes_and_a_restart_in_between() {
    assert!(support::is_root(), "real mounts need root: run the test command as root");
    // Unmounts whatever is still mounted below it when the test ends, failed or not.
    let dir = support::NodeDir::new();
    std::fs::create_dir_all(dir.path().join("shares/cluster-ca")).unwrap();
    std::fs::write(dir.path().join("shares/cluster-ca/ca.crt"), "pem").unwrap();
    let socket = dir.path().join("csi.sock");
    let targets: Vec<PathBuf> =
        (0..100).map(|i| dir.path().join(format!("pods/p{i}/volumes/kubernetes.io~csi/v/mount"))).collect();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(plugin(dir.path(), &socket).run(async {
        let _ = stopped.await;
    }));
    let node = NodeClient::new(channel(socket.clone()).await);
    let publishes: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            let mut node = node.clone();
            let request = publish_request(&format!("csi-{i}"), target, true);
            tokio::spawn(async move { node.node_publish_volume(request).await })
        })
        .collect();
    for publish in publishes {
        publish.await.unwrap().unwrap();
    }
    assert!(targets.iter().all(|t| listed_in_mountinfo(t).unwrap() && t.join("ca.crt").exists()));

    // Restart: the records come back, and publishing the same volumes again changes nothing.
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(plugin(dir.path(), &socket).run(async {
        let _ = stopped.await;
    }));
    let mut node = NodeClient::new(channel(socket.clone()).await);
    node.node_publish_volume(publish_request("csi-0", &targets[0], true)).await.unwrap();
    let mut other = publish_request("csi-0", &targets[0], true);
    other.volume_context.insert("share".into(), "elsewhere".into());
    assert_eq!(node.node_publish_volume(other).await.unwrap_err().code(), Code::AlreadyExists, "the record survived");

    for (i, target) in targets.iter().enumerate() {
        let request = NodeUnpublishVolumeRequest {
            volume_id: format!("csi-{i}"),
            target_path: target.to_string_lossy().into_owned(),
        };
        node.node_unpublish_volume(request).await.unwrap();
    }
    assert!(targets.iter().all(|t| !t.exists()), "no mount or directory left");
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}

#[test]
fn a_host_read_only_volume_is_refreshed_through_its_descriptor_and_stays_read_only() {
    use std::sync::Arc;

    use sharedresource_csi_driver::content::StaticDirSource;
    use sharedresource_csi_driver::csi::request::{check, check_unpublish};
    use sharedresource_csi_driver::volume::mounter::LinuxMounter;
    use sharedresource_csi_driver::volume::service::{NodeService, VolumeSettings};
    use sharedresource_csi_driver::volume::store::FileVolumeStore;

    assert!(support::is_root(), "real mounts need root: run the test command as root");
    // Unmounts whatever is still mounted below it when the test ends, failed or not.
    let dir = support::NodeDir::new();
    let shares = dir.path().join("shares");
    std::fs::create_dir_all(shares.join("cluster-ca")).unwrap();
    std::fs::write(shares.join("cluster-ca/ca.crt"), "first").unwrap();
    let settings = VolumeSettings {
        tmpfs_bytes: 1 << 20,
        host_read_only: true,
        kubelet_dir: dir.path().to_path_buf(),
        refresh_content: true,
        content_budget: sharedresource_csi_driver::volume::content_budget::BudgetLimits::UNBOUNDED,
    };
    let service = NodeService::new(
        "n".into(),
        settings,
        Arc::new(LinuxMounter),
        Arc::new(FileVolumeStore::open(dir.path().join("state")).unwrap()),
        Arc::new(StaticDirSource::new(shares.clone())),
        Vec::new(),
    );
    let target = support::kubelet_target(dir.path(), "u-1", "shared");
    service.publish(&check(&publish_request("csi-1", &target, true), dir.path()).unwrap()).unwrap();
    let erofs = |path: &Path| std::fs::write(path.join("intruder"), "x").unwrap_err().raw_os_error();
    assert_eq!(erofs(&target), Some(30), "read-only on the host");
    std::fs::write(shares.join("cluster-ca/ca.crt"), "rotated").unwrap();
    let refreshed = service.refresh_all();
    assert!(matches!(refreshed[..], [(ref volume, Ok(true))] if volume == "csi-1"), "{refreshed:?}");
    assert_eq!(std::fs::read_to_string(target.join("ca.crt")).unwrap(), "rotated");
    assert_eq!(erofs(&target), Some(30), "read-only again after the refresh");
    let unpublish =
        NodeUnpublishVolumeRequest { volume_id: "csi-1".into(), target_path: target.to_string_lossy().into() };
    service.unpublish(&check_unpublish(&unpublish, dir.path()).unwrap()).unwrap();
    assert!(!dir.path().join("pods").exists());
}

/// What an HTTP/2 server did with a request.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// DATA frames on the stream (the gRPC response message).
    Data(Vec<u8>),
    /// RST_STREAM with this error code.
    Reset(u32),
}

/// A gRPC call with an empty message on raw HTTP/2, as grpc-go sends it when dialled with a bare
/// socket path: `:authority` is that path.
async fn grpc_with_authority(socket: &Path, method: &str, authority: &str) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| {
        let mut frame = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        frame.push(kind);
        frame.push(flags);
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    };
    let literal = |out: &mut Vec<u8>, value: &str| {
        assert!(value.len() < 127);
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
    };
    // :method POST, :scheme http (static 3 and 6), :path and :authority (literals with
    // incremental indexing of static names 4 and 1), content-type (without indexing, static 31),
    // te: trailers (literal name).
    let mut block = vec![0x83, 0x86, 0x44];
    literal(&mut block, method);
    block.push(0x41);
    literal(&mut block, authority);
    block.extend_from_slice(&[0x0f, 0x10]);
    literal(&mut block, "application/grpc");
    block.push(0x00);
    literal(&mut block, "te");
    literal(&mut block, "trailers");
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    stream.write_all(&out).await.unwrap();
    let mut data = Vec::new();
    loop {
        let mut header = [0u8; 9];
        tokio::time::timeout(std::time::Duration::from_secs(5), stream.read_exact(&mut header))
            .await
            .expect("the server answered within 5 s")
            .unwrap();
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let (kind, flags) = (header[3], header[4]);
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        stream.read_exact(&mut payload).await.unwrap();
        match (kind, id) {
            (0x4, 0) if flags & 0x1 == 0 => stream.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(),
            (0x3, 1) => return Answer::Reset(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])),
            (0x0, 1) => data.extend_from_slice(&payload),
            (0x1, 1) if flags & 0x1 != 0 => return Answer::Data(data),
            _ => {}
        }
    }
}

#[tokio::test]
async fn kubelets_registration_dial_with_its_socket_path_as_authority_is_answered() {
    // Unmounts whatever is still mounted below it when the test ends, failed or not.
    let dir = support::NodeDir::new();
    std::fs::create_dir_all(dir.path().join("shares")).unwrap();
    let csi_socket = dir.path().join("csi.sock");
    let registration = dir.path().join("registry/sharedresource.csi.inlineguard.dev-reg.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = Plugin { register: true, ..Plugin::in_directory(dir.path(), csi_socket.clone()) };
    let running = tokio::spawn(plugin.run(async {
        let _ = stopped.await;
    }));
    drop(channel(registration.clone()).await);

    // What kubelet's plugin watcher sends: the socket path as the authority.
    let authority = registration.to_string_lossy().into_owned();
    let Answer::Data(info) =
        grpc_with_authority(&registration, "/pluginregistration.Registration/GetInfo", &authority).await
    else {
        panic!("GetInfo was not answered");
    };
    let info = String::from_utf8_lossy(&info);
    assert!(info.contains("CSIPlugin") && info.contains("sharedresource.csi.inlineguard.dev"), "{info:?}");
    assert!(info.contains(csi_socket.to_str().unwrap()), "it names the CSI socket: {info:?}");
    // The same request on a socket served as sent is refused by h2 (PROTOCOL_ERROR, 0x1): the
    // failure the rewrite exists for.
    let refused = grpc_with_authority(&csi_socket, "/csi.v1.Identity/GetPluginInfo", &authority).await;
    assert_eq!(refused, Answer::Reset(0x1));
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}
