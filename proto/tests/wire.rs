//! The generated messages speak the published wire format: fields are pinned by their encoded
//! bytes (tag = field number << 3 | wire type), messages round-trip, and the gRPC service names
//! are the ones COs and kubelet call.

use std::collections::HashMap;

use inline_guard_proto::csi::v1::{
    NodePublishVolumeRequest, ProbeResponse, VolumeCapability, identity_server, node_server, volume_capability,
};
use inline_guard_proto::pluginregistration::{PluginInfo, registration_server};
use inline_guard_proto::secretsstore::{self, File, MountRequest, MountResponse, ObjectVersion};
use prost::Message;

#[test]
fn node_publish_fields_have_the_spec_numbers() {
    let request = NodePublishVolumeRequest { volume_id: "v".into(), readonly: true, ..Default::default() };
    // volume_id = 1 (length-delimited: 0x0a), readonly = 6 (varint: 0x30).
    assert_eq!(request.encode_to_vec(), [0x0a, 0x01, b'v', 0x30, 0x01]);

    let request = NodePublishVolumeRequest { target_path: "/t".into(), ..Default::default() };
    // target_path = 4 (0x22).
    assert_eq!(request.encode_to_vec(), [0x22, 0x02, b'/', b't']);

    let context: HashMap<String, String> = [("k".to_string(), "v".to_string())].into();
    let request = NodePublishVolumeRequest { volume_context: context, ..Default::default() };
    // volume_context = 8 (0x42): a map entry message with key = 1, value = 2.
    assert_eq!(request.encode_to_vec(), [0x42, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v']);
}

#[test]
fn a_full_publish_request_round_trips() {
    let request = NodePublishVolumeRequest {
        volume_id: "csi-0a1b".into(),
        publish_context: [("p".to_string(), "1".to_string())].into(),
        staging_target_path: String::new(),
        target_path: "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/v/mount".into(),
        volume_capability: Some(VolumeCapability {
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeReaderOnly as i32,
            }),
            access_type: Some(volume_capability::AccessType::Mount(volume_capability::MountVolume {
                fs_type: "tmpfs".into(),
                mount_flags: vec!["ro".into()],
                volume_mount_group: String::new(),
            })),
        }),
        readonly: true,
        secrets: HashMap::new(),
        volume_context: [("csi.storage.k8s.io/ephemeral".to_string(), "true".to_string())].into(),
    };
    let decoded = NodePublishVolumeRequest::decode(request.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded, request);
}

#[test]
fn probe_readiness_is_a_wrapped_bool_so_absent_differs_from_false() {
    assert_eq!(ProbeResponse { ready: None }.encode_to_vec(), Vec::<u8>::new());
    // ready = 1, a BoolValue message whose value = 1 is false, so the wrapper is empty.
    assert_eq!(ProbeResponse { ready: Some(false) }.encode_to_vec(), [0x0a, 0x00]);
    assert_eq!(ProbeResponse { ready: Some(true) }.encode_to_vec(), [0x0a, 0x02, 0x08, 0x01]);
}

#[test]
fn plugin_info_fields_have_kubelets_numbers() {
    let info = PluginInfo {
        r#type: "CSIPlugin".into(),
        name: "d".into(),
        endpoint: "/e".into(),
        supported_versions: vec!["1.0.0".into()],
    };
    let bytes = info.encode_to_vec();
    assert_eq!(&bytes[..2], [0x0a, 0x09], "type = 1");
    assert_eq!(PluginInfo::decode(bytes.as_slice()).unwrap(), info);
}

#[test]
fn service_names_are_the_ones_clients_call() {
    use tonic::server::NamedService;
    fn name<S: NamedService>() -> &'static str {
        S::NAME
    }
    assert_eq!(name::<identity_server::IdentityServer<()>>(), "csi.v1.Identity");
    assert_eq!(name::<node_server::NodeServer<()>>(), "csi.v1.Node");
    assert_eq!(name::<registration_server::RegistrationServer<()>>(), "pluginregistration.Registration");
    assert_eq!(
        name::<secretsstore::csi_driver_provider_server::CsiDriverProviderServer<()>>(),
        "v1alpha1.CSIDriverProvider"
    );
}

#[test]
fn secrets_store_messages_have_upstreams_numbers() {
    // target_path = 3 (0x1a), permission = 4 (0x22), current_object_version = 5 (0x2a) whose
    // id = 1 (0x0a) and version = 2 (0x12).
    let request = MountRequest {
        target_path: "/t".into(),
        permission: "420".into(),
        current_object_version: vec![ObjectVersion { id: "a".into(), version: "1".into() }],
        ..Default::default()
    };
    let expected =
        [0x1a, 0x02, b'/', b't', 0x22, 0x03, b'4', b'2', b'0', 0x2a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'1'];
    assert_eq!(request.encode_to_vec(), expected);
    // attributes = 1 (0x0a), secrets = 2 (0x12).
    let request = MountRequest { attributes: "{}".into(), secrets: "{}".into(), ..Default::default() };
    assert_eq!(request.encode_to_vec(), [0x0a, 0x02, b'{', b'}', 0x12, 0x02, b'{', b'}']);

    // files = 3 (0x1a) whose path = 1, mode = 2 (varint 0x10), contents = 3 (0x1a); error = 2
    // (0x12) whose code = 1.
    let response = MountResponse {
        object_version: vec![],
        error: Some(secretsstore::Error { code: "E".into() }),
        files: vec![File { path: "f".into(), mode: 420, contents: b"x".to_vec() }],
    };
    let expected = [0x12, 0x03, 0x0a, 0x01, b'E', 0x1a, 0x09, 0x0a, 0x01, b'f', 0x10, 0xa4, 0x03, 0x1a, 0x01, b'x'];
    assert_eq!(response.encode_to_vec(), expected);
}
