//! Event series: the repeats of one pod's Event (the same reason and the same note) within a few
//! minutes become one Event whose `series` counts them, as client-go's events library keeps
//! them (a repeat within 6 minutes of the last is counted, and the count written at most every
//! 30 s). So a tenant's volume whose content changes all the time costs its pod one Event and a
//! patch every half minute, not an Event each time. The note is part of what makes a repeat
//! (client-go's key has no note): a pod's volumes, and the different objects an optional volume
//! lacks, are told apart in the notes, and folding them would hide all but the first. The
//! decisions are here; the sink (`crate::volume::refresh::pod_event_sink`) creates and patches.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher as _;
use std::time::{Duration, Instant};

/// How long a series stays open after its last repeat (client-go's 6 minutes): a repeat later
/// than that starts a new Event.
pub const SERIES_OPEN_FOR: Duration = Duration::from_secs(6 * 60);
/// A series' count is written at most this often (client-go's 30 s).
pub const SERIES_WRITTEN_EVERY: Duration = Duration::from_secs(30);
/// The most series kept open. Beyond, an Event is created without one: each namespace's bucket
/// of Events still bounds them (`pod_events.rs`), and this bounds what the driver keeps.
pub const MAX_OPEN_SERIES: usize = 4096;
/// The most series one namespace's pods keep open, so one namespace cannot take the table from
/// the others (its Events are also paced by its own bucket: about one a second).
pub const MAX_OPEN_SERIES_PER_NAMESPACE: usize = 512;

/// What to write for an Event seen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeriesWrite {
    /// A new Event, under the name offered.
    Create,
    /// The Event `name` in `namespace` counts `count` occurrences, the last now: a patch of
    /// its `series`.
    Count {
        /// The Event's namespace.
        namespace: String,
        /// The Event's name.
        name: String,
        /// Every occurrence so far, the first included (the apiserver wants at least 2).
        count: u32,
    },
    /// Nothing now: counted, and written with the series' next write.
    Later,
}

/// One open series: the Event that began it and what is counted.
#[derive(Debug)]
struct Series {
    namespace: String,
    name: String,
    count: u32,
    last_seen: Instant,
    written: Instant,
    unwritten: bool,
}

/// The open series, by pod uid, reason and a digest of the note (keyed per process, so the
/// table holds 8 bytes per note, not the note's up to 1 000).
#[derive(Debug, Default)]
pub struct EventSeries {
    open: HashMap<(String, &'static str, u64), Series>,
    notes: RandomState,
}

/// An Event as the series know it: its pod, reason, note and the name a new one would have.
#[derive(Debug, Clone, Copy)]
pub struct Occurrence<'a> {
    /// The pod's uid.
    pub uid: &'a str,
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's note.
    pub note: &'a str,
    /// The name a new Event would be created under.
    pub name: &'a str,
}

impl EventSeries {
    /// What to write for `event`, seen at `now`.
    pub fn seen(&mut self, event: Occurrence<'_>, now: Instant) -> SeriesWrite {
        self.close_quiet(now);
        let key = (event.uid.to_string(), event.reason, self.notes.hash_one(event.note));
        if let Some(series) = self.open.get_mut(&key) {
            series.count = series.count.saturating_add(1);
            series.last_seen = now;
            if now.saturating_duration_since(series.written) < SERIES_WRITTEN_EVERY {
                series.unwritten = true;
                return SeriesWrite::Later;
            }
            return written(series, now);
        }
        let of_namespace = || self.open.values().filter(|series| series.namespace == event.namespace).count();
        if self.open.len() < MAX_OPEN_SERIES && of_namespace() < MAX_OPEN_SERIES_PER_NAMESPACE {
            let series = Series {
                namespace: event.namespace.to_string(),
                name: event.name.to_string(),
                count: 1,
                last_seen: now,
                written: now,
                unwritten: false,
            };
            self.open.insert(key, series);
        }
        SeriesWrite::Create
    }

    /// The counts not written yet whose last write is [`SERIES_WRITTEN_EVERY`] old at `now`:
    /// what a periodic flush writes, so a series' last repeats are written even if none follows.
    pub fn due(&mut self, now: Instant) -> Vec<SeriesWrite> {
        let due = self
            .open
            .values_mut()
            .filter(|series| series.unwritten && now.saturating_duration_since(series.written) >= SERIES_WRITTEN_EVERY)
            .map(|series| written(series, now))
            .collect();
        self.close_quiet(now);
        due
    }

    /// Forgets the series of Event `name` in `namespace` (its patch failed: the Event expired or
    /// was deleted); the next repeat creates a new one.
    pub fn forget(&mut self, namespace: &str, name: &str) {
        self.open.retain(|_, series| series.namespace != namespace || series.name != name);
    }

    /// How many series are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Closes the series quiet for [`SERIES_OPEN_FOR`] whose count is written.
    fn close_quiet(&mut self, now: Instant) {
        self.open
            .retain(|_, series| series.unwritten || now.saturating_duration_since(series.last_seen) < SERIES_OPEN_FOR);
    }
}

