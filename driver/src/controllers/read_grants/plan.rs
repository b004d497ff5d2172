//! What the driver may read, worked out from the shares alone: for each namespace a share points
//! into, one Role naming exactly the Secrets and ConfigMaps shares name there (`get`, `list`,
//! `watch` by `resourceNames`), and one RoleBinding granting it to the driver's ServiceAccount.
//! Pure: the controller lists the shares and the objects it already made, and applies the
//! difference this file computes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use sharedresource_api::ShareKind;
use sharedresource_api::object_name::{InvalidName, NamespaceName, ObjectName};

/// The name of the Role and the RoleBinding the controller keeps in each backing namespace.
pub const GRANT_NAME: &str = "sharedresource-csi-driver-reads";
/// The label marking them as the controller's: only objects carrying it are ever changed or
/// deleted by it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The label's value.
pub const MANAGED_BY: &str = "sharedresource-read-grants";

/// The identity the grants are for: the driver's ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverAccount {
    /// Its namespace.
    pub namespace: NamespaceName,
    /// Its name.
    pub name: ObjectName,
}

impl DriverAccount {
    /// `NAMESPACE/NAME`, both checked.
    pub fn parse(text: &str) -> Result<DriverAccount, String> {
        let Some((namespace, name)) = text.split_once('/') else {
            return Err(format!("{} is not NAMESPACE/NAME", crate::quote::quote(text)));
        };
        let invalid = |error: InvalidName| format!("the driver's ServiceAccount: {error}");
        Ok(DriverAccount {
            namespace: NamespaceName::parse(namespace).map_err(invalid)?,
            name: ObjectName::parse(name).map_err(invalid)?,
        })
    }
}

/// What every grant belongs to: the driver's own Namespace. A namespaced object may name a
/// cluster-scoped owner, so removing the driver's namespace (`kubectl delete -k`, `helm
/// uninstall`) lets the garbage collector remove the grants it made in every other namespace,
/// which no one would otherwise remove once the controller is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantOwner {
    /// The Namespace's name (the driver's ServiceAccount's).
    pub namespace: NamespaceName,
    /// Its uid: a namespace made again under the same name is another owner.
    pub uid: String,
}

impl GrantOwner {
    /// The grants' one owner reference.
    pub fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            name: self.namespace.as_str().into(),
            uid: self.uid.clone(),
            ..OwnerReference::default()
        }
    }

    /// Whether `references` (an object's) name this owner.
    pub fn owns(&self, references: Option<&[OwnerReference]>) -> bool {
        references.unwrap_or_default().iter().any(|r| r.kind == "Namespace" && r.uid == self.uid)
    }
}

/// The objects shares name in one namespace, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readable {
    /// Secrets named by SharedSecrets.
    pub secrets: BTreeSet<ObjectName>,
    /// ConfigMaps named by SharedConfigMaps.
    pub config_maps: BTreeSet<ObjectName>,
}

/// What the driver may read, by namespace.
pub type Wanted = BTreeMap<NamespaceName, Readable>;

/// The objects `shares` name (kind, backing namespace, backing name), by namespace. A share whose
/// namespace or name cannot be an object's grants nothing (its volumes are refused anyway).
pub fn wanted<'a>(shares: impl IntoIterator<Item = (ShareKind, &'a str, &'a str)>) -> Wanted {
    let mut wanted = Wanted::new();
    for (kind, namespace, name) in shares {
        let (Ok(namespace), Ok(name)) = (NamespaceName::parse(namespace), ObjectName::parse(name)) else {
            continue;
        };
        let readable = wanted.entry(namespace).or_default();
        match kind {
            ShareKind::Secret => readable.secrets.insert(name),
            ShareKind::ConfigMap => readable.config_maps.insert(name),
        };
    }
    wanted
}

fn metadata(namespace: &NamespaceName, owner: Option<&GrantOwner>) -> ObjectMeta {
    ObjectMeta {
        name: Some(GRANT_NAME.into()),
        namespace: Some(namespace.as_str().into()),
        labels: Some([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into()),
        owner_references: owner.map(|owner| vec![owner.reference()]),
        ..ObjectMeta::default()
    }
}

/// The rules letting the driver read exactly `readable`: `get` for a read, `list` and `watch`
/// for a watch of one object (RBAC matches `fieldSelector=metadata.name=` against
/// `resourceNames`); a kind with no object gets no rule (an empty `resourceNames` would grant
/// every object).
pub fn rules(readable: &Readable) -> Vec<PolicyRule> {
    [("secrets", &readable.secrets), ("configmaps", &readable.config_maps)]
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(resource, names)| PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec![resource.into()]),
            verbs: ["get", "list", "watch"].map(String::from).to_vec(),
            resource_names: Some(names.iter().map(|name| name.as_str().to_string()).collect()),
            ..PolicyRule::default()
        })
        .collect()
}

