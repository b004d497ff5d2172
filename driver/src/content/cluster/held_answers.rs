//! Access answers held between refreshes: an answer of the apiserver to "may this service
//! account use this share" serves every later publish and refresh of that pair on this node
//! until a grant's change may concern the account (the access notices say so, through
//! [`crate::content::changes::Changes`], at each of its looks), a notice for every namespace or a
//! lapse of the notices (either may have missed changes), or until it is due again
//! (`accessRecheckSeconds`, spread ±10% per pair so that the nodes of a cluster do not ask all at
//! once). So an idle node asks nothing but those due rechecks, and a change to RBAC is seen
//! through the notices.
//!
//! An answer asked before a grant's change and received after it could be stale: it is not held
//! when a forgetting that concerns its account happened while it was asked. Forgettings of
//! other accounts do not stop it (a tenant churning its own bindings would otherwise have every
//! other namespace's answers asked again at their next use); the last [`RECENT_FORGETTINGS`]
//! are remembered with the accounts they concerned, and an answer asked before the oldest of
//! them is not held.
//!
//! The access-notices controller's answers ([`HeldAnswers::told`]) replace what is held for the
//! accounts it answered for, when the node takes them instead of looking itself
//! (`node_view`). Answers past their due time are swept as the table grows.
//!
//! A grant's change is looked at first at once, then again four times while the apiserver's RBAC
//! cache may lag the driver's watch ([`crate::content::changes::GRANT_LOOKS`]). The first look forgets
//! the accounts' answers, noting each as it was; a later look keeps an answer that already
//! differs from it (the apiserver has seen the change: asking again would tell nothing new) and
//! forgets the others; after two changes close together, it keeps none, since an answer that
//! lags the second can differ from the first's and still be stale. So a change that flips a pair's answer costs that pair one review when
//! the apiserver had caught up by the first look, and a change that leaves it as it was, five.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher as _;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::content::changes::{Accounts, GRANT_LOOKS, GrantLook, WINDOW};
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::access::AccessQuestion;

/// How long an answer serves unless a grant's change concerns it, by default.
pub const DEFAULT_ACCESS_RECHECK: Duration = Duration::from_secs(600);

/// The answers, and how many times answers were forgotten (to spot one asked across a change).
#[derive(Debug)]
pub struct HeldAnswers {
    spread: std::collections::hash_map::RandomState,
    held: Mutex<Held>,
}

#[derive(Debug)]
struct Held {
    recheck: Duration,
    answers: HashMap<AccessQuestion, (bool, Instant)>,
    forgettings: u64,
    /// The last forgettings, by number, with the accounts each concerned (oldest first).
    recent: VecDeque<(u64, Forgot)>,
    /// Answers as they were when a first look forgot them, until the last look is past.
    before: HashMap<AccessQuestion, Before>,
    /// How many answers the table may hold before the next sweep of those past due.
    sweep_at: usize,
}

/// The smallest table that is swept: below it, a sweep would cost more than it saves.
const SWEEP_AT_LEAST: usize = 256;

/// How many forgettings are remembered with their accounts: an answer asked across more than
/// this many (a burst of notices while one review was under way) is not held.
pub const RECENT_FORGETTINGS: usize = 64;

/// The most accounts one forgetting remembers by name; one concerning more counts as
/// concerning every account.
const FORGOT_ACCOUNTS_AT_MOST: usize = 32;

/// Which accounts a forgetting concerned.
#[derive(Debug)]
enum Forgot {
    Every,
    These(Vec<Accounts>),
}

impl Forgot {
    fn of(mut accounts: Vec<Accounts>) -> Forgot {
        accounts.sort_unstable();
        accounts.dedup();
        if accounts.len() > FORGOT_ACCOUNTS_AT_MOST || accounts.contains(&Accounts::Every) {
            Forgot::Every
        } else {
            Forgot::These(accounts)
        }
    }

    fn concerns(&self, question: &AccessQuestion) -> bool {
        match self {
            Forgot::Every => true,
            Forgot::These(accounts) => {
                accounts.iter().any(|a| a.include(&question.namespace, &question.service_account))
            }
        }
    }
}

impl Held {
    /// Counts a forgetting that concerned `forgot`.
    fn forgot(&mut self, forgot: Forgot) {
        self.forgettings += 1;
        self.recent.push_back((self.forgettings, forgot));
        if self.recent.len() > RECENT_FORGETTINGS {
            self.recent.pop_front();
        }
    }

