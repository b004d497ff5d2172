//! Whether grant, share and projection changes reach this node: the access-notices controller
//! renews its Lease every few seconds while it tells nodes of them, and this node watches that one Lease by name; and
//! the controller knows what the node serves only once the node's object says it. While
//! renewals arrive and the object is current, access answers are held until a notice concerns
//! them (or they are due). When no renewal has arrived for [`LEASE_SECONDS`] (the controller is
//! down, or this node cannot hear it), the node falls back to asking on its own: every answer
//! and every share held is forgotten at once and again every `fallback`, so each volume's access
//! and share are asked again at that pace and a revocation or a share's edit is never lost, only
//! slower: at most `LEASE_SECONDS` + `fallback` after the controller's last renewal, and
//! `fallback` (plus one refresh) after it. When renewals arrive but the object has lagged the
//! node's volumes for [`VIEW_GRACE`] (its write pending or failing, or the controller not
//! telling it of something it lists), only what lags is asked on its own that way: the
//! namespaces and objects the object does not list, or lists untold (`NodeView::lagging`);
//! the rest is told. Time is this node's own (when a renewal was seen), never the controller's
//! clock.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::broadcast_denials::{BroadcastDenials, accounts_of};
use super::cache::ShareCache;
use super::held_answers::HeldAnswers;
use super::node_view::{Lagging, NodeView};
use crate::content::changes::{Accounts, Changes};
use crate::metrics::Metrics;
use crate::quote::Logged;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::node_view::{LEASE_SECONDS, LeaseRef, NoticedObject};
use sharedresource_api::revocations;

/// How this node hears of grant changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hearing {
    /// Renewals arrive and the object is current: notices do.
    Notices,
    /// Renewals arrive, but the object has lagged the volumes for [`VIEW_GRACE`]: notices
    /// reach what it lists and the status tells, and the node asks on its own about the rest
    /// (`NodeView::lagging`).
    Lagging,
    /// No renewal for too long: the node asks on its own about everything.
    OnItsOwn,
}

/// How long the node's object may lag its volumes (a write pending) before the node stops
/// counting on notices.
pub const VIEW_GRACE: Duration = Duration::from_secs(10);

/// Which of the two, given when a renewal was last seen (`None`: never), since when the node's
/// object has lagged its volumes (`None`: it does not), and `now`.
pub fn hearing(last_renewal: Option<Instant>, behind_since: Option<Instant>, now: Instant) -> Hearing {
    let renewed = last_renewal.is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(LEASE_SECONDS));
    let current = behind_since.is_none_or(|since| now.saturating_duration_since(since) < VIEW_GRACE);
    match (renewed, current) {
        (false, _) => Hearing::OnItsOwn,
        (true, false) => Hearing::Lagging,
        (true, true) => Hearing::Notices,
    }
}

/// How often the node looks again at whether it hears notices, besides each renewal.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// What the node holds that notices keep current: its object's view of its volumes, the
/// wake-ups that have volumes looked at again, and the shares held until told they changed.
type Held = (Arc<NodeView>, Arc<Changes>, Arc<ShareCache>);

/// Follows `lease` on `client`, and while no renewal is heard or `view`'s object lags, forgets
/// every access answer in `wake` and every share held in `cache` each `fallback`, so every
/// volume is looked at again; runs until dropped.
pub async fn follow(
    client: kube::Client,
    lease: LeaseRef,
    held: Held,
    (answers, denials): (Arc<HeldAnswers>, Arc<BroadcastDenials>),
    fallback: Duration,
    metrics: Arc<Metrics>,
) {
    let (renewed, renewals) = watch::channel::<Option<Instant>>(None);
    let (view, wake, _) = &held;
    let broadcast = Broadcast { view: view.clone(), wake: wake.clone(), answers, denials: denials.clone() };
    let watching = watch_lease(client, lease, broadcast, renewed, metrics.clone());
    futures_util::future::join(watching, fall_back(renewals, held, denials, fallback, metrics)).await;
}

/// What a broadcast of revocations reaches: the answers held for the node's volumes' questions,
/// denied at once, and those volumes, looked at again.
struct Broadcast {
    view: Arc<NodeView>,
    wake: Arc<Changes>,
    answers: Arc<HeldAnswers>,
    denials: Arc<BroadcastDenials>,
}

impl Broadcast {
    /// Denies at once what `revoked` names of the node's questions, until its status says so.
    fn revoked(&self, revoked: Vec<AccessQuestion>) {
        // A renewal (every 10 s) leaves the lines as they were: nothing to compare.
        if revoked.is_empty() {
            return;
        }
        let taken = self.denials.take(revoked, &self.view.questions_of(None), Instant::now());
        if !taken.is_empty() {
            info!(
                questions = taken.len(),
                "revocations broadcast: denied at once, until this node's status says the same"
            );
            self.answers.told(taken.iter().map(|question| (question.clone(), false)), &[]);
            self.wake.answered(accounts_of(&taken));
        }
    }
}

