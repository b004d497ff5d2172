//! Whether a request is exempt from evaluation, checked in Pod Security Admission's order.

use crate::settings::Exemptions;

/// Why a request was not evaluated. The spelling is the audit annotation's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exemption {
    /// The namespace is exempt.
    Namespace,
    /// The requesting user is exempt.
    User,
    /// The pod's RuntimeClass is exempt.
    RuntimeClass,
}

impl Exemption {
    /// The audit annotation value, as Pod Security Admission writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Exemption::Namespace => "namespace",
            Exemption::User => "user",
            Exemption::RuntimeClass => "runtimeClass",
        }
    }

    /// The first exemption that applies: namespace, then user, then runtime class.
    pub fn find(
        exemptions: &Exemptions,
        namespace: &str,
        username: &str,
        runtime_class: Option<&str>,
    ) -> Option<Exemption> {
        if exemptions.namespaces.contains(namespace) {
            Some(Exemption::Namespace)
        } else if exemptions.usernames.contains(username) {
            Some(Exemption::User)
        } else if runtime_class.is_some_and(|class| exemptions.runtime_classes.contains(class)) {
            Some(Exemption::RuntimeClass)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exemptions() -> Exemptions {
        Exemptions {
            usernames: ["ci-bot".to_string()].into(),
            namespaces: ["kube-system".to_string()].into(),
            runtime_classes: ["kata".to_string()].into(),
        }
    }

    #[test]
    fn each_kind_of_exemption_is_found() {
        let e = exemptions();
        assert_eq!(Exemption::find(&e, "kube-system", "alice", None), Some(Exemption::Namespace));
        assert_eq!(Exemption::find(&e, "apps", "ci-bot", None), Some(Exemption::User));
        assert_eq!(Exemption::find(&e, "apps", "alice", Some("kata")), Some(Exemption::RuntimeClass));
        assert_eq!(Exemption::find(&e, "apps", "alice", Some("runc")), None);
    }

    #[test]
    fn namespace_is_checked_before_user_and_runtime_class() {
        let e = exemptions();
        assert_eq!(Exemption::find(&e, "kube-system", "ci-bot", Some("kata")), Some(Exemption::Namespace));
        assert_eq!(Exemption::find(&e, "apps", "ci-bot", Some("kata")), Some(Exemption::User));
    }
}
