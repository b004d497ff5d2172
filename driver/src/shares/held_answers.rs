//! Access answers held between refreshes: an answer of the apiserver to "may this service
//! account use this share" serves every later publish and refresh of that pair on this node
//! until a grant's change may concern the account (the grant watches say so, through
//! [`crate::changes::Changes`], at each of its looks), a relist of the grant watches (which may
//! have missed changes), or until it is due again (`accessRecheckSeconds`, spread ±10% per pair
//! so that the nodes of a cluster do not ask all at once). So an idle node asks nothing but those
//! due rechecks, and a change to RBAC is seen through the watches, as fast as before.
//!
//! An answer asked before a grant's change and received after it could be stale: it is not held
//! when any forgetting happened while it was asked.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::access::AccessQuestion;
use crate::changes::Accounts;

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
}

/// When an answer was asked, as [`HeldAnswers::hold`] needs to know it.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    forgettings: u64,
    at: Instant,
}

impl HeldAnswers {
    /// Answers held for `recheck` (spread ±10% per question).
    pub fn new(recheck: Duration) -> HeldAnswers {
        let held = Held { recheck, answers: HashMap::new(), forgettings: 0 };
        HeldAnswers { spread: Default::default(), held: Mutex::new(held) }
    }

    /// Holds answers given from now on for `recheck` (spread ±10% per question).
    pub fn set_recheck(&self, recheck: Duration) {
        self.lock().recheck = recheck;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Holds the answer to `question` asked at `asked`, unless answers were forgotten meanwhile.
    pub fn hold(&self, question: &AccessQuestion, allowed: bool, asked: Asked) {
        let mut held = self.lock();
        let due = asked.at + self.spread_for(question, held.recheck);
        if held.forgettings == asked.forgettings {
            held.answers.insert(question.clone(), (allowed, due));
        }
    }

    /// Forgets the answers for the service accounts among `accounts`; every answer for `None`.
    pub fn forget(&self, accounts: Option<&[Accounts]>) {
        let mut held = self.lock();
        held.forgettings += 1;
        match accounts {
            None => held.answers.clear(),
            Some(accounts) => held.answers.retain(|question, _| {
                !accounts.iter().any(|a| a.include(&question.namespace, &question.service_account))
            }),
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
    use crate::shares::access::ShareKind;

    fn question(namespace: &str, account: &str, share: &str) -> AccessQuestion {
        AccessQuestion {
            namespace: namespace.into(),
            service_account: account.into(),
            kind: ShareKind::Secret,
            share: share.into(),
        }
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
        held.forget(Some(&[Accounts::One("team".into(), "reader".into())]));
        assert_eq!(
            (held.answer(&reader), held.answer(&other), held.answer(&elsewhere)),
            (None, Some(true), Some(true))
        );
        held.forget(Some(&[Accounts::OfNamespace("team".into())]));
        assert_eq!((held.answer(&other), held.answer(&elsewhere)), (None, Some(true)));
        held.forget(None);
        assert_eq!(held.answer(&elsewhere), None, "a relist forgets everything");
    }

    #[test]
    fn an_answer_asked_across_a_grant_change_is_not_held() {
        let held = HeldAnswers::new(Duration::from_secs(600));
        let q = question("team", "reader", "db");
        let asked = held.asking();
        held.forget(Some(&[Accounts::One("elsewhere".into(), "x".into())]));
        held.hold(&q, true, asked);
        assert_eq!(held.answer(&q), None);
        held.hold(&q, false, held.asking());
        assert_eq!(held.answer(&q), Some(false), "a denial is held too");
    }
}
