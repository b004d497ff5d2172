//! An OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/...`) holding one image for
//! one or more linux platforms, as a tar: `index.json` names one image index (the image's
//! identity, what a registry serves under the tag), which lists one manifest of one
//! uncompressed layer per platform. The form `skopeo copy --all oci-archive:...` pushes and
//! `ctr images import` loads (the machine's platform, or `--all-platforms`). Every byte follows
//! from the layers and the [`ImageSpec`], so two builds of one commit give one digest.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::layer::Layer;
use crate::platform::Architecture;

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// What the image says of itself.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The repository, without a tag (`ghcr.io/inline-guard/csi-volume-admission`).
    pub repository: String,
    /// The tag and `org.opencontainers.image.version` (the workspace version).
    pub version: String,
    /// `org.opencontainers.image.revision`: the commit built.
    pub revision: String,
    /// `org.opencontainers.image.source`: where the source lives.
    pub source: String,
    /// The commit's time, seconds since the epoch: the image's `created` and every file's time.
    pub created: i64,
    /// The program and its arguments.
    pub entrypoint: Vec<String>,
    /// The user it runs as (`65532:65532`, or `0:0`).
    pub user: String,
}

/// A built image: the archive and what identifies it.
#[derive(Debug)]
pub struct Image {
    /// The OCI layout as a tar.
    pub archive: Vec<u8>,
    /// The image index's digest (`sha256:...`): the image's identity in a registry.
    pub digest: String,
    /// Each platform's manifest digest and layer size, uncompressed.
    pub platforms: Vec<(Architecture, String, usize)>,
}

fn sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": format!("sha256:{}", sha256(bytes)), "size": bytes.len()})
}

/// One platform's image: its config, manifest and layer blobs, and the manifest's descriptor.
struct PlatformImage {
    blobs: [Vec<u8>; 3],
    descriptor: Value,
    layer_bytes: usize,
}

fn platform_image(spec: &ImageSpec, architecture: Architecture, rootfs: &Layer) -> std::io::Result<PlatformImage> {
    let mtime = u64::try_from(spec.created).unwrap_or(0);
    let created = created(spec);
    let layer = rootfs.to_tar(mtime)?;
    let labels = labels(spec);
    let config = serde_json::to_vec(&json!({
        "created": created,
        "architecture": architecture.name(),
        "os": "linux",
        "config": {
            "User": spec.user,
            "Entrypoint": spec.entrypoint,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha256(&layer))]},
        "history": [{"created": created, "created_by": "images/build"}],
    }))?;
    let mut annotations = labels.clone();
    annotations.insert("org.opencontainers.image.created", &created);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor(CONFIG, &config),
        "layers": [descriptor(LAYER, &layer)],
        "annotations": annotations,
    }))?;
    let mut descriptor = descriptor(MANIFEST, &manifest);
    descriptor["platform"] = json!({"architecture": architecture.name(), "os": "linux"});
    let layer_bytes = layer.len();
    Ok(PlatformImage { blobs: [config, manifest, layer], descriptor, layer_bytes })
}

fn created(spec: &ImageSpec) -> String {
    jiff::Timestamp::from_second(spec.created).map(|t| t.to_string()).unwrap_or_default()
}

fn labels(spec: &ImageSpec) -> BTreeMap<&'static str, &str> {
    BTreeMap::from([
        ("org.opencontainers.image.source", spec.source.as_str()),
        ("org.opencontainers.image.version", spec.version.as_str()),
        ("org.opencontainers.image.revision", spec.revision.as_str()),
    ])
}

