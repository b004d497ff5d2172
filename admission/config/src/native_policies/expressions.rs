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

/// What a lookup of a label that is not set gives: label values are at most 63 characters of
/// `[A-Za-z0-9._-]`, so a space is no label's value, and "not set" stays apart from "invalid".
const UNSET: &str = "' '";

/// The rank of an optional label value: `unset` when the label is not set, `invalid` when its
/// value is no level. A constant map (the apiserver folds it) and one lookup.
fn rank_of(label: &str, unset: Level, invalid: Level) -> String {
    format!(
        "{{'restricted': 0, 'baseline': 1, 'privileged': 2, {UNSET}: {}}}[?{label}.orValue({UNSET})].orValue({})",
        unset.rank(),
        invalid.rank()
    )
}

/// The namespace's label `key` as an optional string: one lookup, whether it is set or not.
fn namespace_label(key: &str) -> String {
    format!("namespaceObject.metadata.?labels[?{}]", cel_string(key))
}

/// The parameter CSIDriver's profile label as an optional string.
fn profile_label() -> String {
    format!("params.metadata.?labels[?{}]", cel_string(DRIVER_PROFILE))
}

/// One of a mode's two namespace labels: whether it is set and invalid, its key, its value (read
/// only when invalid), and what a valid value looks like.
struct LabelCheck {
    bad: String,
    key: &'static str,
    value: String,
    expected: &'static str,
}

/// A mode's two label checks, its label, its default, and the level an invalid label falls back
/// to (Pod Security's rule: `restricted` for enforce, fail closed; `privileged` for warn and
/// audit, fail open).
fn mode_labels(settings: &PolicySettings, mode: Mode) -> ([LabelCheck; 2], String, Level, Level) {
    let (level_key, version_key, default, fallback) = match mode {
        Mode::Enforce => (labels::ENFORCE_LEVEL, labels::ENFORCE_VERSION, settings.defaults.enforce, Level::Restricted),
        Mode::Warn => (labels::WARN_LEVEL, labels::WARN_VERSION, settings.defaults.warn, Level::Privileged),
        Mode::Audit => (labels::AUDIT_LEVEL, labels::AUDIT_VERSION, settings.defaults.audit, Level::Privileged),
    };
    let (level, version) = (namespace_label(level_key), namespace_label(version_key));
    let checks = [
        LabelCheck {
            bad: format!("!({level}.orValue('restricted') in {RANKS})"),
            key: level_key,
            value: format!("{level}.value()"),
            expected: MUST_BE_A_LEVEL,
        },
        LabelCheck {
            bad: format!(
                "!({version}.orValue('latest') == 'latest' || {version}.value().matches('^v1\\\\.(0|[1-9][0-9]{{0,8}})$'))"
            ),
            key: version_key,
            value: format!("{version}.value()"),
            expected: VERSION_EXPECTED,
        },
    ];
    (checks, level, default, fallback)
}

/// The namespace's level of `mode` as a rank.
pub(super) fn namespace_level(settings: &PolicySettings, mode: Mode) -> String {
    let ([_, version_check], level, default, fallback) = mode_labels(settings, mode);
    format!("{} ? {} : {}", version_check.bad, fallback.rank(), rank_of(&level, default, fallback))
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

/// Why the request is exempt (`namespace`, `user`, `runtimeClass`), `''` when it is not; `spec`
/// is the CEL path of the pod spec. `None` when nothing is exempt at all: each kind of
/// exemption is asked about only when the configuration names one.
pub(super) fn exemption(settings: &PolicySettings, spec: &str) -> Option<String> {
    let list = |names: &std::collections::BTreeSet<String>| {
        format!("[{}]", names.iter().map(|name| cel_string(name)).collect::<Vec<_>>().join(", "))
    };
    let exemptions = &settings.exemptions;
    let kinds = [
        (&exemptions.namespaces, "namespaceObject.metadata.name in {}".to_string(), "namespace"),
        (&exemptions.usernames, "request.userInfo.username in {}".to_string(), "user"),
        (
            &exemptions.runtime_classes,
            format!("has({spec}.runtimeClassName) && {spec}.runtimeClassName in {{}}"),
            "runtimeClass",
        ),
    ];
    let asked: Vec<String> = kinds
        .into_iter()
        .filter(|(names, _, _)| !names.is_empty())
        .map(|(names, test, kind)| format!("{} ? '{kind}' : ", test.replace("{}", &list(names))))
        .collect();
    (!asked.is_empty()).then(|| format!("{}''", asked.concat()))
}

/// The parameter CSIDriver's profile as a rank: an invalid label counts as `privileged`, none
/// as the configured default.
pub(super) fn driver_level(settings: &PolicySettings) -> String {
    rank_of(&profile_label(), settings.defaults.driver_profile, Level::Privileged)
}

/// The violation message of [`inline_guard_policy::message::violation`] for `mode`, whole.
pub(super) fn message(settings: &PolicySettings, mode: Mode) -> String {
    let profile = profile_label();
    let object_name = "(request.name != '' ? request.name : (has(object.metadata.name) && object.metadata.name != '' ? \
                       object.metadata.name : (has(object.metadata.generateName) ? object.metadata.generateName : '')))";
    let level_name = format!(
        "{{'restricted': 'restricted', 'baseline': 'baseline', 'privileged': 'privileged', {UNSET}: {}}}[?{profile}.orValue({UNSET})].orValue('privileged')",
        cel_string(settings.defaults.driver_profile.as_str())
    );
    let invalid_profile = format!(
        "(!({profile}.orValue('restricted') in {RANKS}) ? ' (CSIDriver ' + params.metadata.name + ' has an invalid ' + {} + \
         ' label \"' + {profile}.value() + '\": {MUST_BE_A_LEVEL})' : '')",
        cel_string(DRIVER_PROFILE)
    );
    format!(
        "{object_name} + ' uses an inline volume provided by CSIDriver ' + params.metadata.name + ' and namespace ' + \
         namespaceObject.metadata.name + ' has a pod security {} level that is lower than ' + {level_name} + {invalid_profile}",
        mode.as_str()
    )
}
