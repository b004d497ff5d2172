//! `images/build`, run as the README says: the images are OCI layouts whose programs start in
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
fn the_images_build_offline_the_same_twice_and_start_in_their_own_root() {
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
    example_providers_install_a_helper_that_runs_without_a_shell_of_the_drivers(first.path(), second.path(), &said);
}

/// The example providers' image: the same twice; its entrypoint, given the driver's helper
/// directory, copies the example helper and the static busybox it runs on into it; and the
/// helper then answers from a root holding nothing else (the driver's image has no shell),
/// with an empty environment, as the driver runs it.
fn example_providers_install_a_helper_that_runs_without_a_shell_of_the_drivers(
    first: &Path,
    second: &Path,
    said: &str,
) {
    let name = "example-providers";
    let archive = std::fs::read(first.join(format!("{name}.tar")))
        .unwrap_or_else(|e| panic!("{name}.tar was not built ({e}): images/build said: {said}"));
    assert!(archive == std::fs::read(second.join(format!("{name}.tar"))).unwrap(), "{name}: two builds differ");
    let files = files(&archive);
    let entry = &json(&files["index.json"])["manifests"][0];
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(entry["annotations"]["io.containerd.image.name"], format!("ghcr.io/inline-guard/{name}:{version}"));
    assert!(said.contains(entry["digest"].as_str().unwrap()), "images/build told the digest of {name}: {said}");
    let manifest = json(blob(&files, &entry["digest"]));
    let config = json(blob(&files, &manifest["config"]["digest"]));
    let entrypoint: Vec<String> = serde_json::from_value(config["config"]["Entrypoint"].clone()).unwrap();
    assert_eq!(entrypoint, ["/providers/busybox", "cp", "-pR", "/providers/."]);
    assert_eq!(config["config"]["User"], "0:0");

    let image = tempfile::tempdir().unwrap();
    tar::Archive::new(blob(&files, &manifest["layers"][0]["digest"])).unpack(image.path()).unwrap();
    let helpers = "/usr/libexec/inline-guard";
    std::fs::create_dir_all(image.path().join(helpers.trim_start_matches('/'))).unwrap();
    let installed =
        Command::new(chroot()).arg(image.path()).args(&entrypoint).arg(helpers).env_clear().output().unwrap();
    assert!(installed.status.success(), "the entrypoint failed: {}", String::from_utf8_lossy(&installed.stderr));

    // The driver's root: the helper directory as the init container filled it, and the vault
    // the example helper reads; no /bin/sh.
    let root = tempfile::tempdir().unwrap();
    let directory = root.path().join(helpers.trim_start_matches('/'));
    std::fs::create_dir_all(&directory).unwrap();
    for file in ["busybox", "exec-helper.sh"] {
        std::fs::copy(image.path().join(helpers.trim_start_matches('/')).join(file), directory.join(file)).unwrap();
    }
    let helper = std::fs::read_to_string(directory.join("exec-helper.sh")).unwrap();
    assert!(helper.starts_with(&format!("#!{helpers}/busybox sh\n")), "{}", helper.lines().next().unwrap_or_default());
    let pod = root.path().join("var/lib/inline-guard/example-vault/team-a/web");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join("db-password"), "from-the-vault").unwrap();
    assert!(!root.path().join("bin/sh").exists());
    // As in a container, /proc is mounted (busybox's shell runs its own tools through
    // /proc/self/exe), in a mount namespace of the helper's own that goes with it.
    std::fs::create_dir_all(root.path().join("proc")).unwrap();
    let run = |arguments: &[&str]| {
        let output = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(format!(r#"mount -t proc proc "$0/proc" && exec {} "$0" "$@""#, chroot()))
            .arg(root.path())
            .arg(format!("{helpers}/exec-helper.sh"))
            .args(arguments)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap();
        assert!(output.status.success(), "{arguments:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let options = r#"{"kubernetes.io/pod.namespace":"team-a","kubernetes.io/pod.name":"web"}"#;
    let answer = run(&["mount", "/mnt", options]);
    assert!(answer.contains(r#""files": {"secrets": ["db-password"]}"#), "{answer}");
    assert_eq!(run(&["get", "secrets/db-password", "team-a", "web"]), "from-the-vault");
}
