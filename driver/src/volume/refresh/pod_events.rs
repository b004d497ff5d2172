//! What the refresher tells a pod about its volumes' content, and how often: a Normal Event when
//! new content is in place, a Warning when an update could not be applied and the previous
//! content is still served (which kubelet never shows: it only hears of a publish). Each is paced
//! per volume, so a share changing every second, or a failure lasting a day, costs the pod's
//! namespace a bounded number of Events; and each namespace has a bucket of Events of its own,
//! so one whose many volumes all change (its own ConfigMap, churned, behind many projections)
//! cannot spend the driver's apiserver rate that every other namespace's volumes need. The decisions are here; the sink that creates the
//! Events (`crate::volume::refresh::pod_event_sink`) is the I/O at the edge, given to the refresher at start.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sharedresource_api::quote::quote;

use crate::apiserver::rate::TokenBucket;
use crate::volume::live::record::EventPace;
use sharedresource_api::share_kind::{SHARED_CONFIG_MAP_ATTRIBUTE, SHARED_SECRET_ATTRIBUTE};
use sharedresource_api::volume_attributes::{PROJECTION_ATTRIBUTE, PROVIDER_ATTRIBUTE};

/// A new version is told at most this often per volume; changes in between are counted in the
/// next Event.
pub const UPDATED_AT_MOST_EVERY: Duration = Duration::from_secs(10);
/// A failing update is told at most this often per volume while it keeps failing.
pub const NOT_UPDATED_AT_MOST_EVERY: Duration = Duration::from_secs(300);
/// Events a second one namespace's volumes may cost, after a burst of [`NAMESPACE_EVENT_BURST`];
/// an Event beyond is not created (a change is counted in the volume's next Event, a failure
/// told at its next refresh).
pub const NAMESPACE_EVENTS_PER_SECOND: u32 = 1;
/// Events one namespace's volumes may cost at once after a quiet time.
pub const NAMESPACE_EVENT_BURST: u32 = 20;
/// The longest reason quoted from an error in a note (an Event's note holds at most 1 KiB).
const MAX_WHY_BYTES: usize = 600;
/// The longest note, with the `...` a cut adds: within the apiserver's 1 KiB.
const MAX_NOTE_BYTES: usize = 1000;

/// The pod an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

/// One Event to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// The pod it is about.
    pub pod: PodRef,
    /// A Warning (else Normal).
    pub warning: bool,
    /// `ContentUpdated` or `ContentNotUpdated`.
    pub reason: &'static str,
    /// What happened, in the driver's words; never a value of the content.
    pub note: String,
}

/// Where Events go.
pub trait PodEvents: Send + Sync {
    /// Creates `event` (in the background: the refresher never waits for the apiserver).
    fn tell(&self, event: PodEvent);
}

/// No Events: the static source, and tests that do not look for them.
pub struct NoEvents;

impl PodEvents for NoEvents {
    fn tell(&self, _: PodEvent) {}
}

/// What a refresh of a volume did, as its pod may hear of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    /// New content is in place (an update, a revocation that emptied it, a restoration).
    Changed,
    /// The content was current.
    Unchanged,
    /// The content could not be updated; the previous content is served. `why` is the error, in
    /// the words kubelet would show for a publish.
    Failed {
        /// Why.
        why: String,
    },
}

/// One volume as its pod's Events name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeOfPod {
    /// The pod.
    pub pod: PodRef,
    /// The volume's name in the pod (kubelet's directory name for it).
    pub volume: String,
    /// What it mounts: `SharedSecret "db"`, `SharedProjection "app"`, `provider "vault"`.
    pub mounts: String,
}

/// Each namespace's bucket of Events. When each volume was last told of (so each is told at
/// most so often) is kept in its refresh record ([`EventPace`]), with the volume.
#[derive(Debug, Default)]
pub struct EventPacing {
    namespaces: HashMap<String, TokenBucket>,
}

