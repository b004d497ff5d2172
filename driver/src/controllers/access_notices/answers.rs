//! The central answers: the access-notices controller asks each access question the nodes list
//! (`NAMESPACE/ACCOUNT/RESOURCE/NAME`, at most `MAX_QUESTIONS` per node) once for the whole
//! cluster, and again after each grant change that may concern it, then 0.5, 2, 8 and 30 s later
//! while the apiserver's RBAC cache may lag ([`AGAIN`], as a node's own looks would); a node takes those
//! answers instead of asking itself. So a revocation costs one review per question, whatever the
//! number of nodes serving it, and one status write per node that lists it.
//!
//! [`AnswerBook`] is the pure part: which questions a round asks, what it learnt, when the next
//! looks are due. Only questions some node lists are kept (one small entry each), so what
//! tenants create costs the book nothing beyond the questions their pods' volumes ask.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tracing::warn;

use super::notices::Notices;
use crate::quote::Logged;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::node_view::{MAX_QUESTIONS, NodeNotices, SharedResourceNodeSpec};

/// When a grant change's questions are asked again after the first time: while the apiserver's
/// RBAC cache may lag the controller's watch (the node's own looks wait as long, and say why:
/// `content::changes::GRANT_LOOKS`).
pub const AGAIN: [Duration; 4] =
    [Duration::from_millis(500), Duration::from_secs(2), Duration::from_secs(8), Duration::from_secs(30)];
/// The most questions one round asks: a change for every namespace at a large cluster is asked
/// over several rounds (the nodes whose questions wait look at theirs themselves meanwhile).
pub const ROUND_QUESTIONS: usize = 4096;
/// Reviews in flight at once.
const REVIEWS_AT_ONCE: usize = 16;

/// What the controller learnt of one question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// Whether the service account may `use` what the question names.
    pub allowed: bool,
    /// The round it was asked in.
    pub round: u64,
}

/// Every question some node lists, with its last answer; the round of the last grant change
/// noticed in each namespace (and for every namespace), which an answer must not predate to be
/// current; and the looks still due.
#[derive(Debug, Default)]
pub struct AnswerBook {
    round: u64,
    known: HashMap<String, Answer>,
    noticed: HashMap<String, u64>,
    every_noticed: u64,
    again: BTreeMap<Instant, Notices>,
}

impl AnswerBook {
    /// A round begins: answers recorded from now on are this round's.
    pub fn begin_round(&mut self) -> u64 {
        self.round += 1;
        self.round
    }

    /// The last answer to `question` (an entry).
    pub fn answer(&self, question: &str) -> Option<Answer> {
        self.known.get(question).copied()
    }

    /// Whether the answer to `question` (an entry of namespace `namespace`) is current: asked
    /// after the last grant change noticed in its namespace (or for every namespace), this
    /// round's included.
    pub fn current(&self, question: &str, namespace: &str) -> bool {
        let Some(answer) = self.known.get(question) else { return false };
        let noticed = self.noticed.get(namespace).copied().unwrap_or(0).max(self.every_noticed);
        answer.round >= noticed
    }

    /// Notes that `notices`' grant changes are to be looked at again as [`AGAIN`] says, from `now`.
    pub fn look_again(&mut self, now: Instant, notices: &Notices) {
        if !notices.every_namespace && notices.namespaces.is_empty() {
            return;
        }
        let grants = Notices {
            every_namespace: notices.every_namespace,
            namespaces: notices.namespaces.clone(),
            ..Notices::default()
        };
        for delay in AGAIN {
            self.again.entry(now + delay).or_default().extend(&grants);
        }
    }

    /// When the next look is due.
    pub fn next_look(&self) -> Option<Instant> {
        self.again.keys().next().copied()
    }

    /// The grant changes whose looks are due at `now`, taken.
    pub fn due_looks(&mut self, now: Instant) -> Notices {
        let later = self.again.split_off(&(now + Duration::from_nanos(1)));
        let mut due = Notices::default();
        for notices in std::mem::replace(&mut self.again, later).into_values() {
            due.extend(&notices);
        }
        due
    }

    /// Notes the grant changes of this round (`notices`): an answer asked before now is not
    /// current for the namespaces they name.
    pub fn noticed(&mut self, notices: &Notices) {
        if notices.every_namespace {
            self.every_noticed = self.round;
        }
        for namespace in &notices.namespaces {
            self.noticed.insert(namespace.clone(), self.round);
        }
    }

