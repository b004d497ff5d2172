//! The node's view by name: a cluster-scoped `SharedResourceNode` per node, named after it. The
//! node's driver writes the spec (which namespaces have volumes on it that the access check
//! guards, and which shares and projections those volumes read); the access-notices controller,
//! the one place that watches the cluster's RBAC, shares and projections, writes the status (per
//! namespace, when it last noticed a grant change there; per object, when it last noticed it
//! change; and when it last noticed a change that may concern every namespace or every object).
//! Each driver watches its own object by name, so a binding changed in a namespace, or a share
//! edited, costs one write per node serving it and nothing anywhere else, and no node keeps a
//! copy of the cluster's RBAC or watches a kind cluster-wide.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most namespaces a node's object lists. A node with more sets `everyNamespace` instead,
/// and is told of every grant change: never fewer notices than it needs.
pub const MAX_NAMESPACES: usize = 256;
/// The most shares and projections a node's object lists. A node with more sets `everyObject`
/// instead, and is told of every change of any share or projection.
pub const MAX_OBJECTS: usize = 512;
/// The longest object entry: `SharedProjection/` (17), a namespace (63), `/` and a name (253).
pub const MAX_OBJECT_LENGTH: usize = 334;
/// The most access questions a node's object lists (the first, sorted, when its volumes ask
/// more): a grant's change in a namespace whose every question it lists is answered for it by
/// the controller; one it asks itself in that namespace beyond the list, it looks at itself.
pub const MAX_QUESTIONS: usize = 512;
/// The longest question entry: a namespace (63), a service account (253), a resource
/// (`sharedconfigmaps`, 16), a name (253) and three `/`.
pub const MAX_QUESTION_LENGTH: usize = 588;

/// A share or projection whose changes a node is told of, named in its object as
/// `SharedSecret/NAME`, `SharedConfigMap/NAME` or `SharedProjection/NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NoticedObject {
    /// A share, by kind and name.
    Share(crate::ShareKind, String),
    /// A projection, by namespace and name.
    Projection(String, String),
}

/// The kind an entry names projections by.
const PROJECTION_KIND: &str = "SharedProjection";

impl NoticedObject {
    /// The entry naming it.
    pub fn key(&self) -> String {
        match self {
            NoticedObject::Share(kind, name) => format!("{}/{name}", kind.kind()),
            NoticedObject::Projection(namespace, name) => format!("{PROJECTION_KIND}/{namespace}/{name}"),
        }
    }

    /// The object an entry names; `None` for an entry of no known form.
    pub fn parse(key: &str) -> Option<NoticedObject> {
        let (kind, rest) = key.split_once('/')?;
        let share = |kind: crate::ShareKind| {
            (!rest.is_empty() && !rest.contains('/')).then(|| NoticedObject::Share(kind, rest.to_string()))
        };
        match kind {
            "SharedSecret" => share(crate::ShareKind::Secret),
            "SharedConfigMap" => share(crate::ShareKind::ConfigMap),
            PROJECTION_KIND => {
                let (namespace, name) = rest.split_once('/')?;
                (!namespace.is_empty() && !name.is_empty() && !name.contains('/'))
                    .then(|| NoticedObject::Projection(namespace.to_string(), name.to_string()))
            }
            _ => None,
        }
    }
}

/// The Lease the access-notices controller renews while it tells nodes of grant changes, as
/// shipped (in the driver's namespace). A node that sees it renewed holds access answers until a
/// notice concerns them; one that does not checks every answer again on its own, every
/// `accessFallbackSeconds`.
pub const DEFAULT_LEASE: &str = "inline-guard-driver/sharedresource-access-notices";
/// How long a renewal is good for: a node that has seen none for this long falls back.
pub const LEASE_SECONDS: u64 = 40;
/// How often the controller renews the lease (a quarter of [`LEASE_SECONDS`]: three renewals
/// may be lost before any node falls back).
pub const LEASE_RENEW_SECONDS: u64 = 10;

/// A Lease by namespace and name, as `NAMESPACE/NAME`.
pub type LeaseRef = crate::NamespacedObject;