impl EventPacing {
    /// The Event to create for a refresh at `now` of `of`, a volume told of as `paced` says
    /// (updated), if any.
    pub fn event(
        &mut self,
        paced: &mut EventPace,
        of: &VolumeOfPod,
        refreshed: &Refreshed,
        now: Instant,
    ) -> Option<PodEvent> {
        self.forget_quiet(now);
        let (warning, reason, note) = match refreshed {
            Refreshed::Unchanged => {
                paced.failing = None;
                return None;
            }
            Refreshed::Changed => {
                paced.failing = None;
                if paced.updated.is_some_and(|at| now.saturating_duration_since(at) < UPDATED_AT_MOST_EVERY)
                    || !take_namespace_token(&mut self.namespaces, &of.pod.namespace, now)
                {
                    paced.untold += 1;
                    return None;
                }
                let earlier = match std::mem::take(&mut paced.untold) {
                    0 => String::new(),
                    1 => format!(" (after 1 change not told: {PACE})"),
                    n => format!(" (after {n} changes not told: {PACE})"),
                };
                paced.updated = Some(now);
                let note = format!(
                    "volume {:?} ({}): new content is in place{earlier}; the volume's ..data link names each version",
                    of.volume, of.mounts
                );
                (false, "ContentUpdated", note)
            }
            Refreshed::Failed { why } => {
                if paced.failing.is_some_and(|at| now.saturating_duration_since(at) < NOT_UPDATED_AT_MOST_EVERY)
                    || !take_namespace_token(&mut self.namespaces, &of.pod.namespace, now)
                {
                    return None;
                }
                paced.failing = Some(now);
                let why = crate::quote::bounded(why.clone(), MAX_WHY_BYTES);
                let note = format!(
                    "volume {:?} ({}): the content could not be updated and the previous content is still served: {why}",
                    of.volume, of.mounts
                );
                (true, "ContentNotUpdated", note)
            }
        };
        // The apiserver refuses a note over 1 KiB; the volume's name and the share's are
        // bounded, but together with the reason they could reach it.
        let note = crate::quote::bounded(note, MAX_NOTE_BYTES);
        Some(PodEvent { pod: of.pod.clone(), warning, reason, note })
    }

    /// The Event telling `of`'s pod that its volume is served without `absent` (objects it marks
    /// optional that do not exist), at `now`, if its namespace's bucket has room. Told once
    /// when an absence begins (the content source says when), so no per-volume pace.
    pub fn absent(&mut self, of: &VolumeOfPod, absent: &[String], now: Instant) -> Option<PodEvent> {
        self.forget_quiet(now);
        if absent.is_empty() || !take_namespace_token(&mut self.namespaces, &of.pod.namespace, now) {
            return None;
        }
        let what = crate::quote::bounded(absent.join("; "), MAX_WHY_BYTES);
        let note = format!(
            "volume {:?} ({}) is served without what it marks optional, until that exists: {what}",
            of.volume, of.mounts
        );
        let note = crate::quote::bounded(note, MAX_NOTE_BYTES);
        Some(PodEvent { pod: of.pod.clone(), warning: false, reason: "OptionalObjectMissing", note })
    }

    /// Drops the namespaces whose bucket is full again: the map holds no more than the
    /// namespaces told of in the last few seconds.
    fn forget_quiet(&mut self, now: Instant) {
        // A full bucket is what a namespace never seen gets: nothing is lost by forgetting it.
        self.namespaces.retain(|_, bucket| !bucket.is_full(now));
    }
}

/// What the note of an Event after untold changes says of the pace.
const PACE: &str = "Events about a volume come at most every 10 s, and about a namespace's volumes at most 1 a second";

/// Takes a token of `namespace`'s bucket of Events at `now`, if it has one.
fn take_namespace_token(namespaces: &mut HashMap<String, TokenBucket>, namespace: &str, now: Instant) -> bool {
    namespaces
        .entry(namespace.to_owned())
        .or_insert_with(|| TokenBucket::new(NAMESPACE_EVENTS_PER_SECOND, NAMESPACE_EVENT_BURST, now))
        .try_take(now)
}

