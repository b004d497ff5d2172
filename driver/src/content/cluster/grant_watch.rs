//! The watches of grants: RoleBindings and ClusterRoleBindings (whole, for their subjects and
//! role), and Roles and ClusterRoles (metadata only: a change of any kind may change what they
//! grant). A binding's change looks again at the volumes of the service accounts it named before
//! the change or names after it; a role's change, at those of every binding that grants it. A
//! grant that names no service account costs no access check ([`super::grants`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use tracing::warn;

use super::grants::{RoleKey, accounts_granted, role_granted};
use super::watch::Watchable;
use crate::content::changes::{Accounts, Changes};
use crate::metrics::Metrics;
use crate::unpoisoned::UnpoisonedMutex;

/// Bindings listed per page. Every tenant can make bindings in its own namespace, each up to
/// etcd's 1.5 MiB (a long subject list, large annotations), and a relist reads a page whole
/// before it is decoded: 20 to a page keeps the worst page near 30 MiB, whatever tenants make,
/// while a cluster of 10 000 bindings relists in 500 requests. Only what a binding grants to
/// service accounts is kept after its page.
const BINDINGS_PER_PAGE: u32 = 20;
/// Roles listed per page: metadata only (annotations and managed fields at most, no rules).
const ROLES_PER_PAGE: u32 = 100;

/// A binding: its kind, namespace (empty for a ClusterRoleBinding) and name.
type BindingKey = (&'static str, String, String);
/// What a binding grants, and to which service accounts.
type Grant = (RoleKey, Vec<Accounts>);

/// Every binding that names a service account, with its role: a role's change concerns them.
#[derive(Debug, Default)]
struct Grants(Mutex<HashMap<BindingKey, Grant>>);

impl Grants {
    /// Records what `binding` grants now (`None`: nothing to anyone); returns what it granted.
    fn set(&self, binding: BindingKey, grant: Option<Grant>) -> Option<Grant> {
        let mut grants = self.0.locked();
        match grant {
            Some(grant) => grants.insert(binding, grant),
            None => grants.remove(&binding),
        }
    }

    /// Replaces every binding of `kind` by a relist's.
    fn relisted(&self, kind: &'static str, listed: HashMap<BindingKey, Grant>) {
        let mut grants = self.0.locked();
        grants.retain(|(of, _, _), _| *of != kind);
        grants.extend(listed);
    }

    /// The service accounts the bindings of `role` grant it to.
    fn accounts_of(&self, role: &RoleKey) -> Vec<Accounts> {
        let grants = self.0.locked();
        grants.values().filter(|(of, _)| of == role).flat_map(|(_, accounts)| accounts.iter().cloned()).collect()
    }
}

/// Watches every grant with `client`, noting in `wake` the service accounts each change
/// concerns; runs until dropped.
pub async fn watch_grants(client: Client, wake: Arc<Changes>, metrics: Arc<Metrics>) {
    let grants = Arc::new(Grants::default());
    futures_util::future::join4(
        follow_bindings::<RoleBinding>(
            Api::all(client.clone()),
            |b| {
                let namespace = Some(b.metadata.namespace.as_deref().unwrap_or_default());
                (
                    role_granted(namespace, &b.role_ref),
                    accounts_granted(namespace, b.subjects.as_deref().unwrap_or_default()),
                )
            },
            (grants.clone(), wake.clone(), metrics.clone()),
        ),
        follow_bindings::<ClusterRoleBinding>(
            Api::all(client.clone()),
            |b| (role_granted(None, &b.role_ref), accounts_granted(None, b.subjects.as_deref().unwrap_or_default())),
            (grants.clone(), wake.clone(), metrics.clone()),
        ),
        follow_roles::<Role>(
            Api::all(client.clone()),
            |namespace, name| RoleKey::Role(namespace.to_string(), name.to_string()),
            (grants.clone(), wake.clone(), metrics.clone()),
        ),
        follow_roles::<ClusterRole>(
            Api::all(client),
            |_, name| RoleKey::ClusterRole(name.to_string()),
            (grants, wake, metrics),
        ),
    )
    .await;
}

/// Watches the bindings of one kind (`B`). What each binding named is remembered, since an
/// update's event carries only the new object.
async fn follow_bindings<B>(
    api: Api<B>,
    grant_of: fn(&B) -> Grant,
    (grants, wake, metrics): (Arc<Grants>, Arc<Changes>, Arc<Metrics>),
) where
    B: Watchable + k8s_openapi::Resource,
{
    let kind = <B as k8s_openapi::Resource>::KIND;
    let mut relisting: Option<HashMap<BindingKey, Grant>> = None;
    let paged = watcher::Config::default().page_size(BINDINGS_PER_PAGE);
    let mut events = watch_stream(api, paged).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let key = |binding: &B| {
            (
                kind,
                binding.meta().namespace.clone().unwrap_or_default(),
                binding.meta().name.clone().unwrap_or_default(),
            )
        };
        // Bindings that name no service account are not kept: nothing they grant matters here.
        let named = |binding: &B| Some(grant_of(binding)).filter(|(_, accounts)| !accounts.is_empty());
        match event {
            Ok(Event::Init) => relisting = Some(HashMap::new()),
            Ok(Event::InitApply(binding)) => {
                if let Some(grant) = named(&binding) {
                    relisting.get_or_insert_with(HashMap::new).insert(key(&binding), grant);
                }
            }
            // A relist may have missed changes: every volume is looked at again.
            Ok(Event::InitDone) => {
                grants.relisted(kind, relisting.take().unwrap_or_default());
                wake.grants_relisted();
            }
            Ok(Event::Apply(binding)) => {
                let now = named(&binding);
                let before = grants.set(key(&binding), now.clone());
                wake.grant_changed(before.into_iter().chain(now).flat_map(|(_, accounts)| accounts));
            }
            Ok(Event::Delete(binding)) => {
                let before = grants.set(key(&binding), None);
                wake.grant_changed(before.into_iter().chain(named(&binding)).flat_map(|(_, accounts)| accounts));
            }
            Err(error) => watch_failed(&metrics, kind, &error),
        }
    }
}

