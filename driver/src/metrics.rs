//! What the driver counts, exported in OpenMetrics text on its health port: publishes and
//! unpublishes by result, their failures and refreshes' by kind (`error_type`), access checks by
//! result, refreshes and revocations, volumes published, watch errors, the publish latency, and
//! per-share gauges (volumes, last refresh, seconds stale: what is mounted ([`Mounted`]) and its
//! values ([`Series`]), as the refresher computes them).
//! docs/driver.md maps them to the Secrets Store CSI Driver's metrics.

use std::collections::{BTreeMap, HashSet};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::unpoisoned::UnpoisonedMutex;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabels {
    /// One of the closed set the domain errors name (`csi::error::Error::error_type`).
    error_type: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// What a per-share gauge is about: a share, a projection (with its namespace) or a provider.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ShareLabels {
    kind: &'static str,
    namespace: String,
    name: String,
}

/// A gauge of seconds.
type Seconds = Gauge<f64, std::sync::atomic::AtomicU64>;

/// An access check's answer; its label is the variant's name in snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum AccessResult {
    /// The service account may use the share.
    Allowed,
    /// It may not.
    Denied,
    /// The apiserver could not be asked.
    Failed,
}

/// What a refresh did to one volume; its label is the variant's name in snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum RefreshResult {
    /// New content was written.
    Changed,
    /// The content was already current.
    Unchanged,
    /// The content could not be computed or written; the previous content stays.
    Failed,
}

/// How a CSI call was answered: `ok`, or the gRPC code's name in snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CallResult {
    /// Answered with success.
    Ok,
    /// INVALID_ARGUMENT.
    InvalidArgument,
    /// NOT_FOUND.
    NotFound,
    /// PERMISSION_DENIED.
    PermissionDenied,
    /// ALREADY_EXISTS.
    AlreadyExists,
    /// FAILED_PRECONDITION.
    FailedPrecondition,
    /// ABORTED.
    Aborted,
    /// UNAVAILABLE.
    Unavailable,
    /// RESOURCE_EXHAUSTED.
    ResourceExhausted,
    /// INTERNAL, and any code the driver does not send.
    Internal,
}

impl CallResult {
    /// The result of a call answered with `code` (`None`: success).
    pub fn of(code: Option<tonic::Code>) -> CallResult {
        use tonic::Code;
        match code {
            None => CallResult::Ok,
            Some(Code::InvalidArgument) => CallResult::InvalidArgument,
            Some(Code::NotFound) => CallResult::NotFound,
            Some(Code::PermissionDenied) => CallResult::PermissionDenied,
            Some(Code::AlreadyExists) => CallResult::AlreadyExists,
            Some(Code::FailedPrecondition) => CallResult::FailedPrecondition,
            Some(Code::Aborted) => CallResult::Aborted,
            Some(Code::Unavailable) => CallResult::Unavailable,
            Some(Code::ResourceExhausted) => CallResult::ResourceExhausted,
            Some(_) => CallResult::Internal,
        }
    }
}

