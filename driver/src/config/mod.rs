//! The driver's configuration file (`config/driver.yaml`): where state, kubelet's root and the
//! registration socket live, how big each volume may be, whether the host mount is read-only
//! too, where the static shares are, and how long shutdown may take. Parsed once at start; a bad
//! file stops the driver naming the field.

pub mod file;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

use crate::units::{nonzero, quantity};

/// What the driver's process needs beside the content it holds: its code, caches, records and
/// the pages of listed objects it reads (about 20 MiB resident when idle, measured on the e2e
/// suite's node; a share's reads and the apiserver client's buffers on top).
pub const PROCESS_ROOM: u64 = 64 << 20;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DriverConfig {
    /// Where volume records are kept.
    pub state_dir: PathBuf,
    /// kubelet's plugin registry; `<driver>-reg.sock` is served there.
    pub registry_dir: PathBuf,
    /// kubelet's root directory: every target must be a CSI inline volume's `mount` directory
    /// under `<kubeletDir>/pods/`. Trusted as configured (it may itself be a symlink); nothing
    /// below it is followed through a symlink.
    #[serde(deserialize_with = "absolute_normal_path")]
    pub kubelet_dir: PathBuf,
    /// Size limit of each volume's tmpfs, e.g. `64Mi`.
    #[serde(deserialize_with = "quantity")]
    pub tmpfs_size: u64,
    /// The most volume content all volumes of the node may hold together. The kernel charges
    /// each tmpfs page the driver writes to the driver's own memory cgroup, so this must stay
    /// below the DaemonSet's memory limit with room for the process itself.
    #[serde(deserialize_with = "quantity")]
    pub content_budget: u64,
    /// The most volume content the volumes of one namespace's pods may hold on the node: what
    /// one tenant can take of `contentBudget`.
    #[serde(deserialize_with = "quantity")]
    pub namespace_content_budget: u64,
    /// Mount each tmpfs read-only on the host too.
    pub host_read_only: bool,
    /// Where volume content comes from; when unset, `static` if `staticSharesDir` is given,
    /// `kubernetes` otherwise (see [`DriverConfig::source`]).
    pub content_source: Option<SourceKind>,
    /// The kubeconfig of the Kubernetes source; without it, `$KUBECONFIG` or the in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// A directory of static shares (one subdirectory each), for demos and tests.
    pub static_shares_dir: Option<PathBuf>,
    /// How often published volumes are computed again, access check included (the recheck
    /// interval): rewritten when their content changed, emptied when access or the share went.
    #[serde(deserialize_with = "seconds")]
    pub refresh_seconds: u64,
    /// How long an access check's answer serves a (service account, share) pair on this node
    /// when no grant's change concerns it (a notice of the access-notices controller, through
    /// this node's `SharedResourceNode`, forgets it at once when one may); spread ±10% per pair.
    /// The backstop for what the notices cannot see (an authorizer webhook, a missed write).
    #[serde(deserialize_with = "seconds")]
    pub access_recheck_seconds: u64,
    /// The Lease the access-notices controller renews while it tells nodes of grant changes
    /// (`NAMESPACE/NAME`, watched by name); the controller's `--access-lease` names the same.
    #[serde(deserialize_with = "lease")]
    pub access_lease: sharedresource_api::node_view::LeaseRef,
    /// While that lease is not renewed (the controller is down), how often every access answer
    /// of this node is asked again: a revocation then takes at most this long (plus the
    /// lease's 40 s once the controller stops), never longer.
    #[serde(deserialize_with = "seconds")]
    pub access_fallback_seconds: u64,
    /// How long one apiserver request may take before it is given up (the volume it was for
    /// keeps its content and is tried again at the next change or tick).
    #[serde(deserialize_with = "seconds")]
    pub request_timeout_seconds: u64,
    /// Requests a second the driver sends the apiserver after a burst (client-go's `QPS`);
    /// a whole number, at least 1. See `apiserver::rate`.
    #[serde(rename = "apiserverQPS", deserialize_with = "at_least_one")]
    pub apiserver_qps: u32,
    /// Requests the driver may send at once after a quiet time (client-go's `Burst`); at least 1.
    #[serde(deserialize_with = "at_least_one")]
    pub apiserver_burst: u32,
    /// Whether content updates reach published volumes (a volume's own `refreshResource` can
    /// turn them off too). Off, a volume keeps what it was published with; losing access still
    /// empties it.
    pub refresh: bool,
    /// Whether the driver reads pods, for projections whose `podInfo` items show the pod's
    /// labels or annotations. Off by default: reading pods needs `get pods` cluster-wide
    /// (`config/deploy/driver/pod-metadata.yaml`); off, such a projection is refused at publish.
    pub pod_metadata: bool,
    /// Remove the startup taint (`sharedresource.csi.inlineguard.dev/agent-not-ready`) from this
    /// node once kubelet has registered the driver (see `startup_taint`). Needs the driver's own
    /// registration and the RBAC of `config/deploy/driver/startup-taint.yaml`.
    pub startup_taint: bool,
    /// The plain-HTTP health port (`/healthz`, `/readyz`, `/metrics`); none when unset.
    pub health_address: Option<std::net::SocketAddr>,
    /// After SIGTERM, how long requests in flight may take before the driver exits anyway (an
    /// interrupted publish is undone at the next start).
    #[serde(deserialize_with = "seconds")]
    pub shutdown_timeout_seconds: u64,
    /// Providers of secrets kept outside Kubernetes, selected by a volume's `provider`
    /// attribute (see `content::external`).
    pub providers: Vec<crate::content::external::provider::ProviderConfig>,
    /// How many helper programs may run at once on the node, over every provider and volume.
    #[serde(deserialize_with = "count")]
    pub helper_concurrency: usize,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            state_dir: PathBuf::from("/var/lib/inline-guard/sharedresource"),
            registry_dir: PathBuf::from("/var/lib/kubelet/plugins_registry"),
            kubelet_dir: PathBuf::from("/var/lib/kubelet"),
            tmpfs_size: 8 << 20,
            content_budget: 320 << 20,
            namespace_content_budget: 160 << 20,
            host_read_only: false,
            content_source: None,
            kubeconfig: None,
            static_shares_dir: None,
            refresh_seconds: 60,
            access_recheck_seconds: 600,
            access_lease: crate::content::cluster::NoticeSettings::default().lease,
            access_fallback_seconds: crate::content::cluster::DEFAULT_ACCESS_FALLBACK.as_secs(),
            request_timeout_seconds: 10,
            apiserver_qps: crate::apiserver::rate::DEFAULT_QPS,
            apiserver_burst: crate::apiserver::rate::DEFAULT_BURST,
            refresh: true,
            pod_metadata: false,
            startup_taint: false,
            health_address: None,
            shutdown_timeout_seconds: 10,
            providers: Vec::new(),
            helper_concurrency: 4,
        }
    }
}

