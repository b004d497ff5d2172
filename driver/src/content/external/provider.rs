//! The providers a node's configuration names (`providers:` in `config/driver.yaml`), read as
//! written and then checked into typed values once, at start: a provider the driver cannot run
//! stops it there, naming the provider and what is wrong.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::content::object_name::ObjectName;

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
    #[serde(default = "default_timeout", deserialize_with = "crate::config::duration")]
    pub timeout: Duration,
    /// `exec`, lazy mode: how long a file's content is kept before the helper is asked again.
    #[serde(default = "default_cache_ttl", rename = "cacheTTL", deserialize_with = "crate::config::duration")]
    pub cache_ttl: Duration,
    /// `exec`: the largest file (or `mount` reply) a helper may print, e.g. `1Mi`.
    #[serde(default = "default_max_file_bytes", deserialize_with = "crate::config::quantity")]
    pub max_file_bytes: u64,
    /// `secrets-store`: the provider's unix socket.
    #[serde(default)]
    pub socket: Option<PathBuf>,
}

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

/// An `exec` provider the driver can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecProvider {
    /// Its name.
    pub name: ObjectName,
    /// The helper program.
    pub helper: PathBuf,
    /// How long one call may take.
    pub timeout: Duration,
    /// The largest output of one call.
    pub max_file_bytes: u64,
}

/// The providers of a configuration, checked: by name.
pub fn check_providers(configured: &[ProviderConfig]) -> Result<BTreeMap<String, ExecProvider>, String> {
    let mut providers = BTreeMap::new();
    for (index, config) in configured.iter().enumerate() {
        let at = format!("providers[{index}]");
        let name = ObjectName::parse(&config.name).map_err(|error| format!("{at}.name: {error}"))?;
        let at = format!("provider {}", crate::quote::quote(name.as_str()));
        if config.kind == ProviderKind::SecretsStore {
            return Err(format!(
                "{at}: kind secrets-store is not built yet (the Secrets Store CSI provider API); use kind exec"
            ));
        }
        if config.mode == FetchMode::Lazy {
            return Err(format!("{at}: mode lazy (FUSE) is not built yet; use mode eager"));
        }
        let Some(helper) = config.helper.clone() else {
            return Err(format!("{at}: kind exec needs helper, the program's absolute path"));
        };
        if !helper.is_absolute() {
            return Err(format!("{at}: helper {} is not an absolute path", crate::quote::quote_path(&helper)));
        }
        let provider =
            ExecProvider { name: name.clone(), helper, timeout: config.timeout, max_file_bytes: config.max_file_bytes };
        if providers.insert(name.as_str().to_string(), provider).is_some() {
            return Err(format!("{at} is named twice"));
        }
    }
    Ok(providers)
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
        }
    }

    #[test]
    fn an_eager_exec_provider_is_checked_into_what_the_driver_runs() {
        let providers = check_providers(&[exec("vault-cli")]).unwrap();
        let provider = &providers["vault-cli"];
        assert_eq!(provider.helper, PathBuf::from("/usr/libexec/inline-guard/vault-cli"));
        assert_eq!((provider.timeout, provider.max_file_bytes), (Duration::from_secs(10), 1 << 20));
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
                name: "lazy",
                change: |p| p.mode = FetchMode::Lazy,
                message: "provider \"vault-cli\": mode lazy (FUSE) is not built yet; use mode eager",
            },
            Case {
                name: "secrets-store",
                change: |p| p.kind = ProviderKind::SecretsStore,
                message: "provider \"vault-cli\": kind secrets-store is not built yet",
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
