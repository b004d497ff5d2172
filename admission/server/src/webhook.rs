//! The admission endpoints: `POST /validate` and `POST /mutate` take an AdmissionReview and answer
//! one. Every way a request can be unusable is answered here with an HTTP status and a message;
//! [`HttpError::status`] is the one place those statuses are chosen.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Body;
use hyper::header::{ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use inline_guard_admission::review::{self, ReviewError, ReviewResponse};
use inline_guard_admission::{AdmissionError, Chain, Phase};
use tracing::{debug, warn};

use crate::metrics::{Decision, Endpoint, Metrics};

/// The error type bodies are read with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The largest AdmissionReview accepted. kube-apiserver's own request limit is 3 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Why a request got no AdmissionReview answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Not one of the two endpoints.
    #[error("no such path {0:?}: the admission endpoints are POST /validate and POST /mutate")]
    NotFound(String),
    /// Not a POST.
    #[error("method {0} is not allowed: use POST")]
    MethodNotAllowed(Method),
    /// Not JSON.
    #[error("content type {0:?} is not supported: send application/json")]
    UnsupportedMediaType(String),
    /// Over [`MAX_BODY_BYTES`].
    #[error("request body is larger than {MAX_BODY_BYTES} bytes")]
    PayloadTooLarge,
    /// The body did not arrive in time.
    #[error("request body not received within {0:?}")]
    BodyTimeout(Duration),
    /// The connection failed while the body was read.
    #[error("reading the request body: {0}")]
    BodyRead(String),
    /// The body is not a usable AdmissionReview.
    #[error("{0}")]
    Review(#[from] ReviewError),
    /// The facts needed to decide are not available (cache not synced, apiserver unreachable):
    /// an HTTP error, so that the webhook's failurePolicy decides rather than this server.
    #[error("cannot decide now: {0}")]
    Unavailable(String),
}

impl HttpError {
    /// The one mapping from request failures to HTTP statuses.
    pub fn status(&self) -> StatusCode {
        match self {
            HttpError::NotFound(_) => StatusCode::NOT_FOUND,
            HttpError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            HttpError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            HttpError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            HttpError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            HttpError::BodyRead(_) | HttpError::Review(_) => StatusCode::BAD_REQUEST,
            HttpError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn response(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(format!("{self}\n"))));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if matches!(self, HttpError::MethodNotAllowed(_)) {
            headers.insert(ALLOW, HeaderValue::from_static("POST"));
        }
        if matches!(self, HttpError::BodyTimeout(_)) {
            // The rest of a late body would arrive as the next request's head: close instead.
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// The admission endpoints over one chain.
pub struct Webhook {
    chain: Chain,
    metrics: Arc<Metrics>,
    body_timeout: Duration,
}

impl Webhook {
    /// Serves `chain`; a request body must arrive within `body_timeout` of its head.
    pub fn new(chain: Chain, metrics: Arc<Metrics>, body_timeout: Duration) -> Webhook {
        Webhook { chain, metrics, body_timeout }
    }

    /// Answers one HTTP request. Never fails: every problem becomes a response.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<Full<Bytes>>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let started = Instant::now();
        let (endpoint, phase) = match request.uri().path() {
            "/validate" => (Endpoint::Validate, Phase::Validating),
            "/mutate" => (Endpoint::Mutate, Phase::Mutating),
            _ => (Endpoint::Other, Phase::Both),
        };
        let (response, decision) = match self.answer(endpoint, phase, request).await {
            Ok(review) => {
                let decision = if review.response.allowed { Decision::Allowed } else { Decision::Denied };
                debug!(uid = %review.response.uid, path = ?endpoint, allowed = review.response.allowed, "answered");
                (json_response(review.to_json()), decision)
            }
            Err(error) => {
                warn!(path = ?endpoint, status = error.status().as_u16(), error = %error, "request not answered");
                (error.response(), Decision::Rejected)
            }
        };
        self.metrics.observe_request(endpoint, decision, started.elapsed().as_secs_f64());
        response
    }

    async fn answer<B>(
        &self,
        endpoint: Endpoint,
        phase: Phase,
        request: Request<B>,
    ) -> Result<ReviewResponse, HttpError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        if endpoint == Endpoint::Other {
            return Err(HttpError::NotFound(request.uri().path().to_string()));
        }
        if request.method() != Method::POST {
            return Err(HttpError::MethodNotAllowed(request.method().clone()));
        }
        let content_type =
            request.headers().get(CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let is_json = content_type.as_deref().is_some_and(|value| {
            value.split(';').next().is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
        });
        if !is_json {
            return Err(HttpError::UnsupportedMediaType(content_type.unwrap_or_default()));
        }
        // Refuse a declared oversize body before reading any of it.
        let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return Err(HttpError::PayloadTooLarge);
        }
        let body = Limited::new(request.into_body(), MAX_BODY_BYTES);
        let collected = tokio::time::timeout(self.body_timeout, body.collect())
            .await
            .map_err(|_| HttpError::BodyTimeout(self.body_timeout))?
            .map_err(|error| {
                if error.downcast_ref::<LengthLimitError>().is_some() {
                    HttpError::PayloadTooLarge
                } else {
                    HttpError::BodyRead(error.to_string())
                }
            })?
            .to_bytes();

        let decided = review::decide(&self.chain, phase, &collected).await?;
        if let Err(AdmissionError::Internal(message)) = &decided.outcome.result {
            return Err(HttpError::Unavailable(message.clone()));
        }
        Ok(ReviewResponse::from_outcome(&decided.uid, decided.outcome))
    }
}

fn json_response(json: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(json)));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests;
