//! The apiserver questions against a stand-in apiserver (a service answering kube's client in
//! process, by path): what each answer and each failure becomes. The real apiserver's answers
//! are the end-to-end suite's (`tests/tests/e2e/admission/shared_admission.rs`).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use serde_json::{Value, json};
use sharedresource_api::access::Guarded;

use super::*;

/// Answers kube's requests as an apiserver holding SharedSecret `db`, SharedProjection
/// `apps/app` (and `apps/broken`, whose spec does not decode), and granting `use` of `db` to the
/// service account `apps/reader` only; anything else is 404, and a share named `down` is 500.
async fn apiserver(request: http::Request<kube::client::Body>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_string();
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let status_body = |code: u16, reason: &str| json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code});
    let (code, answer): (u16, Value) = match path.as_str() {
        "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets/db" => {
            (200, json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "db"}}))
        }
        "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets/down" => (500, status_body(500, "InternalError")),
        "/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/apps/sharedprojections/app" => (
            200,
            json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
                   "metadata": {"name": "app", "namespace": "apps"},
                   "spec": {"defaultMode": 288, "sources": [{"sharedSecret": {"name": "db"}}]}}),
        ),
        "/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/apps/sharedprojections/broken" => (
            200,
            json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
                   "metadata": {"name": "broken", "namespace": "apps"}, "spec": {"sources": "none"}}),
        ),
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
            let mut review: Value = serde_json::from_slice(&body).unwrap_or_default();
            let asked = &review["spec"]["resourceAttributes"];
            let allowed = review["spec"]["user"] == "system:serviceaccount:apps:reader"
                && asked["verb"] == "use"
                && asked["resource"] == "sharedsecrets"
                && asked["name"] == "db";
            review["status"] = json!({"allowed": allowed});
            (201, review)
        }
        _ => (404, status_body(404, "NotFound")),
    };
    let response = http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .unwrap();
    Ok(response)
}

fn questions() -> ApiserverQuestions {
    let client = kube::Client::new(tower::service_fn(apiserver), "default");
    ApiserverQuestions { client, timeout: Duration::from_secs(10) }
}

fn name(text: &str) -> ObjectName {
    ObjectName::parse(text).unwrap()
}

#[tokio::test]
async fn a_share_exists_when_the_apiserver_has_it_and_a_failure_is_no_answer() {
    let questions = questions();
    assert_eq!(questions.share_exists(ShareKind::Secret, &name("db")).await, Ok(true));
    assert_eq!(questions.share_exists(ShareKind::Secret, &name("gone")).await, Ok(false));
    assert_eq!(questions.share_exists(ShareKind::ConfigMap, &name("db")).await, Ok(false), "another kind's");
    assert!(questions.share_exists(ShareKind::Secret, &name("down")).await.is_err(), "a 500 is no answer");
}

#[tokio::test]
async fn a_projection_is_its_spec_absent_when_missing_and_an_error_when_it_does_not_decode() {
    let questions = questions();
    let spec = questions.projection("apps", &name("app")).await.unwrap().expect("the projection");
    assert_eq!(spec.default_mode, Some(288));
    assert_eq!(spec.sources.len(), 1);
    assert_eq!(questions.projection("apps", &name("gone")).await, Ok(None));
    assert_eq!(questions.projection("other", &name("app")).await, Ok(None), "another namespace's");
    let error = questions.projection("apps", &name("broken")).await.unwrap_err();
    assert!(error.starts_with("SharedProjection apps/broken does not decode: "), "{error}");
}

#[tokio::test]
async fn access_is_the_review_answer_for_the_pods_service_account() {
    let questions = questions();
    let ask = |account: &str, share: &str| AccessQuestion {
        namespace: "apps".into(),
        service_account: account.into(),
        kind: Guarded::Share(ShareKind::Secret),
        name: share.into(),
    };
    assert_eq!(questions.may_use(&ask("reader", "db")).await, Ok(true));
    assert_eq!(questions.may_use(&ask("writer", "db")).await, Ok(false));
    assert_eq!(questions.may_use(&ask("reader", "other")).await, Ok(false));
}
