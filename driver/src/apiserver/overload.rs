//! Holding back when the apiserver is overloaded. A refused request (429 from priority and
//! fairness, a 5xx, a timeout, no connection) is retried by its caller, and a driver whose
//! answers fail falls back to asking more (its refreshes, its access checks on its own), so a
//! thousand nodes told "too busy" at once answer with more requests than before: the overload
//! feeds itself, and the apiserver may never dig out (seen with 1 000 simulated nodes publishing
//! at a scheduler's pace against one apiserver core: refused watches, reviews and status
//! writes, retried, were most of its work).
//!
//! Each binary's client therefore throttles itself as the SRE book's adaptive throttling does:
//! over the last [`WINDOW`], it counts the requests it made and those the apiserver accepted
//! (answered with anything but 429 or a 5xx), and refuses a new request locally, without sending
//! it, in the proportion `(requests − K × accepted) / (requests + 1)` when that is above zero,
//! and at most [`MOST_REFUSED`]. While the apiserver accepts everything, nothing is refused;
//! when it accepts little, a node sends about K times what it accepts (a tenth of what it wants
//! at least, so that it sees the apiserver recover), so its attempts follow what the apiserver
//! can take.
//! Below [`FLOOR`] requests in the window nothing is refused either: a node asking that little
//! overloads nothing. An apiserver that accepts again is sent more as its acceptances count,
//! and everything once the refusals have aged out of the window (within two windows, unit
//! test below). The proportion is
//! spread evenly (an error-diffusion counter, not a random draw), so the same history refuses
//! the same requests, and a test can say which.
//!
//! The counts are the pure part ([`Acceptance`], given the time); [`OverloadLayer`] puts them in
//! front of the client's stack, outside its retries, so a request and its retries count once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::unpoisoned::UnpoisonedMutex;

/// How far back requests and acceptances are counted.
pub const WINDOW: Duration = Duration::from_secs(30);
/// The window's slots: counts age out a slot at a time.
const SLOTS: usize = 6;
/// How many requests per accepted one are still sent when the apiserver accepts few.
pub const K: f64 = 2.0;
/// Below this many requests in the window, none is refused.
pub const FLOOR: u64 = 30;
/// The largest share refused: a request held back counts as one, so an apiserver accepting
/// nothing would otherwise be asked almost never again, and one that recovers would hardly be
/// seen to; a tenth still sent finds it.
pub const MOST_REFUSED: f64 = 0.9;

/// One slot's counts.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    requests: u64,
    accepted: u64,
}

/// The requests made and accepted over the last [`WINDOW`], and the share of new ones to refuse.
#[derive(Debug, Clone)]
pub struct Acceptance {
    slots: [Slot; SLOTS],
    /// The slot `slots[current]` counts: its index since `origin`.
    current: u64,
    origin: Instant,
    /// The refusals owed but not yet made: each request adds the proportion, and a request is
    /// refused each time this reaches one.
    owed: f64,
}

impl Acceptance {
    /// No request yet, at `now`.
    pub fn new(now: Instant) -> Acceptance {
        Acceptance { slots: [Slot::default(); SLOTS], current: 0, origin: now, owed: 0.0 }
    }

    /// Moves the window to `now`, emptying the slots it left behind.
    fn advance(&mut self, now: Instant) {
        let slot_length = WINDOW / SLOTS as u32;
        let index = (now.saturating_duration_since(self.origin).as_nanos() / slot_length.as_nanos()) as u64;
        let steps = index.saturating_sub(self.current).min(SLOTS as u64);
        for step in 1..=steps {
            self.slots[((self.current + step) % SLOTS as u64) as usize] = Slot::default();
        }
        self.current = self.current.max(index);
    }

    fn totals(&self) -> (u64, u64) {
        self.slots
            .iter()
            .fold((0, 0), |(requests, accepted), slot| (requests + slot.requests, accepted + slot.accepted))
    }

    /// The share of new requests to refuse, given the window as it stands.
    pub fn refusing(&mut self, now: Instant) -> f64 {
        self.advance(now);
        let (requests, accepted) = self.totals();
        if requests < FLOOR {
            return 0.0;
        }
        ((requests as f64 - K * accepted as f64) / (requests as f64 + 1.0)).clamp(0.0, MOST_REFUSED)
    }

