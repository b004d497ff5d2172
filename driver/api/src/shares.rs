//! The shares API: cluster-scoped `SharedSecret` and `SharedConfigMap` of the group
//! `sharedresource.inlineguard.dev`, version `v1alpha1`, each naming one backing object in one
//! namespace. The driver's CRDs (`config/deploy/driver/crds.yaml`: these two and
//! `SharedProjection`) are generated from the types of this crate.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::API_GROUP as GROUP;
pub use crate::access::USE_VERB;

/// A namespaced object named by a share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ObjectRef {
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

/// The most nodes a share's status lists (Kubernetes' largest supported cluster): the
/// apiserver refuses a longer list, so no node can grow what every reader of the share holds.
pub const MAX_NODE_ENTRIES: usize = 5000;
/// The longest message of one node's entry (the driver writes under 1 KiB).
pub const MAX_NODE_MESSAGE: usize = 2048;

/// The status both kinds of share report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShareStatus {
    /// `BackingObjectExists` and `BackingObjectReadable`, in the usual Kubernetes shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The nodes where a volume of this share could not take the latest update and serves
    /// what it had: one entry per node, written by that node's driver alone (server-side
    /// apply, its own field manager) and removed by it once its volumes are current again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NODE_ENTRIES))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes_not_updated: Vec<NodeNotUpdated>,
}

/// A node whose volumes of a share are not up to date.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeNotUpdated {
    /// The node's name.
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// How many of its volumes, and why the first could not be updated (the driver's words,
    /// naming what to change; never the content).
    #[schemars(length(max = MAX_NODE_MESSAGE))]
    pub message: String,
    /// Since when (RFC 3339).
    #[schemars(length(max = 64))]
    pub since: String,
}

/// A Secret of one namespace, offered to pods of other namespaces as a read-only inline volume.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sharedresource.inlineguard.dev",
    version = "v1alpha1",
    kind = "SharedSecret",
    plural = "sharedsecrets",
    status = "ShareStatus",
    printcolumn = r#"{"name": "Namespace", "type": "string", "jsonPath": ".spec.secretRef.namespace"}"#,
    printcolumn = r#"{"name": "Secret", "type": "string", "jsonPath": ".spec.secretRef.name"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SharedSecretSpec {
    /// The Secret shared.
    pub secret_ref: ObjectRef,
    /// What the share is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A ConfigMap of one namespace, offered to pods of other namespaces as a read-only inline volume.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sharedresource.inlineguard.dev",
    version = "v1alpha1",
    kind = "SharedConfigMap",
    plural = "sharedconfigmaps",
    status = "ShareStatus",
    printcolumn = r#"{"name": "Namespace", "type": "string", "jsonPath": ".spec.configMapRef.namespace"}"#,
    printcolumn = r#"{"name": "ConfigMap", "type": "string", "jsonPath": ".spec.configMapRef.name"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SharedConfigMapSpec {
    /// The ConfigMap shared.
    pub config_map_ref: ObjectRef,
    /// What the share is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shares' CRDs and the projections' as one YAML stream: what `config/deploy/driver/crds.yaml` holds.
    fn crds_yaml() -> Result<String, String> {
        use kube::CustomResourceExt as _;
        let mut text = String::from(
            "# Generated from driver/api/src/shares.rs, projection/spec.rs and node_view.rs; `UPDATE_CRDS=1 cargo test -p sharedresource-api crds` rewrites it.\n",
        );
        for crd in [
            SharedSecret::crd(),
            SharedConfigMap::crd(),
            crate::projection::spec::SharedProjection::crd(),
            crate::node_view::SharedResourceNode::crd(),
        ] {
            text.push_str("---\n");
            text.push_str(&serde_saphyr::to_string(&crd).map_err(|e| e.to_string())?);
        }
        Ok(text)
    }

    /// The same CRDs as the Helm chart's template: installed when `crds.install`, and kept on
    /// `helm uninstall` (Helm's resource policy) when `crds.keep`.
    fn chart_crds_template(crds: &str) -> String {
        let body = crds.split_once('\n').map_or(crds, |(_, rest)| rest).replace(
            "kind: CustomResourceDefinition\nmetadata:\n",
            "kind: CustomResourceDefinition\nmetadata:\n{{- if $.Values.crds.keep }}\n  annotations:\n    helm.sh/resource-policy: keep\n{{- end }}\n",
        );
        format!(
            "{{{{- /* Generated with config/deploy/driver/crds.yaml (`UPDATE_CRDS=1 cargo test -p sharedresource-api crds`). */}}}}\n\
             {{{{- if .Values.crds.install }}}}\n{body}{{{{- end }}}}\n"
        )
    }

    #[test]
    fn the_shipped_crds_are_generated_from_these_types() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let generated = crds_yaml().unwrap();
        for (path, generated) in [
            (root.join("config/deploy/driver/crds.yaml"), generated.clone()),
            (root.join("config/helm/inline-guard/templates/driver/crds.yaml"), chart_crds_template(&generated)),
        ] {
            if std::env::var_os("UPDATE_CRDS").is_some_and(|v| v == "1") {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &generated).unwrap();
            }
            let shipped = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(shipped == generated, "{} drifted from the types (UPDATE_CRDS=1 regenerates it)", path.display());
        }
    }

    #[test]
    fn shares_are_cluster_scoped_with_their_backing_object_in_the_columns() {
        use kube::CustomResourceExt as _;
        let crd = SharedSecret::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.group, GROUP);
        let columns: Vec<String> =
            crd.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.json_path.clone()).collect();
        assert_eq!(columns, [".spec.secretRef.namespace", ".spec.secretRef.name", ".metadata.creationTimestamp"]);
        let share: SharedSecret = serde_json::from_value(serde_json::json!({
            "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
            "metadata": {"name": "db"}, "spec": {"secretRef": {"namespace": "infra", "name": "db-creds"}}
        }))
        .unwrap();
        assert_eq!(share.spec.secret_ref, ObjectRef { namespace: "infra".into(), name: "db-creds".into() });
    }
}
