//! The CEL text of one decision: the namespace's level per mode (with Pod Security's rules for
//! invalid labels), the label errors, the exemption, the driver's profile, and the violation
//! message. Each is written out whole where it is read, never as a policy variable: the
//! apiserver evaluates every variable as a program of its own, once in each expression list that
//! reads it, and that per-program price, not the arithmetic inside, was most of what these
//! policies cost a pod (profiled: docs/native-policies.md).

use inline_guard_policy::labels::{self, DRIVER_PROFILE};
use inline_guard_policy::level::{Level, MUST_BE_A_LEVEL, Mode};
use inline_guard_policy::namespace_policy::VERSION_EXPECTED;
use inline_guard_policy::settings::PolicySettings;

use crate::webhook_configurations::cel_string;

/// The CEL map from a level's name to its rank.
const RANKS: &str = "{'restricted': 0, 'baseline': 1, 'privileged': 2}";

/// A level's rank: a driver violates a mode when its rank is above the namespace's.
fn rank(level: Level) -> u8 {
    match level {
        Level::Restricted => 0,
        Level::Baseline => 1,
        Level::Privileged => 2,
    }
}

/// `<label> is set on the namespace`, and its value.
fn namespace_label(key: &str) -> (String, String) {
    let key = cel_string(key);
    (
        format!("(has(namespaceObject.metadata.labels) && {key} in namespaceObject.metadata.labels)"),
        format!("namespaceObject.metadata.labels[{key}]"),
    )
}

/// One of a mode's two namespace labels: whether it is set and invalid, its key, its value, and
/// what a valid value looks like.
struct LabelCheck {
    bad: String,
    key: &'static str,
    value: String,
    expected: &'static str,
}

/// A mode's level and version labels, its default, and the level an invalid label falls back
/// to (Pod Security's rule: `restricted` for enforce, fail closed; `privileged` for warn and
/// audit, fail open).
fn mode_labels(settings: &PolicySettings, mode: Mode) -> ([LabelCheck; 2], Level, Level) {
    let (level_key, version_key, default, fallback) = match mode {
        Mode::Enforce => (labels::ENFORCE_LEVEL, labels::ENFORCE_VERSION, settings.defaults.enforce, Level::Restricted),
        Mode::Warn => (labels::WARN_LEVEL, labels::WARN_VERSION, settings.defaults.warn, Level::Privileged),
        Mode::Audit => (labels::AUDIT_LEVEL, labels::AUDIT_VERSION, settings.defaults.audit, Level::Privileged),
    };
    let (level_set, level) = namespace_label(level_key);
    let (version_set, version) = namespace_label(version_key);
    let checks = [
        LabelCheck {
            bad: format!("({level_set} && !({level} in {RANKS}))"),
            key: level_key,
            value: level,
            expected: MUST_BE_A_LEVEL,
        },
        LabelCheck {
            bad: format!(
                "({version_set} && !({version} == 'latest' || {version}.matches('^v1\\\\.(0|[1-9][0-9]{{0,8}})$')))"
            ),
            key: version_key,
            value: version,
            expected: VERSION_EXPECTED,
        },
    ];
    (checks, default, fallback)
}

/// The namespace's level of `mode` as a rank.
pub(super) fn namespace_level(settings: &PolicySettings, mode: Mode) -> String {
    let ([level_check, version_check], default, fallback) = mode_labels(settings, mode);
    let (level_set, level) = namespace_label(level_check.key);
    format!(
        "{} || {} ? {} : ({level_set} ? {RANKS}[{level}] : {})",
        level_check.bad,
        version_check.bad,
        rank(fallback),
        rank(default)
    )
}

/// Every invalid namespace label, as Pod Security words it, joined by `; ` (empty when none).
pub(super) fn label_errors(settings: &PolicySettings) -> String {
    let mut errors = Vec::new();
    for mode in Mode::ALL {
        for check in mode_labels(settings, mode).0 {
            // Label values are at most 63 characters of [A-Za-z0-9._-]: quoting needs no escapes.
            let text = cel_string(&format!("metadata.labels[{}]: Invalid value: \"", check.key));
            let expected = cel_string(&format!("\": {}", check.expected));
            errors.push(format!("({} ? [{text} + {} + {expected}] : [])", check.bad, check.value));
        }
    }
    format!("({}).join('; ')", errors.join(" + "))
}

/// Why the request is exempt (`namespace`, `user`, `runtimeClass`), or `''`; `spec` is the CEL
/// path of the pod spec.
pub(super) fn exemption(settings: &PolicySettings, spec: &str) -> String {
    let list = |names: &std::collections::BTreeSet<String>| {
        format!("[{}]", names.iter().map(|name| cel_string(name)).collect::<Vec<_>>().join(", "))
    };
    let exemptions = &settings.exemptions;
    format!(
        "namespaceObject.metadata.name in {} ? 'namespace' : (request.userInfo.username in {} ? 'user' : \
         (has({spec}.runtimeClassName) && {spec}.runtimeClassName in {} ? 'runtimeClass' : ''))",
        list(&exemptions.namespaces),
        list(&exemptions.usernames),
        list(&exemptions.runtime_classes)
    )
}

/// The parameter CSIDriver's profile label is set, and its value.
fn profile_label() -> (String, String) {
    let profile = cel_string(DRIVER_PROFILE);
    (
        format!("(has(params.metadata.labels) && {profile} in params.metadata.labels)"),
        format!("params.metadata.labels[{profile}]"),
    )
}

/// The parameter CSIDriver's profile as a rank: an invalid label counts as `privileged`, none
/// as the configured default.
pub(super) fn driver_level(settings: &PolicySettings) -> String {
    let (set, value) = profile_label();
    format!("{set} ? ({value} in {RANKS} ? {RANKS}[{value}] : 2) : {}", rank(settings.defaults.driver_profile))
}

/// The violation message of [`inline_guard_policy::message::violation`] for `mode`, whole.
pub(super) fn message(settings: &PolicySettings, mode: Mode) -> String {
    let (set, value) = profile_label();
    let object_name = "(request.name != '' ? request.name : (has(object.metadata.name) && object.metadata.name != '' ? \
                       object.metadata.name : (has(object.metadata.generateName) ? object.metadata.generateName : '')))";
    let default_name = cel_string(settings.defaults.driver_profile.as_str());
    let level_name = format!("({set} ? ({value} in {RANKS} ? {value} : 'privileged') : {default_name})");
    let invalid_profile = format!(
        "({set} && !({value} in {RANKS}) ? ' (CSIDriver ' + params.metadata.name + ' has an invalid ' + {} + \
         ' label \"' + {value} + '\": {MUST_BE_A_LEVEL})' : '')",
        cel_string(DRIVER_PROFILE)
    );
    format!(
        "{object_name} + ' uses an inline volume provided by CSIDriver ' + params.metadata.name + ' and namespace ' + \
         namespaceObject.metadata.name + ' has a pod security {} level that is lower than ' + {level_name} + {invalid_profile}",
        mode.as_str()
    )
}