/// Where volume content comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// SharedSecret and SharedConfigMap of the cluster, with the access check.
    Kubernetes,
    /// Subdirectories of `staticSharesDir` (demos and tests): every share to every pod.
    Static,
}

impl DriverConfig {
    /// The content source to run: `contentSource` when given, else `static` when
    /// `staticSharesDir` is set, else `kubernetes`. A static source without a directory is an
    /// error.
    pub fn source(&self) -> Result<SourceKind, String> {
        let kind = self.content_source.unwrap_or(if self.static_shares_dir.is_some() {
            SourceKind::Static
        } else {
            SourceKind::Kubernetes
        });
        if kind == SourceKind::Static && self.static_shares_dir.is_none() {
            return Err("contentSource: static needs staticSharesDir".into());
        }
        Ok(kind)
    }

    /// The content budget's bounds; an error when one namespace's part is more than half of the
    /// node's (a namespace never holds more than half of what the others leave, so a larger part
    /// would never be granted, and a setting that says otherwise is refused, not ignored).
    pub fn budget_limits(&self) -> Result<crate::volume::content_budget::BudgetLimits, String> {
        if self.namespace_content_budget > self.content_budget / 2 {
            return Err(format!(
                "namespaceContentBudget ({} bytes) is more than half of contentBudget ({} bytes): one \
                 namespace's volumes never hold more than half of what the other namespaces leave of the \
                 node's budget; lower namespaceContentBudget or raise contentBudget",
                self.namespace_content_budget, self.content_budget
            ));
        }
        Ok(crate::volume::content_budget::BudgetLimits {
            node_bytes: self.content_budget,
            namespace_bytes: self.namespace_content_budget,
        })
    }

