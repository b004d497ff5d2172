//! The shipped RBAC grants the webhook's ServiceAccount what it needs and nothing more, as the
//! apiserver's authorizer sees it: it reads Namespaces and CSIDrivers, gets shares by name and
//! asks SubjectAccessReviews, and reads no pod or Secret, lists no share, and changes nothing. (That it is *enough* is proven by every admission scenario: the servers
//! run as this ServiceAccount. The audit role is exercised by the `audit` scenario.)

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{Outcome, SERVICE_ACCOUNT, Suite, allowed};

pub async fn webhook_gets_exactly_what_it_needs(suite: &Suite) -> Outcome {
    let webhook = suite.cluster.client_as(SERVICE_ACCOUNT, &[]).await?;
    let list = ListParams::default().limit(1);
    let relabel = json!({"metadata": {"labels": {"e2e.inlineguard.dev/touched": "yes"}}});
    let shared_secrets = ApiResource {
        group: "sharedresource.inlineguard.dev".into(),
        version: "v1alpha1".into(),
        api_version: "sharedresource.inlineguard.dev/v1alpha1".into(),
        kind: "SharedSecret".into(),
        plural: "sharedsecrets".into(),
    };
    let shares = Api::<DynamicObject>::all_with(webhook.clone(), &shared_secrets);
    let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {"user": "system:serviceaccount:default:default",
        "resourceAttributes": {"group": "sharedresource.inlineguard.dev", "resource": "sharedsecrets", "verb": "use", "name": "db", "namespace": "default"}}}))
    .map_err(|e| e.to_string())?;
    let checks = [
        ("webhook lists namespaces", true, allowed(Api::<Namespace>::all(webhook.clone()).list_metadata(&list).await)?),
        ("webhook lists csidrivers", true, allowed(Api::<CSIDriver>::all(webhook.clone()).list_metadata(&list).await)?),
        (
            "webhook gets a namespace",
            true,
            allowed(Api::<Namespace>::all(webhook.clone()).get_metadata("default").await)?,
        ),
        ("webhook gets a share", true, allowed(shares.get_metadata_opt("absent").await)?),
        ("webhook lists shares", false, allowed(shares.list_metadata(&list).await)?),
        (
            "webhook asks a SubjectAccessReview",
            true,
            allowed(Api::<SubjectAccessReview>::all(webhook.clone()).create(&PostParams::default(), &review).await)?,
        ),
        ("webhook lists pods", false, allowed(Api::<Pod>::all(webhook.clone()).list(&list).await)?),
        ("webhook lists secrets", false, allowed(Api::<Secret>::all(webhook.clone()).list(&list).await)?),
        (
            "webhook relabels a namespace",
            false,
            allowed(
                Api::<Namespace>::all(webhook.clone())
                    .patch("default", &PatchParams::default(), &Patch::Merge(&relabel))
                    .await,
            )?,
        ),
    ];
    let wrong: Vec<String> = checks
        .iter()
        .filter(|(_, expected, seen)| expected != seen)
        .map(|(what, expected, _)| format!("{what}: expected {}", if *expected { "allowed" } else { "forbidden" }))
        .collect();
    if wrong.is_empty() { Ok(()) } else { Err(wrong.join("\n")) }
}
