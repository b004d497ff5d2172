//! A namespace's Pod Security labels parsed into a policy that is always usable, plus what was wrong.
//!
//! Pod Security Admission's rule for bad labels: an invalid enforce level or version fails closed
//! (`restricted`), an invalid warn or audit level or version fails open (`privileged`). Missing labels
//! take the configured defaults. `-version` labels are validated but do not change the level: the
//! CSI profile of a driver has no versions.

use std::fmt;

use crate::Labels;
use crate::labels;
use crate::level::{Level, Mode};
use crate::settings::Defaults;

/// The level a namespace assigns to each mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespacePolicy {
    /// Violations at this level deny the request.
    pub enforce: Level,
    /// Violations at this level return a warning.
    pub warn: Level,
    /// Violations at this level are recorded in an audit annotation.
    pub audit: Level,
}

/// One namespace label that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelError {
    /// The label key.
    pub key: &'static str,
    /// The value found.
    pub value: String,
    /// What a valid value looks like.
    pub expected: &'static str,
}

impl fmt::Display for LabelError {
    // Same shape as apimachinery's field.Invalid, which Pod Security Admission reports.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "metadata.labels[{}]: Invalid value: {:?}: {}", self.key, self.value, self.expected)
    }
}

const LEVEL_EXPECTED: &str = crate::level::MUST_BE_A_LEVEL;
/// What a valid `-version` label looks like, as every message about a bad version says it.
pub const VERSION_EXPECTED: &str = "must be \"latest\" or \"v1.x\"";

impl NamespacePolicy {
    /// The level for one mode.
    pub fn level(&self, mode: Mode) -> Level {
        match mode {
            Mode::Enforce => self.enforce,
            Mode::Warn => self.warn,
            Mode::Audit => self.audit,
        }
    }

    /// True when no driver can violate this policy in any mode.
    pub fn is_fully_privileged(&self) -> bool {
        self.enforce == Level::Privileged && self.warn == Level::Privileged && self.audit == Level::Privileged
    }

    /// Parses a namespace's labels. The returned policy is always usable; the errors say which
    /// labels were invalid (the policy already holds the fallback for each).
    pub fn from_labels(labels: &Labels, defaults: &Defaults) -> (NamespacePolicy, Vec<LabelError>) {
        let mut errors = Vec::new();
        let policy = NamespacePolicy {
            enforce: mode_level(labels, Mode::Enforce, defaults.enforce, &mut errors),
            warn: mode_level(labels, Mode::Warn, defaults.warn, &mut errors),
            audit: mode_level(labels, Mode::Audit, defaults.audit, &mut errors),
        };
        (policy, errors)
    }
}

fn mode_level(labels: &Labels, mode: Mode, default: Level, errors: &mut Vec<LabelError>) -> Level {
    let (level_key, version_key) = match mode {
        Mode::Enforce => (labels::ENFORCE_LEVEL, labels::ENFORCE_VERSION),
        Mode::Warn => (labels::WARN_LEVEL, labels::WARN_VERSION),
        Mode::Audit => (labels::AUDIT_LEVEL, labels::AUDIT_VERSION),
    };
    let fallback = match mode {
        Mode::Enforce => Level::Restricted,
        Mode::Warn | Mode::Audit => Level::Privileged,
    };
    let mut level = default;
    let mut invalid = false;
    if let Some(value) = labels.get(level_key) {
        match Level::parse(value) {
            Some(parsed) => level = parsed,
            None => {
                invalid = true;
                errors.push(LabelError { key: level_key, value: value.clone(), expected: LEVEL_EXPECTED });
            }
        }
    }
    if let Some(value) = labels.get(version_key)
        && !is_valid_version(value)
    {
        invalid = true;
        errors.push(LabelError { key: version_key, value: value.clone(), expected: VERSION_EXPECTED });
    }
    if invalid { fallback } else { level }
}

