//! The live cluster's answers to SharedResourceAdmission: a share's existence (a metadata-only
//! GET), a projection's spec (a GET in the pod's namespace) and access (the SubjectAccessReview
//! the driver asks), each bounded by a timeout ([`ApiserverQuestions`]), and held for a few
//! seconds, asked once per key however many pods ask at once, and counted ([`HeldShareFacts`]).
//! The holding does not depend on who answers, so the benchmarks measure it with answers that
//! need no apiserver.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use inline_guard_admission::{FactsError, Known, ShareFacts};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Client;
use kube::api::{Api, PostParams};
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::projection::ProjectionSpec;
use sharedresource_api::projection::spec::SharedProjection;
use sharedresource_api::shares::{SharedConfigMap, SharedSecret};
use sharedresource_api::{ObjectName, ShareKind};

use crate::held_answers::{HeldAnswers, Served};
use crate::metrics::{Metrics, ShareQuestion};

/// Bounds of the lookups.
#[derive(Debug, Clone, Copy)]
pub struct LookupSettings {
    /// The longest one lookup may take; past it the plugin admits with a warning.
    pub timeout: Duration,
    /// How long an answer is held.
    pub ttl: Duration,
    /// How many answers of each kind are held.
    pub capacity: NonZeroUsize,
}

impl Default for LookupSettings {
    fn default() -> Self {
        LookupSettings {
            timeout: Duration::from_secs(2),
            ttl: Duration::from_secs(5),
            capacity: NonZeroUsize::MIN.saturating_add(4095),
        }
    }
}

/// A projection's spec, `None` when it does not exist.
pub type Projection = Option<Arc<ProjectionSpec>>;

/// Whoever answers the three questions, each failure in words.
#[async_trait]
pub trait ShareQuestions: Send + Sync {
    /// Whether the share exists.
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<bool, String>;
    /// The projection `namespace/name`.
    async fn projection(&self, namespace: &str, name: &ObjectName) -> Result<Projection, String>;
    /// Whether RBAC allows `question`.
    async fn may_use(&self, question: &AccessQuestion) -> Result<bool, String>;
}

/// The questions asked of the apiserver, each bounded by a timeout.
pub struct ApiserverQuestions {
    client: Client,
    timeout: Duration,
}

impl ApiserverQuestions {
    /// `lookup`, bounded by the timeout, its failure in words.
    async fn bounded<T>(&self, lookup: impl Future<Output = Result<T, kube::Error>>) -> Result<T, String> {
        self.within(lookup).await?.map_err(|error| error.to_string())
    }

    /// `lookup`'s own answer, or the timeout's failure in words.
    async fn within<T>(&self, lookup: impl Future<Output = T>) -> Result<T, String> {
        tokio::time::timeout(self.timeout, lookup).await.map_err(|_| format!("no answer within {:?}", self.timeout))
    }
}

#[async_trait]
impl ShareQuestions for ApiserverQuestions {
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<bool, String> {
        let (client, name) = (self.client.clone(), name.as_str());
        match kind {
            ShareKind::Secret => {
                self.bounded(Api::<SharedSecret>::all(client).get_metadata_opt(name)).await.map(|found| found.is_some())
            }
            ShareKind::ConfigMap => self
                .bounded(Api::<SharedConfigMap>::all(client).get_metadata_opt(name))
                .await
                .map(|found| found.is_some()),
        }
    }

    async fn projection(&self, namespace: &str, name: &ObjectName) -> Result<Projection, String> {
        let api = Api::<SharedProjection>::namespaced(self.client.clone(), namespace);
        let found = match self.within(api.get_opt(name.as_str())).await? {
            Ok(found) => found,
            Err(kube::Error::SerdeError(error)) => {
                return Err(format!("SharedProjection {namespace}/{name} does not decode: {error}"));
            }
            Err(error) => return Err(error.to_string()),
        };
        Ok(found.map(|projection| Arc::new(projection.spec)))
    }

    async fn may_use(&self, question: &AccessQuestion) -> Result<bool, String> {
        let api = Api::<SubjectAccessReview>::all(self.client.clone());
        let review = self.bounded(api.create(&PostParams::default(), &question.review())).await?;
        Ok(review.status.is_some_and(|status| status.allowed))
    }
}

/// Answers of `Q`, held and asked once per key, counted in the metrics.
pub struct HeldShareFacts<Q> {
    questions: Q,
    metrics: Arc<Metrics>,
    shares: HeldAnswers<(ShareKind, ObjectName), bool>,
    projections: HeldAnswers<(String, ObjectName), Projection>,
    access: HeldAnswers<AccessQuestion, bool>,
}

/// Shares, projections and access, looked up in the live cluster.
pub type LiveShareFacts = HeldShareFacts<ApiserverQuestions>;

impl LiveShareFacts {
    /// Lookups with `client`, counted in `metrics`.
    pub fn new(client: Client, settings: LookupSettings, metrics: Arc<Metrics>) -> LiveShareFacts {
        HeldShareFacts::holding(ApiserverQuestions { client, timeout: settings.timeout }, settings, metrics)
    }
}

impl<Q: ShareQuestions> HeldShareFacts<Q> {
    /// The answers of `questions`, held as `settings` say.
    pub fn holding(questions: Q, settings: LookupSettings, metrics: Arc<Metrics>) -> HeldShareFacts<Q> {
        HeldShareFacts {
            questions,
            metrics,
            shares: HeldAnswers::new(settings.capacity, settings.ttl),
            projections: HeldAnswers::new(settings.capacity, settings.ttl),
            access: HeldAnswers::new(settings.capacity, settings.ttl),
        }
    }

    fn counted<T>(
        &self,
        question: ShareQuestion,
        (answer, served): (Result<T, String>, Served),
    ) -> Result<Known<T>, FactsError> {
        self.metrics.share_lookup(question, served, answer.is_ok());
        answer.map(Known::Answer).map_err(FactsError::Unavailable)
    }
}

#[async_trait]
impl<Q: ShareQuestions> ShareFacts for HeldShareFacts<Q> {
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<Known<bool>, FactsError> {
        let answer = self.shares.answer(&(kind, name.clone()), || self.questions.share_exists(kind, name)).await;
        self.counted(ShareQuestion::Share, answer)
    }

    async fn projection(&self, namespace: &str, name: &ObjectName) -> Result<Known<Projection>, FactsError> {
        let key = (namespace.to_string(), name.clone());
        let answer = self.projections.answer(&key, || self.questions.projection(namespace, name)).await;
        self.counted(ShareQuestion::Projection, answer)
    }

    async fn may_use(&self, question: &AccessQuestion) -> Result<Known<bool>, FactsError> {
        let answer = self.access.answer(question, || self.questions.may_use(question)).await;
        self.counted(ShareQuestion::Access, answer)
    }
}

#[cfg(test)]
mod tests;
