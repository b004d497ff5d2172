//! The real Kubernetes components the suites run against (kube-apiserver, etcd, csi-sanity, for
//! the node kubelet, for the control plane kube-controller-manager and kube-scheduler, kubectl,
//! and for the benchmarks Pod Security Admission's webhook), and small Go programs of this
//! repository (a registration probe, a pause process, a Secrets Store CSI provider), built from
//! the Go module proxy with the machine's Go toolchain at the versions the modules under
//! `tests/peers/` pin, and cached outside the checkout so that a fresh clone pays for the build
//! once per machine.
//!
//! Each set of modules has a cache directory keyed by a hash of its files and the Go version: a
//! version bump builds into a new directory instead of reusing a stale binary, and a change to
//! one set does not rebuild another. Builds land in a temporary file and are renamed into place,
//! and a lock file serialises concurrent test processes, so a half-written binary is never run.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::repo_root;

/// Where the built peers are.
#[derive(Debug, Clone)]
pub struct Peers {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `csi-sanity`.
    pub csi_sanity: PathBuf,
    /// `registration-probe` (this repository's `tests/peers/cmd/registration-probe`): grpc-go
    /// dialling a plugin's registration socket exactly as kubelet's plugin watcher does.
    pub registration_probe: PathBuf,
    /// `kubelet`, from the same Kubernetes release as the apiserver.
    pub kubelet: PathBuf,
    /// `pause` (`tests/peers/node/cmd/pause`): the sandbox process of the node's pods.
    pub pause: PathBuf,
    /// `downward-render` (`tests/peers/node/cmd/downward-render`): kubelet's own
    /// `fieldpath.FormatMap`, which renders the downward API's label and annotation files.
    pub downward_render: PathBuf,
    /// Pod Security Admission's webhook (`k8s.io/pod-security-admission/cmd/webhook`), the
    /// reference the benchmarks measure our webhook beside.
    pub pod_security_webhook: PathBuf,
    /// `kube-controller-manager`, from the same release.
    pub kube_controller_manager: PathBuf,
    /// `kube-scheduler`, from the same release.
    pub kube_scheduler: PathBuf,
    /// `kubectl`, from the same release.
    pub kubectl: PathBuf,
    /// `e2e-provider` (`tests/peers/secretsstore/cmd/e2e-provider`): a Secrets Store CSI
    /// provider built on the upstream driver's own provider API module, served by grpc-go.
    pub secrets_store_provider: PathBuf,
    /// `cri-pods` (this repository's `tests/peers/node/cmd/cri-pods`): stops and removes every
    /// pod sandbox through the CRI, as kubelet does, so the network plugin's DEL runs.
    pub cri_pods: PathBuf,
    /// The `SecretProviderClass` CRD as the same upstream module ships it (in the Go module
    /// cache, which building the provider filled).
    pub secret_provider_class_crd: PathBuf,
    /// The Kubernetes release the apiserver was built from, e.g. `v1.35.4`.
    pub kubernetes_version: String,
}

/// One Go main package, the module (a directory of `tests/peers`) it is built in, and the file it
/// is built to.
struct Target {
    file: &'static str,
    package: &'static str,
    module: &'static str,
}

/// Modules whose binaries are cached together, and the files that decide them.
struct PeerSet {
    targets: &'static [Target],
    /// Every file that decides what the set's binaries are: the cache key hashes them all.
    sources: &'static [&'static str],
}

