//! The read-grants controller: keeps, in each namespace a share points into, the Role and
//! RoleBinding [`super::plan`] computes, so the driver on every node may read the Secrets and
//! ConfigMaps shares name and nothing else. It watches both share kinds and its own Roles and
//! RoleBindings (selected by its label: it never touches another object), and after any change
//! applies the difference (server-side apply, so two replicas agree rather than fight). Nothing
//! is removed before every watch has listed: a controller that has not yet seen the shares must
//! not take grants away. A failed step is retried with backoff (`controllers::pacing`), so a
//! grant for a namespace created after its share arrives within that; every request has a
//! timeout. Every
//! grant names the driver's Namespace as its owner (read once at start), so the grants go with
//! an uninstalled driver; a controller that cannot read it grants all the same, and says so.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource};
use tokio::sync::Notify;
use tracing::{info, warn};

use super::plan::{
    DriverAccount, Existing, GRANT_NAME, GrantOwner, MANAGED_BY, MANAGED_BY_LABEL, Step, binding, role, steps, wanted,
};
use crate::apiserver::request::{RequestFailed, ask};
use crate::controllers::follow::follow;
use crate::controllers::pacing::PassPacing;
use crate::quote::Logged;
use sharedresource_api::ShareKind;
use sharedresource_api::shares::{SharedConfigMap, SharedSecret};

/// What the controller watches, each kept by a reflector: the shares whole (cluster-scoped, made
/// by the cluster's operators), and of Roles and RoleBindings only those of its own name and
/// label (at most one of each per namespace, whatever tenants label), without their managed
/// fields and annotations.
struct Stores {
    secrets: Store<SharedSecret>,
    config_maps: Store<SharedConfigMap>,
    roles: Store<Role>,
    bindings: Store<RoleBinding>,
}

/// Runs the controller with `client` for `driver`, each request given up after `timeout`, until
/// dropped.
pub async fn run(client: Client, driver: DriverAccount, timeout: Duration) {
    let owner = grant_owner(&client, &driver, timeout).await;
    let changed = Arc::new(Notify::new());
    // Selected by name as well: its RBAC lets it list and watch only that name, which the
    // apiserver allows only to a request that selects it.
    let mine = watcher::Config::default()
        .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"))
        .fields(&format!("metadata.name={GRANT_NAME}"));
    let stores = Stores {
        secrets: follow(Api::all(client.clone()), watcher::Config::default(), changed.clone()),
        config_maps: follow(Api::all(client.clone()), watcher::Config::default(), changed.clone()),
        roles: follow(Api::all(client.clone()), mine.clone(), changed.clone()),
        bindings: follow(Api::all(client.clone()), mine, changed.clone()),
    };
    for ready in [
        stores.secrets.wait_until_ready().await,
        stores.config_maps.wait_until_ready().await,
        stores.roles.wait_until_ready().await,
        stores.bindings.wait_until_ready().await,
    ] {
        if ready.is_err() {
            return;
        }
    }
    info!("every watch has listed; keeping the driver's read grants");
    let mut pacing = PassPacing::default();
    loop {
        let failed = reconcile(&client, &stores, &driver, owner.as_ref(), timeout).await;
        pacing.next_pass(&changed, failed).await;
    }
}

/// How often the grants' owner is asked for before the controller grants without it.
const OWNER_ATTEMPTS: u32 = 5;

