use super::*;
use crate::shipped_files::{assert_shipped, shipped_config};

#[test]
fn the_shipped_webhooks_are_generated_from_the_shipped_configuration() {
    let drivers = shipped_config().settings.read_only_drivers;
    let shipped = assert_shipped(
        "config/deploy/webhooks.yaml",
        &webhook_configurations_yaml(&drivers).unwrap(),
        "UPDATE_WEBHOOKS",
    );
    assert_eq!(shipped, webhook_configurations(&drivers), "YAML and JSON forms agree");
}

#[test]
fn the_read_only_condition_names_each_listed_driver_as_a_quoted_literal() {
    let drivers = ReadOnlyDrivers(["a.example.com".to_string(), "b.example.com".to_string()].into());
    let condition = read_only_condition(&drivers);
    assert_eq!(condition.name, "has-writable-read-only-driver-volumes");
    assert_eq!(
        condition.expression,
        "has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.csi) && v.csi.driver in [\"a.example.com\", \"b.example.com\"]) && \
         (object.spec.volumes.size() * (\
         (has(object.spec.containers) ? object.spec.containers.map(c, has(c.volumeMounts) ? c.volumeMounts.size() : 0).sum() : 0) + \
         (has(object.spec.initContainers) ? object.spec.initContainers.map(c, has(c.volumeMounts) ? c.volumeMounts.size() : 0).sum() : 0) + \
         (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers.map(c, has(c.volumeMounts) ? c.volumeMounts.size() : 0).sum() : 0)\
         ) > 20000 || \
         object.spec.volumes.exists(v, has(v.csi) && v.csi.driver in [\"a.example.com\", \"b.example.com\"] && \
         ((has(request.subResource) && request.subResource == \"ephemeralcontainers\") || !(has(v.csi.readOnly) && v.csi.readOnly) || \
         (has(object.spec.containers) && object.spec.containers.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == v.name && !(has(m.readOnly) && m.readOnly)))) || \
         (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == v.name && !(has(m.readOnly) && m.readOnly)))) || \
         (has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == v.name && !(has(m.readOnly) && m.readOnly)))))))"
    );
}

#[test]
fn a_name_cannot_break_out_of_its_literal() {
    assert_eq!(cel_string(r#"x" || true || "y"#), r#""x\" || true || \"y""#);
    assert_eq!(cel_string("back\\slash\nline"), r#""back\\slash\u000aline""#);
}

#[test]
fn with_no_read_only_driver_the_mutating_configuration_holds_only_share_injection() {
    let [validating, mutating] = webhook_configurations(&ReadOnlyDrivers(Default::default()));
    assert_eq!(validating["webhooks"].as_array().unwrap().len(), 5);
    assert_eq!(mutating["kind"], "MutatingWebhookConfiguration");
    let names: Vec<&serde_json::Value> = mutating["webhooks"].as_array().unwrap().iter().map(|w| &w["name"]).collect();
    assert_eq!(names, [INJECTION_WEBHOOK]);
}

#[test]
fn share_injection_comes_first_is_reinvoked_and_sees_only_annotated_pod_creates() {
    let [_, mutating] = webhook_configurations(&ReadOnlyDrivers::default());
    let names: Vec<&serde_json::Value> = mutating["webhooks"].as_array().unwrap().iter().map(|w| &w["name"]).collect();
    assert_eq!(names, [INJECTION_WEBHOOK, READ_ONLY_WEBHOOK]);
    let injection = &mutating["webhooks"][0];
    assert_eq!(
        injection["rules"],
        serde_json::json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}])
    );
    assert_eq!(injection["reinvocationPolicy"], "IfNeeded", "a sidecar added after injection gets its mounts");
    assert_eq!(injection["failurePolicy"], "Fail", "a pod is never started without the shares it asked for");
    assert_eq!(
        injection["matchConditions"],
        serde_json::json!([{"name": "has-share-injection-annotation", "expression":
            "has(object.metadata) && has(object.metadata.annotations) && \"sharedresource.inlineguard.dev/inject\" in object.metadata.annotations"}])
    );
}

#[test]
fn every_projection_write_is_sent_and_a_silent_webhook_does_not_block_it() {
    let [validating, _] = webhook_configurations(&ReadOnlyDrivers::default());
    let projections = &validating["webhooks"][4];
    assert_eq!(projections["name"], PROJECTIONS_WEBHOOK);
    assert_eq!(
        projections["rules"],
        serde_json::json!([{"apiGroups": ["sharedresource.inlineguard.dev"], "apiVersions": ["v1alpha1"],
                            "operations": ["CREATE", "UPDATE"], "resources": ["sharedprojections"]}])
    );
    assert_eq!(projections["failurePolicy"], "Ignore", "the driver checks the spec again at every mount");
    assert!(projections.get("matchConditions").is_none(), "every projection is sent");
    assert_eq!(projections["clientConfig"]["service"]["path"], "/validate");
}

#[test]
fn workload_conditions_guard_every_level_of_the_template() {
    let [validating, _] = webhook_configurations(&ReadOnlyDrivers::default());
    let cronjobs = &validating["webhooks"][2];
    assert_eq!(cronjobs["name"], "cronjobs.csi-volume-admission.inlineguard.dev");
    assert_eq!(
        cronjobs["matchConditions"][0]["expression"],
        "(has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) && \
         has(object.spec.jobTemplate.spec.template) && has(object.spec.jobTemplate.spec.template.spec) && \
         has(object.spec.jobTemplate.spec.template.spec.volumes) && object.spec.jobTemplate.spec.template.spec.volumes.exists(v, has(v.csi))) || \
         (has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) && \
         has(object.spec.jobTemplate.spec.template) && has(object.spec.jobTemplate.spec.template.metadata) && \
         has(object.spec.jobTemplate.spec.template.metadata.annotations) && \
         \"sharedresource.inlineguard.dev/inject\" in object.spec.jobTemplate.spec.template.metadata.annotations)"
    );
}