    /// Whether an answer to `question` asked at forgetting `asked` may be stale: a forgetting
    /// since then concerned its account, or happened too long ago to be known.
    fn forgotten_since(&self, asked: u64, question: &AccessQuestion) -> bool {
        if self.forgettings == asked {
            return false;
        }
        let known_from = self.recent.front().map_or(self.forgettings + 1, |(number, _)| *number);
        asked + 1 < known_from
            || self.recent.iter().any(|(number, forgot)| *number > asked && forgot.concerns(question))
    }
}

/// An answer as a first look found it.
#[derive(Debug)]
struct Before {
    allowed: bool,
    until: Instant,
    /// Whether a later look may keep an answer that differs from it: not when a second change
    /// came while the first was still being looked at, since an answer that lags the second
    /// change can then differ from this one and still be stale.
    settles: bool,
}

/// How long an answer forgotten by a first look is remembered for the looks after it: past the
/// last of them, with two windows to spare.
const BEFORE_KEPT: Duration = GRANT_LOOKS[GRANT_LOOKS.len() - 1].saturating_add(WINDOW.saturating_mul(2));

/// When an answer was asked, as [`HeldAnswers::hold`] needs to know it.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    forgettings: u64,
    at: Instant,
}

impl HeldAnswers {
    /// Answers held for `recheck` (spread ±10% per question).
    pub fn new(recheck: Duration) -> HeldAnswers {
        let held = Held {
            recheck,
            answers: HashMap::new(),
            forgettings: 0,
            recent: VecDeque::new(),
            before: HashMap::new(),
            sweep_at: SWEEP_AT_LEAST,
        };
        HeldAnswers { spread: Default::default(), held: Mutex::new(held) }
    }

    /// Holds answers given from now on for `recheck` (spread ±10% per question).
    pub fn set_recheck(&self, recheck: Duration) {
        self.lock().recheck = recheck;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.locked()
    }

    /// The held answer to `question`, if it is not due yet.
    pub fn answer(&self, question: &AccessQuestion) -> Option<bool> {
        let now = Instant::now();
        self.lock().answers.get(question).filter(|(_, due)| *due > now).map(|(allowed, _)| *allowed)
    }

    /// Notes that a question is being asked now.
    pub fn asking(&self) -> Asked {
        Asked { forgettings: self.lock().forgettings, at: Instant::now() }
    }

    /// Holds the answer to `question` asked at `asked`, unless answers of its account were
    /// forgotten meanwhile.
    /// Answers past their due time are swept whenever the table has doubled since the last
    /// sweep, so questions no volume asks any more (pods gone, accounts renamed) cost nothing
    /// for long: the table stays within twice the questions asked within one recheck interval.
    pub fn hold(&self, question: &AccessQuestion, allowed: bool, asked: Asked) {
        let mut held = self.lock();
        let due = asked.at + self.spread_for(question, held.recheck);
        if !held.forgotten_since(asked.forgettings, question) {
            held.answers.insert(question.clone(), (allowed, due));
        }
        if held.answers.len() >= held.sweep_at {
            let now = Instant::now();
            held.answers.retain(|_, (_, due)| *due > now);
            held.sweep_at = (held.answers.len() * 2).max(SWEEP_AT_LEAST);
        }
    }

    /// Holds `answers`, given by the access-notices controller after the grant change they
    /// follow was noticed, in place of what was held (and of what a first look noted), after
    /// forgetting every other answer of the `replaced` accounts (a grant changed for them: an
    /// answer held for a question no live volume asks now would be stale when one asks it
    /// again). The controller asks again while the apiserver's RBAC cache may lag, and tells a
    /// changed answer. An answer this node is asking meanwhile may predate them: it is not held.
    /// Whether what is held changed (an answer differs, is new, or was forgotten): when it did
    /// not, the volumes have nothing to refresh (the node took these answers already, from the
    /// revocations' broadcast or an earlier status).
    pub fn told(&self, answers: impl IntoIterator<Item = (AccessQuestion, bool)>, replaced: &[Accounts]) -> bool {
        let now = Instant::now();
        let answers: Vec<(AccessQuestion, bool)> = answers.into_iter().collect();
        let mut held = self.lock();
        // What is being asked of the replaced accounts, or of a question answered here, may
        // predate these answers.
        let told_of = answers.iter().map(|(q, _)| Accounts::One(q.namespace.clone(), q.service_account.clone()));
        held.forgot(Forgot::of(replaced.iter().cloned().chain(told_of).collect()));
        let concerned = |q: &AccessQuestion| replaced.iter().any(|a| a.include(&q.namespace, &q.service_account));
        let mut forgotten: HashMap<AccessQuestion, bool> = HashMap::new();
        held.answers.retain(|q, (allowed, _)| {
            let keep = !concerned(q);
            if !keep {
                forgotten.insert(q.clone(), *allowed);
            }
            keep
        });
        held.before.retain(|q, _| !concerned(q));
        let recheck = held.recheck;
        let mut changed = false;
        for (question, allowed) in answers {
            let due = now + self.spread_for(&question, recheck);
            held.before.remove(&question);
            let prior = forgotten.remove(&question).or_else(|| held.answers.get(&question).map(|(a, _)| *a));
            changed |= prior != Some(allowed);
            held.answers.insert(question, (allowed, due));
        }
        changed || !forgotten.is_empty()
    }

