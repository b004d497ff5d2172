//! Turning one input document into a request for the chain: an AdmissionReview is taken as sent; a
//! plain object is a CREATE by an anonymous user.

use inline_guard_admission::review::{self, KIND as REVIEW_KIND};
use inline_guard_admission::{AdmissionObject, Attributes, GroupVersionKind, GroupVersionResource, ObjectDecodeError};
use serde_json::Value;

/// An input ready to evaluate.
#[derive(Debug)]
pub enum Prepared {
    /// Decoded; the chain will run on it.
    Ready {
        /// Request uid.
        uid: String,
        /// `Kind namespace/name`, for the table.
        label: String,
        /// The request (boxed: it dwarfs the other variant).
        attributes: Box<Attributes<'static>>,
    },
    /// An AdmissionReview whose object does not decode: answered as the server would, denied.
    Undecodable {
        /// Request uid.
        uid: String,
        /// `Kind namespace/name`, for the table.
        label: String,
        /// What failed.
        error: ObjectDecodeError,
    },
}

/// Namespace kubectl would use for an object that names none.
const DEFAULT_NAMESPACE: &str = "default";

/// Prepares the `ordinal`-th input document; `raw_json` is its own JSON text when it came as
/// JSON, decoded instead of `value` so that duplicate keys fail as they do in the webhook. `Err`
/// is a message for the user: the input is unusable.
pub fn prepare(value: Value, raw_json: Option<&str>, ordinal: usize) -> Result<Prepared, String> {
    if value.get("kind").and_then(Value::as_str) == Some(REVIEW_KIND) {
        return prepare_review(&value, raw_json);
    }
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let metadata = value.get("metadata");
    let metadata_text =
        |key: &str| metadata.and_then(|m| m.get(key)).and_then(Value::as_str).unwrap_or_default().to_string();
    let namespace =
        Some(metadata_text("namespace")).filter(|n| !n.is_empty()).unwrap_or_else(|| DEFAULT_NAMESPACE.into());
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let resource = GroupVersionResource {
        group: group.to_string().into(),
        version: version.to_string().into(),
        resource: resource_name(&kind).into(),
    };
    let kind =
        GroupVersionKind { group: group.to_string().into(), version: version.to_string().into(), kind: kind.into() };
    let object = match raw_json {
        Some(json) => AdmissionObject::from_json(&resource, json),
        None => AdmissionObject::from_value(&resource, &value),
    }
    .map_err(|error| error.to_string())?;
    Ok(anonymous_create(kind, resource, namespace, object, ordinal, false))
}

/// A CREATE of `object` by `system:anonymous`: how `check` and `audit` evaluate objects that come
/// without a request. Plain objects have no uid; one made from `ordinal` keeps output reproducible.
pub fn anonymous_create(
    kind: GroupVersionKind<'static>,
    resource: GroupVersionResource<'static>,
    namespace: String,
    object: AdmissionObject<'static>,
    ordinal: usize,
    dry_run: bool,
) -> Prepared {
    let name = object.names.name.clone().unwrap_or_default();
    let label = label(&kind.kind, &namespace, &name, object.names.generate_name.as_deref().unwrap_or_default());
    let attributes = Attributes { kind, name, dry_run, ..Attributes::anonymous_create(resource, namespace, object) };
    Prepared::Ready { uid: format!("00000000-0000-0000-0000-{ordinal:012}"), label, attributes: Box::new(attributes) }
}

fn prepare_review(value: &Value, raw_json: Option<&str>) -> Result<Prepared, String> {
    let body = match raw_json {
        Some(json) => json.as_bytes().to_vec(),
        None => serde_json::to_vec(value).map_err(|error| error.to_string())?,
    };
    let request = review::parse_request(&body).map_err(|error| error.to_string())?;
    let label = label(&request.kind().kind, request.namespace(), request.name(), "");
    let uid = request.uid;
    Ok(match request.attributes {
        Ok(attributes) => Prepared::Ready { uid, label, attributes: Box::new(attributes.into_owned()) },
        Err(undecodable) => Prepared::Undecodable { uid, label, error: undecodable.error },
    })
}

/// The REST resource of a kind. Exact for the kinds the chain evaluates; for any other kind a
/// lower-case plural that only serves display, since such objects pass untouched.
fn resource_name(kind: &str) -> String {
    match kind {
        "ReplicationController" => "replicationcontrollers".into(),
        "PodTemplate" => "podtemplates".into(),
        "ReplicaSet" => "replicasets".into(),
        "StatefulSet" => "statefulsets".into(),
        "DaemonSet" => "daemonsets".into(),
        "CronJob" => "cronjobs".into(),
        other => format!("{}s", other.to_ascii_lowercase()),
    }
}

fn label(kind: &str, namespace: &str, name: &str, generate_name: &str) -> String {
    let name =
        if name.is_empty() && !generate_name.is_empty() { format!("{generate_name}*") } else { name.to_string() };
    if namespace.is_empty() { format!("{kind} {name}") } else { format!("{kind} {namespace}/{name}") }
}

#[cfg(test)]
mod tests {
    use inline_guard_admission::Operation;
    use inline_guard_admission::object::PodSpecKind;

    use super::*;

    #[test]
    fn resources_of_evaluated_kinds_are_exact() {
        for (kind, resource) in [
            ("Pod", "pods"),
            ("PodTemplate", "podtemplates"),
            ("ReplicationController", "replicationcontrollers"),
            ("ReplicaSet", "replicasets"),
            ("Deployment", "deployments"),
            ("StatefulSet", "statefulsets"),
            ("DaemonSet", "daemonsets"),
            ("Job", "jobs"),
            ("CronJob", "cronjobs"),
        ] {
            assert_eq!(resource_name(kind), resource);
        }
    }

    #[test]
    fn a_plain_object_is_an_anonymous_create_in_the_default_namespace() {
        let value = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"}, "spec": {"selector": {}, "template": {}}});
        let Ok(Prepared::Ready { uid, label, attributes }) = prepare(value, None, 7) else { panic!("not ready") };
        assert_eq!(uid, "00000000-0000-0000-0000-000000000007");
        assert_eq!(label, "Deployment default/api");
        assert_eq!(attributes.operation, Operation::Create);
        assert_eq!(
            attributes.resource,
            GroupVersionResource { group: "apps".into(), version: "v1".into(), resource: "deployments".into() }
        );
        assert_eq!(attributes.user_info.username, "system:anonymous");
        assert!(attributes.object.is_some_and(|object| object.kind == Some(PodSpecKind::Deployment)));
    }

    #[test]
    fn a_plain_object_that_does_not_decode_is_unusable_input() {
        let value = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "none"}});
        let message = prepare(value, None, 1).unwrap_err();
        assert!(
            message.starts_with("object does not decode as Pod: spec.containers: invalid type: string \"none\""),
            "{message}"
        );
    }
}
