//! The level a CSIDriver's inline volumes need, read from its profile label.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::Labels;
use crate::labels::DRIVER_PROFILE;
use crate::level::Level;

/// Where a driver's level came from. An invalid label counts as `privileged` (fail closed) and
/// keeps the bad value so every message about the driver can say what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverProfile {
    /// The CSIDriver carries a valid profile label.
    Labeled(Level),
    /// No such CSIDriver, or it has no profile label: the configured default applies.
    Defaulted(Level),
    /// The label is present but not a level (empty included).
    Invalid(String),
}

impl DriverProfile {
    /// Resolves a driver's profile from its labels (`None`: no such CSIDriver).
    pub fn resolve(labels: Option<&Labels>, default: Level) -> DriverProfile {
        match labels.and_then(|labels| labels.get(DRIVER_PROFILE)) {
            None => DriverProfile::Defaulted(default),
            Some(value) => match Level::parse(value) {
                Some(level) => DriverProfile::Labeled(level),
                None => DriverProfile::Invalid(value.clone()),
            },
        }
    }

    /// The level the driver is evaluated at.
    pub fn level(&self) -> Level {
        match self {
            DriverProfile::Labeled(level) | DriverProfile::Defaulted(level) => *level,
            DriverProfile::Invalid(_) => Level::Privileged,
        }
    }
}

/// Looks up a CSIDriver's labels by driver name; `None` when there is no such CSIDriver.
///
/// The decision core only reads; hosts fill the source from a cache, a file or a test table.
pub trait DriverLabelSource {
    /// The labels of the CSIDriver named `driver`.
    fn driver_labels(&self, driver: &str) -> Option<&Labels>;
}

impl DriverLabelSource for BTreeMap<String, Labels> {
    fn driver_labels(&self, driver: &str) -> Option<&Labels> {
        self.get(driver)
    }
}

/// The shape a host builds per request: each driver the pod names, with what it found.
impl<Name: AsRef<str>> DriverLabelSource for [(Name, Option<Arc<Labels>>)] {
    fn driver_labels(&self, driver: &str) -> Option<&Labels> {
        self.iter().find(|(name, _)| name.as_ref() == driver).and_then(|(_, labels)| labels.as_deref())
    }
}

impl<Name: AsRef<str>> DriverLabelSource for Vec<(Name, Option<Arc<Labels>>)> {
    fn driver_labels(&self, driver: &str) -> Option<&Labels> {
        self.as_slice().driver_labels(driver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_profile(value: &str) -> Labels {
        [(DRIVER_PROFILE.to_string(), value.to_string())].into()
    }

    #[test]
    fn missing_driver_takes_the_configured_default() {
        assert_eq!(DriverProfile::resolve(None, Level::Baseline), DriverProfile::Defaulted(Level::Baseline));
    }

    #[test]
    fn driver_without_the_label_takes_the_configured_default() {
        let labels: Labels = [("app".to_string(), "x".to_string())].into();
        assert_eq!(
            DriverProfile::resolve(Some(&labels), Level::Restricted),
            DriverProfile::Defaulted(Level::Restricted)
        );
    }

    #[test]
    fn valid_label_wins_over_the_default() {
        for level in Level::ALL {
            let labels = with_profile(level.as_str());
            assert_eq!(DriverProfile::resolve(Some(&labels), Level::Restricted), DriverProfile::Labeled(level));
        }
    }

    #[test]
    fn invalid_label_is_treated_as_privileged() {
        for value in ["", "Baseline", "none"] {
            let profile = DriverProfile::resolve(Some(&with_profile(value)), Level::Restricted);
            assert_eq!(profile, DriverProfile::Invalid(value.to_string()));
            assert_eq!(profile.level(), Level::Privileged);
        }
    }

    #[test]
    fn a_hosts_per_request_table_finds_each_driver_by_its_exact_name() {
        let table: Vec<(String, Option<Arc<Labels>>)> = vec![
            ("found.example.com".to_string(), Some(Arc::new(with_profile("baseline")))),
            ("missing.example.com".to_string(), None),
        ];
        assert_eq!(table.driver_labels("found.example.com"), Some(&with_profile("baseline")));
        assert_eq!(table.as_slice().driver_labels("found.example.com"), Some(&with_profile("baseline")));
        assert_eq!(table.driver_labels("missing.example.com"), None);
        assert_eq!(table.driver_labels("found.example"), None);
        assert_eq!(table.as_slice().driver_labels("other.example.com"), None);
    }
}
