//! The service-account tokens kubelet passes when the CSIDriver declares `tokenRequests`: the
//! volume context's `csi.storage.k8s.io/serviceAccount.tokens`, a JSON object from audience to
//! `{token, expirationTimestamp}`. A token is a credential: it is held in a type that never
//! prints it, and a malformed value is reported by position only, never quoted.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::content::error::{Error, Result};

/// The volume-context key kubelet puts the tokens under.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";
/// The largest value read: a token is a few kilobytes and a CSIDriver asks for a handful.
const MAX_TOKENS_BYTES: usize = 1 << 20;

/// The tokens of one publish, by audience (`""` is the apiserver's own audience).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    by_audience: BTreeMap<String, String>,
    // Tokens are held in memory only: after a restart, a volume's are unknown until kubelet's
    // next republish brings them.
    lost: bool,
}

// Audiences are not secret; tokens are.
impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens")
            .field("audiences", &self.by_audience.keys().collect::<Vec<_>>())
            .field("lost", &self.lost)
            .finish()
    }
}

#[derive(Deserialize)]
struct KubeletToken {
    token: String,
}

impl Tokens {
    /// The tokens in `volume_context`; none when kubelet passed none (the CSIDriver requests
    /// none). A value that is not kubelet's shape is an error naming the key and the position.
    pub fn from_volume_context(volume_context: &std::collections::HashMap<String, String>) -> Result<Tokens> {
        let Some(value) = volume_context.get(TOKENS_KEY) else {
            return Ok(Tokens::default());
        };
        if value.len() > MAX_TOKENS_BYTES {
            return Err(Error::Invalid(format!(
                "volume_context[{TOKENS_KEY:?}] is {} bytes, more than the {MAX_TOKENS_BYTES} read",
                value.len()
            )));
        }
        let parsed: BTreeMap<String, KubeletToken> = serde_json::from_str(value).map_err(|error| {
            // serde's message may quote the input, which holds tokens: report the position only.
            Error::Invalid(format!(
                "volume_context[{TOKENS_KEY:?}] is not a JSON object of audience to {{\"token\": ...}} \
                 (line {}, column {})",
                error.line(),
                error.column()
            ))
        })?;
        let by_audience = parsed.into_iter().map(|(audience, token)| (audience, token.token)).collect();
        Ok(Tokens { by_audience, lost: false })
    }

    /// The tokens of a volume published before the driver restarted: unknown until kubelet's
    /// next republish.
    pub fn lost() -> Tokens {
        Tokens { by_audience: BTreeMap::new(), lost: true }
    }

    /// Whether these are [`Tokens::lost`].
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// The token for `audience`, if kubelet passed one.
    pub fn get(&self, audience: &str) -> Option<&str> {
        self.by_audience.get(audience).map(String::as_str)
    }

    /// The audiences kubelet passed tokens for.
    pub fn audiences(&self) -> impl Iterator<Item = &str> {
        self.by_audience.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(value: &str) -> std::collections::HashMap<String, String> {
        [(TOKENS_KEY.to_string(), value.to_string())].into()
    }

    #[test]
    fn kubelets_shape_yields_a_token_per_audience() {
        let value = r#"{"vault":{"token":"T-VAULT","expirationTimestamp":"2026-11-26T09:00:00Z"},"":{"token":"T-API","expirationTimestamp":"2026-11-26T09:00:00Z"}}"#;
        let tokens = Tokens::from_volume_context(&context(value)).unwrap();
        assert_eq!(tokens.get("vault"), Some("T-VAULT"));
        assert_eq!(tokens.get(""), Some("T-API"));
        assert_eq!(tokens.get("other"), None);
        assert_eq!(tokens.audiences().collect::<Vec<_>>(), ["", "vault"]);
    }

    #[test]
    fn no_key_means_no_tokens_which_is_not_lost_tokens() {
        let tokens = Tokens::from_volume_context(&Default::default()).unwrap();
        assert_eq!(tokens.audiences().count(), 0);
        assert!(!tokens.is_lost());
        assert!(Tokens::lost().is_lost());
        assert_ne!(tokens, Tokens::lost());
    }

    #[test]
    fn neither_debug_nor_errors_print_a_token() {
        let tokens = Tokens::from_volume_context(&context(r#"{"vault":{"token":"T-SECRET"}}"#)).unwrap();
        assert_eq!(format!("{tokens:?}"), r#"Tokens { audiences: ["vault"], lost: false }"#);
        for malformed in [
            r#"{"vault":"T-SECRET"}"#,
            r#"{"vault":{"token":["T-SECRET"]}}"#,
            "T-SECRET",
            r#"{"vault":{"token":"T-SECRET""#,
        ] {
            let error = Tokens::from_volume_context(&context(malformed)).unwrap_err();
            let message = error.to_string();
            assert!(matches!(error, Error::Invalid(_)));
            assert!(!message.contains("T-SECRET"), "{message}");
            assert!(
                message
                    .starts_with("volume_context[\"csi.storage.k8s.io/serviceAccount.tokens\"] is not a JSON object"),
                "{message}"
            );
        }
    }

    #[test]
    fn an_oversized_value_is_refused_by_size() {
        let value = format!(r#"{{"vault":{{"token":"{}"}}}}"#, "x".repeat(MAX_TOKENS_BYTES));
        let message = Tokens::from_volume_context(&context(&value)).unwrap_err().to_string();
        assert!(message.contains("more than the 1048576 read"), "{message}");
    }
}