    /// A request is to be made at `now`: whether it may be sent (false: refuse it locally). It
    /// counts as a request either way.
    pub fn admit(&mut self, now: Instant) -> bool {
        let refusing = self.refusing(now);
        self.slots[(self.current % SLOTS as u64) as usize].requests += 1;
        self.owed += refusing;
        if self.owed >= 1.0 {
            self.owed -= 1.0;
            return false;
        }
        // Nothing is owed for long: a history that stops refusing starts from zero.
        if refusing == 0.0 {
            self.owed = 0.0;
        }
        true
    }

    /// A request sent was answered (accepted or not) at `now`.
    pub fn answered(&mut self, accepted: bool, now: Instant) {
        self.advance(now);
        if accepted {
            self.slots[(self.current % SLOTS as u64) as usize].accepted += 1;
        }
    }
}

/// Whether an answer with `status` says the apiserver took the request: anything but 429 (its
/// priority and fairness queues full) and the 5xx of a server that failed or gave up.
pub fn accepted(status: http::StatusCode) -> bool {
    status != http::StatusCode::TOO_MANY_REQUESTS && !status.is_server_error()
}

/// The error a request refused locally fails with.
#[derive(Debug, thiserror::Error)]
#[error(
    "the apiserver is refusing most of this node's requests (overloaded or unreachable): the request was held back \
     and not sent"
)]
pub struct HeldBack;

/// A tower layer refusing requests locally while the apiserver refuses most of them.
#[derive(Clone)]
pub struct OverloadLayer {
    acceptance: Arc<Mutex<Acceptance>>,
}

impl Default for OverloadLayer {
    fn default() -> Self {
        OverloadLayer { acceptance: Arc::new(Mutex::new(Acceptance::new(Instant::now()))) }
    }
}

impl<S> tower::Layer<S> for OverloadLayer {
    type Service = Throttled<S>;

    fn layer(&self, inner: S) -> Throttled<S> {
        Throttled { inner, layer: self.clone() }
    }
}

/// A service whose requests are refused locally in the share [`Acceptance`] says.
#[derive(Clone)]
pub struct Throttled<S> {
    inner: S,
    layer: OverloadLayer,
}

