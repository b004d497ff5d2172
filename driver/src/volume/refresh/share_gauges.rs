//! Per-share gauges, for the dashboards users already have for secret drivers: for each thing
//! this node's volumes mount (a SharedSecret, a SharedConfigMap, a SharedProjection, a
//! provider), how many volumes mount it, when one of them was last refreshed successfully, and
//! for how long the stalest of them has been serving content it could not update. Read from the
//! node's table of live volumes and their refresh records (`record`): nothing is kept here, so a
//! volume's series goes with its entry. Pure: the clock is passed in, and the refresher writes
//! the series into the metrics.
//!
//! Cardinality is bounded three times: one series per thing a volume of this node mounts (so no
//! more than the node's volumes); at most [`MAX_SERIES`] of them, shares and providers (made by
//! the cluster's operators) named first and tenants' projections after them, so no tenant's
//! projections can push a share out of sight; and at most [`MAX_PER_NAMESPACE`] projections of
//! one namespace. Beyond, volumes are counted under the name [`OTHERS`] of their kind (and, for
//! a namespace's projections, of their namespace).

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use sharedresource_api::Selection;
use sharedresource_api::volume_attributes::selection;

pub use crate::metrics::{Mounted, Series};
use crate::volume::live::record::RefreshRecord;

/// The most series of each gauge: things mounted beyond it are counted under [`OTHERS`].
pub const MAX_SERIES: usize = 500;
/// The most projections of one namespace named in the series: the rest of that namespace's are
/// counted under [`OTHERS`] in it.
pub const MAX_PER_NAMESPACE: usize = 20;
/// The name the volumes beyond [`MAX_SERIES`] (or [`MAX_PER_NAMESPACE`]) are counted under.
pub const OTHERS: &str = "(others)";

/// Where a kind's series come in the bound: the operators' shares and providers before the
/// tenants' projections.
fn rank(kind: &str) -> u8 {
    match kind {
        "SharedProjection" => 1,
        _ => 0,
    }
}

impl Mounted {
    /// What a volume with `attributes` in a pod of `namespace` mounts; `None` when the
    /// attributes name nothing valid (such a volume is never published).
    pub fn of(attributes: &BTreeMap<String, String>, namespace: &str) -> Option<Mounted> {
        let (kind, namespace, name) = match selection(attributes).ok()? {
            Selection::Share(kind, name) => (kind.kind(), String::new(), name),
            Selection::Projection(name) => ("SharedProjection", namespace.to_string(), name),
            Selection::Provider(name) => ("provider", String::new(), name),
        };
        Some(Mounted { kind, namespace, name: name.as_str().to_string() })
    }
}

/// The series at `now` of `volumes` (what each live volume mounts, and what its refreshes did):
/// one per thing mounted, shares and providers first, then projections, each by kind and name;
/// the first [`MAX_SERIES`] named (at most [`MAX_PER_NAMESPACE`] projections of one namespace),
/// the rest summed under [`OTHERS`] of their kind (and namespace, for a namespace's projections
/// beyond its part).
pub fn series(volumes: &[(Mounted, RefreshRecord)], now: SystemTime) -> BTreeMap<Mounted, Series> {
    let mut by_mounted: BTreeMap<(u8, &Mounted), Vec<&RefreshRecord>> = BTreeMap::new();
    for (mounted, record) in volumes {
        by_mounted.entry((rank(mounted.kind), mounted)).or_default().push(record);
    }
    let mut series: BTreeMap<Mounted, Series> = BTreeMap::new();
    let mut per_namespace: HashMap<&str, usize> = HashMap::new();
    let mut named = 0;
    for ((_, mounted), volumes) in by_mounted {
        let of_namespace = per_namespace.entry(mounted.namespace.as_str()).or_default();
        let key = if named >= MAX_SERIES {
            Mounted { kind: mounted.kind, namespace: String::new(), name: OTHERS.to_string() }
        } else if !mounted.namespace.is_empty() && *of_namespace >= MAX_PER_NAMESPACE {
            Mounted { kind: mounted.kind, namespace: mounted.namespace.clone(), name: OTHERS.to_string() }
        } else {
            named += 1;
            *of_namespace += 1;
            mounted.clone()
        };
        let entry = series.entry(key).or_insert(Series { volumes: 0, last_refresh_seconds: 0.0, stale_seconds: 0.0 });
        for record in volumes {
            entry.volumes += 1;
            entry.last_refresh_seconds = entry.last_refresh_seconds.max(unix_seconds(record.current_since));
            let stale = record.failing.as_ref().map_or(0.0, |failing| seconds_between(failing.since, now));
            entry.stale_seconds = entry.stale_seconds.max(stale);
        }
    }
    series
}

