//! The two kinds of share, SharedSecret and SharedConfigMap, and the names each goes by: in a
//! volume's attributes, in RBAC, in messages.

/// The volume attribute naming a SharedSecret.
pub const SHARED_SECRET_ATTRIBUTE: &str = "sharedSecret";
/// The volume attribute naming a SharedConfigMap.
pub const SHARED_CONFIG_MAP_ATTRIBUTE: &str = "sharedConfigMap";

/// Which kind of share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShareKind {
    /// `SharedSecret`.
    Secret,
    /// `SharedConfigMap`.
    ConfigMap,
}

impl ShareKind {
    /// The resource name RBAC rules use.
    pub fn resource(self) -> &'static str {
        match self {
            ShareKind::Secret => "sharedsecrets",
            ShareKind::ConfigMap => "sharedconfigmaps",
        }
    }

    /// The kind, for messages.
    pub fn kind(self) -> &'static str {
        match self {
            ShareKind::Secret => "SharedSecret",
            ShareKind::ConfigMap => "SharedConfigMap",
        }
    }

    /// The kind of the backing object, for messages.
    pub fn backing_kind(self) -> &'static str {
        match self {
            ShareKind::Secret => "Secret",
            ShareKind::ConfigMap => "ConfigMap",
        }
    }

    /// The volume attribute naming shares of this kind.
    pub fn attribute(self) -> &'static str {
        match self {
            ShareKind::Secret => SHARED_SECRET_ATTRIBUTE,
            ShareKind::ConfigMap => SHARED_CONFIG_MAP_ATTRIBUTE,
        }
    }

    /// The kind a volume attribute names, `None` for any other attribute.
    pub fn of_attribute(attribute: &str) -> Option<ShareKind> {
        match attribute {
            SHARED_SECRET_ATTRIBUTE => Some(ShareKind::Secret),
            SHARED_CONFIG_MAP_ATTRIBUTE => Some(ShareKind::ConfigMap),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_found_again_from_its_attribute() {
        for kind in [ShareKind::Secret, ShareKind::ConfigMap] {
            assert_eq!(ShareKind::of_attribute(kind.attribute()), Some(kind));
        }
        assert_eq!(ShareKind::of_attribute("projection"), None);
    }
}
