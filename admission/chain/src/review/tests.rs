//! Round trips of AdmissionReview bodies through the standard chain, and every malformed-body answer.

use std::sync::Arc;

use base64::Engine as _;
use futures_executor::block_on;
use inline_guard_policy::settings::SHARED_RESOURCE_DRIVER;
use inline_guard_policy::{Labels, PolicySettings};
use serde_json::{Value, json};

use super::*;
use crate::plugins::standard_chain;
use crate::static_facts::StaticClusterFacts;

fn chain() -> Chain {
    let mut facts = StaticClusterFacts::new();
    let labels =
        |pairs: &[(&str, &str)]| -> Labels { pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() };
    facts.insert_namespace("locked", labels(&[("pod-security.kubernetes.io/enforce", "restricted")]));
    facts.insert_namespace("open", Labels::new());
    facts.insert_csi_driver(
        "csi.example.com",
        labels(&[("security.openshift.io/csi-ephemeral-volume-profile", "privileged")]),
    );
    standard_chain(Arc::new(PolicySettings::default()), Arc::new(facts), Arc::new(crate::NothingChecked))
}

fn review(namespace: &str, operation: &str, sub_resource: Option<&str>, pod: Value) -> Vec<u8> {
    let mut request = json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": pod,
    });
    if let Some(sub) = sub_resource {
        request["subResource"] = json!(sub);
    }
    serde_json::to_vec(&json!({"apiVersion": API_VERSION, "kind": KIND, "request": request})).unwrap()
}

fn pod(driver: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "containers": [{"name": "app", "image": "nginx", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
            "volumes": [{"name": "v", "csi": {"driver": driver}}]
        }
    })
}

fn answer_json(phase: Phase, body: &[u8]) -> Value {
    let response = block_on(answer(&chain(), phase, body)).unwrap();
    serde_json::from_str(&response.to_json()).unwrap()
}

#[test]
fn a_denied_pod_gets_a_403_with_the_exact_message_and_its_uid() {
    let body = review("locked", "CREATE", None, pod("csi.example.com"));
    let message = "web uses an inline volume provided by CSIDriver csi.example.com and namespace locked has a pod security enforce level that is lower than privileged";
    assert_eq!(
        answer_json(Phase::Validating, &body),
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "allowed": false,
                "status": {"status": "Failure", "message": message, "reason": "Forbidden", "code": 403},
                "auditAnnotations": {"enforce-violations": message}
            }
        })
    );
}

#[test]
fn the_mutating_phase_answers_with_a_base64_json_patch() {
    let body = review("open", "CREATE", None, pod(SHARED_RESOURCE_DRIVER));
    let answer = answer_json(Phase::Mutating, &body);
    assert_eq!(answer["response"]["allowed"], json!(true));
    assert_eq!(answer["response"]["patchType"], json!("JSONPatch"));
    let patch =
        base64::engine::general_purpose::STANDARD.decode(answer["response"]["patch"].as_str().unwrap()).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&patch).unwrap(),
        json!([
            {"op": "add", "path": "/spec/volumes/0/csi/readOnly", "value": true},
            {"op": "add", "path": "/spec/containers/0/volumeMounts/0/readOnly", "value": true}
        ])
    );
}

#[test]
fn nothing_to_change_means_no_patch_fields_at_all() {
    let body = review("open", "CREATE", None, pod("csi.example.com"));
    assert_eq!(
        answer_json(Phase::Both, &body),
        json!({"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": true}})
    );
}

#[test]
fn pod_subresources_are_not_evaluated() {
    let body = review("locked", "UPDATE", Some("status"), pod("csi.example.com"));
    assert_eq!(answer_json(Phase::Validating, &body)["response"]["allowed"], json!(true));
}

#[test]
fn an_object_that_does_not_decode_is_denied_saying_what_failed() {
    let mut bad = pod("csi.example.com");
    bad["spec"]["volumes"][0]["csi"]["readOnly"] = json!("yes");
    let answer = answer_json(Phase::Validating, &review("open", "CREATE", None, bad));
    assert_eq!(answer["response"]["allowed"], json!(false));
    assert_eq!(answer["response"]["status"]["code"], json!(400));
    assert_eq!(answer["response"]["status"]["reason"], json!("BadRequest"));
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("object does not decode as Pod: spec.volumes[0].csi.readOnly: invalid type: string \"yes\", expected a boolean"),
        "{message}"
    );
}