/// Watches the roles of one kind (`R`), metadata only: a role's change looks again at the
/// service accounts of the bindings that grant it.
async fn follow_roles<R>(
    api: Api<PartialObjectMeta<R>>,
    key_of: fn(&str, &str) -> RoleKey,
    (grants, wake, metrics): (Arc<Grants>, Arc<Changes>, Arc<Metrics>),
) where
    R: Watchable + k8s_openapi::Resource,
{
    let paged = watcher::Config::default().page_size(ROLES_PER_PAGE);
    let mut events = watch_stream(api, paged).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init | Event::InitApply(_)) => {}
            // A relist may have missed changes: every volume is looked at again.
            Ok(Event::InitDone) => wake.grants_relisted(),
            Ok(Event::Apply(role) | Event::Delete(role)) => {
                let (namespace, name) = (
                    role.metadata.namespace.as_deref().unwrap_or_default(),
                    role.metadata.name.as_deref().unwrap_or_default(),
                );
                wake.grant_changed(grants.accounts_of(&key_of(namespace, name)));
            }
            Err(error) => watch_failed(&metrics, <R as k8s_openapi::Resource>::KIND, &error),
        }
    }
}

fn watch_failed(metrics: &Metrics, kind: &str, error: &watcher::Error) {
    metrics.watch_error(kind);
    warn!(kind = %kind, error = %crate::quote::Logged(error), "watch failed; retrying with backoff (the periodic refresh continues)");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str) -> Vec<Accounts> {
        vec![Accounts::One("team-a".into(), name.into())]
    }

    #[test]
    fn a_role_concerns_the_accounts_of_the_bindings_that_grant_it_and_a_relist_replaces_one_kind() {
        let grants = Grants::default();
        let use_db = RoleKey::Role("team-a".into(), "use-db".into());
        let view = RoleKey::ClusterRole("view".into());
        grants.set(("RoleBinding", "team-a".into(), "web".into()), Some((use_db.clone(), one("web"))));
        grants.set(("RoleBinding", "team-a".into(), "job".into()), Some((use_db.clone(), one("job"))));
        grants.set(("ClusterRoleBinding", "".into(), "viewers".into()), Some((view.clone(), one("viewer"))));
        let mut accounts = grants.accounts_of(&use_db);
        accounts.sort();
        assert_eq!(accounts, [one("job"), one("web")].concat());
        assert_eq!(grants.accounts_of(&RoleKey::Role("team-b".into(), "use-db".into())), []);

        let before = grants.set(("RoleBinding", "team-a".into(), "web".into()), None);
        assert_eq!(before, Some((use_db.clone(), one("web"))));
        assert_eq!(grants.accounts_of(&use_db), one("job"));

        grants.relisted("RoleBinding", HashMap::new());
        assert_eq!(grants.accounts_of(&use_db), []);
        assert_eq!(grants.accounts_of(&view), one("viewer"), "another kind's bindings are kept");
    }
}
