//! The plugin on pods, workloads and SharedProjections, with the messages users read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use futures_executor::block_on;
use serde_json::{Value, json};
use sharedresource_api::DRIVER_NAME;
use sharedresource_api::projection::ProjectionSpec;

use super::*;
use crate::attributes::GroupVersionResource;
use crate::facts::FactsError;
use crate::object::AdmissionObject;
use crate::review::parse_request;
use crate::share_facts::NothingChecked;

/// Shares, projections and grants as a table; `failing` makes every lookup fail. Counts lookups.
#[derive(Default)]
struct Table {
    shares: BTreeSet<(ShareKind, String)>,
    projections: BTreeMap<String, Arc<ProjectionSpec>>,
    /// `(namespace/service account, share name)` pairs RBAC allows.
    allowed: BTreeSet<(String, String)>,
    failing: bool,
    lookups: Mutex<usize>,
}

impl Table {
    fn looked_up(&self) -> Result<(), FactsError> {
        *self.lookups.lock().unwrap() += 1;
        if self.failing { Err(FactsError::Unavailable("no answer within 2s".into())) } else { Ok(()) }
    }
}

#[async_trait]
impl ShareFacts for Table {
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> std::result::Result<Known<bool>, FactsError> {
        self.looked_up()?;
        Ok(Known::Answer(self.shares.contains(&(kind, name.as_str().to_string()))))
    }

    async fn projection(
        &self,
        _namespace: &str,
        name: &ObjectName,
    ) -> std::result::Result<Known<Option<Arc<ProjectionSpec>>>, FactsError> {
        self.looked_up()?;
        Ok(Known::Answer(self.projections.get(name.as_str()).cloned()))
    }

    async fn may_use(&self, question: &AccessQuestion) -> std::result::Result<Known<bool>, FactsError> {
        self.looked_up()?;
        let who = format!("{}/{}", question.namespace, question.service_account);
        Ok(Known::Answer(self.allowed.contains(&(who, question.name.clone()))))
    }
}

/// A cluster with SharedSecret `db` that `team-a/web` may use, and SharedConfigMap `cfg` that
/// nobody may.
fn cluster() -> Table {
    let mut table = Table::default();
    table.shares.insert((ShareKind::Secret, "db".into()));
    table.shares.insert((ShareKind::ConfigMap, "cfg".into()));
    table.allowed.insert(("team-a/web".into(), "db".into()));
    table
}

