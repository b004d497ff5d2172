//! `images/build`, run as the README says: the images are OCI layouts of one image index each,
//! for linux/amd64 and linux/arm64 (the example providers' for amd64), whose programs start in
//! a root holding only what the image holds (the arm64 ones under qemu's user-mode emulator,
//! their ELF headers arm64's), under the size targets on both, naming the commit, with no path
//! of the machine that built them; and a second build gives the same bytes.
//!
//! Two tests, one per command:
//! - every commit (`tests/run`): the node's platform, amd64, built twice from one target
//!   directory: the same bytes prove the packaging deterministic, not the compile;
//! - a release (`tests/release`): both platforms, the second build compiled from nothing in a
//!   target directory of its own: the same bytes prove the compile reproducible.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use inline_guard_tests::images::build_images_in;
use inline_guard_tests::repo_root;

/// Each image, the programs it starts (the first its entrypoint; the driver's image holds one
/// program under both its names), and its uncompressed size target (issue 25): webhook < 20 MB,
/// driver < 30 MB.
const IMAGES: [(&str, &[&str], usize); 2] = [
    ("csi-volume-admission", &["csi-volume-admission"], 20_000_000),
    ("sharedresource-csi-driver", &["sharedresource-csi-driver", "sharedresource-read-grants"], 30_000_000),
];

/// `images/build OUT` for `platforms` (all if none), in `target` (its default if none).
fn build(out: &Path, platforms: Option<&str>, target: Option<&Path>) -> String {
    build_images_in(out, None, platforms, target).unwrap_or_else(|error| panic!("{error}"))
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

/// `index.json`'s one entry (the image index, named) and each platform's architecture and
/// manifest, in the index's order.
fn image_index(files: &BTreeMap<String, Vec<u8>>) -> (serde_json::Value, Vec<(String, serde_json::Value)>) {
    let index = json(&files["index.json"]);
    assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1), "one image per archive: {index}");
    let entry = index["manifests"][0].clone();
    assert_eq!(entry["mediaType"], "application/vnd.oci.image.index.v1+json", "{entry}");
    let image_index = json(blob(files, &entry["digest"]));
    let platforms = image_index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|descriptor| {
            assert_eq!(descriptor["platform"]["os"], "linux");
            let architecture = descriptor["platform"]["architecture"].as_str().unwrap().to_string();
            (architecture, json(blob(files, &descriptor["digest"])))
        })
        .collect();
    (entry, platforms)
}

/// The revision label of the image's first platform in `archive`.
fn revision_of(archive: &[u8]) -> String {
    let files = files(archive);
    let (_, platforms) = image_index(&files);
    let config = json(blob(&files, &platforms[0].1["config"]["digest"]));
    config["config"]["Labels"]["org.opencontainers.image.revision"].as_str().unwrap_or_default().to_string()
}

/// The ELF header's `e_machine` (little-endian, at byte 18).
fn elf_machine(bytes: &[u8]) -> u16 {
    assert!(bytes.starts_with(b"\x7fELF"), "not an ELF file");
    u16::from_le_bytes([bytes[18], bytes[19]])
}

/// `e_machine` of an architecture: EM_X86_64, EM_AARCH64.
fn machine(architecture: &str) -> u16 {
    match architecture {
        "amd64" => 62,
        "arm64" => 183,
        other => panic!("no ELF machine known for {other}"),
    }
}

/// `program --version` answers from `root` with nothing but the image's files and an empty
/// environment: amd64 in a chroot (root, as tests/run is); arm64 under qemu's user-mode
/// emulator with `root` as the prefix its loader and libraries are found under.
fn starts_in_its_own_root(root: &Path, program: &str, architecture: &str, version: &str) {
    let inside = format!("/usr/local/bin/{program}");
    let started = match architecture {
        "amd64" => Command::new(chroot()).arg(root).arg(&inside).arg("--version").env_clear().output().unwrap(),
        _ => Command::new("qemu-aarch64-static")
            .arg("-L")
            .arg(root)
            .arg(root.join(inside.trim_start_matches('/')))
            .arg("--version")
            .env_clear()
            .output()
            .expect("qemu-aarch64-static (qemu-user-static, which tests/node-packages installs)"),
    };
    let stdout = String::from_utf8_lossy(&started.stdout);
    assert!(
        started.status.success() && stdout.trim() == format!("{program} {version}"),
        "{program} ({architecture}) did not start in its image's root: {stdout} {}",
        String::from_utf8_lossy(&started.stderr)
    );
}

#[test]
fn the_images_build_offline_for_amd64_package_the_same_twice_and_start_in_their_own_root() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let said = build(first.path(), Some("amd64"), None);
    build(second.path(), Some("amd64"), None);
    the_images_are_the_same_and_start(first.path(), second.path(), &said, &["amd64"]);
    println!(
        "images: amd64, packaged twice from one target directory; arm64 and a compile from nothing: tests/release"
    );
}