#[test]
fn malformed_bodies_are_errors_that_say_why() {
    let run = |body: &[u8]| block_on(answer(&chain(), Phase::Both, body)).unwrap_err().to_string();
    assert!(run(b"{not json").starts_with("malformed AdmissionReview: key must be a string"));
    assert_eq!(
        run(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#),
        "AdmissionReview has no request"
    );
    assert_eq!(
        run(br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#),
        r#"unsupported "admission.k8s.io/v1beta1" "AdmissionReview": expected "admission.k8s.io/v1" "AdmissionReview""#
    );
    let message = run(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}"#);
    assert!(message.starts_with("malformed AdmissionReview: missing field `kind`"), "{message}");
    let message = run(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"resource":{"version":"v1","resource":"pods"},"operation":"PATCH"}}"#);
    assert!(message.starts_with("malformed AdmissionReview: unknown variant `PATCH`"), "{message}");
}

#[test]
fn each_admission_error_maps_to_its_status() {
    let cases = [
        (AdmissionError::Forbidden("f".into()), "Forbidden", 403),
        (AdmissionError::Invalid("i".into()), "Invalid", 422),
        (AdmissionError::BadRequest("b".into()), "BadRequest", 400),
        (AdmissionError::Internal("x".into()), "InternalError", 500),
    ];
    for (error, reason, code) in cases {
        let status = Status::of(&error);
        assert_eq!((status.status, status.reason, status.code), ("Failure", reason, code));
        assert_eq!(status.message, error.to_string());
    }
}

#[test]
fn a_body_that_is_not_utf8_is_decided_by_serde_and_its_bytes_never_reach_an_answer() {
    let body = review("locked", "CREATE", None, pod("csi.example.com"));
    // In a string the chain reads (the namespace): refused, never read as some other namespace.
    let text = String::from_utf8(body.clone()).unwrap();
    let at = text.find("\"locked\"").unwrap() + 1;
    let mut bad_namespace = body.clone();
    bad_namespace[at] = 0xff;
    let error = parse_request(&bad_namespace).unwrap_err();
    assert!(
        matches!(&error, ReviewError::Malformed(message) if message.contains("invalid unicode code point")),
        "{error}"
    );
    // In a string nobody reads: whatever serde decides for the same bytes, and here still a denial.
    let mut bad_elsewhere = body.clone();
    let at = text.find("nginx").unwrap();
    bad_elsewhere[at] = 0xff;
    let serde = serde_json::from_slice::<ReviewEnvelope<'_, ObjectShape<'_>>>(&bad_elsewhere);
    let request = parse_request(&bad_elsewhere);
    assert_eq!(request.is_ok(), serde.is_ok(), "{:?}", request.err());
    if let Ok(request) = request {
        assert!(!block_on(standard_chain_outcome(request)).is_allowed());
    }
}

async fn standard_chain_outcome(request: ReviewRequest<'_>) -> Outcome {
    match request.attributes {
        Ok(mut attributes) => chain().run(Phase::Both, &mut attributes).await,
        Err(undecodable) => Outcome::rejected(AdmissionError::BadRequest(undecodable.error.to_string())),
    }
}

#[test]
fn a_body_of_another_review_version_is_refused_on_the_byte_path_too() {
    // Not UTF-8 in a string nobody reads, so serde's byte path decides: the envelope's type is
    // still checked there, apiVersion and kind each on its own.
    for (api_version, kind) in [("admission.k8s.io/v1beta1", KIND), (API_VERSION, "AdmissionReviewList")] {
        let mut body = review("open", "CREATE", None, pod("csi.example.com"));
        let text = String::from_utf8(body.clone()).unwrap();
        let at = text.find("nginx").unwrap();
        body[at] = 0xff;
        let text = String::from_utf8_lossy(&body)
            .replacen(&format!("\"apiVersion\":\"{API_VERSION}\""), &format!("\"apiVersion\":\"{api_version}\""), 1)
            .replacen(&format!("\"kind\":\"{KIND}\""), &format!("\"kind\":\"{kind}\""), 1);
        let mut wrong = text.into_bytes();
        // from_utf8_lossy wrote U+FFFD for the bad byte: put the bad byte back.
        let replacement = wrong.windows(3).position(|w| w == "\u{fffd}".as_bytes()).unwrap();
        wrong.splice(replacement..replacement + 3, [0xff]);
        let error = parse_request(&wrong).unwrap_err();
        assert!(
            matches!(&error, ReviewError::WrongType { api_version: v, kind: k } if v == api_version && k == kind),
            "{api_version} {kind}: {error}"
        );
    }
}

#[test]
fn a_request_names_its_kind_namespace_and_name_whether_or_not_its_object_decodes() {
    let mut named = pod("csi.example.com");
    named["metadata"]["name"] = json!("web-0");
    let mut body: Value = serde_json::from_slice(&review("open", "CREATE", None, named.clone())).unwrap();
    body["request"]["name"] = json!("web-0");
    let bytes = serde_json::to_vec(&body).unwrap();
    let request = parse_request(&bytes).unwrap();
    assert!(request.attributes.is_ok());
    assert_eq!((request.kind().kind.as_ref(), request.namespace(), request.name()), ("Pod", "open", "web-0"));
    named["spec"]["volumes"][0]["csi"]["readOnly"] = json!("yes");
    body["request"]["object"] = named;
    let bytes = serde_json::to_vec(&body).unwrap();
    let request = parse_request(&bytes).unwrap();
    assert!(request.attributes.is_err(), "the object does not decode");
    assert_eq!((request.kind().kind.as_ref(), request.namespace(), request.name()), ("Pod", "open", "web-0"));
}

#[cfg(feature = "test-util")]
#[test]
fn each_decoder_alone_reads_a_review_and_declines_what_is_not_one() {
    let body = String::from_utf8(review("open", "CREATE", None, pod("csi.example.com"))).unwrap();
    assert!(decoders::hand_written(&body) && decoders::serde_derive(&body) && decoders::scan_only(&body));
    let broken = &body[..body.len() - 1];
    assert!(!decoders::hand_written(broken) && !decoders::serde_derive(broken) && !decoders::scan_only(broken));
}