/// Every metric of the driver.
pub struct Metrics {
    registry: Registry,
    publishes: Family<ResultLabels, Counter>,
    unpublishes: Family<ResultLabels, Counter>,
    publish_errors: Family<ErrorLabels, Counter>,
    unpublish_errors: Family<ErrorLabels, Counter>,
    refresh_errors: Family<ErrorLabels, Counter>,
    access_checks: Family<ResultLabels, Counter>,
    refreshes: Family<ResultLabels, Counter>,
    revocations: Counter,
    volumes: Gauge,
    stale_volumes: Gauge,
    content_bytes: Gauge,
    notices_heard: Gauge,
    watch_errors: Family<KindLabels, Counter>,
    publish_seconds: Histogram,
    share_volumes: Family<ShareLabels, Gauge>,
    share_last_refresh: Family<ShareLabels, Seconds>,
    share_stale: Family<ShareLabels, Seconds>,
    /// The per-share series written last, so those that went can be removed.
    share_labels: std::sync::Mutex<HashSet<ShareLabels>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sharedresource_csi_driver");
        let publishes = Family::<ResultLabels, Counter>::default();
        registry.register("publishes", "NodePublishVolume calls by result (a gRPC code, or ok)", publishes.clone());
        let unpublishes = Family::<ResultLabels, Counter>::default();
        registry.register("unpublishes", "NodeUnpublishVolume calls by result", unpublishes.clone());
        let publish_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "publish_errors",
            "NodePublishVolume calls that failed, by the kind of failure",
            publish_errors.clone(),
        );
        let unpublish_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "unpublish_errors",
            "NodeUnpublishVolume calls that failed, by the kind of failure",
            unpublish_errors.clone(),
        );
        let refresh_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "refresh_errors",
            "Volume refreshes that failed (the volume keeps its content), by the kind of failure",
            refresh_errors.clone(),
        );
        let access_checks = Family::<ResultLabels, Counter>::default();
        registry.register(
            "access_checks",
            "SubjectAccessReviews by answer: allowed, denied, failed",
            access_checks.clone(),
        );
        let refreshes = Family::<ResultLabels, Counter>::default();
        registry.register("refreshes", "Volumes refreshed, by result: changed, unchanged, failed", refreshes.clone());
        let revocations = Counter::default();
        registry.register(
            "revocations",
            "Volumes emptied because access, the share or its object went away",
            revocations.clone(),
        );
        let volumes = Gauge::default();
        registry.register("volumes_published", "Volumes published on this node", volumes.clone());
        let stale_volumes = Gauge::default();
        registry.register(
            "volumes_stale",
            "Volumes whose last refresh failed: they serve older content until a refresh succeeds",
            stale_volumes.clone(),
        );
        let content_bytes = Gauge::default();
        registry.register(
            "content_bytes",
            "Memory the volumes' content costs the driver (tmpfs pages and inodes, as the content budget counts \
             them; versions being written included)",
            content_bytes.clone(),
        );
        let notices_heard = Gauge::default();
        registry.register(
            "access_notices_heard",
            "1 while grant changes reach this node through its SharedResourceNode (the notices' lease renewed, \
             its object current); 0 while it checks every access answer again on its own",
            notices_heard.clone(),
        );
        let watch_errors = Family::<KindLabels, Counter>::default();
        registry.register("watch_errors", "Watch failures by kind (each retried with backoff)", watch_errors.clone());
        // 100 µs to ~3 s.
        let publish_seconds = Histogram::new(exponential_buckets(0.000_1, 2.0, 15));
        registry.register("publish_duration_seconds", "Time to answer a NodePublishVolume", publish_seconds.clone());
        let share_volumes = Family::<ShareLabels, Gauge>::default();
        registry.register(
            "share_volumes",
            "Volumes on this node mounting each share, projection or provider (at most 500 series, shares and \
             providers first, 20 projections of a namespace; the rest under name \"(others)\")",
            share_volumes.clone(),
        );
        let share_last_refresh = Family::<ShareLabels, Seconds>::default();
        registry.register(
            "share_last_refresh_timestamp_seconds",
            "When a volume of each share, projection or provider was last refreshed successfully (or published)",
            share_last_refresh.clone(),
        );
        let share_stale = Family::<ShareLabels, Seconds>::default();
        registry.register(
            "share_stale_seconds",
            "How long the stalest volume of each share, projection or provider has failed to refresh, serving older \
             content (0 while none fails)",
            share_stale.clone(),
        );
        Metrics {
            registry,
            publishes,
            unpublishes,
            publish_errors,
            unpublish_errors,
            refresh_errors,
            access_checks,
            refreshes,
            revocations,
            volumes,
            stale_volumes,
            content_bytes,
            notices_heard,
            watch_errors,
            publish_seconds,
            share_volumes,
            share_last_refresh,
            share_stale,
            share_labels: std::sync::Mutex::default(),
        }
    }

    /// Replaces the per-share gauges with `series`.
    pub fn set_share_series(&self, series: &BTreeMap<Mounted, Series>) {
        let labels_of = |mounted: &Mounted| ShareLabels {
            kind: mounted.kind,
            namespace: mounted.namespace.clone(),
            name: mounted.name.clone(),
        };
        let wanted: HashSet<ShareLabels> = series.keys().map(labels_of).collect();
        // Series that went are removed one by one, never the families cleared: a scrape between
        // a clear and the writes would see every share vanish for a moment.
        let mut written = self.share_labels.locked();
        for gone in written.difference(&wanted) {
            self.share_volumes.remove(gone);
            self.share_last_refresh.remove(gone);
            self.share_stale.remove(gone);
        }
        for (mounted, values) in series {
            let labels = labels_of(mounted);
            self.share_volumes.get_or_create(&labels).set(i64::try_from(values.volumes).unwrap_or(i64::MAX));
            self.share_last_refresh.get_or_create(&labels).set(values.last_refresh_seconds);
            self.share_stale.get_or_create(&labels).set(values.stale_seconds);
        }
        *written = wanted;
    }

    /// Counts a publish answered with `result` after `seconds`, and its failure's kind.
    pub fn publish(&self, result: CallResult, error_type: Option<&'static str>, seconds: f64) {
        self.publishes.get_or_create(&ResultLabels { result: result.into() }).inc();
        count_error(&self.publish_errors, error_type);
        self.publish_seconds.observe(seconds);
    }

    /// Counts an unpublish answered with `result`, and its failure's kind.
    pub fn unpublish(&self, result: CallResult, error_type: Option<&'static str>) {
        self.unpublishes.get_or_create(&ResultLabels { result: result.into() }).inc();
        count_error(&self.unpublish_errors, error_type);
    }

    /// Counts an access check.
    pub fn access_check(&self, result: AccessResult) {
        self.access_checks.get_or_create(&ResultLabels { result: result.into() }).inc();
    }

    /// Counts a volume refreshed, and a failure's kind.
    pub fn refresh(&self, result: RefreshResult, error_type: Option<&'static str>) {
        self.refreshes.get_or_create(&ResultLabels { result: result.into() }).inc();
        count_error(&self.refresh_errors, error_type);
    }

    /// Counts a volume emptied by a refresh.
    pub fn revocation(&self) {
        self.revocations.inc();
    }

    /// Sets how many volumes are published.
    pub fn set_volumes(&self, count: usize) {
        self.volumes.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Sets how many volumes' last refresh failed.
    pub fn set_stale_volumes(&self, count: usize) {
        self.stale_volumes.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Sets what the volumes' content costs the driver's memory.
    pub fn set_content_bytes(&self, bytes: u64) {
        self.content_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets whether grant changes reach this node through its notices.
    pub fn set_notices_heard(&self, heard: bool) {
        self.notices_heard.set(i64::from(heard));
    }

    /// Counts a failed watch of `kind`.
    pub fn watch_error(&self, kind: &str) {
        self.watch_errors.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

fn count_error(family: &Family<ErrorLabels, Counter>, error_type: Option<&'static str>) {
    if let Some(error_type) = error_type {
        family.get_or_create(&ErrorLabels { error_type }).inc();
    }
}

/// What a volume mounts, as the gauges' labels name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mounted {
    /// `SharedSecret`, `SharedConfigMap`, `SharedProjection` or `provider`.
    pub kind: &'static str,
    /// The projection's namespace; empty for shares (cluster-scoped) and providers.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// One thing mounted: its gauges' values.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Volumes of this node mounting it.
    pub volumes: u64,
    /// When one of them was last refreshed successfully (or published, if none has been
    /// refreshed since), in seconds since the Unix epoch.
    pub last_refresh_seconds: f64,
    /// How long the stalest of them has been failing to refresh, serving the content it had
    /// (0 while none fails).
    pub stale_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shares_series_goes_when_it_is_no_longer_written_and_the_others_stay() {
        let metrics = Metrics::new();
        let mounted = |name: &str| Mounted { kind: "SharedSecret", namespace: String::new(), name: name.into() };
        let series = |volumes| Series { volumes, last_refresh_seconds: 100.0, stale_seconds: 0.0 };
        metrics.set_share_series(&BTreeMap::from([(mounted("db"), series(2)), (mounted("ca"), series(1))]));
        let db = "sharedresource_csi_driver_share_volumes{kind=\"SharedSecret\",namespace=\"\",name=\"db\"} 2";
        let ca = "sharedresource_csi_driver_share_volumes{kind=\"SharedSecret\",namespace=\"\",name=\"ca\"}";
        assert!(metrics.encode().contains(db) && metrics.encode().contains(ca), "{}", metrics.encode());
        metrics.set_share_series(&BTreeMap::from([(mounted("db"), series(2))]));
        let text = metrics.encode();
        assert!(text.contains(db) && !text.contains(ca), "{text}");
    }

    #[test]
    fn every_metric_is_exported_with_its_labels() {
        let metrics = Metrics::new();
        metrics.publish(CallResult::of(None), None, 0.002);
        metrics.publish(CallResult::of(Some(tonic::Code::PermissionDenied)), Some("AccessDenied"), 0.001);
        metrics.publish(CallResult::of(Some(tonic::Code::ResourceExhausted)), Some("OverBudget"), 0.001);
        metrics.unpublish(CallResult::Ok, None);
        metrics.unpublish(CallResult::InvalidArgument, Some("TargetRefused"));
        metrics.access_check(AccessResult::Denied);
        metrics.refresh(RefreshResult::Changed, None);
        metrics.refresh(RefreshResult::Failed, Some("ApiserverUnavailable"));
        metrics.revocation();
        metrics.set_volumes(3);
        metrics.watch_error("Secret");
        let text = metrics.encode();
        assert_eq!(text.matches("{error_type=").count(), 4, "a success counts no error:\n{text}");
        for line in [
            "sharedresource_csi_driver_publishes_total{result=\"ok\"} 1",
            "sharedresource_csi_driver_publishes_total{result=\"permission_denied\"} 1",
            "sharedresource_csi_driver_publishes_total{result=\"resource_exhausted\"} 1",
            "sharedresource_csi_driver_unpublishes_total{result=\"ok\"} 1",
            "sharedresource_csi_driver_publish_errors_total{error_type=\"AccessDenied\"} 1",
            "sharedresource_csi_driver_publish_errors_total{error_type=\"OverBudget\"} 1",
            "sharedresource_csi_driver_unpublish_errors_total{error_type=\"TargetRefused\"} 1",
            "sharedresource_csi_driver_refresh_errors_total{error_type=\"ApiserverUnavailable\"} 1",
            "sharedresource_csi_driver_refreshes_total{result=\"failed\"} 1",
            "sharedresource_csi_driver_access_checks_total{result=\"denied\"} 1",
            "sharedresource_csi_driver_refreshes_total{result=\"changed\"} 1",
            "sharedresource_csi_driver_revocations_total 1",
            "sharedresource_csi_driver_volumes_published 3",
            "sharedresource_csi_driver_watch_errors_total{kind=\"Secret\"} 1",
            "sharedresource_csi_driver_publish_duration_seconds_count 3",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