const SETS: [PeerSet; 4] = [
    PeerSet {
        targets: &[
            Target { file: "kube-apiserver", package: "k8s.io/kubernetes/cmd/kube-apiserver", module: "." },
            Target { file: "etcd", package: "go.etcd.io/etcd/server/v3", module: "." },
            Target { file: "csi-sanity", package: "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity", module: "." },
            Target { file: "registration-probe", package: "./cmd/registration-probe", module: "." },
            // Its module is pinned already: kube-apiserver requires it, at the release's version.
            Target { file: "pod-security-webhook", package: "k8s.io/pod-security-admission/cmd/webhook", module: "." },
            // The node: a module of its own, since csi-test needs a newer CSI spec than kubelet
            // builds with.
            Target { file: "kubelet", package: "k8s.io/kubernetes/cmd/kubelet", module: "node" },
            Target { file: "pause", package: "./cmd/pause", module: "node" },
            Target { file: "downward-render", package: "./cmd/downward-render", module: "node" },
        ],
        sources: &[
            "go.mod",
            "go.sum",
            "tools.go",
            "cmd/registration-probe/main.go",
            "node/go.mod",
            "node/go.sum",
            "node/tools.go",
            "node/cmd/pause/main.go",
            "node/cmd/downward-render/main.go",
        ],
    },
    PeerSet {
        targets: &[
            Target {
                file: "kube-controller-manager",
                package: "k8s.io/kubernetes/cmd/kube-controller-manager",
                module: "control",
            },
            Target { file: "kube-scheduler", package: "k8s.io/kubernetes/cmd/kube-scheduler", module: "control" },
            Target { file: "kubectl", package: "k8s.io/kubernetes/cmd/kubectl", module: "control" },
        ],
        sources: &["control/go.mod", "control/go.sum", "control/tools.go"],
    },
    PeerSet {
        targets: &[Target { file: "e2e-provider", package: "./cmd/e2e-provider", module: "secretsstore" }],
        sources: &["secretsstore/go.mod", "secretsstore/go.sum", "secretsstore/cmd/e2e-provider/main.go"],
    },
    // A set of its own, so that adding it rebuilt none of the long ones.
    PeerSet {
        targets: &[Target { file: "cri-pods", package: "./cmd/cri-pods", module: "node" }],
        sources: &["node/go.mod", "node/go.sum", "node/cmd/cri-pods/main.go"],
    },
];

/// Builds the peers on first use (minutes, cold) and returns them (milliseconds, cached).
pub fn peers() -> Result<Peers, String> {
    let module = repo_root().join("tests/peers");
    let go_version = go(&module, &["env", "GOVERSION"])?;
    let go_mod = read(&module.join("go.mod"))?;
    let kubernetes_version = required_version(&go_mod, "k8s.io/kubernetes")?;
    let [main, control, secrets_store, node_tools] =
        SETS.each_ref().map(|set| build_set(&module, set, &go_version, &kubernetes_version));
    let (main, control, secrets_store, node_tools) = (main?, control?, secrets_store?, node_tools?);
    // Downloaded if the module cache lost it since the provider was built (`go list -m` would
    // then name no directory).
    let upstream =
        go(&module.join("secretsstore"), &["mod", "download", "-json", "sigs.k8s.io/secrets-store-csi-driver"])?;
    let upstream: serde_json::Value =
        serde_json::from_str(&upstream).map_err(|e| format!("`go mod download -json`: {e}"))?;
    let upstream = upstream["Dir"].as_str().ok_or("`go mod download -json` named no directory")?.to_string();
    Ok(Peers {
        kube_apiserver: main.join("kube-apiserver"),
        etcd: main.join("etcd"),
        csi_sanity: main.join("csi-sanity"),
        registration_probe: main.join("registration-probe"),
        kubelet: main.join("kubelet"),
        pause: main.join("pause"),
        downward_render: main.join("downward-render"),
        pod_security_webhook: main.join("pod-security-webhook"),
        kube_controller_manager: control.join("kube-controller-manager"),
        kube_scheduler: control.join("kube-scheduler"),
        kubectl: control.join("kubectl"),
        secrets_store_provider: secrets_store.join("e2e-provider"),
        cri_pods: node_tools.join("cri-pods"),
        secret_provider_class_crd: PathBuf::from(upstream)
            .join("config/crd/bases/secrets-store.csi.x-k8s.io_secretproviderclasses.yaml"),
        kubernetes_version,
    })
}

