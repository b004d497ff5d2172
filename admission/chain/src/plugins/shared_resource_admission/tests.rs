//! The plugin on pods, workloads and SharedProjections, with the messages users read.

use futures_executor::block_on;
use serde_json::{Value, json};
use sharedresource_api::DRIVER_NAME;

use super::*;
use crate::attributes::{GroupVersionResource, UserInfo};
use crate::object::AdmissionObject;
use crate::review::parse_request;

fn request(operation: Operation, resource: GroupVersionResource<'static>, object: Value) -> Attributes<'static> {
    Attributes {
        operation,
        kind: Default::default(),
        object: Some(AdmissionObject::from_value(&resource, &object).unwrap()),
        resource,
        subresource: "".into(),
        namespace: "team-a".into(),
        name: "".into(),
        old_object: None,
        user_info: UserInfo::anonymous(),
        dry_run: false,
    }
}

fn pod(attributes: Value) -> Value {
    json!({"metadata": {"name": "web"}, "spec": {"containers": [], "volumes": [
        {"name": "shared", "csi": {"driver": DRIVER_NAME, "readOnly": true, "volumeAttributes": attributes}},
        {"name": "other", "csi": {"driver": "csi.example.com", "volumeAttributes": {"whatever": "x"}}}]}})
}

fn deployment(attributes: Value) -> Value {
    json!({"metadata": {"name": "api"}, "spec": {"selector": {}, "template": {"spec": pod(attributes)["spec"].clone()}}})
}

fn projection(sources: Value) -> Value {
    json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
           "metadata": {"name": "app", "namespace": "team-a"}, "spec": {"sources": sources}})
}

fn projections() -> GroupVersionResource<'static> {
    GroupVersionResource {
        group: "sharedresource.inlineguard.dev".into(),
        version: "v1alpha1".into(),
        resource: "sharedprojections".into(),
    }
}

fn run(attributes: &Attributes<'_>) -> (Result<()>, Vec<String>) {
    let mut recorder = Recorder::default();
    let result = block_on(SharedResourceAdmission::new().validate(attributes, &mut recorder));
    (result, recorder.into_parts().0)
}

const TYPO: &str = "volumeAttributes[\"refreshResouce\"] is not an attribute of this driver: a sharedSecret volume takes \"sharedSecret\" and \"refreshResource\" only";

#[test]
fn a_pod_the_driver_would_refuse_is_refused_at_creation_in_the_drivers_words() {
    let typo = request(
        Operation::Create,
        GroupVersionResource::v1("", "pods"),
        pod(json!({"sharedSecret": "db", "refreshResouce": "false"})),
    );
    assert_eq!(
        run(&typo),
        (
            Err(AdmissionError::Invalid(format!(
                "web has volumes the shared-resource driver would refuse at mount: volume \"shared\": {TYPO}"
            ))),
            vec![]
        )
    );
    let good = request(Operation::Create, GroupVersionResource::v1("", "pods"), pod(json!({"sharedSecret": "db"})));
    assert_eq!(run(&good), (Ok(()), vec![]));
}

#[test]
fn a_workload_is_warned_not_refused_and_its_updates_too() {
    let deployments = GroupVersionResource::v1("apps", "deployments");
    for operation in [Operation::Create, Operation::Update] {
        let typo = request(
            operation,
            deployments.clone(),
            deployment(json!({"sharedSecret": "db", "refreshResouce": "false"})),
        );
        let (result, warnings) = run(&typo);
        assert_eq!(result, Ok(()), "{operation:?}");
        assert_eq!(
            warnings,
            [format!("api has volumes the shared-resource driver would refuse at mount: volume \"shared\": {TYPO}")]
        );
    }
}

#[test]
fn pod_updates_and_subresources_are_not_judged_again() {
    let bad = pod(json!({"sharedSecret": "Not_A_Name"}));
    let update = request(Operation::Update, GroupVersionResource::v1("", "pods"), bad.clone());
    assert_eq!(run(&update), (Ok(()), vec![]), "pod volumes are immutable after creation");
    let mut status = request(Operation::Create, GroupVersionResource::v1("", "pods"), bad);
    status.subresource = "status".into();
    assert_eq!(run(&status), (Ok(()), vec![]));
}

#[test]
fn a_projection_the_driver_would_refuse_is_refused_on_create_and_update_with_its_message() {
    let colliding = projection(json!([
        {"sharedSecret": {"name": "db", "items": [{"key": "password", "path": "conf"}]}},
        {"sharedConfigMap": {"name": "cfg", "items": [{"key": "level", "path": "conf/level"}]}}]));
    for operation in [Operation::Create, Operation::Update] {
        assert_eq!(
            run(&request(operation, projections(), colliding.clone())).0,
            Err(AdmissionError::Invalid(
                "sources[0] (sharedSecret \"db\") and sources[1] (sharedConfigMap \"cfg\") collide at path \"conf/level\": \"conf\" is a file".into()
            ))
        );
    }
    let fine = projection(
        json!([{"sharedSecret": {"name": "db"}}, {"podInfo": {"items": [{"path": "pod/name", "fieldPath": "metadata.name"}]}}]),
    );
    assert_eq!(run(&request(Operation::Create, projections(), fine)), (Ok(()), vec![]));
    let field = projection(json!([{"podInfo": {"items": [{"path": "ip", "fieldPath": "status.podIP"}]}}]));
    let (Err(AdmissionError::Invalid(message)), _) = run(&request(Operation::Create, projections(), field)) else {
        panic!("accepted")
    };
    assert!(message.starts_with("sources[0] (podInfo): fieldPath \"status.podIP\" is not supported"), "{message}");
}

#[test]
fn a_projection_review_carries_the_spec_through_the_webhook_decoder() {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "sharedresource.inlineguard.dev", "version": "v1alpha1", "kind": "SharedProjection"},
        "resource": {"group": "sharedresource.inlineguard.dev", "version": "v1alpha1", "resource": "sharedprojections"},
        "namespace": "team-a", "name": "app", "operation": "CREATE", "userInfo": {"username": "alice"},
        "object": projection(json!([{"sharedSecret": {"name": "a", "items": [{"key": "k", "path": "x"}]}},
                                    {"sharedSecret": {"name": "b", "items": [{"key": "k", "path": "x"}]}}]))}});
    let body = serde_json::to_vec(&review).unwrap();
    let parsed = parse_request(&body).unwrap();
    let attributes = parsed.attributes.unwrap();
    assert_eq!(attributes.object.as_ref().and_then(|o| o.projection.as_ref()).map(|p| p.sources.len()), Some(2));
    assert_eq!(
        run(&attributes).0,
        Err(AdmissionError::Invalid(
            "sources[0] (sharedSecret \"a\") and sources[1] (sharedSecret \"b\") collide at path \"x\": both name it"
                .into()
        ))
    );
}