    /// Forgets what `look` may have made stale: every answer at a relist; at a window's looks,
    /// the answers of its `first` accounts (noting each as it was), and those of its `again`
    /// accounts that do not differ yet from what they were at the first look.
    pub fn look(&self, look: GrantLook<'_>) {
        let mut held = self.lock();
        let (first, again) = match look {
            GrantLook::Relisted => {
                held.forgot(Forgot::Every);
                held.answers.clear();
                held.before.clear();
                return;
            }
            GrantLook::Window { first, again } => (first, again),
        };
        let now = Instant::now();
        held.before.retain(|_, before| before.until > now);
        let concerns = |accounts: &[Accounts], q: &AccessQuestion| {
            accounts.iter().any(|a| a.include(&q.namespace, &q.service_account))
        };
        // An answer of an `again` account may be asked right now, after the first look but
        // before the apiserver caught up: unless every known answer of those accounts is
        // settled, what is being asked must not be held.
        // A first look's accounts may have answers being asked from before the change.
        let mut unsettled = !first.is_empty()
            || (!again.is_empty() && !held.answers.keys().chain(held.before.keys()).any(|q| concerns(again, q)));
        let Held { answers, before, .. } = &mut *held;
        answers.retain(|question, (allowed, _)| {
            if concerns(first, question) {
                let until = now + BEFORE_KEPT;
                before
                    .entry(question.clone())
                    .and_modify(|b| {
                        b.settles = false;
                        b.until = until;
                    })
                    .or_insert(Before { allowed: *allowed, until, settles: true });
                return false;
            }
            if concerns(again, question) {
                let settled = before.get(question).is_some_and(|b| b.settles && b.allowed != *allowed);
                unsettled |= !settled;
                return settled;
            }
            true
        });
        unsettled |= before.keys().any(|q| concerns(again, q) && !answers.contains_key(q));
        if unsettled {
            held.forgot(Forgot::of(first.iter().chain(again).cloned().collect()));
        }
    }

