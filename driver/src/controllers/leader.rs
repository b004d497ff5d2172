//! Leader election for the read-grants program, on a Lease, as client-go's leader election does
//! it: one replica leads (grants, access notices, waiting pods, rollout) and renews the Lease
//! every [`RETRY`]; the others look every [`RETRY`] and take the Lease over once its holder has
//! not renewed it for [`LEASE_DURATION`], measured on their own clock from when they last saw it
//! change (never from the holder's timestamps: clocks differ between nodes). A leader that
//! cannot renew within [`RENEW_DEADLINE`] stops leading and the process exits, so two replicas
//! never act at once for longer than the difference between the two (5 s); a leader told to stop
//! hands the Lease back first, so the next one takes over at its next look. Every write is
//! conditional on the Lease's resourceVersion: of two replicas that saw it free, one wins.
//! A replica whose role may not read the Lease (a role of an older version, the new image
//! rolled out first) runs without electing, as every replica did before, and says so: replicas
//! apply the same grants and write the same notices, so two agree rather than fight.

use std::hash::{BuildHasher as _, Hasher as _};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

use crate::apiserver::request::ask;
use crate::quote::Logged;
use sharedresource_api::node_view::LeaseRef;

/// The Lease the replicas of the read-grants program elect their leader on, as shipped (in the
/// driver's namespace).
pub const DEFAULT_LEADER_LEASE: &str = "inline-guard-driver/sharedresource-read-grants-leader";
/// How long a holder that stopped renewing keeps the Lease (client-go's default).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a leader may fail to renew before it stops leading (client-go's default).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the Lease is renewed, or looked at by a replica that does not lead.
pub const RETRY: Duration = Duration::from_secs(2);

/// The Lease as last seen, and how long ago (by this replica's clock) it last changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The Lease's record.
    pub spec: LeaseSpec,
    /// How long since this replica first saw that record.
    pub unchanged_for: Duration,
}

/// The record `identity` writes to lead, at `now`, given the Lease as `observed` (`None`: there
/// is none); `None` when another holder's record is still good (it changed less than its
/// duration ago, by this replica's clock).
pub fn record_to_lead(observed: Option<&Observed>, identity: &str, now: MicroTime) -> Option<LeaseSpec> {
    let seconds = i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(i32::MAX);
    let Some(observed) = observed else {
        return Some(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        });
    };
    let holder = observed.spec.holder_identity.as_deref().unwrap_or_default();
    let duration = observed
        .spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(LEASE_DURATION, Duration::from_secs);
    if !holder.is_empty() && holder != identity && observed.unchanged_for < duration {
        return None;
    }
    let transitions = observed.spec.lease_transitions.unwrap_or(0);
    let ours = holder == identity;
    Some(LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(seconds),
        acquire_time: if ours { observed.spec.acquire_time.clone() } else { Some(now.clone()) },
        renew_time: Some(now),
        lease_transitions: Some(if ours { transitions } else { transitions.saturating_add(1) }),
        ..observed.spec.clone()
    })
}

/// This replica's identity: its pod's name (`HOSTNAME`) and a random part, so that a replica
/// restarted under the same name is a new holder.
pub fn identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "sharedresource-read-grants".into());
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    format!("{host}_{:016x}", random.finish())
}

/// Leading stopped: the Lease could not be renewed within [`RENEW_DEADLINE`].
#[derive(Debug, thiserror::Error)]
#[error("stopped leading: the Lease {lease} was not renewed for {deadline:?}")]
pub struct Lost {
    lease: String,
    deadline: Duration,
}

/// One replica's side of the election on one Lease.
pub struct Election {
    api: Api<Lease>,
    lease: LeaseRef,
    identity: String,
    timeout: Duration,
    observed: Option<(LeaseSpec, tokio::time::Instant)>,
}

/// What one look at the Lease came to.
enum Look {
    Leading,
    Held(String),
    /// This replica's role may not read the Lease.
    Forbidden,
}

impl Election {
    /// An election on `lease` as `identity`, each request given up after `timeout`.
    pub fn new(client: Client, lease: LeaseRef, identity: String, timeout: Duration) -> Election {
        let api = Api::namespaced(client, lease.namespace.as_str());
        Election { api, lease, identity, timeout, observed: None }
    }

    /// Waits until this replica leads, then runs `work` while it renews the Lease: `work`'s end
    /// ends it, and [`Lost`] when a renewal did not succeed within [`RENEW_DEADLINE`] (`work`
    /// dropped then).
    pub async fn lead<F: std::future::Future<Output = ()>>(&mut self, work: F) -> Result<(), Lost> {
        let mut waiting_logged = None;
        loop {
            match self.look().await {
                Ok(Look::Leading) => break,
                Ok(Look::Forbidden) => {
                    warn!(lease = %self.lease, "this replica's role may not read the leader's Lease (a role older than this program): running without electing a leader");
                    work.await;
                    return Ok(());
                }
                Ok(Look::Held(holder)) => {
                    if waiting_logged.as_ref() != Some(&holder) {
                        info!(lease = %self.lease, holder = %holder, "another replica leads; waiting for its Lease to lapse");
                        waiting_logged = Some(holder);
                    }
                }
                Err(error) => {
                    warn!(lease = %self.lease, error = %error, "the leader's Lease could not be read or written")
                }
            }
            tokio::time::sleep(RETRY).await;
        }
        info!(lease = %self.lease, identity = %self.identity, "leading: this replica holds the Lease");
        let mut renewed = tokio::time::Instant::now();
        tokio::pin!(work);
        loop {
            tokio::select! {
                () = &mut work => return Ok(()),
                () = tokio::time::sleep(RETRY) => {}
            }
            match self.look().await {
                Ok(Look::Leading) => renewed = tokio::time::Instant::now(),
                Ok(Look::Held(holder)) => {
                    warn!(lease = %self.lease, holder = %holder, "another replica took the Lease");
                    return Err(self.lost());
                }
                Ok(Look::Forbidden) => warn!(lease = %self.lease, "the leader's Lease may no longer be read"),
                Err(error) => warn!(lease = %self.lease, error = %error, "the leader's Lease could not be renewed"),
            }
            if renewed.elapsed() >= RENEW_DEADLINE {
                return Err(self.lost());
            }
        }
    }