/// The image of `rootfs` per platform as `spec` describes it, platforms in the order given.
pub fn build(spec: &ImageSpec, rootfs: &[(Architecture, Layer)]) -> std::io::Result<Image> {
    let mtime = u64::try_from(spec.created).unwrap_or(0);
    let images =
        rootfs.iter().map(|(arch, layer)| platform_image(spec, *arch, layer)).collect::<std::io::Result<Vec<_>>>()?;
    let mut annotations = labels(spec);
    let created = created(spec);
    annotations.insert("org.opencontainers.image.created", &created);
    let image_index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": images.iter().map(|image| &image.descriptor).collect::<Vec<_>>(),
        "annotations": annotations,
    }))?;
    let mut index_descriptor = descriptor(INDEX, &image_index);
    index_descriptor["annotations"] = json!({
        // skopeo's `oci-archive:FILE:TAG` picks by this; containerd's import names the image by the next.
        "org.opencontainers.image.ref.name": spec.version,
        "io.containerd.image.name": format!("{}:{}", spec.repository, spec.version),
    });
    let digest = index_descriptor["digest"].as_str().unwrap_or_default().to_string();
    let index = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [index_descriptor]}))?;

    let mut archive = Layer::default();
    archive.add_file("/oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec());
    archive.add_file("/index.json", 0o644, index);
    archive.add_file(&format!("/blobs/sha256/{}", sha256(&image_index)), 0o644, image_index);
    let mut platforms = Vec::new();
    for ((architecture, _), image) in rootfs.iter().zip(images) {
        let manifest = image.descriptor["digest"].as_str().unwrap_or_default().to_string();
        platforms.push((*architecture, manifest, image.layer_bytes));
        for blob in image.blobs {
            archive.add_file(&format!("/blobs/sha256/{}", sha256(&blob)), 0o644, blob);
        }
    }
    Ok(Image { archive: archive.to_tar(mtime)?, digest, platforms })
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn spec() -> ImageSpec {
        ImageSpec {
            repository: "example.invalid/tool".into(),
            version: "1.2.3".into(),
            revision: "abc123".into(),
            source: "https://example.invalid/src".into(),
            created: 1_700_000_000,
            entrypoint: vec!["/usr/local/bin/tool".into()],
            user: "65532:65532".into(),
        }
    }

    fn files(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let mut tar = tar::Archive::new(archive);
        let mut files = BTreeMap::new();
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.insert(entry.path().unwrap().display().to_string(), data);
        }
        files
    }

    fn json_of(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn the_layout_indexes_a_manifest_whose_blobs_are_all_present_under_their_digests() {
        let mut rootfs = Layer::default();
        rootfs.add_file("/usr/local/bin/tool", 0o755, b"program".to_vec());
        let mut other = Layer::default();
        other.add_file("/usr/local/bin/tool", 0o755, b"another program".to_vec());
        let image = build(&spec(), &[(Architecture::Amd64, rootfs), (Architecture::Arm64, other)]).unwrap();
        let files = files(&image.archive);
        assert_eq!(json_of(&files["oci-layout"]), json!({"imageLayoutVersion": "1.0.0"}));
        let index = json_of(&files["index.json"]);
        let entry = &index["manifests"][0];
        assert_eq!(index["manifests"].as_array().unwrap().len(), 1, "one image, named once");
        assert_eq!(entry["mediaType"], INDEX);
        assert_eq!(entry["digest"], image.digest.as_str());
        assert_eq!(entry["annotations"]["io.containerd.image.name"], "example.invalid/tool:1.2.3");
        assert_eq!(entry["annotations"]["org.opencontainers.image.ref.name"], "1.2.3");
        for (name, data) in files.iter().filter(|(n, _)| n.starts_with("blobs/sha256/") && !n.ends_with('/')) {
            assert_eq!(name.trim_start_matches("blobs/sha256/"), sha256(data), "{name} is stored under its digest");
        }
        let image_index = json_of(&files[&format!("blobs/sha256/{}", image.digest.trim_start_matches("sha256:"))]);
        let platforms: Vec<&Value> =
            image_index["manifests"].as_array().unwrap().iter().map(|m| &m["platform"]).collect();
        assert_eq!(
            platforms,
            [&json!({"architecture": "amd64", "os": "linux"}), &json!({"architecture": "arm64", "os": "linux"})]
        );
        assert_eq!(image.platforms[1].1, image_index["manifests"][1]["digest"].as_str().unwrap());
        let arm64 = json_of(&files[&format!("blobs/sha256/{}", image.platforms[1].1.trim_start_matches("sha256:"))]);
        let arm64_config = arm64["config"]["digest"].as_str().unwrap().trim_start_matches("sha256:");
        assert_eq!(json_of(&files[&format!("blobs/sha256/{arm64_config}")])["architecture"], "arm64");
        let manifest = json_of(&files[&format!("blobs/sha256/{}", image.platforms[0].1.trim_start_matches("sha256:"))]);
        let config_digest = manifest["config"]["digest"].as_str().unwrap().trim_start_matches("sha256:");
        let config = json_of(&files[&format!("blobs/sha256/{config_digest}")]);
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(config["config"]["Labels"]["org.opencontainers.image.revision"], "abc123");
        assert_eq!(config["created"], "2023-11-14T22:13:20Z");
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest, "an uncompressed layer's diff ID is its digest");
    }

    #[test]
    fn one_input_gives_one_digest_and_another_revision_another() {
        let mut rootfs = Layer::default();
        rootfs.add_file("/usr/local/bin/tool", 0o755, b"program".to_vec());
        let rootfs = [(Architecture::Amd64, rootfs)];
        let one = build(&spec(), &rootfs).unwrap();
        let two = build(&spec(), &rootfs).unwrap();
        assert_eq!(one.archive, two.archive);
        let other = build(&ImageSpec { revision: "def456".into(), ..spec() }, &rootfs).unwrap();
        assert_ne!(one.digest, other.digest);
    }
}