/// Watches `lease` by name: each renewal is sent on `renewed` (the time this node saw it), and
/// each broadcast's new revocations reach `broadcast`.
async fn watch_lease(
    client: kube::Client,
    lease: LeaseRef,
    broadcast: Broadcast,
    renewed: watch::Sender<Option<Instant>>,
    metrics: Arc<Metrics>,
) {
    let api = Api::<Lease>::namespaced(client, lease.namespace.as_str());
    let by_name = watcher::Config::default().fields(&format!("metadata.name={}", lease.name.as_str()));
    let mut events = watch_stream(api, by_name).default_backoff().boxed();
    let mut last_renew_time = None;
    let mut broadcast_seen: Option<String> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(lease) | Event::InitApply(lease)) => {
                let lines = lease.annotations().get(revocations::ANNOTATION).cloned().unwrap_or_default();
                broadcast.revoked(revoked_since(broadcast_seen.as_deref(), &lines));
                broadcast_seen = Some(lines);
                let renew_time = lease.spec.and_then(|spec| spec.renew_time);
                if renew_time.is_some() && renew_time != last_renew_time {
                    last_renew_time = renew_time;
                    renewed.send_replace(Some(Instant::now()));
                }
            }
            Ok(_) => {}
            Err(error) => {
                metrics.watch_error("Lease");
                warn!(error = %Logged(&error), "watch of the access notices' lease failed; retrying with backoff");
            }
        }
    }
}