/// The write of `series`' count at `now`.
fn written(series: &mut Series, now: Instant) -> SeriesWrite {
    series.written = now;
    series.unwritten = false;
    SeriesWrite::Count { namespace: series.namespace.clone(), name: series.name.clone(), count: series.count }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occurrence<'a>(uid: &'a str, name: &'a str) -> Occurrence<'a> {
        Occurrence { uid, namespace: "team-a", reason: "ContentUpdated", note: "volume \"db\": new content", name }
    }

    fn count(name: &str, count: u32) -> SeriesWrite {
        SeriesWrite::Count { namespace: "team-a".into(), name: name.into(), count }
    }

    #[test]
    fn repeats_are_counted_in_the_first_event_and_written_at_most_every_half_minute() {
        let mut series = EventSeries::default();
        let start = Instant::now();
        assert_eq!(series.seen(occurrence("u1", "web.1"), start), SeriesWrite::Create);
        // Every 10 s for a minute: counted, written twice.
        let mut writes = Vec::new();
        for tick in 1..=6 {
            let at = start + Duration::from_secs(10 * tick);
            writes.push(series.seen(occurrence("u1", &format!("web.{tick}")), at));
        }
        assert_eq!(
            writes,
            [
                SeriesWrite::Later,
                SeriesWrite::Later,
                count("web.1", 4),
                SeriesWrite::Later,
                SeriesWrite::Later,
                count("web.1", 7),
            ]
        );
        // Another pod, another reason, or another note (another volume of the pod) is a series
        // of its own.
        assert_eq!(series.seen(occurrence("u2", "api.1"), start + Duration::from_secs(60)), SeriesWrite::Create);
        let failing = Occurrence { reason: "ContentNotUpdated", ..occurrence("u1", "web.9") };
        assert_eq!(series.seen(failing, start + Duration::from_secs(60)), SeriesWrite::Create);
        let other_volume = Occurrence { note: "volume \"cache\": new content", ..occurrence("u1", "web.10") };
        assert_eq!(series.seen(other_volume, start + Duration::from_secs(60)), SeriesWrite::Create);
        assert_eq!(series.len(), 4);
        assert_eq!(series.seen(other_volume, start + Duration::from_secs(61)), SeriesWrite::Later, "its repeat is");
    }

    #[test]
    fn the_last_repeats_are_flushed_and_a_quiet_series_closes() {
        let mut series = EventSeries::default();
        let start = Instant::now();
        series.seen(occurrence("u1", "web.1"), start);
        assert_eq!(series.seen(occurrence("u1", "web.2"), start + Duration::from_secs(5)), SeriesWrite::Later);
        assert!(series.due(start + Duration::from_secs(29)).is_empty(), "not yet half a minute");
        assert_eq!(series.due(start + Duration::from_secs(30)), [count("web.1", 2)]);
        assert!(series.due(start + Duration::from_secs(90)).is_empty(), "written once");
        // Quiet for six minutes: the next occurrence is a new Event.
        let later = start + Duration::from_secs(5) + SERIES_OPEN_FOR;
        assert_eq!(series.seen(occurrence("u1", "web.3"), later), SeriesWrite::Create);
        assert_eq!(series.seen(occurrence("u1", "web.4"), later + SERIES_WRITTEN_EVERY), count("web.3", 2));
    }

    #[test]
    fn a_forgotten_series_starts_again_and_the_open_ones_are_bounded() {
        let mut series = EventSeries::default();
        let start = Instant::now();
        series.seen(occurrence("u1", "web.1"), start);
        series.forget("team-a", "web.1");
        assert_eq!(series.seen(occurrence("u1", "web.2"), start + SERIES_WRITTEN_EVERY), SeriesWrite::Create);
        // One namespace's pods fill its part; another namespace's still get series.
        for pod in 0..MAX_OPEN_SERIES_PER_NAMESPACE + 10 {
            series.seen(occurrence(&format!("pod-{pod}"), "x"), start);
        }
        assert_eq!(series.len(), MAX_OPEN_SERIES_PER_NAMESPACE, "the positive control filled its part");
        let other = Occurrence { namespace: "team-b", ..occurrence("b-1", "b.1") };
        assert_eq!(series.seen(other, start), SeriesWrite::Create);
        assert_eq!(
            series.seen(other, start + Duration::from_secs(1)),
            SeriesWrite::Later,
            "team-b's repeat is counted"
        );
        // Many namespaces fill the table; no more kept.
        for pod in 0..MAX_OPEN_SERIES + 10 {
            let namespace = format!("ns-{}", pod % 64);
            series.seen(Occurrence { namespace: &namespace, ..occurrence(&format!("many-{pod}"), "x") }, start);
        }
        assert_eq!(series.len(), MAX_OPEN_SERIES, "the positive control filled it; no more kept");
        // Beyond the bound an Event is still created, without a series.
        let beyond = occurrence("pod-beyond", "beyond.1");
        assert_eq!(series.seen(beyond, start), SeriesWrite::Create);
        assert_eq!(series.seen(beyond, start + SERIES_WRITTEN_EVERY), SeriesWrite::Create);
    }
}