/// The Role of `namespace`, owned by `owner` when it is known.
pub fn role(namespace: &NamespaceName, readable: &Readable, owner: Option<&GrantOwner>) -> Role {
    Role { metadata: metadata(namespace, owner), rules: Some(rules(readable)) }
}

/// The RoleBinding of `namespace`, granting its Role to `driver`, owned by `owner` when it is
/// known.
pub fn binding(namespace: &NamespaceName, driver: &DriverAccount, owner: Option<&GrantOwner>) -> RoleBinding {
    RoleBinding {
        metadata: metadata(namespace, owner),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: GRANT_NAME.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: driver.name.as_str().into(),
            namespace: Some(driver.namespace.as_str().into()),
            ..Subject::default()
        }]),
    }
}

/// One change to the cluster's grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Apply the Role of this namespace (created, or its names changed).
    ApplyRole(NamespaceName, Readable),
    /// Apply the RoleBinding of this namespace.
    ApplyBinding(NamespaceName),
    /// Delete the Role and RoleBinding of a namespace no share points into any more.
    Remove(String),
}

/// What the controller already made, as it last saw it.
#[derive(Debug, Default)]
pub struct Existing {
    /// Each namespace's Role rules.
    pub roles: BTreeMap<String, Vec<PolicyRule>>,
    /// Each namespace's RoleBinding: its role and subjects.
    pub bindings: BTreeMap<String, (RoleRef, Vec<Subject>)>,
    /// The namespaces whose Role or RoleBinding does not name the owner (made by a version
    /// before owners, or for a driver namespace made again): applied again.
    pub unowned: BTreeSet<String>,
}