    /// The questions this round asks, at most [`ROUND_QUESTIONS`]: those `concerned` names (a
    /// grant change of their namespace, now or looked at again), then those whose answer is not
    /// current (never asked, or asked before a change a round could not ask again). A question
    /// is asked once for every node that lists it, and a node's new namespace costs nothing
    /// when its questions are current. Forgets the answers of questions no node lists any more,
    /// and the changes of namespaces none of them is of.
    pub fn to_ask<'a>(
        &mut self,
        nodes: impl Iterator<Item = (&'a SharedResourceNodeSpec, Option<&'a NodeNotices>)>,
        concerned: &Notices,
    ) -> Vec<AccessQuestion> {
        let mut listed: HashSet<&'a str> = HashSet::new();
        let mut first: BTreeSet<&'a str> = BTreeSet::new();
        let mut second: BTreeSet<&'a str> = BTreeSet::new();
        let mut namespaces: HashSet<String> = HashSet::new();
        for (spec, _) in nodes {
            for key in spec.questions.iter().take(MAX_QUESTIONS) {
                if !listed.insert(key) {
                    continue;
                }
                let Some(question) = AccessQuestion::parse(key) else { continue };
                if concerned.every_namespace || concerned.namespaces.contains(&question.namespace) {
                    first.insert(key);
                } else if !self.current(key, &question.namespace) {
                    second.insert(key);
                }
                namespaces.insert(question.namespace);
            }
        }
        self.known.retain(|key, _| listed.contains(key.as_str()));
        self.noticed.retain(|namespace, _| namespaces.contains(namespace));
        let second = second.into_iter().filter(|key| !first.contains(key)).collect::<Vec<_>>();
        first.into_iter().chain(second).take(ROUND_QUESTIONS).filter_map(AccessQuestion::parse).collect()
    }

    /// Records this round's answer to `question`; whether it differs from the last one (or is
    /// the first).
    pub fn record(&mut self, question: &AccessQuestion, allowed: bool) -> bool {
        let answer = Answer { allowed, round: self.round };
        self.known.insert(question.key(), answer).is_none_or(|before| before.allowed != allowed)
    }
}

/// What a round's reviews gave: the keys of the answers that changed, and whether any review
/// failed (its question is asked again at the controller's next retry).
#[derive(Debug, Default)]
pub struct Asked {
    /// The keys of the answers that changed (or were given for the first time).
    pub changed: HashSet<String>,
    /// The questions whose answer turned from allowed to denied: revocations, broadcast to the
    /// nodes before their statuses are written ([`sharedresource_api::revocations`]).
    pub revoked: Vec<AccessQuestion>,
    /// Whether any review failed.
    pub failed: bool,
}

