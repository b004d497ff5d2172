//! One volume's record of what its refreshes did, kept in its entry of the live table and
//! written in one place (`NodeService::note_refresh`), once per refresh: since when its content
//! is current, since when its refreshes fail and why, and what its share's status is to say of
//! it; beside them, when its pod was last told of them (the refresher's Events). The refresh
//! wing's reporters read it (`volume::refresh`: the pod's Events, the per-share gauges, the
//! shares' per-node entries), and so does a republish (a failure is told to kubelet); it goes
//! when the volume does, with its entry. Pure: the clock is passed in.

use std::time::{Instant, SystemTime};

/// The longest reason kept: the words of a share's per-node entry and of an Event quote it.
pub const MAX_WHY_BYTES: usize = 512;

/// When a volume's pod was last told of its refreshes (`volume::refresh::pod_events` paces
/// the Events by it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventPace {
    /// When a new version was last told.
    pub updated: Option<Instant>,
    /// Versions not told since.
    pub untold: u32,
    /// When the failure going on was last told (`None`: none going on, or not told yet).
    pub failing: Option<Instant>,
}

/// A volume's refreshes failing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failing {
    /// When the first of the failures in a row happened.
    pub since: SystemTime,
    /// Why the last one did (bounded to [`MAX_WHY_BYTES`]).
    pub why: String,
}

/// What a volume's share's status is to say of the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareSaid {
    /// Nothing yet: no refresh of this process ended in a way that speaks of the share. The
    /// share's entry for this node is not written for it (so a driver's start does not write
    /// every share it serves).
    NotYet,
    /// The volume's last such refresh took the share's content.
    Current,
    /// Its refreshes fail for a reason of the share's own.
    Failing(Failing),
}

/// How one refresh ended, as the record takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The volume shows what its source has now (changed or not).
    Current,
    /// The update could not be applied: the volume serves what it had.
    Failed {
        /// Why.
        why: String,
        /// Whether the failure says something of what the volume mounts. An apiserver that
        /// did not answer says nothing of the share: reporting it would be one more write to
        /// that apiserver from every node at once, its refusals coming back to it as status
        /// writes (the metrics and the pods' Events say it instead).
        of_the_share: bool,
    },
}

impl Outcome {
    /// How a refresh that ended with `result` is taken; `None` when it is no outcome (another
    /// operation held the volume: it is tried again shortly).
    pub fn of(result: &crate::volume::error::Result<bool>) -> Option<Outcome> {
        use crate::volume::error::Error;
        match result {
            Err(Error::Busy(_)) => None,
            Ok(_) => Some(Outcome::Current),
            Err(error) => Some(Outcome::Failed {
                why: error.to_string(),
                of_the_share: !matches!(error, Error::Content(crate::content::error::Error::Unavailable(_))),
            }),
        }
    }
}

/// What a volume's refreshes did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshRecord {
    /// Its last successful refresh, or when this process began to serve it.
    pub current_since: SystemTime,
    /// While its refreshes fail: since when, and why.
    pub failing: Option<Failing>,
    /// What its share's status is to say of it.
    pub share: ShareSaid,
    /// When its pod was last told of its refreshes.
    pub told: EventPace,
}

impl RefreshRecord {
    /// A volume this process begins to serve at `now` (published, or found at its start): current.
    pub fn new(now: SystemTime) -> RefreshRecord {
        RefreshRecord { current_since: now, failing: None, share: ShareSaid::NotYet, told: EventPace::default() }
    }

    /// Whether its content is not current (its last refresh failed).
    pub fn stale(&self) -> bool {
        self.failing.is_some()
    }