/// What a volume with `attributes` mounts, for messages: `SharedSecret "db"`, `SharedConfigMap
/// "ca"`, `SharedProjection "app"`, `provider "vault"`; names quoted and bounded.
pub fn mounts(attributes: &std::collections::BTreeMap<String, String>) -> String {
    let named = [
        (SHARED_SECRET_ATTRIBUTE, "SharedSecret"),
        (SHARED_CONFIG_MAP_ATTRIBUTE, "SharedConfigMap"),
        (PROJECTION_ATTRIBUTE, "SharedProjection"),
        (PROVIDER_ATTRIBUTE, "provider"),
    ];
    named
        .iter()
        .find_map(|(attribute, kind)| attributes.get(*attribute).map(|name| format!("{kind} {}", quote(name))))
        .unwrap_or_else(|| "its content".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pacing with each volume's pace by id, as the live table keeps them (one per entry).
    #[derive(Default)]
    struct Paced {
        pacing: EventPacing,
        volumes: HashMap<String, EventPace>,
    }

    impl Paced {
        fn event(
            &mut self,
            volume_id: &str,
            of: &VolumeOfPod,
            refreshed: &Refreshed,
            now: Instant,
        ) -> Option<PodEvent> {
            let paced = self.volumes.entry(volume_id.to_string()).or_default();
            self.pacing.event(paced, of, refreshed, now)
        }

        fn absent(&mut self, of: &VolumeOfPod, absent: &[String], now: Instant) -> Option<PodEvent> {
            self.pacing.absent(of, absent, now)
        }

        /// The volume is unpublished: its pace goes with its entry.
        fn forget(&mut self, volume_id: &str) {
            self.volumes.remove(volume_id);
        }
    }

    fn of() -> VolumeOfPod {
        VolumeOfPod {
            pod: PodRef { namespace: "team-a".into(), name: "web".into(), uid: "u-1".into() },
            volume: "db".into(),
            mounts: "SharedSecret \"db\"".into(),
        }
    }

    fn failed(why: &str) -> Refreshed {
        Refreshed::Failed { why: why.into() }
    }

    #[test]
    fn an_absence_is_told_in_a_normal_event_within_the_namespaces_bucket() {
        let mut pacing = Paced::default();
        let start = Instant::now();
        let absent = ["Secret infra/db, shared by SharedSecret \"db\", not found".to_string()];
        assert_eq!(
            pacing.absent(&of(), &absent, start),
            Some(PodEvent {
                pod: of().pod,
                warning: false,
                reason: "OptionalObjectMissing",
                note: "volume \"db\" (SharedSecret \"db\") is served without what it marks optional, until that \
                       exists: Secret infra/db, shared by SharedSecret \"db\", not found"
                    .into(),
            })
        );
        assert_eq!(pacing.absent(&of(), &[], start), None, "nothing lacking, nothing told");
        for _ in 1..NAMESPACE_EVENT_BURST {
            assert!(pacing.absent(&of(), &absent, start).is_some());
        }
        assert_eq!(pacing.absent(&of(), &absent, start), None, "the namespace's bucket is spent");
        let mut elsewhere = of();
        elsewhere.pod.namespace = "team-b".into();
        assert!(pacing.absent(&elsewhere, &absent, start).is_some(), "another namespace's is not");
    }

    #[test]
    fn a_change_is_told_then_at_most_every_ten_seconds_counting_what_was_not() {
        let mut pacing = Paced::default();
        let start = Instant::now();
        let first = pacing.event("v", &of(), &Refreshed::Changed, start).unwrap();
        assert_eq!(
            first,
            PodEvent {
                pod: of().pod,
                warning: false,
                reason: "ContentUpdated",
                note: "volume \"db\" (SharedSecret \"db\"): new content is in place; the volume's ..data link names each version"
                    .into(),
            }
        );
        assert_eq!(pacing.event("v", &of(), &Refreshed::Changed, start + Duration::from_secs(3)), None);
        assert_eq!(pacing.event("v", &of(), &Refreshed::Changed, start + Duration::from_secs(6)), None);
        assert_eq!(pacing.event("v", &of(), &Refreshed::Unchanged, start + Duration::from_secs(8)), None);
        let next = pacing.event("v", &of(), &Refreshed::Changed, start + UPDATED_AT_MOST_EVERY).unwrap();
        assert_eq!(
            next.note,
            "volume \"db\" (SharedSecret \"db\"): new content is in place (after 2 changes not told: Events about a \
             volume come at most every 10 s, and about a namespace's volumes at most 1 a second); the volume's ..data \
             link names each version"
        );
        // Another volume of the same pod has its own pace.
        assert!(pacing.event("w", &of(), &Refreshed::Changed, start + Duration::from_secs(11)).is_some());
    }

    #[test]
    fn a_failure_is_told_at_once_then_every_five_minutes_while_it_lasts_and_again_after_a_recovery() {
        let mut pacing = Paced::default();
        let start = Instant::now();
        let warning = pacing.event("v", &of(), &failed("the content (70 KiB) does not fit"), start).unwrap();
        assert!(warning.warning);
        assert_eq!(warning.reason, "ContentNotUpdated");
        assert_eq!(
            warning.note,
            "volume \"db\" (SharedSecret \"db\"): the content could not be updated and the previous content is still \
             served: the content (70 KiB) does not fit"
        );
        assert_eq!(pacing.event("v", &of(), &failed("again"), start + Duration::from_secs(299)), None);
        assert!(pacing.event("v", &of(), &failed("again"), start + NOT_UPDATED_AT_MOST_EVERY).is_some());
        // Recovered (unchanged content read fine), then failing anew: told at once.
        let later = start + NOT_UPDATED_AT_MOST_EVERY + Duration::from_secs(1);
        assert_eq!(pacing.event("v", &of(), &Refreshed::Unchanged, later), None);
        assert!(pacing.event("v", &of(), &failed("anew"), later + Duration::from_secs(1)).is_some());
    }

    #[test]
    fn a_long_reason_is_cut_and_a_forgotten_volume_starts_afresh() {
        let mut pacing = Paced::default();
        let start = Instant::now();
        let warning = pacing.event("v", &of(), &failed(&"y".repeat(10_000)), start).unwrap();
        assert!(warning.note.len() < 1024, "an Event's note holds 1 KiB: {}", warning.note.len());
        let long = VolumeOfPod { volume: "v".repeat(253), mounts: "m".repeat(400), ..of() };
        let warning = pacing.event("w", &long, &failed(&"y".repeat(10_000)), start).unwrap();
        assert!(warning.note.len() <= 1024, "names at their longest still fit: {}", warning.note.len());
        assert!(pacing.event("v", &of(), &Refreshed::Changed, start).is_some());
        assert!(pacing.event("v", &of(), &Refreshed::Changed, start + Duration::from_secs(1)).is_none());
        pacing.forget("v");
        assert!(pacing.event("v", &of(), &Refreshed::Changed, start + Duration::from_secs(2)).is_some());
    }

    #[test]
    fn namespaces_whose_bucket_filled_again_are_not_kept() {
        let mut pacing = Paced::default();
        let start = Instant::now();
        for n in 0..100 {
            pacing.event(&format!("v{n}"), &of_namespace(&format!("n{n}")), &Refreshed::Changed, start);
        }
        assert_eq!(pacing.pacing.namespaces.len(), 100);
        pacing.event("last", &of(), &Refreshed::Changed, start + NOT_UPDATED_AT_MOST_EVERY);
        assert_eq!(pacing.pacing.namespaces.len(), 1, "only the namespace just told of");
    }

    fn of_namespace(namespace: &str) -> VolumeOfPod {
        VolumeOfPod { pod: PodRef { namespace: namespace.into(), ..of().pod }, ..of() }
    }

    /// One namespace's thousand volumes all changing every second for a minute cost it the
    /// burst and then one Event a second, while another namespace's volume is told every time.
    #[test]
    fn one_namespace_flooding_gets_its_bucket_and_another_is_told_on() {
        let mut pacing = Paced::default();
        let start = Instant::now();
        let (mut flood, mut other) = (0, 0);
        for second in 0..60u64 {
            let now = start + Duration::from_secs(second);
            for n in 0..1000 {
                flood +=
                    usize::from(pacing.event(&format!("a{n}"), &of_namespace("a"), &Refreshed::Changed, now).is_some());
            }
            if second % 10 == 0 {
                other += usize::from(pacing.event("b", &of_namespace("b"), &Refreshed::Changed, now).is_some());
            }
        }
        let bound = NAMESPACE_EVENT_BURST as usize + 59 * NAMESPACE_EVENTS_PER_SECOND as usize;
        assert_eq!(flood, bound, "the flooding namespace's Events: the burst, then one a second");
        assert_eq!(other, 6, "the other namespace's volume, changing every 10 s, told each time");
    }

    /// A failure the namespace's bucket had no room for is told at the volume's next refresh.
    #[test]
    fn a_failure_dropped_for_the_namespace_is_told_at_the_next_refresh() {
        let mut pacing = Paced::default();
        let start = Instant::now();
        for n in 0..NAMESPACE_EVENT_BURST {
            assert!(pacing.event(&format!("v{n}"), &of(), &Refreshed::Changed, start).is_some());
        }
        assert_eq!(pacing.event("f", &of(), &failed("too large"), start), None);
        assert_eq!(pacing.event("c", &of(), &Refreshed::Changed, start), None);
        assert!(pacing.event("f", &of(), &failed("too large"), start + Duration::from_secs(1)).is_some());
        // The change not told is kept (however quiet the volume) and counted when it is told.
        let later = start + NOT_UPDATED_AT_MOST_EVERY;
        let told = pacing.event("c", &of(), &Refreshed::Changed, later).unwrap();
        assert!(told.note.contains("(after 1 change not told: "), "{}", told.note);
    }

    #[test]
    fn what_a_volume_mounts_is_named_by_its_selecting_attribute() {
        let attributes = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(mounts(&attributes(&[("sharedSecret", "db"), ("refreshResource", "true")])), "SharedSecret \"db\"");
        assert_eq!(mounts(&attributes(&[("sharedConfigMap", "ca")])), "SharedConfigMap \"ca\"");
        assert_eq!(mounts(&attributes(&[("projection", "app")])), "SharedProjection \"app\"");
        assert_eq!(mounts(&attributes(&[("provider", "vault"), ("role", "x")])), "provider \"vault\"");
        assert_eq!(mounts(&attributes(&[("share", "demo")])), "its content");
    }
}
