//! The rate at which a binary of the driver sends requests to the apiserver: a token bucket of
//! `qps` tokens a second holding at most `burst`, as client-go's `QPS` and `Burst`. Each request
//! (a read, a review, a status write, a watch's start) takes a token, waiting its turn when
//! none is left; requests are served in the order they came. A node's driver starting a hundred
//! pods at once then asks the apiserver at most `burst` times at once and `qps` a second after,
//! whatever its tenants do.
//!
//! The bucket is the pure part ([`TokenBucket::reserve`], given the time); [`RateLayer`] puts
//! it in front of the client's stack, so no request path can skip it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::apiserver::overload::OverloadLayer;
use crate::unpoisoned::UnpoisonedMutex;

/// Requests a second unless configured (`apiserverQPS`): far above what held answers leave a
/// node to ask (a burst of 100 pods of one account and share asks one review), so it never
/// slows a node that is not flooding the apiserver. client-go's default of 5 is what held
/// secrets-store providers' pods for minutes (aws provider #136).
pub const DEFAULT_QPS: u32 = 100;
/// Requests sent at once after a quiet time unless configured (`apiserverBurst`).
pub const DEFAULT_BURST: u32 = 200;

/// The bucket: how many tokens it holds now (below zero: that many requests are waiting for
/// one) and when that was computed.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now` (a `qps` or `burst` of zero counts as one: the configuration
    /// refuses both).
    pub fn new(qps: u32, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps: f64::from(qps.max(1)), burst, tokens: burst, at: now }
    }

    /// Takes a token for a request made at `now`: how long the request must wait for it
    /// (zero when the bucket had one). A waiting request's token is reserved at once, so the
    /// next request waits behind it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.qps) }
    }

    /// Takes a token for something done at `now` if the bucket has one: false, taking
    /// nothing, when it has not (what cannot wait is dropped instead).
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        let taken = self.tokens >= 1.0;
        if taken {
            self.tokens -= 1.0;
        }
        taken
    }

    /// Whether the bucket is full at `now`: as if it had never been used.
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }

    /// Adds the tokens earned since the last look, up to `burst`.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now.max(self.at);
    }
}

/// A tower layer taking a token of one shared bucket before each request; it carries the
/// binary's [`OverloadLayer`] too, so that every client made with one rate also holds back on
/// one count of what the apiserver accepted.
#[derive(Clone)]
pub struct RateLayer {
    bucket: Arc<Mutex<TokenBucket>>,
    overload: OverloadLayer,
}

impl RateLayer {
    /// A layer with a full bucket of `burst` tokens refilled at `qps`.
    pub fn new(qps: u32, burst: u32) -> RateLayer {
        RateLayer {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst, Instant::now()))),
            overload: OverloadLayer::default(),
        }
    }

    /// The layer holding back requests while the apiserver refuses most of them, shared by
    /// every client of this rate.
    pub fn overload(&self) -> OverloadLayer {
        self.overload.clone()
    }

    /// A layer at the defaults the shipped configuration has ([`DEFAULT_QPS`],
    /// [`DEFAULT_BURST`]): for the benchmarks, which measure the driver as it ships.
    pub fn shipped() -> RateLayer {
        RateLayer::new(DEFAULT_QPS, DEFAULT_BURST)
    }

    /// How long a request made now waits for its token (and takes it).
    fn wait(&self) -> Duration {
        self.bucket.locked().reserve(Instant::now())
    }
}

impl<S> tower::Layer<S> for RateLayer {
    type Service = Rated<S>;

    fn layer(&self, inner: S) -> Rated<S> {
        Rated { inner, layer: self.clone() }
    }
}

/// A service whose requests each wait for a token first.
#[derive(Clone)]
pub struct Rated<S> {
    inner: S,
    layer: RateLayer,
}