    fn lost(&self) -> Lost {
        Lost { lease: self.lease.to_string(), deadline: RENEW_DEADLINE }
    }

    /// Reads the Lease and writes it when this replica may lead.
    async fn look(&mut self) -> Result<Look, String> {
        let name = self.lease.name.as_str().to_string();
        let current = match tokio::time::timeout(self.timeout, self.api.get_opt(&name)).await {
            Ok(Ok(current)) => current,
            Ok(Err(kube::Error::Api(status))) if status.code == 403 => return Ok(Look::Forbidden),
            Ok(Err(error)) => return Err(format!("reading Lease {}: {}", self.lease, Logged(&error))),
            Err(_) => return Err(format!("reading Lease {}: no answer within {:?}", self.lease, self.timeout)),
        };
        let now = tokio::time::Instant::now();
        let observed = current.as_ref().map(|lease| {
            let spec = lease.spec.clone().unwrap_or_default();
            let since = match &self.observed {
                Some((seen, at)) if *seen == spec => *at,
                _ => now,
            };
            self.observed = Some((spec.clone(), since));
            Observed { spec, unchanged_for: now.duration_since(since) }
        });
        let wall = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(record) = record_to_lead(observed.as_ref(), &self.identity, wall) else {
            let holder = observed.and_then(|o| o.spec.holder_identity).unwrap_or_default();
            return Ok(Look::Held(holder));
        };
        let written = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.lease.namespace.as_str().to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(record),
                };
                let what = || format!("creating Lease {}", self.lease);
                ask(self.timeout, what, self.api.create(&PostParams::default(), &lease)).await
            }
            // A replace carrying the resourceVersion read: of two replicas writing, one wins.
            Some(mut lease) => {
                lease.spec = Some(record);
                let what = || format!("taking or renewing Lease {}", self.lease);
                ask(self.timeout, what, self.api.replace(&name, &PostParams::default(), &lease)).await
            }
        };
        let written = written.map_err(|e| Logged(&e.0).to_string())?;
        self.observed = written.spec.map(|spec| (spec, tokio::time::Instant::now()));
        Ok(Look::Leading)
    }

    /// Hands the Lease back when this replica holds it (its holder emptied, its duration one
    /// second), so the next replica takes over at its next look instead of after
    /// [`LEASE_DURATION`].
    pub async fn release(&self) {
        let name = self.lease.name.as_str();
        let what = || format!("reading Lease {}", self.lease);
        let Ok(Some(mut lease)) = ask(self.timeout, what, self.api.get_opt(name)).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        let what = || format!("handing back Lease {}", self.lease);
        if ask(self.timeout, what, self.api.replace(name, &PostParams::default(), &lease)).await.is_ok() {
            info!(lease = %self.lease, "handed the Lease back");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    fn held(holder: &str, duration: i32, transitions: i32, unchanged_for: u64) -> Observed {
        Observed {
            spec: LeaseSpec {
                holder_identity: (!holder.is_empty()).then(|| holder.to_string()),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(at(100)),
                renew_time: Some(at(150)),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            },
            unchanged_for: Duration::from_secs(unchanged_for),
        }
    }

    #[test]
    fn no_lease_is_taken_as_the_first_holder() {
        let record = record_to_lead(None, "me", at(200)).unwrap();
        assert_eq!(record.holder_identity.as_deref(), Some("me"));
        assert_eq!((record.acquire_time, record.renew_time), (Some(at(200)), Some(at(200))));
        assert_eq!(record.lease_transitions, Some(0));
        assert_eq!(record.lease_duration_seconds, Some(15));
    }

    #[test]
    fn another_holder_is_waited_for_until_its_lease_lapses_by_this_replica_s_clock() {
        assert_eq!(record_to_lead(Some(&held("other", 15, 3, 14)), "me", at(200)), None);
        // Its renew time (long past here) does not count: only how long this replica saw no change.
        let taken = record_to_lead(Some(&held("other", 15, 3, 15)), "me", at(200)).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!((taken.acquire_time, taken.renew_time), (Some(at(200)), Some(at(200))));
        assert_eq!(taken.lease_transitions, Some(4), "a new holder is a transition");
    }

    #[test]
    fn a_handed_back_lease_is_taken_at_once() {
        let taken = record_to_lead(Some(&held("", 1, 2, 0)), "me", at(200)).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_transitions, Some(3));
        assert_eq!(taken.lease_duration_seconds, Some(15), "the full duration again");
        // A holder's own short duration counts too.
        assert!(record_to_lead(Some(&held("other", 1, 2, 2)), "me", at(200)).is_some());
    }

    #[test]
    fn the_holder_renews_keeping_when_it_took_the_lease() {
        let renewed = record_to_lead(Some(&held("me", 15, 3, 1)), "me", at(200)).unwrap();
        assert_eq!(renewed.holder_identity.as_deref(), Some("me"));
        assert_eq!((renewed.acquire_time, renewed.renew_time), (Some(at(100)), Some(at(200))));
        assert_eq!(renewed.lease_transitions, Some(3));
    }

    #[test]
    fn each_process_is_a_holder_of_its_own() {
        assert_ne!(identity(), identity());
    }
}
