//! Revocations heard from the controller's broadcast on the notices' Lease
//! ([`sharedresource_api::revocations`]): a question this node asks, revoked since the node last
//! saw the Lease, is held as denied at once and its volumes refreshed, without a review and
//! before the node's own status says so (at 200 nodes the statuses take seconds to write; the
//! broadcast is one write).
//!
//! Such a denial is doubted until the status confirms it. The broadcast and the status are two
//! watches, whose events may arrive in either order: a line may be older than a grant given
//! again since (the node's watch of the Lease lagged), and a status may be older than the line.
//! So, while a denial is doubted, the status's word that its question is allowed is not taken
//! (the node asks the apiserver itself), and a denial the status has not confirmed within
//! [`CONFIRM_WITHIN`] is asked about again by the node itself. A status that denies it too ends
//! the doubt. Taking a line can so deny for a moment what is allowed, never allow what is denied.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::content::changes::Accounts;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::node_view::NodeNotices;

/// How long a denial taken from the broadcast waits for the node's status to say the same
/// before the node asks the apiserver itself: the controller writes the statuses right after
/// the broadcast, a few seconds at most for hundreds of nodes.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(10);

/// The denials taken from the broadcast that the status has not confirmed yet, with when each
/// was taken. At most one entry per question this node's volumes ask.
#[derive(Debug, Default)]
pub struct BroadcastDenials {
    doubted: Mutex<HashMap<AccessQuestion, Instant>>,
}

impl BroadcastDenials {
    /// Of `revoked`, the questions this node asks (`asked`), doubted from `now` on: the ones to
    /// hold as denied.
    pub fn take(&self, revoked: Vec<AccessQuestion>, asked: &[AccessQuestion], now: Instant) -> Vec<AccessQuestion> {
        let taken: Vec<AccessQuestion> = revoked.into_iter().filter(|question| asked.contains(question)).collect();
        let mut doubted = self.doubted.locked();
        for question in &taken {
            doubted.insert(question.clone(), now);
        }
        taken
    }

    /// The questions whose denial is doubted.
    pub fn doubted(&self) -> Vec<AccessQuestion> {
        self.doubted.locked().keys().cloned().collect()
    }

    /// `status` was seen: the denials it confirms are no longer doubted.
    pub fn seen(&self, status: &NodeNotices) {
        self.doubted.locked().retain(|question, _| status.answer(&question.key()) != Some(false));
    }

    /// The node asks about `questions` itself: no longer doubted.
    pub fn asked_again(&self, questions: &[AccessQuestion]) {
        let mut doubted = self.doubted.locked();
        for question in questions {
            doubted.remove(question);
        }
    }

    /// The denials taken before `now` - [`CONFIRM_WITHIN`] and still doubted, taken out: the node
    /// asks about them itself.
    pub fn unconfirmed(&self, now: Instant) -> Vec<AccessQuestion> {
        let mut doubted = self.doubted.locked();
        let late: Vec<AccessQuestion> = doubted
            .iter()
            .filter(|(_, taken)| now.saturating_duration_since(**taken) >= CONFIRM_WITHIN)
            .map(|(question, _)| question.clone())
            .collect();
        for question in &late {
            doubted.remove(question);
        }
        late
    }
}

/// The accounts of `questions`, each once.
pub fn accounts_of(questions: &[AccessQuestion]) -> Vec<Accounts> {
    let accounts: BTreeSet<Accounts> =
        questions.iter().map(|q| Accounts::One(q.namespace.clone(), q.service_account.clone())).collect();
    accounts.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedresource_api::node_view::CentralAnswer;

    fn question(key: &str) -> AccessQuestion {
        AccessQuestion::parse(key).unwrap()
    }

    fn status(answers: &[(&str, bool)]) -> NodeNotices {
        NodeNotices {
            answers: answers
                .iter()
                .map(|(question, allowed)| CentralAnswer { question: question.to_string(), allowed: *allowed })
                .collect(),
            ..NodeNotices::default()
        }
    }

    const DB: &str = "team-a/web/sharedsecrets/db";
    const CA: &str = "team-a/web/sharedconfigmaps/ca";
    const ELSEWHERE: &str = "team-b/web/sharedsecrets/db";

    #[test]
    fn a_denial_is_doubted_until_the_status_confirms_it_or_the_node_asks_itself() {
        let denials = BroadcastDenials::default();
        let start = Instant::now();
        let taken =
            denials.take(vec![question(DB), question(ELSEWHERE), question(CA)], &[question(DB), question(CA)], start);
        assert_eq!(taken, [question(DB), question(CA)], "only what this node asks");
        denials.seen(&status(&[(DB, true), (CA, false)]));
        assert_eq!(denials.doubted(), [question(DB)], "the status confirms CA; DB's allow may be older than the line");
        assert!(denials.unconfirmed(start + CONFIRM_WITHIN - Duration::from_millis(1)).is_empty());
        assert_eq!(denials.unconfirmed(start + CONFIRM_WITHIN), [question(DB)], "asked by the node itself");
        assert!(denials.doubted().is_empty());
        denials.take(vec![question(DB)], &[question(DB)], start);
        denials.asked_again(&[question(DB)]);
        assert!(denials.doubted().is_empty());
    }

    #[test]
    fn each_account_is_named_once() {
        let accounts = accounts_of(&[question(DB), question(CA), question(ELSEWHERE)]);
        assert_eq!(
            accounts,
            [Accounts::One("team-a".into(), "web".into()), Accounts::One("team-b".into(), "web".into())]
        );
    }
}
