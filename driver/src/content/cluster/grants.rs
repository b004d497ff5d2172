//! Which service accounts a RoleBinding or ClusterRoleBinding may grant `use` of a share to, read
//! from its subjects as the apiserver's RBAC authorizer matches them against the identity the
//! access check asks as (`system:serviceaccount:<ns>:<name>`, in the groups every service
//! account has), and which role it grants. A binding that names none of them cannot change any
//! volume's access check, so its changes (and its role's) cost no SubjectAccessReview.

use k8s_openapi::api::rbac::v1::{RoleRef, Subject};

use crate::content::changes::Accounts;

const SERVICE_ACCOUNT_USER: &str = "system:serviceaccount:";
const ALL_SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
const NAMESPACE_SERVICE_ACCOUNTS: &str = "system:serviceaccounts:";
const AUTHENTICATED: &str = "system:authenticated";

/// A role as bindings refer to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RoleKey {
    /// A Role: its namespace and name.
    Role(String, String),
    /// A ClusterRole: its name.
    ClusterRole(String),
}

/// The role a binding grants: `namespace` is a RoleBinding's (which may refer to a Role of its
/// own namespace or to a ClusterRole), `None` for a ClusterRoleBinding.
pub fn role_granted(namespace: Option<&str>, role: &RoleRef) -> RoleKey {
    match (role.kind.as_str(), namespace) {
        ("Role", Some(namespace)) => RoleKey::Role(namespace.to_string(), role.name.clone()),
        _ => RoleKey::ClusterRole(role.name.clone()),
    }
}

/// The service accounts a binding with `subjects` may grant to. `namespace` is the namespace of
/// a RoleBinding (its grants hold only there, where access is checked for the pods of that
/// namespace) and `None` for a ClusterRoleBinding (its grants hold everywhere).
pub fn accounts_granted(namespace: Option<&str>, subjects: &[Subject]) -> Vec<Accounts> {
    let mut accounts: Vec<Accounts> = subjects.iter().filter_map(|subject| accounts_of(namespace, subject)).collect();
    accounts.sort();
    accounts.dedup();
    accounts
}

fn accounts_of(namespace: Option<&str>, subject: &Subject) -> Option<Accounts> {
    // Before the subject's own namespace decides, a RoleBinding's grants reach only the
    // pods of its own namespace: a service account of another namespace is never checked there.
    let within = |of: &str| namespace.is_none_or(|namespace| namespace == of);
    match subject.kind.as_str() {
        "ServiceAccount" => {
            // The authorizer reads an empty namespace as the binding's own.
            let of = subject.namespace.as_deref().filter(|n| !n.is_empty()).or(namespace)?;
            within(of).then(|| Accounts::One(of.to_string(), subject.name.clone()))
        }
        "User" => {
            let (of, name) = subject.name.strip_prefix(SERVICE_ACCOUNT_USER)?.split_once(':')?;
            within(of).then(|| Accounts::One(of.to_string(), name.to_string()))
        }
        "Group" => match subject.name.as_str() {
            ALL_SERVICE_ACCOUNTS | AUTHENTICATED => {
                Some(namespace.map_or(Accounts::Every, |namespace| Accounts::OfNamespace(namespace.to_string())))
            }
            group => {
                let of = group.strip_prefix(NAMESPACE_SERVICE_ACCOUNTS)?;
                within(of).then(|| Accounts::OfNamespace(of.to_string()))
            }
        },
        // A kind the authorizer does not know matches no one; read it as anyone, so that a
        // future kind can only cost a check, never miss a revocation.
        _ => Some(namespace.map_or(Accounts::Every, |namespace| Accounts::OfNamespace(namespace.to_string()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
        Subject {
            kind: kind.into(),
            name: name.into(),
            namespace: namespace.map(String::from),
            api_group: (kind != "ServiceAccount").then(|| "rbac.authorization.k8s.io".into()),
        }
    }

    fn one(namespace: &str, name: &str) -> Accounts {
        Accounts::One(namespace.into(), name.into())
    }

    #[test]
    fn a_role_binding_grants_only_to_service_accounts_of_its_own_namespace() {
        struct Case {
            subject: Subject,
            granted: Vec<Accounts>,
        }
        let team = || Accounts::OfNamespace("team-a".into());
        for case in [
            Case { subject: subject("ServiceAccount", "web", Some("team-a")), granted: vec![one("team-a", "web")] },
            Case { subject: subject("ServiceAccount", "web", None), granted: vec![one("team-a", "web")] },
            Case { subject: subject("ServiceAccount", "web", Some("")), granted: vec![one("team-a", "web")] },
            Case { subject: subject("ServiceAccount", "web", Some("team-b")), granted: vec![] },
            Case {
                subject: subject("User", "system:serviceaccount:team-a:web", None),
                granted: vec![one("team-a", "web")],
            },
            Case { subject: subject("User", "system:serviceaccount:team-b:web", None), granted: vec![] },
            Case { subject: subject("User", "alice", None), granted: vec![] },
            Case { subject: subject("User", "system:serviceaccount:broken", None), granted: vec![] },
            Case { subject: subject("Group", "system:serviceaccounts", None), granted: vec![team()] },
            Case { subject: subject("Group", "system:authenticated", None), granted: vec![team()] },
            Case { subject: subject("Group", "system:serviceaccounts:team-a", None), granted: vec![team()] },
            Case { subject: subject("Group", "system:serviceaccounts:team-b", None), granted: vec![] },
            Case { subject: subject("Group", "developers", None), granted: vec![] },
            Case { subject: subject("Robot", "r2", None), granted: vec![team()] },
        ] {
            assert_eq!(
                accounts_granted(Some("team-a"), std::slice::from_ref(&case.subject)),
                case.granted,
                "{:?}",
                case.subject
            );
        }
    }

    #[test]
    fn a_binding_grants_a_role_of_its_namespace_or_a_cluster_role() {
        let role_ref = |kind: &str| RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: kind.into(),
            name: "use-db".into(),
        };
        assert_eq!(role_granted(Some("team-a"), &role_ref("Role")), RoleKey::Role("team-a".into(), "use-db".into()));
        assert_eq!(role_granted(Some("team-a"), &role_ref("ClusterRole")), RoleKey::ClusterRole("use-db".into()));
        assert_eq!(role_granted(None, &role_ref("ClusterRole")), RoleKey::ClusterRole("use-db".into()));
    }

    #[test]
    fn a_cluster_role_binding_grants_to_its_service_accounts_everywhere() {
        assert_eq!(
            accounts_granted(
                None,
                &[
                    subject("ServiceAccount", "web", Some("team-b")),
                    subject("User", "system:serviceaccount:team-c:job", None),
                    subject("Group", "system:serviceaccounts:team-d", None),
                    subject("User", "alice", None),
                    subject("ServiceAccount", "web", Some("team-b")),
                ]
            ),
            [Accounts::OfNamespace("team-d".into()), one("team-b", "web"), one("team-c", "job")]
        );
        assert_eq!(accounts_granted(None, &[subject("Group", "system:authenticated", None)]), [Accounts::Every]);
        // No namespace to read an empty one as: it names no one.
        assert_eq!(accounts_granted(None, &[subject("ServiceAccount", "web", None)]), []);
    }
}
