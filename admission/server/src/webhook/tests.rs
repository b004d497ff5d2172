//! The handler called in process: both endpoints, and every bad-input answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, StatusCode};
use inline_guard_admission::plugins::standard_chain;
use inline_guard_admission::{ClusterFacts, FactsError, StaticClusterFacts};
use inline_guard_policy::{Labels, PolicySettings};
use serde_json::{Value, json};

use super::*;

fn facts() -> StaticClusterFacts {
    let mut facts = StaticClusterFacts::new();
    facts.insert_namespace("locked", [("pod-security.kubernetes.io/enforce".into(), "restricted".into())].into());
    facts.insert_csi_driver(
        "csi.example.com",
        [("security.openshift.io/csi-ephemeral-volume-profile".into(), "privileged".into())].into(),
    );
    facts
}

fn webhook_with(facts: Arc<dyn ClusterFacts>) -> (Webhook, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let chain =
        standard_chain(Arc::new(PolicySettings::default()), facts, Arc::new(inline_guard_admission::NothingChecked));
    let limits = Limits { body_timeout: Duration::from_millis(200), body_budget: BodyBudget::new(8 << 20) };
    (Webhook::new(chain, metrics.clone(), limits, Arc::new(Drain::new())), metrics)
}

fn webhook() -> Webhook {
    webhook_with(Arc::new(facts())).0
}

fn review(namespace: &str, driver: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "b7e2c6d0-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": {"metadata": {"name": "web"}, "spec": {
                "containers": [{"name": "app", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                "volumes": [{"name": "v", "csi": {"driver": driver}}]}}
        }
    })
    .to_string()
}

fn post(path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(path).header("content-type", "application/json").body(Full::new(body.into())).unwrap()
}

async fn send<B>(webhook: &Webhook, request: Request<B>) -> (StatusCode, String, hyper::HeaderMap)
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let response = webhook.handle(request).await;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap(), headers)
}

#[tokio::test]
async fn validate_denies_with_the_review_answer() {
    let (status, body, headers) = send(&webhook(), post("/validate", review("locked", "csi.example.com"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["uid"], "b7e2c6d0-0000-4000-8000-000000000001");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 403);
}

#[tokio::test]
async fn mutate_answers_with_a_patch_and_does_not_validate() {
    let (status, body, _) =
        send(&webhook(), post("/mutate", review("locked", "sharedresource.csi.inlineguard.dev"))).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
}

#[tokio::test]
async fn content_type_parameters_are_accepted() {
    let request = Request::post("/validate")
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(Full::new(Bytes::from(review("open", "csi.example.com"))))
        .unwrap();
    assert_eq!(send(&webhook(), request).await.0, StatusCode::OK);
}

#[tokio::test]
async fn every_bad_request_gets_its_status_and_a_message() {
    let webhook = webhook();
    let (status, body, headers) =
        send(&webhook, Request::get("/validate").body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!((status, body.as_str()), (StatusCode::METHOD_NOT_ALLOWED, "method GET is not allowed: use POST\n"));
    assert_eq!(headers["allow"], "POST");

    let (status, body, _) = send(&webhook, post("/admit", "{}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, "no such path \"/admit\": the admission endpoints are POST /validate and POST /mutate\n");

    let text = Request::post("/validate").header("content-type", "text/yaml").body(Full::new(Bytes::new())).unwrap();
    let (status, body, _) = send(&webhook, text).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "content type \"text/yaml\" is not supported: send application/json\n")
    );
    let untyped = Request::post("/validate").body(Full::new(Bytes::new())).unwrap();
    assert_eq!(send(&webhook, untyped).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let (status, body, _) = send(&webhook, post("/validate", "{\"apiVersion\":")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("malformed AdmissionReview: EOF while parsing"), "{body}");

    let (status, body, _) =
        send(&webhook, post("/validate", r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#)).await;
    assert_eq!((status, body.as_str()), (StatusCode::BAD_REQUEST, "AdmissionReview has no request\n"));
}

#[tokio::test]
async fn an_object_that_does_not_decode_is_answered_200_not_allowed() {
    let body = review("open", "csi.example.com").replace("\"containers\":[", "\"containers\":7,\"x\":[");
    let (status, body, _) = send(&webhook(), post("/validate", body)).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("object does not decode as Pod: spec.containers: invalid type: integer `7`"),
        "{message}"
    );
}

#[tokio::test]
async fn an_oversize_body_is_413_whether_declared_or_streamed() {
    let webhook = webhook();
    let big = vec![b' '; MAX_BODY_BYTES + 1];
    let (status, body, _) = send(&webhook, post("/validate", big.clone())).await;
    assert_eq!((status, body.as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "request body is larger than 3145728 bytes\n"));

    // No Content-Length: the limit is enforced while reading.
    let chunks =
        big.chunks(64 * 1024).map(|c| Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(c)))).collect::<Vec<_>>();
    let streamed = Request::post("/validate")
        .header("content-type", "application/json")
        .body(StreamBody::new(futures_util::stream::iter(chunks)))
        .unwrap();
    assert_eq!(send(&webhook, streamed).await.0, StatusCode::PAYLOAD_TOO_LARGE);

    // The bound itself is allowed, declared or not: read, and answered for what it is (not a
    // review: 400).
    let (status, _, _) = send(&webhook, post("/validate", vec![b' '; MAX_BODY_BYTES])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let mut declared = post("/validate", vec![b' '; MAX_BODY_BYTES]);
    declared.headers_mut().insert("content-length", MAX_BODY_BYTES.into());
    let (status, _, _) = send(&webhook, declared).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_body_that_never_arrives_times_out_with_408() {
    let stalled = Request::post("/validate")
        .header("content-type", "application/json")
        .body(StreamBody::new(futures_util::stream::pending::<Result<Frame<Bytes>, Infallible>>()))
        .unwrap();
    let (status, body, _) = send(&webhook(), stalled).await;
    assert_eq!((status, body.as_str()), (StatusCode::REQUEST_TIMEOUT, "request body not received within 200ms\n"));
}

#[tokio::test]
async fn unavailable_facts_are_a_503_so_the_failure_policy_decides() {
    struct Unsynced;
    #[async_trait::async_trait]
    impl ClusterFacts for Unsynced {
        async fn namespace_labels(&self, _: &str) -> Result<Option<Arc<Labels>>, FactsError> {
            Err(FactsError::Unavailable("caches not synced after 5s".into()))
        }
        async fn csi_driver_labels(&self, _: &str) -> Result<Option<Arc<Labels>>, FactsError> {
            Ok(None)
        }
    }
    let (webhook, _) = webhook_with(Arc::new(Unsynced));
    let (status, body, _) = send(&webhook, post("/validate", review("locked", "csi.example.com"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "cannot decide now: cluster facts unavailable: caches not synced after 5s\n");
}

#[tokio::test]
async fn every_answer_is_counted_by_path_and_decision() {
    let (webhook, metrics) = webhook_with(Arc::new(facts()));
    send(&webhook, post("/validate", review("locked", "csi.example.com"))).await;
    send(&webhook, post("/validate", review("open", "csi.example.com"))).await;
    send(&webhook, post("/mutate", "nonsense")).await;
    let text = metrics.encode();
    for line in [
        "csi_volume_admission_requests_total{path=\"/validate\",decision=\"denied\"} 1",
        "csi_volume_admission_requests_total{path=\"/validate\",decision=\"allowed\"} 1",
        "csi_volume_admission_requests_total{path=\"/mutate\",decision=\"rejected\"} 1",
        "csi_volume_admission_request_duration_seconds_count{path=\"/validate\"} 2",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