/// What the node's driver says of its volumes.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sharedresource.inlineguard.dev",
    version = "v1alpha1",
    kind = "SharedResourceNode",
    plural = "sharedresourcenodes",
    status = "NodeNotices",
    printcolumn = r#"{"name": "Every namespace", "type": "boolean", "jsonPath": ".spec.everyNamespace"}"#,
    printcolumn = r#"{"name": "Every object", "type": "boolean", "jsonPath": ".spec.everyObject"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SharedResourceNodeSpec {
    /// The namespaces of the pods whose volumes on this node the access check guards (shares,
    /// projections, providers), sorted; written by this node's driver alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NAMESPACES), inner(length(min = 1, max = 63)))]
    pub namespaces: Vec<String>,
    /// Set when the node has volumes in more namespaces than `namespaces` may list: it is told
    /// of every grant change.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub every_namespace: bool,
    /// The shares and projections this node's volumes read ([`NoticedObject`] entries), sorted;
    /// written by this node's driver alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_OBJECTS), inner(length(min = 1, max = MAX_OBJECT_LENGTH)))]
    pub objects: Vec<String>,
    /// Set when the node's volumes read more objects than `objects` may list: it is told of
    /// every change of any share or projection.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub every_object: bool,
    /// The access questions this node's live volumes ask (`NAMESPACE/ACCOUNT/RESOURCE/NAME`,
    /// [`crate::access::AccessQuestion::key`]), sorted, at most [`MAX_QUESTIONS`]: the
    /// controller answers each, and again after every grant change that may concern it, so the
    /// node need not ask. Written by this node's driver alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_QUESTIONS), inner(length(min = 1, max = MAX_QUESTION_LENGTH)))]
    pub questions: Vec<String>,
    /// When (Unix milliseconds) this node's driver was last registered with kubelet and listed in
    /// the node's CSINode, set with the startup taint's opt-in: the access-notices controller then
    /// tells the node's Pending pods with a volume of the driver (placed before it was) that
    /// their mounts succeed at kubelet's next retry, so no node's driver needs to list pods.
    /// Written by this node's driver alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_registered: Option<i64>,
}

/// What the access-notices controller tells the node: values that change whenever a grant may
/// have changed, or a share or projection did. The node compares them with what it saw last; a
/// value that moved (or appeared) asks it to check again the access of its volumes of that
/// namespace (or of every volume), or to read that object again (or every object).
///
/// Its lists are atomic: the controller alone writes them, always whole (a merge patch of the
/// status), so nothing is gained by tracking each entry's owner, and a keyed list would make the
/// apiserver keep, in every object and in every event of its watch cache, a managed-fields entry
/// per namespace, object and answer: most of the object and most of what each node cost it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeNotices {
    /// One entry per namespace the spec lists (the controller drops the others).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NAMESPACES))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub namespaces: Vec<NamespaceGrantChanges>,
    /// When (Unix milliseconds, raised by at least one each time) the controller last noticed a
    /// change that may concern every namespace: a ClusterRole or ClusterRoleBinding that can
    /// grant `use`, or a relist of its watches (it may have missed one).
    #[serde(default)]
    pub every_namespace: i64,
    /// Set with a raised `everyNamespace` when every question the spec lists was answered after
    /// the change was noticed (in `answers`): the node takes those answers and asks nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub every_namespace_answered: bool,
    /// The controller's answer to each question the spec lists, asked after the last grant
    /// change that may concern it was noticed (and again twice while the apiserver's RBAC cache
    /// may lag); a question it could not ask yet has none. On the wire `accessAnswers`, a map of
    /// each question's entry to whether it is allowed ([`wire_maps`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "accessAnswers", with = "wire_maps")]
    #[schemars(with = "std::collections::BTreeMap<String, bool>")]
    #[schemars(extend("maxProperties" = MAX_QUESTIONS, "x-kubernetes-map-type" = "atomic"))]
    pub answers: Vec<CentralAnswer>,
    /// One entry per object the spec lists (the controller drops the others). On the wire
    /// `objectsNoticed`, a map of each object's entry to when its change was last noticed.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "objectsNoticed", with = "wire_maps")]
    #[schemars(with = "std::collections::BTreeMap<String, i64>")]
    #[schemars(extend("maxProperties" = MAX_OBJECTS, "x-kubernetes-map-type" = "atomic"))]
    pub objects: Vec<ObjectChanges>,
    /// When (Unix milliseconds, raised by at least one each time) the controller last noticed a
    /// change that may concern every share and projection: a relist of their watches (it may have
    /// missed one, as at every start of the controller).
    #[serde(default)]
    pub every_object: i64,
    /// The spec's `driverRegistered` whose waiting pods the controller has told (or could not
    /// list): a value it has not told yet asks it to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration_told: Option<i64>,
}

/// The controller's answer to one access question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CentralAnswer {
    /// The question, as a [`crate::access::AccessQuestion::key`] entry.
    #[schemars(length(min = 1, max = MAX_QUESTION_LENGTH))]
    pub question: String,
    /// Whether the apiserver said the service account may `use` what it names.
    pub allowed: bool,
}

