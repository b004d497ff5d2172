//! The providers a node's configuration names (`providers:` in `config/driver.yaml`), read as
//! written and then checked into typed values once, at start: a provider the driver cannot run
//! stops it there, naming the provider and what is wrong. A provider is a helper program
//! (`exec`) or a Secrets Store CSI provider on its socket (`secrets-store`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use sharedresource_api::object_name::ObjectName;

/// What `config/driver.yaml` says of one provider.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderConfig {
    /// The name pods select it by (`volumeAttributes: {provider: NAME}`) and RBAC grants `use` of.
    pub name: String,
    /// How the provider is reached.
    pub kind: ProviderKind,
    /// `exec`: the helper program, an absolute path.
    #[serde(default)]
    pub helper: Option<PathBuf>,
    /// `exec`: when files are fetched.
    #[serde(default)]
    pub mode: FetchMode,
    /// `exec`: how long one helper call may take (`10s`, `500ms`, `1m`, or seconds).
    #[serde(default = "default_timeout", deserialize_with = "crate::units::duration")]
    pub timeout: Duration,
    /// `exec`, lazy mode: how long a file's content is kept before the helper is asked again.
    #[serde(default = "default_cache_ttl", rename = "cacheTTL", deserialize_with = "crate::units::duration")]
    pub cache_ttl: Duration,
    /// `exec`: the largest file (or `mount` reply) a helper may print, e.g. `1Mi`.
    #[serde(default = "default_max_file_bytes", deserialize_with = "crate::units::quantity")]
    pub max_file_bytes: u64,
    /// `exec`: the user the helper runs as (default 65534, `nobody`): never the driver's root
    /// unless said (`0`), since a helper is a program of the operators' choosing that reads what
    /// pods pass it. Set from root, the kernel leaves the helper no capability.
    #[serde(default)]
    pub run_as_user: Option<u32>,
    /// `exec`: the helper's group (default 65534, `nogroup`); it has no other group.
    #[serde(default)]
    pub run_as_group: Option<u32>,
    /// `secrets-store`: the provider's unix socket (default
    /// `/var/run/secrets-store-csi-providers/NAME.sock`, upstream's directory).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// `secrets-store`: the largest answer to `Mount` accepted, e.g. `16Mi` (gRPC's default of
    /// 4 MiB is too small for some providers' certificate bundles).
    #[serde(default = "default_max_message_bytes", deserialize_with = "crate::units::quantity")]
    pub max_message_bytes: u64,
}

/// Where Secrets Store CSI providers listen unless a socket is named: upstream's directory.
pub const SECRETS_STORE_SOCKET_DIR: &str = "/var/run/secrets-store-csi-providers";

fn default_max_message_bytes() -> u64 {
    16 << 20
}

/// The bounds a provider's `maxMessageBytes` must lie within: below 4 KiB no answer fits, and
/// above 256 MiB one answer would hold a node's memory hostage.
const MESSAGE_BYTES_BOUNDS: std::ops::RangeInclusive<u64> = 4 << 10..=256 << 20;

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_cache_ttl() -> Duration {
    Duration::from_secs(60)
}

fn default_max_file_bytes() -> u64 {
    1 << 20
}

/// How a provider is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    /// A helper program on the node.
    Exec,
    /// A Secrets Store CSI Driver provider on its unix socket.
    SecretsStore,
}

/// When an `exec` provider's files are fetched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FetchMode {
    /// Every file the helper lists, at publish and at each refresh, into the volume's tmpfs.
    #[default]
    Eager,
    /// Each file when software in the container first opens it (FUSE).
    Lazy,
}

/// The bounds of a lazy provider's `cacheTTL`: under a second every read of a busy file would be
/// a helper call, and over an hour a rotated secret would stay unseen for longer than any vault's
/// lease.
const CACHE_TTL_BOUNDS: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);