/// The steps that make `existing` what `wanted` says: a Role whose names differ is applied, a
/// missing or altered binding applied, and the grants of a namespace no share points into
/// removed; grants not naming their owner are applied again. Roles are applied before bindings
/// (a binding to a missing Role grants nothing, but a Role first means the grant holds as soon
/// as its binding does).
pub fn steps(wanted: &Wanted, existing: &Existing, driver: &DriverAccount, owner: Option<&GrantOwner>) -> Vec<Step> {
    let mut roles = Vec::new();
    let mut bindings = Vec::new();
    for (namespace, readable) in wanted {
        let unowned = existing.unowned.contains(namespace.as_str());
        if unowned || existing.roles.get(namespace.as_str()) != Some(&rules(readable)) {
            roles.push(Step::ApplyRole(namespace.clone(), readable.clone()));
        }
        let want = binding(namespace, driver, owner);
        let have = existing.bindings.get(namespace.as_str());
        if unowned || have != Some(&(want.role_ref, want.subjects.unwrap_or_default())) {
            bindings.push(Step::ApplyBinding(namespace.clone()));
        }
    }
    let made: BTreeSet<&String> = existing.roles.keys().chain(existing.bindings.keys()).collect();
    let removed = made
        .into_iter()
        .filter(|namespace| NamespaceName::parse(namespace).map_or(true, |n| !wanted.contains_key(&n)))
        .map(|namespace| Step::Remove(namespace.clone()));
    roles.into_iter().chain(bindings).chain(removed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver() -> DriverAccount {
        DriverAccount::parse("inline-guard-driver/sharedresource-csi-driver").unwrap()
    }

    fn ns(name: &str) -> NamespaceName {
        NamespaceName::parse(name).unwrap()
    }

    fn owner() -> GrantOwner {
        GrantOwner { namespace: ns("inline-guard-driver"), uid: "7d3c-uid".into() }
    }

    fn names(list: &[&str]) -> BTreeSet<ObjectName> {
        list.iter().map(|name| ObjectName::parse(name).unwrap()).collect()
    }

    #[test]
    fn each_namespace_gets_exactly_the_names_its_shares_point_at() {
        let wanted = wanted([
            (ShareKind::Secret, "infra", "db-creds"),
            (ShareKind::Secret, "infra", "db-creds"),
            (ShareKind::Secret, "infra", "api-key"),
            (ShareKind::ConfigMap, "infra", "ca"),
            (ShareKind::ConfigMap, "web", "settings"),
            (ShareKind::Secret, "Bad_NS", "x"),
            (ShareKind::Secret, "infra", "../other"),
            (ShareKind::Secret, "", "x"),
        ]);
        assert_eq!(
            wanted,
            Wanted::from([
                (ns("infra"), Readable { secrets: names(&["api-key", "db-creds"]), config_maps: names(&["ca"]) }),
                (ns("web"), Readable { secrets: names(&[]), config_maps: names(&["settings"]) }),
            ])
        );
    }

    #[test]
    fn a_role_reads_named_objects_only_and_never_a_whole_kind() {
        let only_config_maps = Readable { secrets: BTreeSet::new(), config_maps: names(&["ca", "b"]) };
        let rules = rules(&only_config_maps);
        assert_eq!(rules.len(), 1, "no rule for Secrets, which no share names here: {rules:?}");
        assert_eq!(rules[0].resources.as_deref(), Some(&["configmaps".to_string()][..]));
        assert_eq!(rules[0].resource_names.as_deref(), Some(&["b".to_string(), "ca".to_string()][..]));
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
        assert_eq!(rules[0].api_groups.as_deref(), Some(&[String::new()][..]));
        let role = role(&ns("web"), &only_config_maps, Some(&owner()));
        assert_eq!(role.metadata.name.as_deref(), Some(GRANT_NAME));
        assert_eq!(role.metadata.namespace.as_deref(), Some("web"));
        assert_eq!(role.metadata.labels.unwrap()[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(role.metadata.owner_references, Some(vec![owner().reference()]));
        let reference = owner().reference();
        assert_eq!((reference.kind.as_str(), reference.name.as_str()), ("Namespace", "inline-guard-driver"));
        let binding = binding(&ns("web"), &driver(), Some(&owner()));
        assert!(owner().owns(binding.metadata.owner_references.as_deref()));
        // Without a known owner (its Namespace unreadable), the grants are made all the same.
        assert_eq!(super::role(&ns("web"), &only_config_maps, None).metadata.owner_references, None);
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.namespace.as_deref(), subject.name.as_str()),
            ("ServiceAccount", Some("inline-guard-driver"), "sharedresource-csi-driver")
        );
        assert_eq!((binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()), ("Role", GRANT_NAME));
    }

    #[test]
    fn only_differences_are_applied_and_stale_grants_removed() {
        let readable = Readable { secrets: names(&["db"]), config_maps: BTreeSet::new() };
        let wanted = Wanted::from([(ns("infra"), readable.clone()), (ns("web"), readable.clone())]);
        let made = binding(&ns("infra"), &driver(), Some(&owner()));
        let existing = Existing {
            roles: [
                ("infra".to_string(), rules(&readable)),
                ("web".to_string(), rules(&Readable { secrets: names(&["db", "old"]), ..Readable::default() })),
                ("gone".to_string(), rules(&readable)),
            ]
            .into(),
            bindings: [
                ("infra".to_string(), (made.role_ref.clone(), made.subjects.clone().unwrap())),
                ("web".to_string(), (made.role_ref.clone(), vec![])),
                ("also-gone".to_string(), (made.role_ref, made.subjects.unwrap())),
            ]
            .into(),
            unowned: BTreeSet::new(),
        };
        assert_eq!(
            steps(&wanted, &existing, &driver(), Some(&owner())),
            [
                Step::ApplyRole(ns("web"), readable.clone()),
                Step::ApplyBinding(ns("web")),
                Step::Remove("also-gone".into()),
                Step::Remove("gone".into()),
            ]
        );
        assert_eq!(steps(&Wanted::new(), &Existing::default(), &driver(), Some(&owner())), []);
        // Grants made without their owner (an older controller, or the driver's namespace made
        // again) are applied again, though nothing else of them differs.
        let unowned = Existing { unowned: ["infra".to_string()].into(), ..existing };
        assert_eq!(
            steps(&wanted, &unowned, &driver(), Some(&owner()))[..2],
            [Step::ApplyRole(ns("infra"), readable.clone()), Step::ApplyRole(ns("web"), readable)]
        );
        assert!(steps(&wanted, &unowned, &driver(), Some(&owner())).contains(&Step::ApplyBinding(ns("infra"))));
        assert!(!owner().owns(None));
        assert!(!GrantOwner { uid: "other".into(), ..owner() }.owns(Some(&[owner().reference()])));
    }

    #[test]
    fn the_owner_reference_names_the_namespace_whole_as_the_garbage_collector_reads_it() {
        // Without its apiVersion the apiserver refuses the grant (ownerReferences' apiVersion is
        // required), so no grant would be made at all.
        let reference = owner().reference();
        assert_eq!(
            (reference.api_version.as_str(), reference.kind.as_str(), reference.name.as_str(), reference.uid.as_str()),
            ("v1", "Namespace", "inline-guard-driver", "7d3c-uid")
        );
        let role = role(&ns("infra"), &Readable::default(), Some(&owner()));
        assert_eq!(role.metadata.owner_references, Some(vec![reference]));
    }

    #[test]
    fn the_driver_account_is_namespace_slash_name() {
        assert_eq!(driver().name.as_str(), "sharedresource-csi-driver");
        for bad in ["no-slash", "a/b/c", "/name", "ns/", "NS/name"] {
            assert!(DriverAccount::parse(bad).is_err(), "{bad}");
        }
    }
}