/// Builds what `set` lacks in its cache directory and returns the directory.
fn build_set(module: &Path, set: &PeerSet, go_version: &str, kubernetes_version: &str) -> Result<PathBuf, String> {
    let mut sources =
        set.sources.iter().map(|file| read(&module.join(file))).collect::<Result<Vec<String>, String>>()?;
    sources.push(go_version.to_string());
    let key = fingerprint(&sources.iter().map(String::as_str).collect::<Vec<_>>());
    let dir = cache_root()?.join(format!("{go_version}-{key:016x}"));
    fs::create_dir_all(&dir).map_err(|e| format!("creating the peer cache {}: {e}", dir.display()))?;

    let lock_path = dir.join(".lock");
    let lock = File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    for target in set.targets {
        let binary = dir.join(target.file);
        if binary.exists() {
            continue;
        }
        eprintln!("peers: building {} from the Go module proxy (once per machine; minutes when cold)", target.package);
        let partial = dir.join(format!(".{}.partial", target.file));
        // The components report this version to clients; without it, v0.0.0-master.
        let ldflags = format!(
            "-s -w -X k8s.io/component-base/version.gitVersion={kubernetes_version} \
             -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor={}",
            minor(kubernetes_version)
        );
        let out = partial.to_str().ok_or("the cache path is not UTF-8")?.to_string();
        go(&module.join(target.module), &["build", "-trimpath", "-ldflags", &ldflags, "-o", &out, target.package])?;
        fs::rename(&partial, &binary).map_err(|e| format!("moving {} into place: {e}", binary.display()))?;
    }
    drop(lock);
    Ok(dir)
}

/// `$INLINE_GUARD_PEERS_CACHE`, else `$XDG_CACHE_HOME/inline-guard/peers`, else
/// `~/.cache/inline-guard/peers`.
fn cache_root() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("INLINE_GUARD_PEERS_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("neither XDG_CACHE_HOME nor HOME is set")?).join(".cache"),
    };
    Ok(base.join("inline-guard/peers"))
}

/// Runs `go ARGS` in the pinned module, offline from anything but the module proxy.
fn go(module: &Path, args: &[&str]) -> Result<String, String> {
    let mut command = Command::new("go");
    command.args(args).current_dir(module).env("GOFLAGS", "-mod=readonly").env("CGO_ENABLED", "0");
    // A cold build of kube-apiserver takes minutes; an hour means something is stuck.
    let output = crate::bounded::output_within(&mut command, Duration::from_secs(3600), &format!("`go {}`", args[0]))
        .map_err(|e| format!("{e}; the end-to-end suites need the Go toolchain on PATH"))?;
    if !output.status.success() {
        return Err(format!(
            "`go {}` in {} failed ({}):\n{}",
            args.join(" "),
            module.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn read(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The version `go.mod` requires of `module`.
fn required_version(go_mod: &str, module: &str) -> Result<String, String> {
    go_mod
        .lines()
        .map(str::split_whitespace)
        .find_map(|mut words| {
            let first = words.next()?;
            let (name, version) =
                if first == "require" { (words.next()?, words.next()?) } else { (first, words.next()?) };
            (name == module).then(|| version.to_string())
        })
        .ok_or_else(|| format!("tests/peers/go.mod does not require {module}"))
}

/// `35` of `v1.35.4`.
fn minor(version: &str) -> &str {
    version.split('.').nth(1).unwrap_or("0")
}

/// FNV-1a over the parts, separated so that moving bytes between parts changes the key. Stable
/// across Rust releases, unlike `DefaultHasher`.
fn fingerprint(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain([0xff]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_required_version_is_read_from_a_require_block() {
        let go_mod = "module x\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v3.6.16\n\tk8s.io/kubernetes v1.35.4\n)\n";
        assert_eq!(required_version(go_mod, "k8s.io/kubernetes").unwrap(), "v1.35.4");
        assert_eq!(minor("v1.35.4"), "35");
        assert!(required_version(go_mod, "k8s.io/api").is_err());
    }

    #[test]
    fn the_fingerprint_changes_when_bytes_move_between_parts() {
        assert_ne!(fingerprint(&["ab", "c"]), fingerprint(&["a", "bc"]));
        assert_eq!(fingerprint(&["ab", "c"]), fingerprint(&["ab", "c"]));
    }
}
