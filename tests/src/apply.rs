//! Server-side apply of manifest files from the repository, as `kubectl apply --server-side`
//! (optionally `--dry-run=server`) would send them, so the apiserver itself validates them.

use std::path::Path;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::Value;

/// What became of one object.
#[derive(Debug)]
pub enum Applied {
    /// Accepted (created, updated, or passed dry-run).
    Accepted(String),
    /// Its kind is not served by this apiserver (e.g. a cert-manager kind without cert-manager).
    NotServed(String),
}

/// The Kubernetes objects in `path` (a file under the repository root); `kind: Kustomization`
/// is a build file, not an object, and is left out.
pub fn objects(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let documents = inline_guard_config::read_documents(path, &text).map_err(|e| e.to_string())?;
    Ok(documents.into_iter().map(|d| d.value).filter(|v| v["kind"] != "Kustomization").collect())
}

/// Applies every object in order; stops at the first the apiserver refuses.
pub async fn apply(client: &kube::Client, objects: &[Value], dry_run: bool) -> Result<Vec<Applied>, String> {
    let mut params = PatchParams::apply("inline-guard-e2e").force();
    params.dry_run = dry_run;
    let mut applied = Vec::new();
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let label = format!(
            "{kind} {}",
            if name.is_empty() { object["metadata"]["generateName"].as_str().unwrap_or_default() } else { name }
        );
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = match pinned_kind(client, &gvk).await {
            Ok(found) => found,
            Err(_) => {
                applied.push(Applied::NotServed(format!("{label} ({api_version})")));
                continue;
            }
        };
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Namespaced => {
                let namespace = object["metadata"]["namespace"].as_str().unwrap_or("default");
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        if name.is_empty() {
            // Apply needs a name; an object with only generateName can only be created.
            let object: DynamicObject = serde_json::from_value(object.clone()).map_err(|e| format!("{label}: {e}"))?;
            let post = PostParams { dry_run, field_manager: params.field_manager.clone() };
            api.create(&post, &object).await.map_err(|e| format!("{label}: {e}"))?;
        } else {
            api.patch(name, &params, &Patch::Apply(object)).await.map_err(|e| format!("{label}: {e}"))?;
        }
        applied.push(Applied::Accepted(label));
    }
    Ok(applied)
}