/// An `exec` provider the driver can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecProvider {
    /// Its name.
    pub name: ObjectName,
    /// The helper program.
    pub helper: PathBuf,
    /// When its files are fetched.
    pub mode: FetchMode,
    /// How long one call may take.
    pub timeout: Duration,
    /// Lazy mode: how long a file's content is served before the helper is asked again.
    pub cache_ttl: Duration,
    /// The largest output of one call.
    pub max_file_bytes: u64,
    /// Who the helper runs as.
    pub run_as: HelperUser,
}

/// The user and group a helper runs as, with no supplementary group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelperUser {
    /// The user id.
    pub uid: u32,
    /// The group id.
    pub gid: u32,
}

impl HelperUser {
    /// `nobody` and `nogroup`: what a helper runs as unless its provider says otherwise.
    pub const NOBODY: HelperUser = HelperUser { uid: 65534, gid: 65534 };
    /// Root, as the driver runs: only when a provider says so (`runAsUser: 0`).
    pub const ROOT: HelperUser = HelperUser { uid: 0, gid: 0 };

    /// This process's own user and group (a helper run as it needs no change of user; a test's
    /// helpers, in its private directories, run so whoever runs the test).
    pub fn this_process() -> HelperUser {
        HelperUser { uid: nix::unistd::geteuid().as_raw(), gid: nix::unistd::getegid().as_raw() }
    }
}

/// A Secrets Store CSI provider the driver can ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretsStoreProvider {
    /// Its name.
    pub name: ObjectName,
    /// Its unix socket.
    pub socket: PathBuf,
    /// How long one `Mount` may take.
    pub timeout: Duration,
    /// The largest answer accepted.
    pub max_message_bytes: usize,
}

/// A provider of the node, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// A helper program.
    Exec(ExecProvider),
    /// A Secrets Store CSI provider.
    SecretsStore(SecretsStoreProvider),
}

/// The providers of a configuration, checked: by name.
pub fn check_providers(configured: &[ProviderConfig]) -> Result<BTreeMap<String, Provider>, String> {
    let mut providers = BTreeMap::new();
    for (index, config) in configured.iter().enumerate() {
        let name = ObjectName::parse(&config.name).map_err(|error| format!("providers[{index}].name: {error}"))?;
        let at = format!("provider {}", crate::quote::quote(name.as_str()));
        let provider = match config.kind {
            ProviderKind::Exec => Provider::Exec(check_exec(config, name.clone(), &at)?),
            ProviderKind::SecretsStore => Provider::SecretsStore(check_secrets_store(config, name.clone(), &at)?),
        };
        if providers.insert(name.as_str().to_string(), provider).is_some() {
            return Err(format!("{at} is named twice"));
        }
    }
    Ok(providers)
}

fn check_exec(config: &ProviderConfig, name: ObjectName, at: &str) -> Result<ExecProvider, String> {
    if config.socket.is_some() {
        return Err(format!("{at}: socket is for kind secrets-store; kind exec runs helper"));
    }
    let Some(helper) = config.helper.clone() else {
        return Err(format!("{at}: kind exec needs helper, the program's absolute path"));
    };
    if !helper.is_absolute() {
        return Err(format!("{at}: helper {} is not an absolute path", crate::quote::quote_path(&helper)));
    }
    if config.mode == FetchMode::Lazy && !CACHE_TTL_BOUNDS.contains(&config.cache_ttl) {
        return Err(format!("{at}: cacheTTL {} s is outside 1s..1h", config.cache_ttl.as_secs_f64()));
    }
    Ok(ExecProvider {
        name,
        helper,
        mode: config.mode,
        timeout: config.timeout,
        cache_ttl: config.cache_ttl,
        max_file_bytes: config.max_file_bytes,
        run_as: HelperUser {
            uid: config.run_as_user.unwrap_or(HelperUser::NOBODY.uid),
            gid: config.run_as_group.unwrap_or(HelperUser::NOBODY.gid),
        },
    })
}