/// Looks, at each renewal and every [`LOOK_EVERY`], at whether the node hears notices, and
/// while it does not (or its object lags) has what it holds looked at again every `fallback`;
/// broadcast denials its status has not confirmed in time have their accounts looked at again.
async fn fall_back(
    mut renewals: watch::Receiver<Option<Instant>>,
    held: Held,
    denials: Arc<BroadcastDenials>,
    fallback: Duration,
    metrics: Arc<Metrics>,
) {
    let (view, wake, _) = &held;
    let mut state = Hearing::OnItsOwn;
    let mut next_forget = Instant::now() + fallback;
    loop {
        let last = *renewals.borrow_and_update();
        let now = Instant::now();
        let heard = hearing(last, view.behind_since(), now);
        if look_again(state, heard, now >= next_forget, fallback, &held) {
            next_forget = now + fallback;
        }
        let unconfirmed = denials.unconfirmed(now);
        if !unconfirmed.is_empty() {
            wake.grant_changed(accounts_of(&unconfirmed));
        }
        state = heard;
        metrics.set_notices_heard(state == Hearing::Notices);
        // Woken by a renewal, or to look again (the object's state has no signal of its own).
        let until = match state {
            Hearing::Notices => now + LOOK_EVERY,
            Hearing::Lagging | Hearing::OnItsOwn => next_forget.min(now + LOOK_EVERY),
        };
        tokio::select! {
            changed = renewals.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}

/// What the node does as its hearing goes from `was` to `heard` (`due`: a fallback's forget is
/// due): says so when it changes, and forgets what it can no longer count on being told of.
/// Whether it forgot (the next forget is then a `fallback` away).
fn look_again(was: Hearing, heard: Hearing, due: bool, fallback: Duration, (view, wake, cache): &Held) -> bool {
    match (was, heard) {
        (Hearing::Notices | Hearing::Lagging, Hearing::OnItsOwn) => {
            warn!(
                fallback_seconds = fallback.as_secs(),
                "grant changes may not reach this node (no renewal of the access notices' lease): checking every \
                 volume's access again on its own"
            );
            forget_everything(wake, cache);
            true
        }
        (Hearing::Notices, Hearing::Lagging) => {
            let lagging = view.lagging();
            warn!(
                fallback_seconds = fallback.as_secs(),
                namespaces = lagging.namespaces.len(),
                objects = lagging.objects.len(),
                "this node's object lags its volumes (its write pending or failing, or the controller not telling \
                 it): checking what it lacks on its own"
            );
            forget_lagging(lagging, wake, cache);
            true
        }
        (Hearing::OnItsOwn | Hearing::Lagging, Hearing::Notices) => {
            info!("the access notices' lease is renewed and this node's object current: grant changes are heard");
            false
        }
        (Hearing::OnItsOwn, Hearing::OnItsOwn) if due => {
            forget_everything(wake, cache);
            true
        }
        (Hearing::OnItsOwn | Hearing::Lagging, Hearing::Lagging) if due => {
            forget_lagging(view.lagging(), wake, cache);
            true
        }
        _ => false,
    }
}

/// The questions revoked in `now`'s broadcast that were not in `before` (the value last seen;
/// `None` at the first sight, whose lines predate this driver's look at every volume at its
/// start).
fn revoked_since(before: Option<&str>, now: &str) -> Vec<AccessQuestion> {
    before.map(|before| revocations::revoked_since(before, now)).unwrap_or_default()
}

/// What the node holds until told it changed is forgotten: every access answer and every share;
/// every volume is looked at again.
fn forget_everything(wake: &Changes, cache: &ShareCache) {
    cache.forget_shares();
    wake.grants_relisted();
}

/// What the node holds of what `lagging` names is forgotten, and those volumes looked at again,
/// once: the answers of its namespaces' accounts, its shares (the rest is told by notices). On a
/// busy cluster, where a node's newest volumes wait seconds for the controller, this keeps the
/// node's own asking to them: forgetting everything, a thousand simulated nodes each asked again
/// about every volume every `fallback`, and those reviews and reads were most of what the
/// apiserver answered while their pods arrived.
fn forget_lagging(lagging: Lagging, wake: &Changes, cache: &ShareCache) {
    if lagging.every_namespace {
        wake.grants_relisted();
    } else if !lagging.namespaces.is_empty() {
        wake.look_once(lagging.namespaces.into_iter().map(Accounts::OfNamespace));
    }
    if lagging.every_object {
        cache.forget_shares();
        wake.everything();
        return;
    }
    for object in lagging.objects.iter().filter_map(|key| NoticedObject::parse(key)) {
        match object {
            NoticedObject::Share(kind, name) => {
                cache.forget_share(kind, &name);
                wake.share(kind.attribute(), &name);
            }
            NoticedObject::Projection(namespace, name) => wake.projection(&namespace, &name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedresource_api::ShareKind;

    #[test]
    fn a_broadcast_is_read_only_after_the_first_sight() {
        let db = AccessQuestion::parse("team-a/web/sharedsecrets/db").unwrap();
        let mut log = revocations::RevocationLog::default();
        let before = log.value();
        log.revoked([&db], 10);
        assert_eq!(revoked_since(Some(&before), &log.value()), [db]);
        assert!(revoked_since(None, &log.value()).is_empty(), "the first sight predates the driver's own look");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lagging_object_has_the_node_ask_about_what_lags_and_nothing_else() {
        use std::collections::{BTreeMap, BTreeSet};
        let cache = ShareCache::default();
        let backing = sharedresource_api::shares::ObjectRef { namespace: "infra".into(), name: "db".into() };
        for name in ["db", "ca"] {
            cache.keep_share(cache.read_begins(), ShareKind::Secret, name, Some((backing.clone(), vec![])));
        }
        let wake = std::sync::Arc::new(Changes::default());
        let looks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        wake.on_grant_looks({
            let looks = looks.clone();
            move |look| {
                if let crate::content::changes::GrantLook::Window { first, again } = look {
                    looks.lock().unwrap().push((first.to_vec(), again.to_vec()));
                }
            }
        });
        let delivering = tokio::spawn({
            let wake = wake.clone();
            async move { wake.deliver_grant_looks().await }
        });
        let lagging = Lagging {
            namespaces: BTreeSet::from(["team-b".to_string()]),
            objects: BTreeSet::from(["SharedSecret/ca".to_string()]),
            ..Lagging::default()
        };
        forget_lagging(lagging, &wake, &cache);
        assert!(cache.share(ShareKind::Secret, "ca").is_none(), "lagging: read again");
        assert!(cache.share(ShareKind::Secret, "db").is_some(), "told by notices: held");
        let attributes = |name: &str| BTreeMap::from([("sharedSecret".to_string(), name.to_string())]);
        let pending = wake.take();
        assert!(pending.touches(&attributes("ca"), "team-a", "reader"));
        assert!(!pending.touches(&attributes("db"), "team-a", "reader"), "{pending:?}");
        // The lagging namespace's accounts are looked at once, in the next window, not again.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let pending = wake.take();
        assert!(pending.touches(&attributes("db"), "team-b", "reader"), "{pending:?}");
        assert!(!pending.touches(&attributes("db"), "team-a", "reader"), "{pending:?}");
        assert_eq!(*looks.lock().unwrap(), [(vec![Accounts::OfNamespace("team-b".into())], vec![])]);
        delivering.abort();
    }

    #[test]
    fn notices_are_heard_only_while_a_renewal_is_recent_and_the_object_current() {
        let now = Instant::now() + Duration::from_secs(1_000);
        let ago = |seconds: u64| Some(now - Duration::from_secs(seconds));
        assert_eq!(hearing(None, None, now), Hearing::OnItsOwn, "never renewed");
        assert_eq!(hearing(ago(1), None, now), Hearing::Notices);
        assert_eq!(hearing(ago(LEASE_SECONDS - 1), None, now), Hearing::Notices);
        assert_eq!(hearing(ago(LEASE_SECONDS), None, now), Hearing::OnItsOwn);
        assert_eq!(hearing(ago(1), ago(VIEW_GRACE.as_secs() - 1), now), Hearing::Notices, "a write pending");
        assert_eq!(hearing(ago(1), ago(VIEW_GRACE.as_secs()), now), Hearing::Lagging, "the object lags");
        assert_eq!(hearing(None, ago(VIEW_GRACE.as_secs()), now), Hearing::OnItsOwn, "lagging and never renewed");
    }
}