fn request(operation: Operation, resource: GroupVersionResource<'static>, object: Value) -> Attributes<'static> {
    let object = AdmissionObject::from_value(&resource, &object).unwrap();
    Attributes { operation, ..Attributes::anonymous_create(resource, "team-a", object) }
}

fn pod(attributes: Value) -> Value {
    json!({"metadata": {"name": "web"}, "spec": {"serviceAccountName": "web", "containers": [], "volumes": [
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
    run_with(Arc::new(cluster()), attributes)
}

fn run_with(facts: Arc<dyn ShareFacts>, attributes: &Attributes<'_>) -> (Result<()>, Vec<String>) {
    let mut recorder = Recorder::default();
    let result = block_on(SharedResourceAdmission::new(facts).validate(attributes, &mut recorder));
    (result, recorder.into_parts().0)
}

fn pod_create(attributes: Value) -> Attributes<'static> {
    request(Operation::Create, GroupVersionResource::v1("", "pods"), pod(attributes))
}

const DENIED: &str = "service account team-a/web may not use SharedConfigMap \"cfg\": grant it the verb \"use\" on sharedconfigmaps.sharedresource.inlineguard.dev \"cfg\" (a Role and RoleBinding in namespace team-a)";

#[test]
fn a_pod_whose_account_may_not_use_the_share_is_forbidden_in_the_drivers_words() {
    assert_eq!(
        run(&pod_create(json!({"sharedConfigMap": "cfg"}))).0,
        Err(AdmissionError::Forbidden(format!(
            "web has volumes the shared-resource driver would refuse at mount: volume \"shared\": {DENIED}"
        )))
    );
    assert_eq!(run(&pod_create(json!({"sharedSecret": "db"}))), (Ok(()), vec![]), "granted");
}

#[test]
fn a_missing_share_or_projection_is_refused_naming_it() {
    let refused = |attributes: Value| match run(&pod_create(attributes)).0 {
        Err(AdmissionError::Invalid(message)) => message,
        other => panic!("{other:?}"),
    };
    assert!(refused(json!({"sharedSecret": "gone"})).ends_with("volume \"shared\": SharedSecret \"gone\" not found"));
    assert!(
        refused(json!({"projection": "gone"}))
            .ends_with("volume \"shared\": SharedProjection team-a/\"gone\" not found")
    );
}

#[test]
fn an_optional_share_may_be_missing_but_never_ungranted() {
    let mut granted = cluster();
    granted.allowed.insert(("team-a/web".into(), "gone".into()));
    let optional = pod_create(json!({"sharedSecret": "gone", "optional": "true"}));
    assert_eq!(run_with(Arc::new(granted), &optional), (Ok(()), vec![]));
    let (Err(AdmissionError::Forbidden(message)), _) = run(&optional) else {
        panic!("a missing optional share the pod may not use is admitted")
    };
    assert!(message.ends_with("may not use SharedSecret \"gone\": grant it the verb \"use\" on sharedsecrets.sharedresource.inlineguard.dev \"gone\" (a Role and RoleBinding in namespace team-a)"), "{message}");
    // In a projection: the optional source may be missing, a required one naming the same
    // share may not.
    let spec = |sources: Value| -> Arc<ProjectionSpec> {
        Arc::new(serde_json::from_value(json!({"sources": sources})).unwrap())
    };
    let mut table = cluster();
    table.allowed.insert(("team-a/web".into(), "gone".into()));
    table.projections.insert("optional".into(), spec(json!([{"sharedSecret": {"name": "gone", "optional": true}}])));
    table.projections.insert(
        "both".into(),
        spec(json!([{"sharedSecret": {"name": "gone", "optional": true}}, {"sharedSecret": {"name": "gone"}}])),
    );
    let facts: Arc<dyn ShareFacts> = Arc::new(table);
    assert_eq!(run_with(facts.clone(), &pod_create(json!({"projection": "optional"}))), (Ok(()), vec![]));
    let (Err(AdmissionError::Invalid(message)), _) = run_with(facts, &pod_create(json!({"projection": "both"}))) else {
        panic!("a required source of a missing share is admitted")
    };
    assert!(message.ends_with("SharedSecret \"gone\" not found"), "{message}");
}

#[test]
fn a_projection_needs_every_share_it_shows_and_access_to_each() {
    let spec = |sources: Value| -> Arc<ProjectionSpec> {
        Arc::new(serde_json::from_value(json!({"sources": sources})).unwrap())
    };
    let mut table = cluster();
    table
        .projections
        .insert("fine".into(), spec(json!([{"sharedSecret": {"name": "db"}}, {"podInfo": {"items": []}}])));
    table
        .projections
        .insert("mixed".into(), spec(json!([{"sharedSecret": {"name": "db"}}, {"sharedConfigMap": {"name": "cfg"}}])));
    table.projections.insert("dangling".into(), spec(json!([{"sharedSecret": {"name": "gone"}}])));
    let facts: Arc<dyn ShareFacts> = Arc::new(table);
    assert_eq!(run_with(facts.clone(), &pod_create(json!({"projection": "fine"}))), (Ok(()), vec![]));
    let (Err(AdmissionError::Forbidden(message)), _) =
        run_with(facts.clone(), &pod_create(json!({"projection": "mixed"})))
    else {
        panic!()
    };
    assert!(message.ends_with(DENIED), "{message}");
    let (Err(AdmissionError::Invalid(message)), _) = run_with(facts, &pod_create(json!({"projection": "dangling"})))
    else {
        panic!()
    };
    assert!(message.ends_with("SharedSecret \"gone\" not found"), "{message}");
}

#[test]
fn a_workload_before_its_rolebinding_is_warned_and_kept() {
    let create = request(
        Operation::Create,
        GroupVersionResource::v1("apps", "deployments"),
        deployment(json!({"sharedConfigMap": "cfg"})),
    );
    let (result, warnings) = run(&create);
    assert_eq!(result, Ok(()));
    assert_eq!(
        warnings,
        [format!("api has volumes the shared-resource driver would refuse at mount: volume \"shared\": {DENIED}")]
    );
}

#[test]
fn an_unchanged_workload_update_asks_nothing() {
    let deployments = GroupVersionResource::v1("apps", "deployments");
    let mut update = request(Operation::Update, deployments.clone(), deployment(json!({"sharedConfigMap": "cfg"})));
    update.old_object =
        Some(AdmissionObject::from_value(&deployments, &deployment(json!({"sharedConfigMap": "cfg"}))).unwrap());
    let table = Arc::new(cluster());
    assert_eq!(run_with(table.clone(), &update), (Ok(()), vec![]));
    assert_eq!(*table.lookups.lock().unwrap(), 0);
    update.old_object =
        Some(AdmissionObject::from_value(&deployments, &deployment(json!({"sharedSecret": "db"}))).unwrap());
    assert_eq!(run_with(table.clone(), &update).1.len(), 1, "a changed volume is judged again");
    assert_eq!(*table.lookups.lock().unwrap(), 2);
}

#[test]
fn when_lookups_fail_the_pod_is_admitted_with_a_warning_and_an_audit_annotation() {
    let table = Table { failing: true, ..cluster() };
    let mut recorder = Recorder::default();
    let attributes = pod_create(json!({"sharedSecret": "db"}));
    let result = block_on(SharedResourceAdmission::new(Arc::new(table)).validate(&attributes, &mut recorder));
    assert_eq!(result, Ok(()));
    let (warnings, annotations) = recorder.into_parts();
    assert_eq!(
        warnings,
        [
            "volume \"shared\": SharedSecret \"db\": cluster facts unavailable: no answer within 2s: not checked at creation; the driver checks it at mount",
            "volume \"shared\": access to SharedSecret \"db\": cluster facts unavailable: no answer within 2s: not checked at creation; the driver checks it at mount",
        ]
    );
    assert!(annotations[UNCHECKED_ANNOTATION].contains("access to SharedSecret \"db\""), "{annotations:?}");
}

#[test]
fn offline_access_is_reported_not_checked_and_the_default_account_is_named() {
    let mut anonymous = pod(json!({"sharedSecret": "db"}));
    anonymous["spec"].as_object_mut().unwrap().remove("serviceAccountName");
    let attributes = request(Operation::Create, GroupVersionResource::v1("", "pods"), anonymous);
    assert_eq!(
        run_with(Arc::new(NothingChecked), &attributes),
        (Ok(()), vec!["volume \"shared\": access of service account team-a/default to SharedSecret \"db\" is not checked offline".to_string()])
    );
}

const TYPO: &str = "volumeAttributes[\"refreshResouce\"] is not an attribute of this driver: a sharedSecret volume takes \"sharedSecret\", \"refreshResource\" and \"optional\" only";

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

/// A pod (or a Deployment's template) of service account `web` with one container and no
/// volumes, asking for `annotation` to be injected.
fn annotated_pod(annotation: &str) -> Value {
    json!({"metadata": {"name": "web", "annotations": {"sharedresource.inlineguard.dev/inject": annotation}},
           "spec": {"serviceAccountName": "web", "containers": [{"name": "app"}]}})
}

fn annotated(resource: &str, annotation: &str) -> Attributes<'static> {
    match resource {
        "deployments" => request(
            Operation::Create,
            GroupVersionResource::v1("apps", "deployments"),
            json!({"metadata": {"name": "api"}, "spec": {"selector": {}, "template": annotated_pod(annotation)}}),
        ),
        _ => request(Operation::Create, GroupVersionResource::v1("", "pods"), annotated_pod(annotation)),
    }
}

#[test]
fn an_annotated_pod_the_injection_webhook_missed_is_refused_saying_what_it_lacks() {
    let (result, _) = run(&annotated("pods", "sharedsecret/db:/etc/db"));
    assert_eq!(
        result,
        Err(AdmissionError::Invalid(
            "web asks for shares by annotation \"sharedresource.inlineguard.dev/inject\" but lacks volume \"inject-secret-db\", \
             mount of \"inject-secret-db\" at \"/etc/db\" in container \"app\". The share injection webhook did not inject them; \
             its MutatingWebhookConfiguration is missing or older than this server (regenerate it with `csi-volume-admission webhooks`)"
                .into()
        ))
    );
    let (result, _) = run(&annotated("pods", "sharedsecret/db"));
    assert_eq!(
        result,
        Err(AdmissionError::Invalid(
            "web: annotation \"sharedresource.inlineguard.dev/inject\": entry \"sharedsecret/db\": is not <kind>/<name>:<mountPath>"
                .into()
        ))
    );
}

#[test]
fn injected_shares_are_judged_like_written_ones_through_the_whole_chain() {
    let chain = crate::plugins::standard_chain(
        Arc::new(inline_guard_policy::PolicySettings::default()),
        Arc::new(crate::static_facts::StaticClusterFacts::new()),
        Arc::new(cluster()),
    );
    let mut granted = annotated("pods", "sharedsecret/db:/etc/db");
    let outcome = block_on(chain.run(crate::chain::Phase::Both, &mut granted));
    assert_eq!(outcome.result, Ok(()));
    let paths: Vec<&str> = outcome.patch.iter().map(|op| op.path.as_str()).collect();
    assert_eq!(paths, ["/spec/volumes", "/spec/containers/0/volumeMounts"], "injected, and nothing left to force");
    let mut stranger = annotated("pods", "sharedconfigmap/cfg:/etc/cfg");
    let outcome = block_on(chain.run(crate::chain::Phase::Both, &mut stranger));
    assert_eq!(
        outcome.result,
        Err(AdmissionError::Forbidden(format!(
            "web has volumes the shared-resource driver would refuse at mount: volume \"inject-configmap-cfg\": {DENIED}"
        )))
    );
    assert_eq!(outcome.patch, [], "a refused pod carries no patch");
}

#[test]
fn a_workloads_template_is_judged_as_its_pods_will_be_injected_and_warned() {
    let (result, warnings) = run(&annotated("deployments", "sharedsecret/missing:/etc/m"));
    assert_eq!(result, Ok(()));
    assert_eq!(
        warnings,
        [
            "api has volumes the shared-resource driver would refuse at mount: volume \"inject-secret-missing\": SharedSecret \"missing\" not found"
        ]
    );
    let (result, warnings) = run(&annotated("deployments", "secret/db:/etc/db"));
    assert_eq!(result, Ok(()));
    assert_eq!(
        warnings,
        [
            "api: annotation \"sharedresource.inlineguard.dev/inject\": entry \"secret/db:/etc/db\": kind \"secret\" is not one of \"sharedsecret\", \"sharedconfigmap\", \"projection\""
        ]
    );
    let (result, warnings) = run(&annotated("deployments", "sharedsecret/db:/etc/db"));
    assert_eq!((result, warnings), (Ok(()), vec![]), "a template whose injection would pass is silent");
}

#[test]
fn an_unchanged_workload_update_is_not_warned_again_and_a_changed_annotation_is_judged() {
    let deployments = GroupVersionResource::v1("apps", "deployments");
    let template = |annotation: &str| json!({"metadata": {"name": "api"}, "spec": {"selector": {}, "template": annotated_pod(annotation)}});
    let old = |annotation: &str| Some(AdmissionObject::from_value(&deployments, &template(annotation)).unwrap());
    let mut update = request(Operation::Update, deployments.clone(), template("secret/db:/etc/db"));
    update.old_object = old("secret/db:/etc/db");
    let table = Arc::new(cluster());
    assert_eq!(run_with(table.clone(), &update), (Ok(()), vec![]), "a scale is not warned about again");
    update.old_object = old("sharedsecret/db:/etc/db");
    assert_eq!(run_with(table.clone(), &update).1.len(), 1, "a changed annotation is judged again");
    update.object = Some(AdmissionObject::from_value(&deployments, &template("sharedsecret/missing:/m")).unwrap());
    let (result, warnings) = run_with(table.clone(), &update);
    assert_eq!(result, Ok(()));
    assert_eq!(
        warnings,
        [
            "api has volumes the shared-resource driver would refuse at mount: volume \"inject-secret-missing\": SharedSecret \"missing\" not found"
        ]
    );
}

fn with_sub_path_mount(mut object: Value, spec: &[&str]) -> Value {
    let mut at = &mut object;
    for key in spec {
        at = &mut at[*key];
    }
    at["containers"] = json!([{"name": "app", "volumeMounts": [
        {"name": "shared", "mountPath": "/etc/tls.crt", "subPath": "tls.crt"},
        {"name": "other", "mountPath": "/etc/other", "subPath": "x"}]}]);
    object
}

const SUB_PATH_WARNING: &str = "container \"app\" mounts volume \"shared\" of CSIDriver sharedresource.csi.inlineguard.dev \
    with subPath \"tls.crt\": it will never see an update or a revocation of the volume's content (kubelet binds what the \
    path was when the container started); mount the volume without subPath and read the file under its mountPath";

#[test]
fn a_sub_path_mount_of_the_drivers_volume_is_admitted_and_warned() {
    let pods = GroupVersionResource::v1("", "pods");
    let pod = with_sub_path_mount(pod(json!({"sharedSecret": "db"})), &["spec"]);
    let (result, warnings) = run(&request(Operation::Create, pods, pod));
    assert_eq!(result, Ok(()));
    assert_eq!(warnings, [SUB_PATH_WARNING]);
}

#[test]
fn a_workload_is_warned_of_a_sub_path_mount_even_when_its_volumes_did_not_change() {
    let deployments = GroupVersionResource::v1("apps", "deployments");
    let changed = with_sub_path_mount(deployment(json!({"sharedSecret": "db"})), &["spec", "template", "spec"]);
    let (result, warnings) = run(&request(Operation::Create, deployments.clone(), changed.clone()));
    assert_eq!((result, warnings), (Ok(()), vec![SUB_PATH_WARNING.to_string()]));

    let mut update = request(Operation::Update, deployments.clone(), changed);
    update.old_object =
        Some(AdmissionObject::from_value(&deployments, &deployment(json!({"sharedSecret": "db"}))).unwrap());
    let table = Arc::new(cluster());
    assert_eq!(run_with(table.clone(), &update), (Ok(()), vec![SUB_PATH_WARNING.to_string()]));
    assert_eq!(*table.lookups.lock().unwrap(), 0, "the volumes were judged when they were written");
}
