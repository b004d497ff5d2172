//! The live cluster's answers to SharedResourceAdmission: a share's existence (a metadata-only
//! GET), a projection's spec (a GET in the pod's namespace) and access (the SubjectAccessReview
//! the driver asks), each bounded by a timeout and held for a few seconds, asked once per key
//! however many pods ask at once ([`HeldAnswers`]).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use inline_guard_admission::{FactsError, Known, ShareFacts};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::projection::ProjectionSpec;
use sharedresource_api::{API_GROUP, ObjectName, ShareKind};

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

type Projection = Option<Arc<ProjectionSpec>>;

/// Shares, projections and access, looked up in the live cluster.
pub struct LiveShareFacts {
    client: Client,
    settings: LookupSettings,
    metrics: Arc<Metrics>,
    shares: HeldAnswers<(ShareKind, ObjectName), bool>,
    projections: HeldAnswers<(String, ObjectName), Projection>,
    access: HeldAnswers<AccessQuestion, bool>,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: API_GROUP.into(),
        version: "v1alpha1".into(),
        api_version: format!("{API_GROUP}/v1alpha1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

impl LiveShareFacts {
    /// Lookups with `client`, counted in `metrics`.
    pub fn new(client: Client, settings: LookupSettings, metrics: Arc<Metrics>) -> LiveShareFacts {
        LiveShareFacts {
            client,
            settings,
            metrics,
            shares: HeldAnswers::new(settings.capacity, settings.ttl),
            projections: HeldAnswers::new(settings.capacity, settings.ttl),
            access: HeldAnswers::new(settings.capacity, settings.ttl),
        }
    }

    /// `lookup`, bounded by the timeout, its failure in words.
    async fn bounded<T>(&self, lookup: impl Future<Output = Result<T, kube::Error>>) -> Result<T, String> {
        match tokio::time::timeout(self.settings.timeout, lookup).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.settings.timeout)),
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
impl ShareFacts for LiveShareFacts {
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<Known<bool>, FactsError> {
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &resource(kind.kind(), kind.resource()));
        let answer = self
            .shares
            .answer(&(kind, name.clone()), || async {
                self.bounded(api.get_metadata_opt(name.as_str())).await.map(|found| found.is_some())
            })
            .await;
        self.counted(ShareQuestion::Share, answer)
    }

    async fn projection(&self, namespace: &str, name: &ObjectName) -> Result<Known<Projection>, FactsError> {
        let api = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            namespace,
            &resource("SharedProjection", "sharedprojections"),
        );
        let answer = self
            .projections
            .answer(&(namespace.to_string(), name.clone()), || async {
                let Some(object) = self.bounded(api.get_opt(name.as_str())).await? else {
                    return Ok(None);
                };
                let spec = object.data.get("spec").cloned().unwrap_or_default();
                let spec: ProjectionSpec = serde_json::from_value(spec)
                    .map_err(|error| format!("SharedProjection {namespace}/{name} does not decode: {error}"))?;
                Ok(Some(Arc::new(spec)))
            })
            .await;
        self.counted(ShareQuestion::Projection, answer)
    }

    async fn may_use(&self, question: &AccessQuestion) -> Result<Known<bool>, FactsError> {
        let api = Api::<SubjectAccessReview>::all(self.client.clone());
        let answer = self
            .access
            .answer(question, || async {
                let review = self.bounded(api.create(&PostParams::default(), &question.review())).await?;
                Ok(review.status.is_some_and(|status| status.allowed))
            })
            .await;
        self.counted(ShareQuestion::Access, answer)
    }
}