    /// The least memory limit the driver's container needs with these settings: the content
    /// budget, the eighth over it an update that grows nothing may take while both versions are
    /// held, the content the operations in flight hold before the budget counts it (each
    /// publish, refresh and helper call at most `tmpfsSize`), and [`PROCESS_ROOM`]. The shipped
    /// DaemonSet's limit is checked against it (`tests/tests/manifests.rs`).
    pub fn memory_needed(&self) -> u64 {
        let in_flight = crate::csi::node::CONCURRENT_PUBLISHES
            + crate::volume::refresh::CONCURRENT_REFRESHES
            + self.helper_concurrency;
        self.content_budget
            .saturating_add(self.content_budget / 8)
            .saturating_add((in_flight as u64).saturating_mul(self.tmpfs_size))
            .saturating_add(PROCESS_ROOM)
    }

    /// Reads and validates `path` (YAML or JSON).
    pub fn load(path: &Path) -> Result<DriverConfig, crate::config::file::ConfigFileError> {
        crate::config::file::load(path)
    }
}

/// `NAMESPACE/NAME` of a Lease.
fn lease<'de, D: Deserializer<'de>>(deserializer: D) -> Result<sharedresource_api::node_view::LeaseRef, D::Error> {
    let text = String::deserialize(deserializer)?;
    sharedresource_api::node_view::LeaseRef::parse(&text).map_err(serde::de::Error::custom)
}

/// An absolute path with no `.`, `..` or empty components: the prefix every target is compared
/// against, so it must have one spelling.
fn absolute_normal_path<'de, D: Deserializer<'de>>(deserializer: D) -> Result<PathBuf, D::Error> {
    let text = String::deserialize(deserializer)?;
    let normal =
        text.starts_with('/') && (text == "/" || text[1..].split('/').all(|c| !c.is_empty() && c != "." && c != ".."));
    if !normal {
        return Err(serde::de::Error::custom(format!(
            "{} is not an absolute path without \".\", \"..\" or empty components",
            crate::quote::quote(&text)
        )));
    }
    Ok(PathBuf::from(text))
}

fn seconds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    nonzero(u64::deserialize(deserializer)?)
}

fn at_least_one<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let value = nonzero(u64::deserialize(deserializer)?)?;
    u32::try_from(value).map_err(|_| serde::de::Error::custom("too large"))
}

