//! The access question: may a pod's service account `use` a share (or an external provider)?
//! Asked of the apiserver as a SubjectAccessReview for the service account's user and groups, so
//! that RBAC (a RoleBinding in the pod's namespace, or a ClusterRoleBinding) decides, and
//! revoking the binding revokes the volume. The driver asks it at every mount and refresh, the
//! admission plugin at creation: one review, one refusal message.

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};

use crate::API_GROUP as GROUP;
use crate::share_kind::ShareKind;

/// The verb a service account must be granted on a share or provider to mount it.
pub const USE_VERB: &str = "use";

/// What the verb `use` is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guarded {
    /// A share of a kind.
    Share(ShareKind),
    /// A provider of secrets kept outside Kubernetes (`content::external`).
    Provider,
}

impl Guarded {
    /// The resource name RBAC rules use.
    pub fn resource(self) -> &'static str {
        match self {
            Guarded::Share(kind) => kind.resource(),
            Guarded::Provider => "providers",
        }
    }

    /// What it is, for messages.
    pub fn kind(self) -> &'static str {
        match self {
            Guarded::Share(kind) => kind.kind(),
            Guarded::Provider => "provider",
        }
    }
}

/// Who asks for which share or provider: the unit access is checked and cached by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccessQuestion {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's service account.
    pub service_account: String,
    /// What is asked about.
    pub kind: Guarded,
    /// Its name.
    pub name: String,
}

impl AccessQuestion {
    /// The question as one entry of a node's object: `NAMESPACE/ACCOUNT/RESOURCE/NAME`, the
    /// resource as RBAC names it (`sharedsecrets`, `sharedconfigmaps`, `providers`). None of the
    /// four may hold a `/` (names of namespaces, service accounts, shares and providers cannot).
    pub fn key(&self) -> String {
        format!("{}/{}/{}/{}", self.namespace, self.service_account, self.kind.resource(), self.name)
    }

    /// The question an entry names; `None` for an entry of no known form.
    pub fn parse(key: &str) -> Option<AccessQuestion> {
        let mut parts = key.split('/');
        let (namespace, account, resource, name) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || [namespace, account, name].iter().any(|part| part.is_empty()) {
            return None;
        }
        let kind = [Guarded::Share(ShareKind::Secret), Guarded::Share(ShareKind::ConfigMap), Guarded::Provider]
            .into_iter()
            .find(|kind| kind.resource() == resource)?;
        Some(AccessQuestion {
            namespace: namespace.to_string(),
            service_account: account.to_string(),
            kind,
            name: name.to_string(),
        })
    }

    /// The SubjectAccessReview asking it: verb `use` on the share or provider, in the pod's namespace, as
    /// `system:serviceaccount:<ns>:<sa>` with the groups every service account has.
    pub fn review(&self) -> SubjectAccessReview {
        let namespace = &self.namespace;
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(format!("system:serviceaccount:{namespace}:{}", self.service_account)),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.into()),
                    resource: Some(self.kind.resource().into()),
                    verb: Some(USE_VERB.into()),
                    name: Some(self.name.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The refusal's message: the share or provider, the namespace and the service account.
    pub fn denial(&self) -> String {
        format!(
            "service account {}/{} may not use {} {:?}: grant it the verb \"use\" on {}.{} {:?} (a Role and RoleBinding in namespace {})",
            self.namespace,
            self.service_account,
            self.kind.kind(),
            self.name,
            self.kind.resource(),
            GROUP,
            self.name,
            self.namespace
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_is_named_by_one_entry_and_reads_back() {
        for kind in [Guarded::Share(ShareKind::Secret), Guarded::Share(ShareKind::ConfigMap), Guarded::Provider] {
            let question =
                AccessQuestion { namespace: "team-a".into(), service_account: "web".into(), kind, name: "db".into() };
            assert_eq!(AccessQuestion::parse(&question.key()), Some(question.clone()), "{}", question.key());
        }
        let share = AccessQuestion {
            namespace: "team-a".into(),
            service_account: "web".into(),
            kind: Guarded::Share(ShareKind::Secret),
            name: "db".into(),
        };
        assert_eq!(share.key(), "team-a/web/sharedsecrets/db");
        for bad in [
            "",
            "team-a/web/sharedsecrets",
            "team-a/web/secrets/db",
            "team-a//sharedsecrets/db",
            "a/b/providers/c/d",
            "a/b/providers/",
        ] {
            assert_eq!(AccessQuestion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_review_asks_as_the_service_account_for_use_of_the_share_in_its_namespace() {
        let question = AccessQuestion {
            namespace: "team-a".into(),
            service_account: "web".into(),
            kind: Guarded::Share(ShareKind::Secret),
            name: "db".into(),
        };
        let review = serde_json::to_value(question.review()).unwrap();
        assert_eq!(
            review["spec"],
            serde_json::json!({
                "user": "system:serviceaccount:team-a:web",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
                "resourceAttributes": {
                    "group": "sharedresource.inlineguard.dev", "resource": "sharedsecrets", "verb": "use",
                    "name": "db", "namespace": "team-a"
                }
            })
        );
        assert_eq!(
            question.denial(),
            "service account team-a/web may not use SharedSecret \"db\": grant it the verb \"use\" on sharedsecrets.sharedresource.inlineguard.dev \"db\" (a Role and RoleBinding in namespace team-a)"
        );
    }

    #[test]
    fn a_provider_is_asked_about_as_providers_of_the_same_group() {
        let question = AccessQuestion {
            namespace: "team-a".into(),
            service_account: "web".into(),
            kind: Guarded::Provider,
            name: "vault-cli".into(),
        };
        let review = serde_json::to_value(question.review()).unwrap();
        assert_eq!(review["spec"]["resourceAttributes"]["resource"], "providers");
        assert_eq!(review["spec"]["resourceAttributes"]["name"], "vault-cli");
        assert_eq!(
            question.denial(),
            "service account team-a/web may not use provider \"vault-cli\": grant it the verb \"use\" on providers.sharedresource.inlineguard.dev \"vault-cli\" (a Role and RoleBinding in namespace team-a)"
        );
    }
}
