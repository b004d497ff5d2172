//! Kubernetes object names as typed values: a name is checked once, by the apiserver's own
//! rules, before it may reach a request. Every path the driver asks the apiserver for is built
//! from these types only, so no text a user spelled (`?watch=true`, `s1/status`, `..`, `%2f`)
//! can become a query, a subresource or another object.

use std::fmt;

use crate::quote::quote;

/// The longest DNS-1123 subdomain (object names of Secrets, ConfigMaps, shares, projections,
/// pods).
const MAX_SUBDOMAIN_BYTES: usize = 253;
/// The longest DNS-1123 label (namespace names).
const MAX_LABEL_BYTES: usize = 63;

/// Why a name is not a valid one; the message quotes it (bounded) and says the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{quoted} is not a valid {what}: {rule}")]
pub struct InvalidName {
    quoted: String,
    what: &'static str,
    rule: &'static str,
}

/// The name of a namespaced or cluster-scoped object: a DNS-1123 subdomain (at most 253 bytes
/// of lowercase letters, digits, `-` and `.`, each dot-separated part starting and ending with a
/// letter or digit), as the apiserver requires of Secrets, ConfigMaps, pods and our own kinds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectName(String);

/// The name of a namespace: a DNS-1123 label (at most 63 bytes of lowercase letters, digits and
/// `-`, starting and ending with a letter or digit).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceName(String);

impl ObjectName {
    /// `name`, when it is a DNS-1123 subdomain.
    pub fn parse(name: &str) -> Result<ObjectName, InvalidName> {
        let rule = "an object name is at most 253 characters of lowercase letters, digits, '-' and '.', \
                    each '.'-separated part starting and ending with a letter or digit";
        let valid = !name.is_empty() && name.len() <= MAX_SUBDOMAIN_BYTES && name.split('.').all(is_label);
        if valid {
            Ok(ObjectName(name.to_string()))
        } else {
            Err(InvalidName { quoted: quote(name), what: "object name", rule })
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl NamespaceName {
    /// `name`, when it is a DNS-1123 label.
    pub fn parse(name: &str) -> Result<NamespaceName, InvalidName> {
        let rule = "a namespace name is at most 63 characters of lowercase letters, digits and '-', \
                    starting and ending with a letter or digit";
        if name.len() <= MAX_LABEL_BYTES && is_label(name) {
            Ok(NamespaceName(name.to_string()))
        } else {
            Err(InvalidName { quoted: quote(name), what: "namespace name", rule })
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One DNS-1123 label, without its length bound: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_label(part: &str) -> bool {
    let bytes = part.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alphanumeric(first) && alphanumeric(last) && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
        }
        _ => false,
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for NamespaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An object of one namespace by its namespace and name, as `NAMESPACE/NAME` (a Lease, a
/// Secret the configuration names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespacedObject {
    /// Its namespace.
    pub namespace: NamespaceName,
    /// Its name.
    pub name: ObjectName,
}

impl NamespacedObject {
    /// `NAMESPACE/NAME`, each a valid name; otherwise what is wrong, quoting at most a little.
    pub fn parse(text: &str) -> Result<NamespacedObject, String> {
        let quoted = crate::quote::quote(text);
        let (namespace, name) = text.split_once('/').ok_or_else(|| format!("{quoted} is not NAMESPACE/NAME"))?;
        Ok(NamespacedObject {
            namespace: NamespaceName::parse(namespace).map_err(|e| format!("{quoted}: {e}"))?,
            name: ObjectName::parse(name).map_err(|e| format!("{quoted}: {e}"))?,
        })
    }
}

impl std::fmt::Display for NamespacedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace.as_str(), self.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_follow_the_dns_subdomain_rule() {
        for good in ["db", "db-creds", "ca.bundle", "a", "0", "a-1.b-2", &"a".repeat(253), "x.y.z"] {
            assert_eq!(ObjectName::parse(good).map(|n| n.as_str().to_string()), Ok(good.to_string()), "{good}");
        }
        let hostile = [
            "",
            ".",
            "..",
            "?watch=true",
            "s1/status",
            "../../api/v1/secrets",
            "%2f",
            "a#b",
            "A",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a b",
            "é",
            "a\nb",
            "a.-b",
        ];
        for bad in hostile.iter().map(|s| s.to_string()).chain([format!("a{}", "b".repeat(253))]) {
            assert!(ObjectName::parse(&bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn namespace_names_follow_the_dns_label_rule() {
        assert!(NamespaceName::parse("team-a").is_ok());
        assert!(NamespaceName::parse(&"a".repeat(63)).is_ok());
        for bad in ["", "a.b", "Team", "-a", "a-", "a/b", "?x", &"a".repeat(64)] {
            assert!(NamespaceName::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_refusal_quotes_the_name_bounded_and_says_the_rule() {
        let message = ObjectName::parse("?watch=true").unwrap_err().to_string();
        assert_eq!(
            message,
            "\"?watch=true\" is not a valid object name: an object name is at most 253 characters of lowercase \
             letters, digits, '-' and '.', each '.'-separated part starting and ending with a letter or digit"
        );
        let long = ObjectName::parse(&"x".repeat(30_003)).unwrap_err().to_string();
        assert!(long.len() < 600, "{} bytes", long.len());
        assert!(long.contains("(30003 bytes)"), "{long}");
    }
}