/// Asks each of `questions` with a SubjectAccessReview, [`REVIEWS_AT_ONCE`] at a time, and
/// records the answers in `book`. A question whose review fails keeps its last answer, not this
/// round's: nodes look at its namespace themselves until a later round answers it.
pub async fn ask(client: &Client, timeout: Duration, questions: Vec<AccessQuestion>, book: &mut AnswerBook) -> Asked {
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let answers = futures_util::stream::iter(questions)
        .map(|question| {
            let api = api.clone();
            async move {
                let what = || "asking the apiserver whether a pod may use a share".to_string();
                let (review, post) = (question.review(), PostParams::default());
                let asked = crate::apiserver::request::ask(timeout, what, api.create(&post, &review)).await;
                let allowed = asked.map(|review| review.status.is_some_and(|status| status.allowed));
                (question, allowed)
            }
        })
        .buffer_unordered(REVIEWS_AT_ONCE)
        .collect::<Vec<_>>()
        .await;
    let mut changed = HashSet::new();
    let mut revoked = Vec::new();
    let mut failed = 0;
    for (question, allowed) in answers {
        match allowed {
            Ok(allowed) => {
                let before = book.answer(&question.key()).map(|answer| answer.allowed);
                if book.record(&question, allowed) {
                    changed.insert(question.key());
                    if before == Some(true) {
                        revoked.push(question);
                    }
                }
            }
            Err(error) => {
                failed += 1;
                if failed == 1 {
                    warn!(error = %Logged(&error), "an access question could not be answered for the nodes; they look at it themselves");
                }
            }
        }
    }
    Asked { changed, revoked, failed: failed > 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedresource_api::node_view::NamespaceGrantChanges;

    fn spec(questions: &[&str]) -> SharedResourceNodeSpec {
        SharedResourceNodeSpec {
            questions: questions.iter().map(|q| q.to_string()).collect(),
            ..SharedResourceNodeSpec::default()
        }
    }

    fn serving(namespaces: &[&str]) -> NodeNotices {
        NodeNotices {
            namespaces: namespaces
                .iter()
                .map(|n| NamespaceGrantChanges { namespace: n.to_string(), noticed: 1, answered: false })
                .collect(),
            ..NodeNotices::default()
        }
    }

    fn keys(questions: &[AccessQuestion]) -> Vec<String> {
        questions.iter().map(AccessQuestion::key).collect()
    }

    fn grant_changed(namespaces: &[&str]) -> Notices {
        Notices { namespaces: namespaces.iter().map(|n| n.to_string()).collect(), ..Notices::default() }
    }

    const A_DB: &str = "team-a/web/sharedsecrets/db";
    const A_CA: &str = "team-a/web/sharedconfigmaps/ca";
    const B_DB: &str = "team-b/web/sharedsecrets/db";

    #[test]
    fn a_round_asks_the_questions_of_changed_namespaces_once_for_every_node() {
        let mut book = AnswerBook::default();
        let (one, two) = (spec(&[A_DB, B_DB]), spec(&[A_DB, A_CA]));
        let status = serving(&["team-a", "team-b"]);
        book.begin_round();
        let asked = book.to_ask([(&one, Some(&status)), (&two, Some(&status))].into_iter(), &Notices::default());
        assert_eq!(keys(&asked), [A_CA, A_DB, B_DB], "never asked: each once");
        for question in &asked {
            assert!(book.record(question, true), "a first answer is a change");
        }
        book.begin_round();
        let quiet = book.to_ask([(&one, Some(&status)), (&two, Some(&status))].into_iter(), &Notices::default());
        assert!(quiet.is_empty(), "known and nothing changed: {quiet:?}");
        book.noticed(&grant_changed(&["team-a"]));
        assert!(!book.current(A_DB, "team-a") && book.current(B_DB, "team-b"), "team-a's answers predate its change");
        let asked =
            book.to_ask([(&one, Some(&status)), (&two, Some(&status))].into_iter(), &grant_changed(&["team-a"]));
        assert_eq!(keys(&asked), [A_CA, A_DB], "team-a's, once though two nodes list one");
        assert!(!book.record(&asked[0], true), "the same answer is no change");
        assert!(book.record(&asked[1], false), "a revocation is");
        assert!(book.current(A_DB, "team-a") && book.current(B_DB, "team-b"));
        // A review that failed leaves its answer stale until a round asks it again.
        book.begin_round();
        book.noticed(&grant_changed(&["team-b"]));
        assert!(!book.current(B_DB, "team-b"));
        let again = book.to_ask([(&one, Some(&status))].into_iter(), &Notices::default());
        assert_eq!(keys(&again), [B_DB], "a stale answer is asked again without a notice");
    }

    #[test]
    fn a_namespace_new_to_a_node_costs_no_review_while_its_answers_are_current_and_unlisted_ones_are_forgotten() {
        let mut book = AnswerBook::default();
        let one = spec(&[A_DB]);
        book.begin_round();
        for question in book.to_ask([(&one, Some(&serving(&["team-a"])))].into_iter(), &Notices::default()) {
            book.record(&question, true);
        }
        book.begin_round();
        let asked = book.to_ask([(&one, Some(&serving(&[])))].into_iter(), &Notices::default());
        assert!(asked.is_empty(), "another node's answer, current: {asked:?}");
        assert!(book.current(A_DB, "team-a"));
        let none = spec(&[]);
        book.to_ask([(&none, None)].into_iter(), &Notices::default());
        assert_eq!(book.answer(A_DB), None, "no node lists it");
    }

    #[test]
    fn a_round_asks_at_most_its_share_and_a_bad_entry_is_passed_over() {
        let mut book = AnswerBook::default();
        let many: Vec<String> = (0..MAX_QUESTIONS).map(|i| format!("team-a/sa{i}/sharedsecrets/db")).collect();
        let nodes: Vec<SharedResourceNodeSpec> = (0..10)
            .map(|n| SharedResourceNodeSpec {
                questions: many.iter().map(|q| q.replace("team-a", &format!("team-{n}"))).collect(),
                ..SharedResourceNodeSpec::default()
            })
            .collect();
        book.begin_round();
        let asked = book.to_ask(nodes.iter().map(|spec| (spec, None)), &Notices::default());
        assert_eq!(asked.len(), ROUND_QUESTIONS);
        let bad = spec(&["not/a/question", A_DB]);
        assert_eq!(keys(&book.to_ask([(&bad, None)].into_iter(), &Notices::default())), [A_DB]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_change_is_looked_at_again_until_an_apiserver_lagging_by_seconds_has_caught_up() {
        let mut book = AnswerBook::default();
        let start = Instant::now();
        book.look_again(start, &grant_changed(&["team-a"]));
        book.look_again(start, &Notices { every_object: true, ..Notices::default() });
        assert_eq!(book.next_look(), Some(start + AGAIN[0]));
        assert!(book.due_looks(start + Duration::from_millis(499)).is_empty());
        assert_eq!(book.due_looks(start + AGAIN[0]), grant_changed(&["team-a"]));
        assert_eq!(book.next_look(), Some(start + AGAIN[1]));
        assert_eq!(book.due_looks(start + Duration::from_secs(5)), grant_changed(&["team-a"]));
        // An authorizer that learns of the change 5 s late (an apiserver under load, or another
        // of the cluster's answering) still has it looked at after it has caught up.
        assert_eq!(book.next_look(), Some(start + Duration::from_secs(8)));
        assert_eq!(book.due_looks(start + Duration::from_secs(8)), grant_changed(&["team-a"]));
        assert_eq!(book.next_look(), Some(start + Duration::from_secs(30)), "and one 25 s late");
        assert_eq!(book.due_looks(start + Duration::from_secs(30)), grant_changed(&["team-a"]));
        assert_eq!(book.next_look(), None, "an object's change is no grant's");
    }
}
