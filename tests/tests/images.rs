//! `images/build`, run as the README says: both images are OCI layouts whose programs start in
//! a root holding only what the image holds, under the size targets, naming the commit, with
//! no path of the machine that built them; and a second build gives the same bytes.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use inline_guard_tests::images::build_images;
use inline_guard_tests::repo_root;

/// Each image, the programs it holds (the first its entrypoint), and its uncompressed size
/// target (issue 25): webhook < 20 MB, driver < 30 MB.
const IMAGES: [(&str, &[&str], usize); 2] = [
    ("csi-volume-admission", &["csi-volume-admission"], 20_000_000),
    ("sharedresource-csi-driver", &["sharedresource-csi-driver", "sharedresource-read-grants"], 30_000_000),
];

fn build(out: &Path) -> String {
    build_images(out, None).unwrap_or_else(|error| panic!("{error}"))
}

fn files(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in tar::Archive::new(archive).entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        files.insert(entry.path().unwrap().display().to_string(), data);
    }
    files
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

fn blob<'a>(files: &'a BTreeMap<String, Vec<u8>>, digest: &serde_json::Value) -> &'a [u8] {
    let hex = digest.as_str().unwrap().trim_start_matches("sha256:");
    &files[&format!("blobs/sha256/{hex}")]
}

/// coreutils' chroot, by path: the programs start with an empty environment.
fn chroot() -> &'static str {
    ["/usr/sbin/chroot", "/usr/bin/chroot", "/sbin/chroot"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("chroot (coreutils) is installed")
}

#[test]
fn both_images_build_offline_the_same_twice_and_start_in_their_own_root() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let said = build(first.path());
    build(second.path());
    let version = env!("CARGO_PKG_VERSION");
    let head = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(repo_root()).output().unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();

    for (name, programs, target) in IMAGES {
        let archive = std::fs::read(first.path().join(format!("{name}.tar"))).unwrap();
        let again = std::fs::read(second.path().join(format!("{name}.tar"))).unwrap();
        assert!(archive == again, "{name}: two builds of one commit differ");

        let files = files(&archive);
        let index = json(&files["index.json"]);
        let entry = &index["manifests"][0];
        assert_eq!(entry["annotations"]["io.containerd.image.name"], format!("ghcr.io/inline-guard/{name}:{version}"));
        assert_eq!(entry["platform"], serde_json::json!({"architecture": "amd64", "os": "linux"}));
        let digest = entry["digest"].as_str().unwrap();
        assert!(said.contains(digest), "images/build told the digest of {name}: {said}");
        let manifest = json(blob(&files, &entry["digest"]));
        let config = json(blob(&files, &manifest["config"]["digest"]));
        let labels = &config["config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], version);
        assert!(labels["org.opencontainers.image.revision"].as_str().unwrap().starts_with(&head), "{labels}");
        assert_eq!(config["config"]["Entrypoint"][0], format!("/usr/local/bin/{name}"));
        let user = if name == "csi-volume-admission" { "65532:65532" } else { "0:0" };
        assert_eq!(config["config"]["User"], user);

        let layer = blob(&files, &manifest["layers"][0]["digest"]);
        assert!(layer.len() < target, "{name}: {} bytes uncompressed, target < {target}", layer.len());
        let root = tempfile::tempdir().unwrap();
        tar::Archive::new(layer).unpack(root.path()).unwrap();
        for program in programs {
            let binary = std::fs::read(root.path().join(format!("usr/local/bin/{program}"))).unwrap();
            for path in [repo_root().display().to_string(), std::env::var("HOME").unwrap_or_default() + "/.cargo"] {
                let found = binary.windows(path.len()).any(|w| w == path.as_bytes());
                assert!(!found, "{program} holds the build machine's path {path}");
            }
            // It starts with nothing but the image's files (a chroot: root, as tests/run is).
            let started = Command::new(chroot())
                .arg(root.path())
                .args([format!("/usr/local/bin/{program}"), "--version".into()])
                .env_clear()
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&started.stdout);
            assert!(
                started.status.success() && stdout.trim() == format!("{program} {version}"),
                "{program} did not start in the root of {name}: {stdout} {}",
                String::from_utf8_lossy(&started.stderr)
            );
        }
    }
}