fn unix_seconds(at: SystemTime) -> f64 {
    seconds_between(SystemTime::UNIX_EPOCH, at)
}

/// Seconds from `from` to `to`; 0 when the clock went back.
fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from).map_or(0.0, |elapsed| elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::volume::live::record::Failing;

    fn share(name: &str) -> Mounted {
        Mounted { kind: "SharedSecret", namespace: String::new(), name: name.into() }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn what_a_volume_mounts_is_named_by_its_attributes() {
        let attributes = |key: &str, value: &str| BTreeMap::from([(key.to_string(), value.to_string())]);
        assert_eq!(Mounted::of(&attributes("sharedSecret", "db"), "team-a"), Some(share("db")));
        assert_eq!(
            Mounted::of(&attributes("projection", "app"), "team-a"),
            Some(Mounted { kind: "SharedProjection", namespace: "team-a".into(), name: "app".into() })
        );
        assert_eq!(Mounted::of(&attributes("provider", "vault"), "team-a").map(|m| m.kind), Some("provider"));
        assert_eq!(Mounted::of(&attributes("sharedSecret", "Not A Name"), "team-a"), None);
    }

    fn current(since: u64) -> RefreshRecord {
        RefreshRecord::new(at(since))
    }

    fn failing(current: u64, since: u64) -> RefreshRecord {
        RefreshRecord { failing: Some(Failing { since: at(since), why: "too large".into() }), ..self::current(current) }
    }

    #[test]
    fn each_share_counts_its_volumes_its_last_refresh_and_its_stalest_failure() {
        let volumes = vec![(share("db"), current(160)), (share("db"), failing(100, 170)), (share("ca"), current(100))];
        let series = series(&volumes, at(250));
        assert_eq!(
            series[&share("db")],
            Series { volumes: 2, last_refresh_seconds: 160.0, stale_seconds: 80.0 },
            "one fails since 170"
        );
        assert_eq!(series[&share("ca")], Series { volumes: 1, last_refresh_seconds: 100.0, stale_seconds: 0.0 });
        assert_eq!(series.len(), 2);
        assert!(super::series(&[], at(250)).is_empty(), "no volume, no series: an unpublished one's goes");
    }

    #[test]
    fn the_series_are_bounded_the_rest_counted_under_others() {
        let live: Vec<_> = (0..MAX_SERIES + 10).map(|i| (share(&format!("s{i:04}")), current(100))).collect();
        let series = series(&live, at(100));
        assert_eq!(series.len(), MAX_SERIES + 1);
        let others = Mounted { kind: "SharedSecret", namespace: String::new(), name: OTHERS.into() };
        assert_eq!(series[&others].volumes, 10);
        assert_eq!(series.values().map(|s| s.volumes).sum::<u64>(), (MAX_SERIES + 10) as u64);
    }

    #[test]
    fn a_tenants_projections_neither_hide_a_share_nor_take_another_namespaces_series() {
        let projection =
            |namespace: &str, name: String| Mounted { kind: "SharedProjection", namespace: namespace.into(), name };
        let mut live: Vec<(Mounted, RefreshRecord)> =
            (0..MAX_SERIES + 50).map(|i| (projection("flood", format!("p{i:04}")), current(100))).collect();
        live.push((projection("calm", "app".into()), current(100)));
        live.extend((0..10).map(|i| (share(&format!("zz-share-{i}")), current(100))));
        let series = series(&live, at(100));
        for i in 0..10 {
            assert_eq!(series[&share(&format!("zz-share-{i}"))].volumes, 1, "every share is named");
        }
        assert_eq!(series[&projection("calm", "app".into())].volumes, 1, "another namespace's projection is named");
        let flood_named = series.keys().filter(|m| m.namespace == "flood" && m.name != OTHERS).count();
        assert_eq!(flood_named, MAX_PER_NAMESPACE);
        assert_eq!(series[&projection("flood", OTHERS.into())].volumes, (MAX_SERIES + 50 - MAX_PER_NAMESPACE) as u64);
        assert_eq!(series.values().map(|s| s.volumes).sum::<u64>(), (MAX_SERIES + 50 + 1 + 10) as u64);
    }
}