impl<S, B, Q> tower::Service<http::Request<Q>> for Throttled<S>
where
    S: tower::Service<http::Request<Q>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: From<HeldBack>,
    Q: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // As the rate layer: readiness is asked of the inner service when the call is made.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Q>) -> Self::Future {
        let acceptance = self.layer.acceptance.clone();
        let admitted = acceptance.locked().admit(Instant::now());
        let mut inner = self.inner.clone();
        Box::pin(async move {
            if !admitted {
                return Err(HeldBack.into());
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let answer = inner.call(request).await;
            let took = matches!(&answer, Ok(response) if accepted(response.status()));
            acceptance.locked().answered(took, Instant::now());
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` requests at `now`, each answered `accepted`: how many were sent.
    fn ask(window: &mut Acceptance, count: u64, accepted: bool, now: Instant) -> u64 {
        let mut sent = 0;
        for _ in 0..count {
            if window.admit(now) {
                sent += 1;
                window.answered(accepted, now);
            }
        }
        sent
    }

    #[test]
    fn an_apiserver_that_accepts_everything_is_sent_everything() {
        let start = Instant::now();
        let mut window = Acceptance::new(start);
        assert_eq!(ask(&mut window, 10_000, true, start), 10_000);
    }

    #[test]
    fn a_node_asking_little_is_never_held_back_however_it_is_answered() {
        let start = Instant::now();
        let mut window = Acceptance::new(start);
        // FLOOR - 1 refused requests within the window: all were sent.
        assert_eq!(ask(&mut window, FLOOR - 1, false, start), FLOOR - 1);
    }

    #[test]
    fn an_apiserver_refusing_everything_is_sent_a_tenth_and_one_accepting_again_everything_soon() {
        let start = Instant::now();
        let mut window = Acceptance::new(start);
        // 1 000 requests in one slot, every one sent refused: past the floor, nine in ten are
        // held back, the tenth still sent to see whether it recovered.
        let sent = ask(&mut window, 1_000, false, start);
        let most = FLOOR + ((1_000 - FLOOR) as f64 * (1.0 - MOST_REFUSED)).ceil() as u64;
        assert!((most - 10..=most + 1).contains(&sent), "{sent} sent of 1 000, about {most}");
        // Accepting again, 20 wanted each second: the accepted ones lower the share, and once
        // the refusals have aged out of the window every request is sent again.
        let later = start + Duration::from_secs(1);
        let sent_after: Vec<u64> =
            (0..90u64).map(|second| ask(&mut window, 20, true, later + Duration::from_secs(second))).collect();
        assert!(sent_after[0] < 20, "right after, most are still held back: {sent_after:?}");
        let all_again = sent_after.iter().position(|&sent| sent == 20).expect("every request sent again");
        println!("all sent again {all_again} s after the apiserver accepted again: {sent_after:?}");
        assert!(all_again <= 2 * WINDOW.as_secs() as usize, "all sent again after {all_again} s: {sent_after:?}");
        assert!(sent_after[all_again..].iter().all(|&sent| sent == 20), "{sent_after:?}");
    }

    #[test]
    fn an_apiserver_taking_ten_a_second_is_asked_about_k_times_that() {
        let start = Instant::now();
        let mut window = Acceptance::new(start);
        // Each second 100 requests are wanted; the apiserver takes the first 10 sent in each
        // second and refuses the rest (its capacity), as priority and fairness would.
        let (mut sent, mut accepted) = (0u64, 0u64);
        for second in 0..120u64 {
            let now = start + Duration::from_secs(second);
            let mut taken_this_second = 0;
            for _ in 0..100 {
                if window.admit(now) {
                    let took = taken_this_second < 10;
                    taken_this_second += u64::from(took);
                    // Counted after the first window, once the counts stand on a full one.
                    if second >= 30 {
                        sent += 1;
                        accepted += u64::from(took);
                    }
                    window.answered(took, now);
                }
            }
        }
        // Without the throttle, 9 000 sent in those 90 s; with it, about K times what was taken.
        assert_eq!(accepted, 900, "the apiserver was still given all it could take");
        let ratio = sent as f64 / accepted as f64;
        assert!((K - 0.3..=K + 0.3).contains(&ratio), "sent {sent}, accepted {accepted}: {ratio}");
    }

    #[test]
    fn a_clock_seen_going_back_keeps_the_counts() {
        let start = Instant::now() + Duration::from_secs(100);
        let mut window = Acceptance::new(start);
        ask(&mut window, 50, false, start);
        let refusing = window.refusing(start);
        assert_eq!(refusing, MOST_REFUSED);
        assert_eq!(window.refusing(start - Duration::from_secs(50)), refusing);
    }

    #[tokio::test]
    async fn the_layer_holds_back_without_sending_and_counts_what_the_apiserver_answered() {
        use tower::{Layer, Service};
        let sent = Arc::new(Mutex::new(0u64));
        let refusing = {
            let sent = sent.clone();
            tower::service_fn(move |_: http::Request<()>| {
                let sent = sent.clone();
                async move {
                    *sent.locked() += 1;
                    let answer = http::Response::builder().status(429).body(()).unwrap();
                    Ok::<_, tower::BoxError>(answer)
                }
            })
        };
        let mut throttled = OverloadLayer::default().layer(refusing);
        let mut held_back = 0;
        for _ in 0..200 {
            match throttled.call(http::Request::new(())).await {
                Ok(answer) => assert_eq!(answer.status(), 429),
                Err(error) => {
                    assert!(error.to_string().contains("held back and not sent"), "{error}");
                    held_back += 1;
                }
            }
        }
        let sent = *sent.locked();
        assert_eq!(sent + held_back, 200);
        // Past the floor, nine in ten of what is asked.
        assert!((150..=160).contains(&held_back), "held back {held_back}, sent {sent}");
    }
}