fn check_secrets_store(config: &ProviderConfig, name: ObjectName, at: &str) -> Result<SecretsStoreProvider, String> {
    if config.helper.is_some()
        || config.mode != FetchMode::Eager
        || config.run_as_user.is_some()
        || config.run_as_group.is_some()
    {
        return Err(format!(
            "{at}: helper, mode, runAsUser and runAsGroup are for kind exec; kind secrets-store asks the provider's socket"
        ));
    }
    let socket = match &config.socket {
        Some(socket) if !socket.is_absolute() => {
            return Err(format!("{at}: socket {} is not an absolute path", crate::quote::quote_path(socket)));
        }
        Some(socket) => socket.clone(),
        None => PathBuf::from(SECRETS_STORE_SOCKET_DIR).join(format!("{}.sock", name.as_str())),
    };
    if !MESSAGE_BYTES_BOUNDS.contains(&config.max_message_bytes) {
        return Err(format!("{at}: maxMessageBytes {} is outside 4Ki..256Mi", config.max_message_bytes));
    }
    // Within the bounds just checked, so it fits any usize of a 32- or 64-bit node.
    let max_message_bytes = usize::try_from(config.max_message_bytes).unwrap_or(usize::MAX);
    Ok(SecretsStoreProvider { name, socket, timeout: config.timeout, max_message_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(name: &str) -> ProviderConfig {
        ProviderConfig {
            name: name.into(),
            kind: ProviderKind::Exec,
            helper: Some("/usr/libexec/inline-guard/vault-cli".into()),
            mode: FetchMode::Eager,
            timeout: default_timeout(),
            cache_ttl: default_cache_ttl(),
            max_file_bytes: default_max_file_bytes(),
            socket: None,
            max_message_bytes: default_max_message_bytes(),
            run_as_user: None,
            run_as_group: None,
        }
    }

    fn secrets_store(name: &str) -> ProviderConfig {
        ProviderConfig { kind: ProviderKind::SecretsStore, helper: None, ..exec(name) }
    }

    #[test]
    fn an_eager_exec_provider_is_checked_into_what_the_driver_runs() {
        let providers = check_providers(&[exec("vault-cli")]).unwrap();
        let Provider::Exec(provider) = &providers["vault-cli"] else { panic!("{providers:?}") };
        assert_eq!(provider.helper, PathBuf::from("/usr/libexec/inline-guard/vault-cli"));
        assert_eq!((provider.timeout, provider.max_file_bytes), (Duration::from_secs(10), 1 << 20));
        assert_eq!(provider.mode, FetchMode::Eager);
        assert_eq!(provider.run_as, HelperUser::NOBODY, "never root unless said");
        let as_root = ProviderConfig { run_as_user: Some(0), run_as_group: Some(0), ..exec("vault-cli") };
        let Provider::Exec(provider) = &check_providers(&[as_root]).unwrap()["vault-cli"] else { panic!() };
        assert_eq!(provider.run_as, HelperUser::ROOT);
        let as_user = ProviderConfig { run_as_user: Some(1000), ..exec("vault-cli") };
        let Provider::Exec(provider) = &check_providers(&[as_user]).unwrap()["vault-cli"] else { panic!() };
        assert_eq!(provider.run_as, HelperUser { uid: 1000, gid: 65534 });
    }

    #[test]
    fn a_lazy_exec_provider_keeps_its_cache_ttl() {
        let config = ProviderConfig { mode: FetchMode::Lazy, cache_ttl: Duration::from_secs(30), ..exec("vault-cli") };
        let providers = check_providers(&[config]).unwrap();
        let Provider::Exec(provider) = &providers["vault-cli"] else { panic!("{providers:?}") };
        assert_eq!((provider.mode, provider.cache_ttl), (FetchMode::Lazy, Duration::from_secs(30)));
    }

    #[test]
    fn a_secrets_store_provider_listens_in_upstreams_directory_unless_a_socket_is_named() {
        let providers = check_providers(&[secrets_store("vault")]).unwrap();
        let Provider::SecretsStore(provider) = &providers["vault"] else { panic!("{providers:?}") };
        assert_eq!(provider.socket, PathBuf::from("/var/run/secrets-store-csi-providers/vault.sock"));
        assert_eq!(provider.max_message_bytes, 16 << 20);
        let named = ProviderConfig {
            socket: Some("/etc/kubernetes/secrets-store-csi-providers/v.sock".into()),
            ..secrets_store("vault")
        };
        let Provider::SecretsStore(provider) = &check_providers(&[named]).unwrap()["vault"] else { panic!() };
        assert_eq!(provider.socket, PathBuf::from("/etc/kubernetes/secrets-store-csi-providers/v.sock"));
    }

    #[test]
    fn a_secrets_store_provider_is_refused_what_only_helpers_have() {
        type Change = fn(&mut ProviderConfig);
        let only_exec = "provider \"vault\": helper, mode, runAsUser and runAsGroup are for kind exec";
        let cases: [(Change, &str); 6] = [
            (|p| p.helper = Some("/h".into()), only_exec),
            (|p| p.mode = FetchMode::Lazy, only_exec),
            (|p| p.run_as_user = Some(0), only_exec),
            (|p| p.run_as_group = Some(0), only_exec),
            (
                |p| p.socket = Some("vault.sock".into()),
                "provider \"vault\": socket \"vault.sock\" is not an absolute path",
            ),
            (
                |p| p.max_message_bytes = 1 << 40,
                "provider \"vault\": maxMessageBytes 1099511627776 is outside 4Ki..256Mi",
            ),
        ];
        for (change, message) in cases {
            let mut config = secrets_store("vault");
            change(&mut config);
            let error = check_providers(&[config]).unwrap_err();
            assert!(error.starts_with(message), "{error}");
        }
    }

    #[test]
    fn what_the_driver_cannot_run_is_refused_naming_the_provider() {
        struct Case {
            name: &'static str,
            change: fn(&mut ProviderConfig),
            message: &'static str,
        }
        let cases = [
            Case {
                name: "a name that is no object name",
                change: |p| p.name = "Vault_CLI".into(),
                message: "providers[0].name: \"Vault_CLI\" is not a valid",
            },
            Case {
                name: "a lazy cache kept under a second",
                change: |p| (p.mode, p.cache_ttl) = (FetchMode::Lazy, Duration::from_millis(500)),
                message: "provider \"vault-cli\": cacheTTL 0.5 s is outside 1s..1h",
            },
            Case {
                name: "a lazy cache kept over an hour",
                change: |p| (p.mode, p.cache_ttl) = (FetchMode::Lazy, Duration::from_secs(7200)),
                message: "provider \"vault-cli\": cacheTTL 7200 s is outside 1s..1h",
            },
            Case {
                name: "a socket",
                change: |p| p.socket = Some("/run/p.sock".into()),
                message: "provider \"vault-cli\": socket is for kind secrets-store",
            },
            Case {
                name: "no helper",
                change: |p| p.helper = None,
                message: "provider \"vault-cli\": kind exec needs helper",
            },
            Case {
                name: "a relative helper",
                change: |p| p.helper = Some("vault-cli".into()),
                message: "provider \"vault-cli\": helper \"vault-cli\" is not an absolute path",
            },
        ];
        for case in cases {
            let mut config = exec("vault-cli");
            (case.change)(&mut config);
            let error = check_providers(&[config]).unwrap_err();
            assert!(error.starts_with(case.message), "{}: {error}", case.name);
        }
        let error = check_providers(&[exec("vault-cli"), exec("vault-cli")]).unwrap_err();
        assert_eq!(error, "provider \"vault-cli\" is named twice");
    }
}
