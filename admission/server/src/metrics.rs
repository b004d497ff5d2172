//! The server's Prometheus metrics, exposed as text on the health port. A label's value is its
//! enum variant's name in snake case (derived, as the driver's are), so a new variant cannot be
//! exported under a label written by hand for another.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::held_answers::Served;

/// Which admission endpoint answered; its label is the path it serves (`other` for any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
pub enum Endpoint {
    /// `POST /validate`.
    #[strum(serialize = "/validate")]
    Validate,
    /// `POST /mutate`.
    #[strum(serialize = "/mutate")]
    Mutate,
    /// Any other path.
    #[strum(serialize = "other")]
    Other,
}

/// What the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Decision {
    /// `allowed: true`.
    Allowed,
    /// `allowed: false`.
    Denied,
    /// An HTTP error (bad body, wrong method, ...): no AdmissionReview answer.
    Rejected,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    path: &'static str,
    decision: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EndpointLabels {
    path: &'static str,
}

/// The kind of object a cache holds; its label is its singular resource name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum CacheKind {
    /// Namespaces.
    Namespace,
    /// CSIDrivers.
    CsiDriver,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CacheLabels {
    kind: &'static str,
}

/// Whether a certificate reload took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ReloadResult {
    /// The new pair is served.
    Success,
    /// The new pair was broken; the old one is still served.
    Failure,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

/// What SharedResourceAdmission asked the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ShareQuestion {
    /// Whether a share exists.
    Share,
    /// A projection's spec.
    Projection,
    /// A SubjectAccessReview.
    Access,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ShareLookupLabels {
    question: &'static str,
    served: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    status: u16,
}

impl CacheKind {
    /// `namespace` or `csidriver`.
    pub fn singular(self) -> &'static str {
        self.into()
    }

    /// Whether decisions read the label `key` on objects of this kind.
    pub fn reads_label(self, key: &str) -> bool {
        match self {
            CacheKind::Namespace => key.starts_with("pod-security.kubernetes.io/"),
            CacheKind::CsiDriver => key == inline_guard_policy::labels::DRIVER_PROFILE,
        }
    }

    /// `namespaces` or `csidrivers`.
    pub fn plural(self) -> &'static str {
        match self {
            CacheKind::Namespace => "namespaces",
            CacheKind::CsiDriver => "csidrivers",
        }
    }
}