/// When the controller last noticed a share or projection change (or first told the node of it:
/// an object new to the node is read again once, for a change made before the controller knew
/// the node read it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ObjectChanges {
    /// The object, as a [`NoticedObject`] entry.
    #[schemars(length(min = 1, max = MAX_OBJECT_LENGTH))]
    pub object: String,
    /// Unix milliseconds, raised by at least one each time: only its change matters.
    pub noticed: i64,
}

/// When the controller last noticed a grant change in one namespace (or first told the node of
/// it: a namespace new to the node is looked at once, for a change made before the controller
/// knew the node served it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NamespaceGrantChanges {
    /// The namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Unix milliseconds, raised by at least one each time: only its change matters.
    pub noticed: i64,
    /// Set with a raised `noticed` when every question of this namespace the spec lists was
    /// answered after the change was noticed (in `answers`): the node takes those answers and
    /// asks nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answered: bool,
}

/// The status's per-volume lists as maps on the wire (`entry: value`), smaller in etcd and in every
/// watch event than a list of two-field objects. New names (`accessAnswers`, `objectsNoticed`; the
/// lists were `answers` and `objects`), so that a driver and a controller of different releases
/// never read each other's shape: an entry missing is read as not told, and the node looks at it
/// itself. Read back in key order, as the controller writes them.
mod wire_maps {
    use std::collections::BTreeMap;

    use serde::de::DeserializeOwned;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{CentralAnswer, ObjectChanges};

    /// One list item, as a key and a value of the map.
    pub trait Entry: Sized {
        type Value: Serialize + DeserializeOwned;
        fn key(&self) -> &str;
        fn value(&self) -> Self::Value;
        fn from_pair(key: String, value: Self::Value) -> Self;
    }

    impl Entry for CentralAnswer {
        type Value = bool;
        fn key(&self) -> &str {
            &self.question
        }
        fn value(&self) -> bool {
            self.allowed
        }
        fn from_pair(question: String, allowed: bool) -> Self {
            CentralAnswer { question, allowed }
        }
    }

    impl Entry for ObjectChanges {
        type Value = i64;
        fn key(&self) -> &str {
            &self.object
        }
        fn value(&self) -> i64 {
            self.noticed
        }
        fn from_pair(object: String, noticed: i64) -> Self {
            ObjectChanges { object, noticed }
        }
    }

    pub fn serialize<S: Serializer, E: Entry>(entries: &[E], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(entries.iter().map(|entry| (entry.key(), entry.value())))
    }

    pub fn deserialize<'de, D: Deserializer<'de>, E: Entry>(deserializer: D) -> Result<Vec<E>, D::Error> {
        let map = BTreeMap::<String, E::Value>::deserialize(deserializer)?;
        Ok(map.into_iter().map(|(key, value)| E::from_pair(key, value)).collect())
    }
}

impl NodeNotices {
    /// When a change in `namespace` was last noticed, if the node was told of it.
    pub fn of(&self, namespace: &str) -> Option<i64> {
        self.namespaces.iter().find(|entry| entry.namespace == namespace).map(|entry| entry.noticed)
    }

    /// The controller's answer to `question` (an entry), if it gave one.
    pub fn answer(&self, question: &str) -> Option<bool> {
        self.answers.iter().find(|entry| entry.question == question).map(|entry| entry.allowed)
    }