fn count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let value = nonzero(u64::deserialize(deserializer)?)?;
    usize::try_from(value).map_err(|_| serde::de::Error::custom("too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DriverConfig, String> {
        crate::config::file::decode(Path::new("driver.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_shipped_file_is_valid() {
        let config = parse(include_str!("../../../config/driver.yaml")).unwrap();
        assert_eq!(config.tmpfs_size, 8 << 20);
        assert_eq!((config.content_budget, config.namespace_content_budget), (320 << 20, 160 << 20));
        assert_eq!(config.budget_limits().map(|limits| limits.node_bytes), Ok(320 << 20));
        assert_eq!(config.registry_dir, PathBuf::from("/var/lib/kubelet/plugins_registry"));
        assert_eq!(config.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(config.shutdown_timeout_seconds, 10);
        assert_eq!((config.apiserver_qps, config.apiserver_burst), (100, 200));
    }

    #[test]
    fn the_apiserver_rate_is_a_whole_number_of_at_least_one() {
        let config = parse("apiserverQPS: 5\napiserverBurst: 10").unwrap();
        assert_eq!((config.apiserver_qps, config.apiserver_burst), (5, 10));
        assert!(parse("apiserverQPS: 0").unwrap_err().contains("greater than zero"));
        assert!(parse("apiserverBurst: 0").unwrap_err().contains("greater than zero"));
        let fraction = parse("apiserverQPS: 2.5").unwrap_err();
        assert_eq!(fraction, "driver.yaml: apiserverQPS: invalid u64 at line 1, column 15");
        assert!(parse("apiserverQps: 5").unwrap_err().contains("unknown field `apiserverQps`"));
        let defaults = DriverConfig::default();
        assert_eq!((defaults.apiserver_qps, defaults.apiserver_burst), (100, 200));
    }

    #[test]
    fn the_kubelet_dir_has_one_spelling() {
        assert_eq!(parse("kubeletDir: /data/kubelet").unwrap().kubelet_dir, PathBuf::from("/data/kubelet"));
        for bad in ["relative", "/var/lib/kubelet/", "/var//lib", "/var/lib/../etc", "/var/./lib"] {
            let error = parse(&format!("kubeletDir: {bad}")).unwrap_err();
            assert!(error.contains("is not an absolute path without"), "{bad}: {error}");
        }
    }

    #[test]
    fn sizes_are_quantities_or_bytes() {
        assert_eq!(parse("tmpfsSize: 64Mi").unwrap().tmpfs_size, 64 << 20);
        assert_eq!(parse("tmpfsSize: 4096").unwrap().tmpfs_size, 4096);
        assert_eq!(
            parse("tmpfsSize: 64MB").unwrap_err(),
            "driver.yaml: tmpfsSize: invalid size \"64MB\": use bytes or a Ki, Mi or Gi quantity at line 1, column 12"
        );
        assert!(parse("tmpfsSize: 0").unwrap_err().contains("greater than zero"));
    }

    #[test]
    fn the_content_source_follows_the_static_directory_unless_named() {
        assert_eq!(parse("{}").unwrap().source(), Ok(SourceKind::Kubernetes));
        assert_eq!(parse("staticSharesDir: /s").unwrap().source(), Ok(SourceKind::Static));
        assert_eq!(
            parse("contentSource: kubernetes\nstaticSharesDir: /s").unwrap().source(),
            Ok(SourceKind::Kubernetes)
        );
        assert_eq!(
            parse("contentSource: static").unwrap().source(),
            Err("contentSource: static needs staticSharesDir".into())
        );
        assert!(parse("contentSource: vault").unwrap_err().contains("unknown variant `vault`"));
    }

    #[test]
    fn providers_are_read_with_their_defaults_and_durations_in_units() {
        let config = parse(
            "providers:\n- {name: vault-cli, kind: exec, helper: /usr/libexec/vault-cli, timeout: 500ms, maxFileBytes: 4Ki}\n\
             - {name: files, kind: exec, helper: /h, timeout: 2m}\nhelperConcurrency: 2",
        )
        .unwrap();
        assert_eq!(config.helper_concurrency, 2);
        let [first, second] = config.providers.as_slice() else { panic!("{:?}", config.providers) };
        assert_eq!((first.timeout, first.max_file_bytes), (std::time::Duration::from_millis(500), 4096));
        assert_eq!((second.timeout, second.max_file_bytes), (std::time::Duration::from_secs(120), 1 << 20));
        assert_eq!(second.cache_ttl, std::time::Duration::from_secs(60));
        for bad in ["10 s", "10d", "s", "0s"] {
            let error =
                parse(&format!("providers:\n- {{name: a, kind: exec, helper: /h, timeout: {bad}}}")).unwrap_err();
            assert!(error.contains("duration") || error.contains("greater than zero"), "{bad}: {error}");
        }
        let error = parse("providers:\n- {name: a, kind: exec, helper: /h, timout: 1s}").unwrap_err();
        assert!(error.contains("unknown field `timout`"), "{error}");
    }

    #[test]
    fn a_namespace_budget_above_half_the_node_s_is_refused() {
        let config = parse("contentBudget: 64Mi\nnamespaceContentBudget: 33Mi").unwrap();
        let refused = config.budget_limits().unwrap_err();
        assert!(
            refused.starts_with(
                "namespaceContentBudget (34603008 bytes) is more than half of contentBudget (67108864 bytes)"
            ),
            "{refused}"
        );
        assert!(parse("contentBudget: 64Mi\nnamespaceContentBudget: 32Mi").unwrap().budget_limits().is_ok());
        assert!(parse("contentBudget: 0").unwrap_err().contains("must be greater than zero"));
    }

    #[test]
    fn an_unknown_field_is_named() {
        let error = parse("stateDirectory: /x").unwrap_err();
        assert!(error.starts_with("driver.yaml: stateDirectory: unknown field `stateDirectory`"), "{error}");
    }
}