/// `latest`, or `v1.<minor>` with a minor version written without leading zeros.
pub fn is_valid_version(value: &str) -> bool {
    if value == "latest" {
        return true;
    }
    let Some(minor) = value.strip_prefix("v1.") else {
        return false;
    };
    !minor.is_empty()
        && minor.bytes().all(|b| b.is_ascii_digit())
        && (minor == "0" || !minor.starts_with('0'))
        && minor.len() <= 9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const DEFAULTS: Defaults = Defaults {
        driver_profile: Level::Restricted,
        enforce: Level::Baseline,
        warn: Level::Baseline,
        audit: Level::Baseline,
    };

    #[test]
    fn missing_labels_take_the_configured_defaults() {
        let (policy, errors) = NamespacePolicy::from_labels(&Labels::new(), &DEFAULTS);
        assert_eq!(policy, NamespacePolicy { enforce: Level::Baseline, warn: Level::Baseline, audit: Level::Baseline });
        assert!(errors.is_empty());
    }

    #[test]
    fn valid_labels_override_the_defaults() {
        let (policy, errors) = NamespacePolicy::from_labels(
            &labels(&[
                (labels::ENFORCE_LEVEL, "privileged"),
                (labels::WARN_LEVEL, "restricted"),
                (labels::AUDIT_LEVEL, "privileged"),
            ]),
            &DEFAULTS,
        );
        assert_eq!(
            policy,
            NamespacePolicy { enforce: Level::Privileged, warn: Level::Restricted, audit: Level::Privileged }
        );
        assert!(errors.is_empty());
    }

    #[test]
    fn invalid_enforce_label_falls_back_to_restricted() {
        let (policy, errors) =
            NamespacePolicy::from_labels(&labels(&[(labels::ENFORCE_LEVEL, "Privileged")]), &DEFAULTS);
        assert_eq!(policy.enforce, Level::Restricted);
        assert_eq!(policy.warn, Level::Baseline);
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "Privileged": must be one of privileged, baseline, restricted"#
            ]
        );
    }

    #[test]
    fn invalid_warn_and_audit_labels_fall_back_to_privileged() {
        let (policy, errors) = NamespacePolicy::from_labels(
            &labels(&[(labels::WARN_LEVEL, ""), (labels::AUDIT_LEVEL, "strict")]),
            &DEFAULTS,
        );
        assert_eq!(policy.enforce, Level::Baseline);
        assert_eq!(policy.warn, Level::Privileged);
        assert_eq!(policy.audit, Level::Privileged);
        assert_eq!(errors.len(), 2);
    }

    #[test]
    fn invalid_enforce_version_fails_closed_even_with_a_valid_level() {
        let (policy, errors) = NamespacePolicy::from_labels(
            &labels(&[(labels::ENFORCE_LEVEL, "privileged"), (labels::ENFORCE_VERSION, "1.30")]),
            &DEFAULTS,
        );
        assert_eq!(policy.enforce, Level::Restricted);
        assert_eq!(
            errors[0].to_string(),
            r#"metadata.labels[pod-security.kubernetes.io/enforce-version]: Invalid value: "1.30": must be "latest" or "v1.x""#
        );
    }

    #[test]
    fn valid_versions_are_accepted_and_do_not_change_the_level() {
        for version in ["latest", "v1.0", "v1.25", "v1.35"] {
            let (policy, errors) = NamespacePolicy::from_labels(
                &labels(&[(labels::WARN_LEVEL, "restricted"), (labels::WARN_VERSION, version)]),
                &DEFAULTS,
            );
            assert!(errors.is_empty(), "{version}");
            assert_eq!(policy.warn, Level::Restricted);
        }
        for version in ["", "v1", "v1.", "v1.01", "v2.0", "v1.x", "V1.2"] {
            let (_, errors) = NamespacePolicy::from_labels(&labels(&[(labels::AUDIT_VERSION, version)]), &DEFAULTS);
            assert_eq!(errors.len(), 1, "{version:?}");
        }
    }

    #[test]
    fn unrelated_labels_are_ignored() {
        let (policy, errors) = NamespacePolicy::from_labels(
            &labels(&[("pod-security.kubernetes.io/enforce-level", "nonsense"), ("team", "a")]),
            &DEFAULTS,
        );
        assert_eq!(policy.enforce, Level::Baseline);
        assert!(errors.is_empty());
    }
}
