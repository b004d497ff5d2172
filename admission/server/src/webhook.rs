//! The admission endpoints: `POST /validate` and `POST /mutate` take an AdmissionReview and answer
//! one. Every way a request can be unusable is answered here with an HTTP status and a message;
//! [`HttpError::status`] is the one place those statuses are chosen.

use std::future::Future as _;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Body;
use hyper::header::{ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use inline_guard_admission::review::{self, ReviewError, ReviewResponse};
use inline_guard_admission::{AdmissionError, Chain, Phase};
use tracing::{debug, warn};

use crate::body_budget::BodyBudget;
use crate::drain::Drain;
use crate::log_text::{LogLimiter, escaped};
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
    /// The bodies already in memory fill the server's budget: retry shortly (another replica
    /// may have room).
    #[error("too many request bodies in memory: retry shortly")]
    OverBudget,
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
            HttpError::OverBudget => StatusCode::TOO_MANY_REQUESTS,
            HttpError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            HttpError::BodyRead(_) | HttpError::Review(_) => StatusCode::BAD_REQUEST,
            HttpError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn response(&self) -> Response<Full<Bytes>> {
        // Parser messages quote the request: escaped and bounded like a log line.
        let mut response = Response::new(Full::new(Bytes::from(format!("{}\n", escaped(&self.to_string())))));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if matches!(self, HttpError::MethodNotAllowed(_)) {
            headers.insert(ALLOW, HeaderValue::from_static("POST"));
        }
        if matches!(self, HttpError::OverBudget) {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, HttpError::BodyTimeout(_)) {
            // The rest of a late body would arrive as the next request's head: close instead.
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// How the webhook bounds what clients make it hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A request body must arrive within this of its head.
    pub body_timeout: Duration,
    /// The bytes all bodies in memory may take together.
    pub body_budget: BodyBudget,
}

/// The admission endpoints over one chain.
pub struct Webhook {
    chain: Chain,
    metrics: Arc<Metrics>,
    limits: Limits,
    drain: Arc<Drain>,
    // One WARN line per second for requests that get no AdmissionReview; every one is counted in
    // `unanswered_requests_total`.
    unanswered_log: LogLimiter,
}

impl Webhook {
    /// Serves `chain` within `limits`; once `drain` starts, every response asks its client to
    /// close the connection.
    pub fn new(chain: Chain, metrics: Arc<Metrics>, limits: Limits, drain: Arc<Drain>) -> Webhook {
        Webhook { chain, metrics, limits, drain, unanswered_log: LogLimiter::new(Duration::from_secs(1)) }
    }

    /// Answers one HTTP request. Never fails: every problem becomes a response.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<Full<Bytes>>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let started = Instant::now();
        let _in_flight = self.metrics.in_flight();
        let (endpoint, phase) = match request.uri().path() {
            "/validate" => (Endpoint::Validate, Phase::Validating),
            "/mutate" => (Endpoint::Mutate, Phase::Mutating),
            _ => (Endpoint::Other, Phase::Both),
        };
        let (mut response, decision) = match self.answer(endpoint, phase, request).await {
            Ok(review) => {
                let decision = if review.response.allowed { Decision::Allowed } else { Decision::Denied };
                debug!(uid = %escaped(&review.response.uid), path = ?endpoint, allowed = review.response.allowed, "answered");
                (json_response(review.to_json()), decision)
            }
            Err(error) => {
                let status = error.status().as_u16();
                self.metrics.unanswered(status);
                if let Some(held_back) = self.unanswered_log.allow() {
                    warn!(path = ?endpoint, status, error = %escaped(&error.to_string()), held_back, "request not answered");
                }
                (error.response(), Decision::Rejected)
            }
        };
        if self.drain.is_draining() {
            response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        }
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
        let content_type = request.headers().get(CONTENT_TYPE).map(HeaderValue::as_bytes);
        let is_json = content_type.is_some_and(|value| {
            value
                .split(|b| *b == b';')
                .next()
                .is_some_and(|media| media.trim_ascii().eq_ignore_ascii_case(b"application/json"))
        });
        if !is_json {
            let named = content_type.map(|value| String::from_utf8_lossy(value).into_owned()).unwrap_or_default();
            return Err(HttpError::UnsupportedMediaType(named));
        }
        // Refuse a declared oversize body before reading any of it.
        let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return Err(HttpError::PayloadTooLarge);
        }
        // Held until the answer is built: the body, and what is decoded from it, stay within
        // the budget. A body of unknown length reserves the most it may be.
        let reserve = declared.map_or(MAX_BODY_BYTES, |length| length as usize);
        let body = Limited::new(request.into_body(), declared.map_or(MAX_BODY_BYTES, |length| length as usize));
        let body_timeout = self.limits.body_timeout;
        let Some(_reservation) = self.limits.body_budget.try_reserve(reserve) else {
            // Read and dropped chunk by chunk (no memory kept), so the 429 reaches a client still
            // writing its body instead of a reset connection, and the connection stays usable.
            let _ = tokio::time::timeout(body_timeout, discard(body)).await;
            return Err(HttpError::OverBudget);
        };
        // A body already in hyper's buffer (the usual case: it arrives with its head) is taken
        // without arming the timer; only one still on its way is waited for under the timeout.
        let mut collect = std::pin::pin!(body.collect());
        let ready = std::future::poll_fn(|context| {
            Poll::Ready(match collect.as_mut().poll(context) {
                Poll::Ready(collected) => Some(collected),
                Poll::Pending => None,
            })
        })
        .await;
        let collected = match ready {
            Some(collected) => collected,
            None => {
                tokio::time::timeout(body_timeout, collect).await.map_err(|_| HttpError::BodyTimeout(body_timeout))?
            }
        };
        let collected = collected
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
        Ok(ReviewResponse::from_decided(decided))
    }
}

/// Reads `body` to its end, keeping none of it.
async fn discard<B>(body: Limited<B>)
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    while let Some(Ok(_)) = body.as_mut().frame().await {}
}

fn json_response(json: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(json)));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests;