    /// The recheck interval for `question`: between 90% and 110% of the configured one, fixed
    /// per question within this process and differing between processes.
    fn spread_for(&self, question: &AccessQuestion, recheck: Duration) -> Duration {
        let fraction = (self.spread.hash_one(question) % 1_000) as f64 / 1_000.0;
        recheck.mul_f64(0.9 + 0.2 * fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedresource_api::ShareKind;
    use sharedresource_api::access::Guarded;

    fn question(namespace: &str, account: &str, share: &str) -> AccessQuestion {
        AccessQuestion {
            namespace: namespace.into(),
            service_account: account.into(),
            kind: Guarded::Share(ShareKind::Secret),
            name: share.into(),
        }
    }

    /// Answers held for 600 s, the account team/reader, and its question about share db.
    fn reader_of_db() -> (HeldAnswers, [Accounts; 1], AccessQuestion) {
        let held = HeldAnswers::new(Duration::from_secs(600));
        (held, [Accounts::One("team".into(), "reader".into())], question("team", "reader", "db"))
    }

    fn first(accounts: &[Accounts]) -> GrantLook<'_> {
        GrantLook::Window { first: accounts, again: &[] }
    }

    fn again(accounts: &[Accounts]) -> GrantLook<'_> {
        GrantLook::Window { first: &[], again: accounts }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_asked_across_another_accounts_forgetting_is_held_and_across_its_own_is_not() {
        let (held, reader, q) = reader_of_db();
        let stranger = [Accounts::OfNamespace("elsewhere".into())];
        // Another namespace's grant changed while this answer was asked: it still holds.
        let asked = held.asking();
        held.look(first(&stranger));
        held.told([(question("elsewhere", "app", "db"), true)], &stranger);
        held.hold(&q, true, asked);
        assert_eq!(held.answer(&q), Some(true), "another account's forgetting does not make it stale");
        // Its own account's: not held.
        let asked = held.asking();
        held.look(first(&reader));
        held.hold(&q, false, asked);
        assert_eq!(held.answer(&q), None, "asked across its own account's change");
        // Told an answer to this very question meanwhile: the one asked before is not held.
        let asked = held.asking();
        held.told([(q.clone(), true)], &[]);
        held.hold(&q, false, asked);
        assert_eq!(held.answer(&q), Some(true), "the controller's answer stays");
        // A relist concerns every account.
        let other = question("team", "other", "db");
        let asked = held.asking();
        held.look(GrantLook::Relisted);
        held.hold(&other, true, asked);
        assert_eq!(held.answer(&other), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_asked_across_more_forgettings_than_are_remembered_is_not_held() {
        let (held, _, q) = reader_of_db();
        let stranger = [Accounts::OfNamespace("elsewhere".into())];
        let asked = held.asking();
        for _ in 0..RECENT_FORGETTINGS {
            held.look(first(&stranger));
        }
        held.hold(&q, true, asked);
        assert_eq!(held.answer(&q), Some(true), "every forgetting since is remembered, none of its account");
        let asked = held.asking();
        for _ in 0..=RECENT_FORGETTINGS {
            held.look(first(&stranger));
        }
        held.hold(&q, false, asked);
        assert_eq!(held.answer(&q), Some(true), "the oldest forgetting since is not known: not held");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_the_first_look_saw_change_is_not_asked_again() {
        let (held, reader, q) = reader_of_db();
        held.hold(&q, true, held.asking());
        held.look(first(&reader));
        assert_eq!(held.answer(&q), None, "the first look asks again");
        held.hold(&q, false, held.asking());
        tokio::time::advance(Duration::from_millis(500)).await;
        held.look(again(&reader));
        assert_eq!(held.answer(&q), Some(false), "revoked already: settled");
        let asked = held.asking();
        tokio::time::advance(Duration::from_millis(1_500)).await;
        held.look(again(&reader));
        held.hold(&question("web", "x", "db"), true, asked);
        assert_eq!(held.answer(&question("web", "x", "db")), Some(true), "a settled look forgets nothing");
        assert_eq!(held.answer(&q), Some(false));
    }

    #[tokio::test(start_paused = true)]
    async fn after_two_quick_changes_every_look_asks_again() {
        // Granted, then revoked 0.3 s later: an answer that lags the revocation but not the
        // grant differs from the first "before" and must not pass for settled.
        let (held, reader, q) = reader_of_db();
        held.hold(&q, false, held.asking());
        held.look(first(&reader));
        held.hold(&q, false, held.asking());
        tokio::time::advance(Duration::from_millis(300)).await;
        held.look(first(&reader));
        held.hold(&q, true, held.asking());
        tokio::time::advance(Duration::from_millis(200)).await;
        held.look(again(&reader));
        assert_eq!(held.answer(&q), None, "the revocation may not be seen yet: asked again");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_looks_unchanged_is_asked_again_in_case_the_apiserver_lagged() {
        let (held, reader, q) = reader_of_db();
        held.hold(&q, true, held.asking());
        held.look(first(&reader));
        held.hold(&q, true, held.asking());
        tokio::time::advance(Duration::from_millis(500)).await;
        held.look(again(&reader));
        assert_eq!(held.answer(&q), None, "still as before the change: asked again");
        // Asked meanwhile, before the apiserver caught up: the answer is not held.
        let asked = held.asking();
        held.look(again(&reader));
        held.hold(&q, true, asked);
        assert_eq!(held.answer(&q), None);
        // Long after the looks, the answer as it was is forgotten: a later look asks again.
        held.hold(&q, false, held.asking());
        tokio::time::advance(BEFORE_KEPT + Duration::from_millis(500)).await;
        held.look(again(&reader));
        assert_eq!(held.answer(&q), None, "nothing to compare with any more");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_serves_until_it_is_due_within_ten_percent() {
        let held = HeldAnswers::new(Duration::from_secs(600));
        let q = question("team", "reader", "db");
        assert_eq!(held.answer(&q), None, "nothing asked yet");
        held.hold(&q, true, held.asking());
        assert_eq!(held.answer(&q), Some(true));
        tokio::time::advance(Duration::from_secs(539)).await;
        assert_eq!(held.answer(&q), Some(true), "not due before 90%");
        tokio::time::advance(Duration::from_secs(122)).await;
        assert_eq!(held.answer(&q), None, "due by 110%");
    }

    #[tokio::test(start_paused = true)]
    async fn a_told_answer_replaces_the_held_one_and_an_answer_asked_meanwhile_is_not_held() {
        let (held, _, q) = reader_of_db();
        held.hold(&q, true, held.asking());
        let other = question("team", "other", "db");
        let asked = held.asking();
        let elsewhere = question("web", "reader", "db");
        held.hold(&elsewhere, true, held.asking());
        let gone = question("team", "gone", "db");
        held.hold(&gone, true, held.asking());
        assert!(held.told([(q.clone(), false)], &[Accounts::OfNamespace("team".into())]), "changed");
        assert_eq!(held.answer(&q), Some(false), "the controller's answer is held");
        assert_eq!(held.answer(&gone), None, "another answer of the namespace: forgotten");
        assert_eq!(held.answer(&elsewhere), Some(true), "another namespace's: held");
        held.hold(&other, true, asked);
        assert_eq!(held.answer(&other), None, "asked before the told answers: maybe stale");
        assert!(held.told([(q.clone(), true)], &[]), "changed");
        assert_eq!(held.answer(&q), Some(true), "a flipped answer replaces it");
        // Told what is held already (taken from the broadcast, then the status says the same):
        // nothing changed, nothing to refresh; a namespace's answer forgotten is a change.
        assert!(!held.told([(q.clone(), true)], &[]));
        assert!(!held.told([(q.clone(), true)], &[Accounts::OfNamespace("team".into())]));
        held.hold(&gone, true, held.asking());
        assert!(held.told([(q.clone(), true)], &[Accounts::OfNamespace("team".into())]), "gone's answer forgotten");
        tokio::time::advance(Duration::from_secs(661)).await;
        assert_eq!(held.answer(&q), None, "due like any answer");
    }

    #[tokio::test(start_paused = true)]
    async fn answers_past_due_are_swept_once_the_table_doubles() {
        let held = HeldAnswers::new(Duration::from_secs(600));
        for i in 0..SWEEP_AT_LEAST - 1 {
            held.hold(&question("team", &format!("gone-{i}"), "db"), true, held.asking());
        }
        tokio::time::advance(Duration::from_secs(661)).await;
        assert_eq!(held.lock().answers.len(), SWEEP_AT_LEAST - 1, "seen before it is swept");
        let fresh = question("team", "reader", "db");
        held.hold(&fresh, true, held.asking());
        assert_eq!(held.lock().answers.len(), 1, "every answer past due swept");
        assert_eq!(held.answer(&fresh), Some(true));
        assert_eq!(held.lock().sweep_at, SWEEP_AT_LEAST);
    }

    #[test]
    fn questions_are_spread_over_the_interval() {
        let held = HeldAnswers::new(Duration::from_secs(600));
        let spreads: Vec<Duration> = (0..200)
            .map(|i| held.spread_for(&question("ns", &format!("sa{i}"), "db"), Duration::from_secs(600)))
            .collect();
        assert!(spreads.iter().all(|s| (540.0..=660.0).contains(&s.as_secs_f64())), "{spreads:?}");
        let min = spreads.iter().min().unwrap().as_secs_f64();
        let max = spreads.iter().max().unwrap().as_secs_f64();
        assert!(max - min > 60.0, "200 questions spread over {min}..{max} s only");
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_change_forgets_the_answers_of_the_accounts_it_concerns_only() {
        let held = HeldAnswers::new(Duration::from_secs(600));
        let (reader, other, elsewhere) =
            (question("team", "reader", "db"), question("team", "other", "db"), question("web", "reader", "db"));
        for q in [&reader, &other, &elsewhere] {
            held.hold(q, true, held.asking());
        }
        held.look(first(&[Accounts::One("team".into(), "reader".into())]));
        assert_eq!(
            (held.answer(&reader), held.answer(&other), held.answer(&elsewhere)),
            (None, Some(true), Some(true))
        );
        held.look(first(&[Accounts::OfNamespace("team".into())]));
        assert_eq!((held.answer(&other), held.answer(&elsewhere)), (None, Some(true)));
        held.look(GrantLook::Relisted);
        assert_eq!(held.answer(&elsewhere), None, "a relist forgets everything");
    }

    #[test]
    fn an_answer_asked_across_a_grant_change_is_not_held() {
        let held = HeldAnswers::new(Duration::from_secs(600));
        let q = question("team", "reader", "db");
        let asked = held.asking();
        held.look(first(&[Accounts::OfNamespace("team".into())]));
        held.hold(&q, true, asked);
        assert_eq!(held.answer(&q), None, "a change of its namespace's grants came while it was asked");
        held.hold(&q, false, held.asking());
        assert_eq!(held.answer(&q), Some(false), "a denial is held too");
    }
}
