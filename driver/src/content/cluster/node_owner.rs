//! Who owns this node's `SharedResourceNode`: the Node itself, so that the cluster's garbage
//! collector removes the object when the Node is deleted (a node pool scaled down leaves no
//! objects behind, and the access-notices controller stops telling it). The Node's uid is
//! learned without any read of Nodes: a DaemonSet pod's ServiceAccount token is bound to its
//! Node, and the apiserver says so in the token's user (`authentication.kubernetes.io/node-name`
//! and `node-uid`), which a SelfSubjectReview (allowed to every authenticated user) returns. A
//! token bound to no Node, or to another, leaves the object without an owner.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use tracing::info;

use crate::quote::Logged;

/// The user extra naming the Node a token is bound to.
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The user extra holding that Node's uid.
const NODE_UID_EXTRA: &str = "authentication.kubernetes.io/node-uid";

/// The uid of Node `node`, when `review` (this client's own user) is bound to it.
pub fn bound_node_uid(review: &SelfSubjectReview, node: &str) -> Option<String> {
    let extra = review.status.as_ref()?.user_info.as_ref()?.extra.as_ref()?;
    let single = |key: &str| extra.get(key).and_then(|values| values.first()).filter(|_| extra[key].len() == 1);
    (single(NODE_NAME_EXTRA)? == node).then(|| single(NODE_UID_EXTRA).cloned()).flatten()
}

/// The uid of Node `node`, when `client`'s token is bound to it; `None` otherwise (logged).
pub async fn own_node_uid(client: &kube::Client, node: &str, timeout: Duration) -> Option<String> {
    let reviews = Api::<SelfSubjectReview>::all(client.clone());
    let what = || "asking the apiserver who this driver is (SelfSubjectReview)".to_string();
    let (params, review) = (PostParams::default(), SelfSubjectReview::default());
    match crate::apiserver::request::ask(timeout, what, reviews.create(&params, &review)).await {
        Ok(review) => {
            let uid = bound_node_uid(&review, node);
            if uid.is_none() {
                info!("this driver's token is not bound to its Node: its SharedResourceNode has no owner");
            }
            uid
        }
        Err(error) => {
            info!(error = %Logged(&error), "its SharedResourceNode has no owner");
            None
        }
    }
}

/// The owner references of node `node`'s object, for Node uid `uid`.
pub fn owned_by_node(node: &str, uid: &str) -> serde_json::Value {
    serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::{SelfSubjectReviewStatus, UserInfo};

    fn review(extra: &[(&str, &[&str])]) -> SelfSubjectReview {
        let extra = extra.iter().map(|(k, v)| (k.to_string(), v.iter().map(|v| v.to_string()).collect())).collect();
        SelfSubjectReview {
            status: Some(SelfSubjectReviewStatus {
                user_info: Some(UserInfo { extra: Some(extra), ..UserInfo::default() }),
            }),
            ..SelfSubjectReview::default()
        }
    }

    #[test]
    fn the_node_uid_is_taken_only_from_a_token_bound_to_this_node() {
        let bound = review(&[(NODE_NAME_EXTRA, &["node-a"]), (NODE_UID_EXTRA, &["uid-a"])]);
        assert_eq!(bound_node_uid(&bound, "node-a").as_deref(), Some("uid-a"));
        assert_eq!(bound_node_uid(&bound, "node-b"), None, "bound to another node");
        assert_eq!(bound_node_uid(&review(&[(NODE_NAME_EXTRA, &["node-a"])]), "node-a"), None, "no uid");
        let two = review(&[(NODE_NAME_EXTRA, &["node-a", "node-b"]), (NODE_UID_EXTRA, &["uid-a"])]);
        assert_eq!(bound_node_uid(&two, "node-a"), None, "two names: none believed");
        assert_eq!(bound_node_uid(&SelfSubjectReview::default(), "node-a"), None);
        assert_eq!(owned_by_node("node-a", "uid-a")[0]["kind"], "Node");
    }
}