impl<S, R> tower::Service<R> for Rated<S>
where
    S: tower::Service<R> + Clone + Send + 'static,
    S::Future: Send,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Readiness is the inner service's, asked once the token is had (in `call`): a service
        // made ready now and called after the wait could have become unready meanwhile.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let wait = self.layer.wait();
        // The clone is what gets called; `self.inner` stays ready-agnostic for the next call.
        let mut inner = self.inner.clone();
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_lets_burst_requests_through_then_one_each_tick() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10, 3, start);
        let waits: Vec<Duration> = (0..5).map(|_| bucket.reserve(start)).collect();
        assert_eq!(waits[..3], [Duration::ZERO; 3], "the burst goes at once");
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200), "each waits behind the one before it");
    }

    #[test]
    fn a_quiet_time_refills_the_bucket_up_to_the_burst_only() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10, 2, start);
        bucket.reserve(start);
        bucket.reserve(start);
        // An hour later: two tokens again, not 36 000.
        let later = start + Duration::from_secs(3600);
        assert_eq!(bucket.reserve(later), Duration::ZERO);
        assert_eq!(bucket.reserve(later), Duration::ZERO);
        assert_eq!(bucket.reserve(later), Duration::from_millis(100));
        // Half a token's time later, the waiting one's token is half made: the next waits on.
        let waited = bucket.reserve(later + Duration::from_millis(50));
        assert!((waited.as_secs_f64() - 0.15).abs() < 1e-9, "{waited:?}");
    }

    #[test]
    fn a_clock_seen_going_back_takes_nothing_away() {
        let start = Instant::now() + Duration::from_secs(10);
        let mut bucket = TokenBucket::new(1, 1, start);
        assert_eq!(bucket.reserve(start), Duration::ZERO);
        assert_eq!(bucket.reserve(start - Duration::from_secs(5)), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rated_service_sends_requests_past_the_burst_at_the_rate() {
        use tower::{Layer, Service};
        let sent = Arc::new(Mutex::new(Vec::new()));
        let recorder = {
            let sent = sent.clone();
            tower::service_fn(move |n: u32| {
                let sent = sent.clone();
                async move {
                    sent.locked().push((n, tokio::time::Instant::now()));
                    Ok::<_, std::convert::Infallible>(n)
                }
            })
        };
        let mut rated = RateLayer::new(4, 2).layer(recorder);
        let started = tokio::time::Instant::now();
        // Always ready: the wait is in the call.
        let calls: Vec<_> = (0..4).map(|n| rated.call(n)).collect();
        let answers = futures_util::future::join_all(calls).await;
        assert_eq!(answers.into_iter().map(Result::unwrap).collect::<Vec<_>>(), [0, 1, 2, 3]);
        let offsets: Vec<(u32, u128)> =
            sent.locked().iter().map(|(n, at)| (*n, at.duration_since(started).as_millis())).collect();
        assert_eq!(offsets, [(0, 0), (1, 0), (2, 250), (3, 500)]);
    }

    #[tokio::test]
    async fn every_client_of_one_rate_holds_back_on_one_count_of_what_the_apiserver_accepted() {
        use tower::{Layer, Service};
        let answering = |status: u16| {
            tower::service_fn(move |_: http::Request<()>| async move {
                Ok::<_, tower::BoxError>(http::Response::builder().status(status).body(()).unwrap())
            })
        };
        let rate = RateLayer::new(1000, 1000);
        // One client of the rate meets an apiserver refusing everything, past the floor.
        let mut refused = rate.overload().layer(answering(429));
        for _ in 0..100 {
            let _ = refused.call(http::Request::new(())).await;
        }
        // Another client of the same rate holds back too, before it has been refused once.
        let mut other = rate.overload().layer(answering(200));
        let mut held_back = 0;
        for _ in 0..20 {
            held_back += usize::from(other.call(http::Request::new(())).await.is_err());
        }
        assert!(held_back > 0, "a second client of the rate sent all 20 while the first was refused 100 times");
    }
}