/// A request counted in `requests_in_flight`; dropping it ends the count.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<EndpointLabels, Histogram>,
    cache_objects: Family<CacheLabels, Gauge>,
    cache_synced: Family<CacheLabels, Gauge>,
    cache_last_update: Family<CacheLabels, Gauge<f64, AtomicU64>>,
    live_lookups: Counter,
    watch_errors: Family<CacheLabels, Counter>,
    tls_reloads: Family<ReloadLabels, Counter>,
    unanswered: Family<StatusLabels, Counter>,
    share_lookups: Family<ShareLookupLabels, Counter>,
    in_flight: Gauge,
    // Handles on the series every request touches, resolved on first use: a family lookup
    // takes a lock and hashes the labels, on the hot path twice per request. Lazily, so a
    // series appears when first counted, as through the family.
    request_series: [[OnceLock<Counter>; 3]; 3],
    latency_series: [OnceLock<Histogram>; 3],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every metric at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("csi_volume_admission");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("requests", "Admission requests by path and decision", requests.clone());
        // 25 µs to ~1.6 s: sub-millisecond resolution where the answers are expected to land.
        let latency = Family::<EndpointLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_025, 2.0, 17))
        });
        registry.register("request_duration_seconds", "Time from request head to response, by path", latency.clone());
        let cache_objects = Family::<CacheLabels, Gauge>::default();
        registry.register("cache_objects", "Objects held by the lister cache, by kind", cache_objects.clone());
        let cache_synced = Family::<CacheLabels, Gauge>::default();
        registry.register("cache_synced", "1 once the cache of this kind has synced", cache_synced.clone());
        let cache_last_update = Family::<CacheLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cache_last_update_timestamp_seconds",
            "Unix time of the last successful cache update, by kind (staleness = now - this)",
            cache_last_update.clone(),
        );
        let live_lookups = Counter::default();
        registry.register("live_lookups", "Cache misses answered by a live GET", live_lookups.clone());
        let watch_errors = Family::<CacheLabels, Counter>::default();
        registry.register("watch_errors", "Watch failures by kind (each retried with backoff)", watch_errors.clone());
        let tls_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register("tls_reloads", "Serving certificate reloads, by result", tls_reloads.clone());
        let unanswered = Family::<StatusLabels, Counter>::default();
        registry.register(
            "unanswered_requests",
            "Requests answered with an HTTP error instead of an AdmissionReview, by status (their log lines are rate-limited)",
            unanswered.clone(),
        );
        let share_lookups = Family::<ShareLookupLabels, Counter>::default();
        registry.register(
            "share_lookups",
            "SharedResourceAdmission's lookups by question (share, projection, access), how each was served (held: a held answer; joined: waited for another request's question; asked: asked the apiserver) and result (ok, failed)",
            share_lookups.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "requests_in_flight",
            "Webhook requests whose head has arrived and whose answer is not yet written",
            in_flight.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            cache_objects,
            cache_synced,
            cache_last_update,
            live_lookups,
            watch_errors,
            tls_reloads,
            unanswered,
            share_lookups,
            in_flight,
            request_series: Default::default(),
            latency_series: Default::default(),
        }
    }

    /// Counts a request in flight until the returned guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Counts one lookup of SharedResourceAdmission.
    pub fn share_lookup(&self, question: ShareQuestion, served: Served, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        let labels = ShareLookupLabels { question: question.into(), served: served.into(), result };
        self.share_lookups.get_or_create(&labels).inc();
    }

    /// Counts a request answered with an HTTP error status.
    pub fn unanswered(&self, status: u16) {
        self.unanswered.get_or_create(&StatusLabels { status }).inc();
    }

    /// Counts one answered request and its latency.
    pub fn observe_request(&self, path: Endpoint, decision: Decision, seconds: f64) {
        let label = path.into();
        self.request_series[path as usize][decision as usize]
            .get_or_init(|| {
                self.requests.get_or_create(&RequestLabels { path: label, decision: decision.into() }).clone()
            })
            .inc();
        self.latency_series[path as usize]
            .get_or_init(|| self.latency.get_or_create(&EndpointLabels { path: label }).clone())
            .observe(seconds);
    }

    /// Records the size and sync state of a cache.
    pub fn set_cache(&self, kind: CacheKind, objects: usize, synced: bool, updated_unix_seconds: f64) {
        let labels = CacheLabels { kind: kind.into() };
        self.cache_objects.get_or_create(&labels).set(i64::try_from(objects).unwrap_or(i64::MAX));
        self.cache_synced.get_or_create(&labels).set(i64::from(synced));
        self.cache_last_update.get_or_create(&labels).set(updated_unix_seconds);
    }

    /// Counts a cache miss answered by a live lookup.
    pub fn live_lookup(&self) {
        self.live_lookups.inc();
    }

    /// Counts a failed watch.
    pub fn watch_error(&self, kind: CacheKind) {
        self.watch_errors.get_or_create(&CacheLabels { kind: kind.into() }).inc();
    }

    /// Counts a certificate reload.
    pub fn tls_reload(&self, result: ReloadResult) {
        self.tls_reloads.get_or_create(&ReloadLabels { result: result.into() }).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_latency_cache_and_reloads_are_exported() {
        let metrics = Metrics::new();
        metrics.observe_request(Endpoint::Validate, Decision::Denied, 0.0004);
        metrics.set_cache(CacheKind::Namespace, 3, true, 1_700_000_000.0);
        metrics.live_lookup();
        metrics.tls_reload(ReloadResult::Failure);
        metrics.unanswered(429);
        let in_flight = metrics.in_flight();
        assert!(metrics.encode().contains("csi_volume_admission_requests_in_flight 1"));
        drop(in_flight);
        let text = metrics.encode();
        for line in [
            "csi_volume_admission_requests_total{path=\"/validate\",decision=\"denied\"} 1",
            "csi_volume_admission_request_duration_seconds_bucket{le=\"0.0004\",path=\"/validate\"} 1",
            "csi_volume_admission_cache_objects{kind=\"namespace\"} 3",
            "csi_volume_admission_cache_synced{kind=\"namespace\"} 1",
            "csi_volume_admission_live_lookups_total 1",
            "csi_volume_admission_tls_reloads_total{result=\"failure\"} 1",
            "csi_volume_admission_unanswered_requests_total{status=\"429\"} 1",
            "csi_volume_admission_requests_in_flight 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn every_label_value_is_the_one_dashboards_read() {
        let label = |value: &'static str| value;
        let cases: [(&str, &str); 16] = [
            (label(Endpoint::Validate.into()), "/validate"),
            (label(Endpoint::Mutate.into()), "/mutate"),
            (label(Endpoint::Other.into()), "other"),
            (label(Decision::Allowed.into()), "allowed"),
            (label(Decision::Denied.into()), "denied"),
            (label(Decision::Rejected.into()), "rejected"),
            (label(CacheKind::Namespace.into()), "namespace"),
            (label(CacheKind::CsiDriver.into()), "csidriver"),
            (label(ReloadResult::Success.into()), "success"),
            (label(ReloadResult::Failure.into()), "failure"),
            (label(ShareQuestion::Share.into()), "share"),
            (label(ShareQuestion::Projection.into()), "projection"),
            (label(ShareQuestion::Access.into()), "access"),
            (label(Served::Held.into()), "held"),
            (label(Served::Joined.into()), "joined"),
            (label(Served::Asked.into()), "asked"),
        ];
        for (derived, documented) in cases {
            assert_eq!(derived, documented);
        }
        let metrics = Metrics::new();
        metrics.share_lookup(ShareQuestion::Access, Served::Joined, false);
        metrics.set_cache(CacheKind::CsiDriver, 1, false, 0.0);
        let text = metrics.encode();
        for line in [
            "csi_volume_admission_share_lookups_total{question=\"access\",served=\"joined\",result=\"failed\"} 1",
            "csi_volume_admission_cache_synced{kind=\"csidriver\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
