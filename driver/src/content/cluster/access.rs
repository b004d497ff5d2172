//! The access check of a pod's service account to a guarded resource (a share, a provider):
//! a SubjectAccessReview, its answer held until a grant's change may concern it (or it is due),
//! and shared by the volumes of one refresh pass.

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::api::{Api, PostParams};
use sharedresource_api::access::AccessQuestion;

use super::Cluster;
use crate::content::PassId;
use crate::content::error::{Error, Result};
use crate::metrics::AccessResult;

impl Cluster {
    /// Nothing when the apiserver says `question`'s service account may use what it names;
    /// otherwise the denial, in the question's words. Within pass `pass`, asked once.
    pub async fn may_use(&self, question: &AccessQuestion, pass: Option<PassId>) -> Result<()> {
        if !self.allowed_in(question, pass).await? {
            return Err(Error::Denied(question.denial()));
        }
        Ok(())
    }

    /// Whether the apiserver says `question`'s service account may use what it names, asked
    /// once within pass `pass`.
    pub async fn allowed_in(&self, question: &AccessQuestion, pass: Option<PassId>) -> Result<bool> {
        self.shared(pass, question.clone(), |p| &mut p.access, self.allowed(question)).await
    }

    /// Whether the apiserver says `question`'s service account may use what it names: its
    /// answer held from before when no grant's change has concerned it since (and it is not
    /// due).
    async fn allowed(&self, question: &AccessQuestion) -> Result<bool> {
        // Listed in this node's object, so the access-notices controller answers it after a
        // grant's change and the node need not ask.
        self.node_view.asked(question);
        if let Some(allowed) = self.answers.answer(question) {
            return Ok(allowed);
        }
        let asked = self.answers.asking();
        let what = || "asking the apiserver whether the pod may use the share".to_string();
        let api = Api::<SubjectAccessReview>::all(self.client.clone());
        let review =
            self.ask(what, api.create(&PostParams::default(), &question.review())).await.inspect_err(|_| {
                self.metrics.access_check(AccessResult::Failed);
            })?;
        let allowed = review.status.is_some_and(|s| s.allowed);
        self.metrics.access_check(if allowed { AccessResult::Allowed } else { AccessResult::Denied });
        self.answers.hold(question, allowed, asked);
        Ok(allowed)
    }
}