    /// Takes a refresh that ended with `outcome` at `now`: a failure in a row keeps the first's
    /// time; a success ends it.
    pub fn note(&mut self, outcome: Outcome, now: SystemTime) {
        match outcome {
            Outcome::Current => {
                self.current_since = now;
                self.failing = None;
                self.share = ShareSaid::Current;
            }
            Outcome::Failed { why, of_the_share } => {
                let why = crate::quote::bounded(why, MAX_WHY_BYTES);
                let since = self.failing.as_ref().map_or(now, |failing| failing.since);
                self.failing = Some(Failing { since, why: why.clone() });
                if of_the_share {
                    let since = match &self.share {
                        ShareSaid::Failing(failing) => failing.since,
                        _ => now,
                    };
                    self.share = ShareSaid::Failing(Failing { since, why });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn failed(why: &str, of_the_share: bool) -> Outcome {
        Outcome::Failed { why: why.into(), of_the_share }
    }

    #[test]
    fn failures_in_a_row_count_from_the_first_and_a_success_ends_them() {
        let mut record = RefreshRecord::new(at(10));
        assert!(!record.stale());
        assert_eq!(record.share, ShareSaid::NotYet, "nothing said of the share before a refresh");
        record.note(failed("too large", true), at(20));
        record.note(failed("still too large", true), at(30));
        let failing = Failing { since: at(20), why: "still too large".into() };
        assert_eq!(record.failing, Some(failing.clone()));
        assert_eq!(record.share, ShareSaid::Failing(failing));
        assert_eq!(record.current_since, at(10), "not current since the publish");
        assert!(record.stale());
        record.note(Outcome::Current, at(40));
        let current =
            RefreshRecord { current_since: at(40), failing: None, share: ShareSaid::Current, ..record.clone() };
        assert_eq!(record, current);
    }

    #[test]
    fn an_unanswered_apiserver_is_a_failure_but_leaves_what_the_share_is_told() {
        let mut record = RefreshRecord::new(at(10));
        record.note(failed("the apiserver did not answer", false), at(20));
        assert!(record.stale(), "the volume is not current");
        assert_eq!(record.share, ShareSaid::NotYet, "said of no share");
        record.note(Outcome::Current, at(30));
        record.note(failed("the apiserver did not answer", false), at(40));
        assert_eq!(record.share, ShareSaid::Current, "the last word of the share stands");
        record.note(failed("too large", true), at(50));
        let ShareSaid::Failing(failing) = &record.share else { panic!("{record:?}") };
        assert_eq!(failing.since, at(50), "failing for the share since its own first failure");
        assert_eq!(record.failing.as_ref().map(|failing| failing.since), Some(at(40)));
    }

    #[test]
    fn the_share_hears_of_its_own_failures_not_of_an_apiserver_that_did_not_answer() {
        use crate::content::error::Error as ContentError;
        assert_eq!(Outcome::of(&Ok(true)), Some(Outcome::Current), "changed");
        assert_eq!(Outcome::of(&Ok(false)), Some(Outcome::Current), "unchanged");
        let too_large = ContentError::TooLarge("the volume's content needs 2 MiB".into());
        assert_eq!(
            Outcome::of(&Err(too_large.clone().into())),
            Some(Outcome::Failed { why: too_large.to_string(), of_the_share: true })
        );
        let unanswered = ContentError::Unavailable("the apiserver did not answer within 10 s".into());
        assert_eq!(
            Outcome::of(&Err(unanswered.clone().into())),
            Some(Outcome::Failed { why: unanswered.to_string(), of_the_share: false }),
            "a failure of the volume, said of no share: no node writes an entry for it"
        );
        let busy = crate::volume::error::Error::Busy("an operation is in progress".into());
        assert_eq!(Outcome::of(&Err(busy)), None, "held by another operation: tried again, no outcome");
    }

    #[test]
    fn a_long_reason_is_bounded() {
        let mut record = RefreshRecord::new(at(10));
        record.note(failed(&"x".repeat(10_000), true), at(20));
        let why = &record.failing.as_ref().unwrap().why;
        assert!(why.len() <= MAX_WHY_BYTES + 3, "{}", why.len());
    }
}
