//! The violation message. Its wording is part of the API: it is kept compatible with OpenShift's
//! CSIInlineVolumeSecurity plugin because runbooks and audit queries grep for it.

use crate::driver_profile::DriverProfile;
use crate::labels::DRIVER_PROFILE;
use crate::level::{MUST_BE_A_LEVEL, Mode};

/// `<object> uses an inline volume provided by CSIDriver <driver> and namespace <ns> has a pod
/// security <mode> level that is lower than <driver level>`, followed, for an invalid profile
/// label, by what is wrong with it.
pub fn violation(object: &str, driver: &str, namespace: &str, mode: Mode, profile: &DriverProfile) -> String {
    // Joined from its parts rather than formatted: one allocation of the exact size, and every
    // admitted pod with a warned or audited volume pays for this message.
    let mut message = [
        object,
        " uses an inline volume provided by CSIDriver ",
        driver,
        " and namespace ",
        namespace,
        " has a pod security ",
        mode.as_str(),
        " level that is lower than ",
        profile.level().as_str(),
    ]
    .concat();
    if let DriverProfile::Invalid(value) = profile {
        message.push_str(&format!(
            " (CSIDriver {driver} has an invalid {DRIVER_PROFILE} label {value:?}: {MUST_BE_A_LEVEL})"
        ));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::Level;

    #[test]
    fn message_matches_openshift_wording() {
        assert_eq!(
            violation("web", "csi.example.com", "apps", Mode::Enforce, &DriverProfile::Labeled(Level::Baseline)),
            "web uses an inline volume provided by CSIDriver csi.example.com and namespace apps has a pod security enforce level that is lower than baseline"
        );
    }

    #[test]
    fn invalid_label_message_says_what_is_wrong_and_what_is_valid() {
        assert_eq!(
            violation("web", "csi.example.com", "apps", Mode::Warn, &DriverProfile::Invalid("trusted".into())),
            "web uses an inline volume provided by CSIDriver csi.example.com and namespace apps has a pod security warn level that is lower than privileged (CSIDriver csi.example.com has an invalid security.openshift.io/csi-ephemeral-volume-profile label \"trusted\": must be one of privileged, baseline, restricted)"
        );
    }
}