    /// When a change of `object` (an entry) was last noticed, if the node was told of it.
    pub fn of_object(&self, object: &str) -> Option<i64> {
        self.objects.iter().find(|entry| entry.object == object).map(|entry| entry.noticed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt as _;

    #[test]
    fn a_node_s_object_is_cluster_scoped_and_its_lists_are_bounded() {
        let crd = SharedResourceNode::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(spec["namespaces"]["maxItems"], MAX_NAMESPACES);
        assert_eq!(spec["namespaces"]["items"]["maxLength"], 63);
        let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
        assert_eq!(status["namespaces"]["maxItems"], MAX_NAMESPACES);
        assert_eq!(status["namespaces"]["x-kubernetes-list-type"], "atomic");
        assert_eq!(spec["objects"]["maxItems"], MAX_OBJECTS);
        assert_eq!(spec["objects"]["items"]["maxLength"], MAX_OBJECT_LENGTH);
        assert_eq!(status["objectsNoticed"]["maxProperties"], MAX_OBJECTS);
        assert_eq!(status["objectsNoticed"]["x-kubernetes-map-type"], "atomic");
        assert_eq!(status["objectsNoticed"]["additionalProperties"]["type"], "integer");
        assert_eq!(spec["questions"]["maxItems"], MAX_QUESTIONS);
        assert_eq!(spec["questions"]["items"]["maxLength"], MAX_QUESTION_LENGTH);
        assert_eq!(status["accessAnswers"]["maxProperties"], MAX_QUESTIONS);
        assert_eq!(status["accessAnswers"]["x-kubernetes-map-type"], "atomic");
        assert_eq!(status["accessAnswers"]["additionalProperties"]["type"], "boolean");
        // The lists of the release before are not in the schema: the apiserver prunes them.
        assert!(status.get("answers").is_none() && status.get("objects").is_none());
        assert!(
            crd.spec.versions[0].subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            "status is a subresource"
        );
    }

    #[test]
    fn answers_and_object_notices_are_maps_on_the_wire_and_read_back_in_entry_order() {
        let status = NodeNotices {
            answers: vec![
                CentralAnswer { question: "team-a/web/sharedsecrets/a".into(), allowed: true },
                CentralAnswer { question: "team-a/web/sharedsecrets/b".into(), allowed: false },
            ],
            objects: vec![
                ObjectChanges { object: "SharedConfigMap/z".into(), noticed: 7 },
                ObjectChanges { object: "SharedSecret/a".into(), noticed: 9 },
            ],
            ..NodeNotices::default()
        };
        let wire = serde_json::to_value(&status).unwrap();
        assert_eq!(
            wire["accessAnswers"],
            serde_json::json!({"team-a/web/sharedsecrets/a": true, "team-a/web/sharedsecrets/b": false})
        );
        assert_eq!(wire["objectsNoticed"], serde_json::json!({"SharedConfigMap/z": 7, "SharedSecret/a": 9}));
        assert!(wire.get("answers").is_none() && wire.get("objects").is_none());
        assert_eq!(serde_json::from_value::<NodeNotices>(wire).unwrap(), status);
        // A status of the release before (lists) reads as one that tells nothing yet.
        let before = serde_json::json!({"answers": [{"question": "team-a/web/sharedsecrets/a", "allowed": true}],
            "objects": [{"object": "SharedSecret/a", "noticed": 9}], "everyNamespace": 3});
        let read: NodeNotices = serde_json::from_value(before).unwrap();
        assert!(read.answers.is_empty() && read.objects.is_empty());
        assert_eq!(read.every_namespace, 3);
    }

    #[test]
    fn a_lease_is_named_namespace_slash_name() {
        let lease = LeaseRef::parse(DEFAULT_LEASE).unwrap();
        assert_eq!(
            (lease.namespace.as_str(), lease.name.as_str()),
            ("inline-guard-driver", "sharedresource-access-notices")
        );
        assert_eq!(lease.to_string(), DEFAULT_LEASE);
        for bad in ["no-slash", "/name", "ns/", "Ns/name", "ns/na me"] {
            assert!(LeaseRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_namespace_s_notice_is_found_by_its_name() {
        let changes = NodeNotices {
            namespaces: vec![NamespaceGrantChanges { namespace: "team-a".into(), noticed: 3, answered: false }],
            every_namespace: 1,
            objects: vec![ObjectChanges { object: "SharedSecret/db".into(), noticed: 4 }],
            every_object: 1,
            answers: vec![CentralAnswer { question: "team-a/web/sharedsecrets/db".into(), allowed: true }],
            ..NodeNotices::default()
        };
        assert_eq!(changes.answer("team-a/web/sharedsecrets/db"), Some(true));
        assert_eq!(changes.answer("team-a/other/sharedsecrets/db"), None);
        assert_eq!(changes.of("team-a"), Some(3));
        assert_eq!(changes.of("team-b"), None);
        assert_eq!(changes.of_object("SharedSecret/db"), Some(4));
        assert_eq!(changes.of_object("SharedConfigMap/db"), None);
    }

    #[test]
    fn an_object_entry_names_a_share_or_a_projection_and_reads_back() {
        let objects = [
            NoticedObject::Share(crate::ShareKind::Secret, "db".into()),
            NoticedObject::Share(crate::ShareKind::ConfigMap, "ca.example.com".into()),
            NoticedObject::Projection("team-a".into(), "app".into()),
        ];
        for object in objects {
            assert_eq!(NoticedObject::parse(&object.key()), Some(object.clone()), "{}", object.key());
        }
        assert_eq!(NoticedObject::Projection("team-a".into(), "app".into()).key(), "SharedProjection/team-a/app");
        for bad in [
            "",
            "db",
            "SharedSecret/",
            "SharedSecret/a/b",
            "Secret/db",
            "SharedProjection/team-a",
            "SharedProjection/a/b/c",
            "SharedProjection//b",
        ] {
            assert_eq!(NoticedObject::parse(bad), None, "{bad}");
        }
        let longest = NoticedObject::Projection("n".repeat(63), "p".repeat(253)).key();
        assert_eq!(longest.len(), MAX_OBJECT_LENGTH);
    }
}