#[test]
fn the_images_build_for_both_platforms_the_same_from_two_target_directories_and_start() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let said = build(first.path(), None, None);
    // Compiled from nothing: a target directory of this test's own, removed with it.
    let target = inline_guard_tests::run_root::OwnedDir::new().unwrap_or_else(|e| panic!("{e}"));
    build(second.path(), None, Some(target.path()));
    the_images_are_the_same_and_start(first.path(), second.path(), &said, &["amd64", "arm64"]);
}

/// The two builds' archives are the same bytes; each image is as described at the top, for
/// `architectures`.
fn the_images_are_the_same_and_start(first: &Path, second: &Path, said: &str, architectures: &[&str]) {
    let version = env!("CARGO_PKG_VERSION");
    let head = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(repo_root()).output().unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();

    for (name, programs, target) in IMAGES {
        let archive = std::fs::read(first.join(format!("{name}.tar"))).unwrap();
        let again = std::fs::read(second.join(format!("{name}.tar"))).unwrap();
        // Two builds of one tree: a checkout changed between them (an edit, a commit) is named
        // in the images' revision label, and is no finding about the build.
        let (revision, revision_again) = (revision_of(&archive), revision_of(&again));
        assert_eq!(
            revision, revision_again,
            "{name}: the checkout changed between the two builds; build an unchanging one"
        );
        assert!(archive == again, "{name}: two builds of one commit differ");

        let files = files(&archive);
        let (entry, platforms) = image_index(&files);
        assert_eq!(entry["annotations"]["io.containerd.image.name"], format!("ghcr.io/inline-guard/{name}:{version}"));
        let digest = entry["digest"].as_str().unwrap();
        assert!(said.contains(digest), "images/build told the digest of {name}: {said}");
        let built: Vec<&str> = platforms.iter().map(|(arch, _)| arch.as_str()).collect();
        assert_eq!(architectures, built, "{name}: the platforms of its index");
        for (architecture, manifest) in &platforms {
            let config = json(blob(&files, &manifest["config"]["digest"]));
            assert_eq!(config["architecture"], architecture.as_str());
            let labels = &config["config"]["Labels"];
            assert_eq!(labels["org.opencontainers.image.version"], version);
            assert!(labels["org.opencontainers.image.revision"].as_str().unwrap().starts_with(&head), "{labels}");
            assert_eq!(config["config"]["Entrypoint"][0], format!("/usr/local/bin/{name}"));
            let user = if name == "csi-volume-admission" { "65532:65532" } else { "0:0" };
            assert_eq!(config["config"]["User"], user);

            let layer = blob(&files, &manifest["layers"][0]["digest"]);
            assert!(
                layer.len() < target,
                "{name} {architecture}: {} bytes uncompressed, target < {target}",
                layer.len()
            );
            eprintln!("images: {name} linux/{architecture}: {} bytes uncompressed (target < {target})", layer.len());
            let root = tempfile::tempdir().unwrap();
            tar::Archive::new(layer).unpack(root.path()).unwrap();
            if name == "sharedresource-csi-driver" {
                let link = std::fs::read_link(root.path().join("usr/local/bin/sharedresource-read-grants"));
                assert_eq!(
                    link.ok(),
                    Some(std::path::PathBuf::from("sharedresource-csi-driver")),
                    "{architecture}: the read-grants controller is the driver's program by another name"
                );
            }
            for program in programs {
                let path = root.path().join(format!("usr/local/bin/{program}"));
                let binary = std::fs::read(&path).unwrap();
                assert_eq!(
                    elf_machine(&binary),
                    machine(architecture),
                    "{program} in {name} {architecture}: its ELF machine"
                );
                for path in [repo_root().display().to_string(), std::env::var("HOME").unwrap_or_default() + "/.cargo"] {
                    let found = binary.windows(path.len()).any(|w| w == path.as_bytes());
                    assert!(!found, "{program} holds the build machine's path {path}");
                }
                starts_in_its_own_root(root.path(), program, architecture, version);
            }
            // Every library the image holds is of its architecture too.
            for library in inline_guard_tests::walk::files_under(root.path())
                .into_iter()
                .filter(|p| p.to_string_lossy().contains(".so"))
            {
                let bytes = std::fs::read(&library).unwrap();
                assert_eq!(
                    elf_machine(&bytes),
                    machine(architecture),
                    "{} in {name} {architecture}",
                    library.display()
                );
            }
        }
    }
    example_providers_install_a_helper_that_runs_without_a_shell_of_the_drivers(first, second, said);
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
    let (entry, platforms) = image_index(&files);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(entry["annotations"]["io.containerd.image.name"], format!("ghcr.io/inline-guard/{name}:{version}"));
    assert!(said.contains(entry["digest"].as_str().unwrap()), "images/build told the digest of {name}: {said}");
    // Its busybox is the building machine's: amd64 only (docs/deploying.md).
    assert_eq!(platforms.iter().map(|(arch, _)| arch.as_str()).collect::<Vec<_>>(), ["amd64"]);
    let manifest = platforms[0].1.clone();
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