/// The driver's Namespace as the grants' owner, asked a few times (an apiserver still starting
/// answers within them). Without it the controller grants all the same: the drivers' reads
/// matter more than the grants' removal with the driver, which is then said in the log (an
/// installation that renamed the namespace but not read-grants.yaml's rule, for example).
async fn grant_owner(client: &Client, driver: &DriverAccount, timeout: Duration) -> Option<GrantOwner> {
    let api = Api::<Namespace>::all(client.clone());
    let what = || format!("reading Namespace {}, the owner of the read grants", driver.namespace);
    for attempt in 1..=OWNER_ATTEMPTS {
        match ask(timeout, what, api.get(driver.namespace.as_str())).await {
            Ok(namespace) => match namespace.metadata.uid {
                Some(uid) if !uid.is_empty() => return Some(GrantOwner { namespace: driver.namespace.clone(), uid }),
                _ => warn!(namespace = %driver.namespace, "the driver's Namespace has no uid"),
            },
            Err(error) => warn!(error = %Logged(&error), attempt, "the grants' owner could not be read"),
        }
        if attempt < OWNER_ATTEMPTS {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    warn!(
        namespace = %driver.namespace,
        "granting without an owner: the read grants will outlive the driver's namespace (delete them by name when uninstalling)"
    );
    None
}

/// Applies what differs; true when a step failed (it is retried).
async fn reconcile(
    client: &Client,
    stores: &Stores,
    driver: &DriverAccount,
    owner: Option<&GrantOwner>,
    timeout: Duration,
) -> bool {
    let secrets = stores.secrets.state();
    let config_maps = stores.config_maps.state();
    let named = secrets
        .iter()
        .map(|share| (ShareKind::Secret, &share.spec.secret_ref))
        .chain(config_maps.iter().map(|share| (ShareKind::ConfigMap, &share.spec.config_map_ref)))
        .map(|(kind, object)| (kind, object.namespace.as_str(), object.name.as_str()));
    let wanted = wanted(named);
    let (roles, bindings) = (stores.roles.state(), stores.bindings.state());
    let unowned = roles
        .iter()
        .map(|role| (&role.metadata, &role.metadata.owner_references))
        .chain(bindings.iter().map(|binding| (&binding.metadata, &binding.metadata.owner_references)))
        .filter(|(meta, references)| {
            meta.name.as_deref() == Some(GRANT_NAME) && owner.is_some_and(|owner| !owner.owns(references.as_deref()))
        })
        .map(|(meta, _)| meta.namespace.clone().unwrap_or_default())
        .collect();
    let existing = Existing {
        roles: roles
            .iter()
            .filter(|role| role.metadata.name.as_deref() == Some(GRANT_NAME))
            .map(|role| (role.metadata.namespace.clone().unwrap_or_default(), role.rules.clone().unwrap_or_default()))
            .collect(),
        bindings: bindings
            .iter()
            .filter(|binding| binding.metadata.name.as_deref() == Some(GRANT_NAME))
            .map(|binding| {
                let namespace = binding.metadata.namespace.clone().unwrap_or_default();
                (namespace, (binding.role_ref.clone(), binding.subjects.clone().unwrap_or_default()))
            })
            .collect(),
        unowned,
    };
    let mut failed = false;
    for step in steps(&wanted, &existing, driver, owner) {
        if let Err(error) = take(client, &step, driver, owner, timeout).await {
            warn!(error = %Logged(&error), "a read grant could not be changed; retrying with backoff");
            failed = true;
        }
    }
    failed
}

/// Takes one step.
async fn take(
    client: &Client,
    step: &Step,
    driver: &DriverAccount,
    owner: Option<&GrantOwner>,
    timeout: Duration,
) -> Result<(), RequestFailed> {
    let apply = PatchParams::apply(MANAGED_BY).force();
    match step {
        Step::ApplyRole(namespace, readable) => {
            let api = Api::<Role>::namespaced(client.clone(), namespace.as_str());
            let what = || format!("applying Role {namespace}/{GRANT_NAME}");
            ask(timeout, what, api.patch(GRANT_NAME, &apply, &Patch::Apply(role(namespace, readable, owner)))).await?;
            info!(%namespace, secrets = readable.secrets.len(), config_maps = readable.config_maps.len(), "read grant applied");
        }
        Step::ApplyBinding(namespace) => {
            let api = Api::<RoleBinding>::namespaced(client.clone(), namespace.as_str());
            let what = || format!("applying RoleBinding {namespace}/{GRANT_NAME}");
            ask(timeout, what, api.patch(GRANT_NAME, &apply, &Patch::Apply(binding(namespace, driver, owner)))).await?;
        }
        Step::Remove(namespace) => {
            // Names from the controller's own labelled objects, which the apiserver named.
            delete_if_present(Api::<RoleBinding>::namespaced(client.clone(), namespace), timeout).await?;
            delete_if_present(Api::<Role>::namespaced(client.clone(), namespace), timeout).await?;
            info!(%namespace, "read grant removed: no share points into the namespace");
        }
    }
    Ok(())
}

/// Deletes the controller's object of `api`'s kind and namespace; one already gone is deleted.
async fn delete_if_present<K>(api: Api<K>, timeout: Duration) -> Result<(), RequestFailed>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let what = || format!("deleting {} {}/{GRANT_NAME}", K::kind(&()), api.namespace().unwrap_or_default());
    let delete = async {
        match api.delete(GRANT_NAME, &DeleteParams::default()).await {
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            deleted => deleted.map(drop),
        }
    };
    ask(timeout, what, delete).await
}

#[cfg(test)]
mod tests;
