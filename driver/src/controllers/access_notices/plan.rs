//! The access-notices rule, pure: which namespaces a change of RBAC may concern, and what a
//! node's `SharedResourceNode` status must say after the notices gathered since the last write.
//!
//! A Role or RoleBinding grants only within its own namespace, so its change concerns that
//! namespace's pods alone, whatever it names: nothing of it need be kept (a tenant's bindings,
//! however many and however large, cost the controller one event each and nothing after). A
//! ClusterRole concerns every namespace when its rules can grant `use` in this API group, before
//! or after the change; a ClusterRoleBinding, when the ClusterRole it names can. Both are made by
//! the cluster's operators alone; the names of the ClusterRoles that can grant `use` are all the
//! controller keeps of them.

use std::collections::{BTreeSet, HashSet};

use super::answers::AnswerBook;
use super::notices::{Concerns, Notices};
use k8s_openapi::api::rbac::v1::PolicyRule;
use sharedresource_api::API_GROUP;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::access::USE_VERB;
use sharedresource_api::node_view::{
    CentralAnswer, MAX_NAMESPACES, MAX_OBJECTS, MAX_QUESTIONS, NamespaceGrantChanges, NodeNotices, ObjectChanges,
    SharedResourceNodeSpec,
};

/// Whether `rules` can grant `use` of something in the driver's API group (wildcards included).
/// Resources are not looked at: any resource of the group may be what a share or provider's
/// access question names, so a rule of the group with the verb counts.
pub fn can_grant_use(rules: &[PolicyRule]) -> bool {
    rules.iter().any(|rule| {
        let groups = rule.api_groups.as_deref().unwrap_or_default();
        groups.iter().any(|group| group == API_GROUP || group == "*")
            && rule.verbs.iter().any(|verb| verb == USE_VERB || verb == "*")
    })
}

/// The ClusterRoles that can grant `use` now, by name.
#[derive(Debug, Default)]
pub struct GrantingClusterRoles(HashSet<String>);

impl GrantingClusterRoles {
    /// ClusterRole `name` now has `rules` (`None`: deleted); what that concerns.
    pub fn changed(&mut self, name: &str, rules: Option<&[PolicyRule]>) -> Concerns {
        let before = self.0.contains(name);
        let now = rules.is_some_and(can_grant_use);
        if now {
            self.0.insert(name.to_string());
        } else {
            self.0.remove(name);
        }
        if before || now { Concerns::EveryNamespace } else { Concerns::Nobody }
    }

    /// A relist's roles replace what was known.
    pub fn relisted(&mut self, granting: impl IntoIterator<Item = String>) {
        self.0 = granting.into_iter().collect();
    }

    /// What a ClusterRoleBinding's change concerns: every namespace when the role it names
    /// (`kind`, `name`) is a ClusterRole that can grant `use`. A kind other than ClusterRole
    /// binds nothing a ClusterRoleBinding can use; read as concerning everyone all the same, so
    /// that only a check is lost, never a revocation.
    pub fn binding_changed(&self, kind: &str, name: &str) -> Concerns {
        match kind {
            "ClusterRole" if !self.0.contains(name) => Concerns::Nobody,
            _ => Concerns::EveryNamespace,
        }
    }

    /// How many are known (for the log).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What the status of a node with `spec` must say after `notices`, from `current` (what the
/// controller last wrote or saw), at `now` (Unix milliseconds), with the answers in `book`;
/// `None` when it already says it.
///
/// Every namespace and object the spec lists has an entry: a new one is written at once (the
/// node looks at it once: a grant changed, or an object edited, before the controller knew the
/// node served it is not missed), one a notice names is raised, the others keep theirs; entries
/// the spec no longer lists go. A node whose spec says `everyNamespace` (`everyObject`) is told
/// of every namespace's (object's) notices through that value. Each raised value is at least
/// one more than before, so two notices in the same millisecond still change it. A raised
/// namespace value is `answered` when the book's answer to every question of it the spec lists
/// is current (asked after the last grant change noticed there, this round's included), and so
/// is a raised `everyNamespace` when every listed question's is; `answers` holds the book's
/// answer to each listed question.
pub fn next_status(
    spec: &SharedResourceNodeSpec,
    current: &NodeNotices,
    notices: &Notices,
    now: i64,
    book: &AnswerBook,
) -> Option<NodeNotices> {
    let raise = |before: Option<i64>| before.map_or(now, |before| now.max(before.saturating_add(1)));
    // In key order and once each, as the status's map holds them when read back: a status read
    // from the apiserver then equals the one that was written.
    let questions: BTreeSet<&String> = spec.questions.iter().take(MAX_QUESTIONS).collect();
    // Each listed question looked at once: the namespaces one of whose questions is not current.
    let mut stale: std::collections::HashSet<String> = std::collections::HashSet::new();
    for key in &questions {
        if let Some(question) = AccessQuestion::parse(key)
            && !book.current(key, &question.namespace)
        {
            stale.insert(question.namespace);
        }
    }
    let answered = |namespace: Option<&str>| match namespace {
        Some(namespace) => !stale.contains(namespace),
        None => stale.is_empty(),
    };
    let listed_namespaces: BTreeSet<&String> = spec.namespaces.iter().take(MAX_NAMESPACES).collect();
    let namespaces = listed_namespaces
        .into_iter()
        .map(|namespace| match current.namespaces.iter().find(|entry| entry.namespace == *namespace) {
            Some(entry) if !notices.namespaces.contains(namespace) => entry.clone(),
            before => NamespaceGrantChanges {
                namespace: namespace.clone(),
                noticed: raise(before.map(|entry| entry.noticed)),
                answered: answered(Some(namespace)),
            },
        })
        .collect();
    let listed_objects: BTreeSet<&String> = spec.objects.iter().take(MAX_OBJECTS).collect();
    let objects = listed_objects
        .into_iter()
        .map(|object| match current.of_object(object) {
            Some(before) if !notices.objects.contains(object) => {
                ObjectChanges { object: object.clone(), noticed: before }
            }
            before => ObjectChanges { object: object.clone(), noticed: raise(before) },
        })
        .collect();
    let raise_every_namespace = notices.every_namespace || (spec.every_namespace && !notices.namespaces.is_empty());
    let raise_every_object = notices.every_object || (spec.every_object && !notices.objects.is_empty());
    let next = NodeNotices {
        namespaces,
        every_namespace: if raise_every_namespace {
            raise(Some(current.every_namespace))
        } else {
            current.every_namespace
        },
        every_namespace_answered: if raise_every_namespace { answered(None) } else { current.every_namespace_answered },
        answers: questions
            .iter()
            .filter_map(|key| {
                book.answer(key).map(|answer| CentralAnswer { question: (*key).clone(), allowed: answer.allowed })
            })
            .collect(),
        objects,
        every_object: if raise_every_object { raise(Some(current.every_object)) } else { current.every_object },
        // Not the notices' to change: the waiting pods' teller writes it (`waiting_pods`).
        registration_told: current.registration_told,
    };
    (next != *current).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedresource_api::node_view::NoticedObject;

    fn rule(groups: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            resources: Some(vec!["sharedsecrets".into()]),
            ..PolicyRule::default()
        }
    }

    fn spec(namespaces: &[&str]) -> SharedResourceNodeSpec {
        SharedResourceNodeSpec {
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            ..SharedResourceNodeSpec::default()
        }
    }

    /// The next status with no question answered.
    fn unanswered(
        spec: &SharedResourceNodeSpec,
        current: &NodeNotices,
        notices: &Notices,
        now: i64,
    ) -> Option<NodeNotices> {
        next_status(spec, current, notices, now, &AnswerBook::default())
    }

    /// A namespace's entry; `answered`, as the specs here list no question (none to ask).
    fn entry(namespace: &str, noticed: i64) -> NamespaceGrantChanges {
        NamespaceGrantChanges { namespace: namespace.into(), noticed, answered: true }
    }

    fn notices(namespaces: &[&str], every_namespace: bool) -> Notices {
        Notices {
            every_namespace,
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            ..Notices::default()
        }
    }

    #[test]
    fn only_rules_of_the_group_with_the_use_verb_can_grant_use() {
        struct Case {
            name: &'static str,
            rules: Vec<PolicyRule>,
            can: bool,
        }
        for case in [
            Case { name: "the group and use", rules: vec![rule(&[API_GROUP], &["use"])], can: true },
            Case { name: "every group, use", rules: vec![rule(&["*"], &["use"])], can: true },
            Case { name: "the group, every verb", rules: vec![rule(&[API_GROUP], &["*"])], can: true },
            Case { name: "the group, reads only", rules: vec![rule(&[API_GROUP], &["get", "list"])], can: false },
            Case { name: "another group's use", rules: vec![rule(&["policy"], &["use"])], can: false },
            Case {
                name: "use and the group in different rules",
                rules: vec![rule(&["policy"], &["use"]), rule(&[API_GROUP], &["get"])],
                can: false,
            },
            Case { name: "no rules", rules: vec![], can: false },
        ] {
            assert_eq!(can_grant_use(&case.rules), case.can, "{}", case.name);
        }
    }

    #[test]
    fn a_cluster_role_concerns_everyone_when_it_could_grant_use_before_or_after() {
        let mut roles = GrantingClusterRoles::default();
        let granting = [rule(&[API_GROUP], &["use"])];
        let reading = [rule(&[API_GROUP], &["get"])];
        assert_eq!(roles.changed("view", Some(&reading)), Concerns::Nobody);
        assert_eq!(roles.changed("use-db", Some(&granting)), Concerns::EveryNamespace);
        assert_eq!(roles.binding_changed("ClusterRole", "use-db"), Concerns::EveryNamespace);
        assert_eq!(roles.binding_changed("ClusterRole", "view"), Concerns::Nobody);
        assert_eq!(roles.binding_changed("Role", "view"), Concerns::EveryNamespace, "an unknown kind: everyone");
        // Its rule taken away: a revocation, so everyone still.
        assert_eq!(roles.changed("use-db", Some(&reading)), Concerns::EveryNamespace);
        assert_eq!(roles.binding_changed("ClusterRole", "use-db"), Concerns::Nobody);
        assert_eq!(roles.changed("use-db", None), Concerns::Nobody, "it could not grant before its deletion");
        roles.changed("admin", Some(&granting));
        assert_eq!(roles.changed("admin", None), Concerns::EveryNamespace);
        roles.relisted(["edit".to_string()]);
        assert_eq!((roles.len(), roles.binding_changed("ClusterRole", "edit")), (1, Concerns::EveryNamespace));
    }

    #[test]
    fn a_namespace_s_notice_concerns_only_the_nodes_serving_it() {
        let team_a = notices(&["team-a"], false);
        assert!(team_a.concern(&spec(&["team-a", "team-b"])));
        assert!(!team_a.concern(&spec(&["team-b"])));
        assert!(!team_a.concern(&spec(&[])));
        assert!(team_a.concern(&SharedResourceNodeSpec { every_namespace: true, ..SharedResourceNodeSpec::default() }));
        assert!(
            notices(&[], true).concern(&spec(&["team-b"])),
            "a change for every namespace concerns every node serving one"
        );
        assert!(!notices(&[], true).concern(&spec(&[])), "a node that serves nothing is told nothing");
        assert!(
            !Notices::default()
                .concern(&SharedResourceNodeSpec { every_namespace: true, ..SharedResourceNodeSpec::default() })
        );
    }

    #[test]
    fn the_status_raises_what_a_notice_names_welcomes_new_namespaces_and_drops_the_rest() {
        let current = NodeNotices {
            namespaces: vec![entry("team-a", 100), entry("gone", 50)],
            every_namespace: 7,
            ..NodeNotices::default()
        };
        let next = unanswered(&spec(&["team-b", "team-a"]), &current, &notices(&["team-a"], false), 1_000).unwrap();
        assert_eq!(next.namespaces, [entry("team-a", 1_000), entry("team-b", 1_000)]);
        assert_eq!(next.every_namespace, 7, "no change for every namespace");

        // The same notice again within the same millisecond still moves the value.
        let again = unanswered(&spec(&["team-a", "team-b"]), &next, &notices(&["team-a"], false), 1_000).unwrap();
        assert_eq!(again.namespaces, [entry("team-a", 1_001), entry("team-b", 1_000)]);

        // Nothing gathered and nothing new: nothing to write.
        assert_eq!(unanswered(&spec(&["team-a", "team-b"]), &again, &Notices::default(), 2_000), None);
        // A notice elsewhere: nothing to write either.
        assert_eq!(unanswered(&spec(&["team-a", "team-b"]), &again, &notices(&["team-c"], false), 2_000), None);

        let every = unanswered(&spec(&["team-a"]), &again, &notices(&[], true), 2_000).unwrap();
        assert_eq!((every.every_namespace, every.namespaces), (2_000, vec![entry("team-a", 1_001)]));
    }

    #[test]
    fn a_node_with_too_many_namespaces_hears_every_namespace_s_notices() {
        let node = SharedResourceNodeSpec { every_namespace: true, ..SharedResourceNodeSpec::default() };
        let current = NodeNotices::default();
        let next = unanswered(&node, &current, &notices(&["anywhere"], false), 5).unwrap();
        assert_eq!(next.every_namespace, 5);
        assert_eq!(unanswered(&node, &next, &Notices::default(), 9), None);
    }

    fn db() -> NoticedObject {
        NoticedObject::Share(sharedresource_api::ShareKind::Secret, "db".into())
    }

    fn object_notice(object: NoticedObject) -> Notices {
        let mut notices = Notices::default();
        notices.add(Concerns::Object(object));
        notices
    }

    #[test]
    fn an_object_s_notice_concerns_only_the_nodes_reading_it_and_raises_only_its_entry() {
        let reads_db = SharedResourceNodeSpec {
            objects: vec!["SharedProjection/team-a/app".into(), db().key()],
            ..SharedResourceNodeSpec::default()
        };
        let reads_ca = SharedResourceNodeSpec { objects: vec!["SharedConfigMap/ca".into()], ..Default::default() };
        let notice = object_notice(db());
        assert!(notice.concern(&reads_db));
        assert!(!notice.concern(&reads_ca));
        assert!(!notice.concern(&spec(&["team-a"])), "a node serving the namespace but not reading the share");
        assert!(notice.concern(&SharedResourceNodeSpec { every_object: true, ..Default::default() }));
        let every = Notices { every_object: true, ..Notices::default() };
        assert!(every.concern(&reads_ca) && !every.concern(&spec(&["team-a"])), "every object: the nodes reading one");

        let first = unanswered(&reads_db, &NodeNotices::default(), &Notices::default(), 10).unwrap();
        let entry = |object: &str, noticed| ObjectChanges { object: object.into(), noticed };
        assert_eq!(first.objects, [entry("SharedProjection/team-a/app", 10), entry("SharedSecret/db", 10)]);
        let next = unanswered(&reads_db, &first, &notice, 20).unwrap();
        assert_eq!(next.objects, [entry("SharedProjection/team-a/app", 10), entry("SharedSecret/db", 20)]);
        assert_eq!((next.every_object, next.every_namespace), (0, 0), "nothing else moves");
        let relisted = unanswered(&reads_db, &next, &every, 30).unwrap();
        assert_eq!((relisted.every_object, relisted.objects), (30, next.objects.clone()));
        let too_many = SharedResourceNodeSpec { every_object: true, ..Default::default() };
        let told = unanswered(&too_many, &NodeNotices::default(), &notice, 40).unwrap();
        assert_eq!(told.every_object, 40, "a node listing no objects but reading every one");
    }

    #[test]
    fn a_raised_namespace_is_answered_when_its_every_listed_question_was_asked_since_its_last_change() {
        let (db, ca) = ("team-a/web/sharedsecrets/db", "team-a/web/sharedconfigmaps/ca");
        let other = "team-b/web/sharedsecrets/db";
        let node = SharedResourceNodeSpec {
            namespaces: vec!["team-a".into(), "team-b".into()],
            questions: vec![ca.into(), db.into(), other.into()],
            ..SharedResourceNodeSpec::default()
        };
        let question = |key: &str| AccessQuestion::parse(key).unwrap();
        let mut book = AnswerBook::default();
        book.begin_round();
        for key in [db, ca, other] {
            book.record(&question(key), true);
        }
        let first = next_status(&node, &NodeNotices::default(), &Notices::default(), 10, &book).unwrap();
        assert!(first.namespaces.iter().all(|entry| entry.answered), "new entries, every answer current");
        assert_eq!(first.answer(db), Some(true));
        assert_eq!(first.answers.len(), 3);

        book.begin_round();
        book.noticed(&notices(&["team-a"], false));
        book.record(&question(db), false);
        let revoked = next_status(&node, &first, &notices(&["team-a"], false), 20, &book).unwrap();
        let team_a = &revoked.namespaces[0];
        assert_eq!((team_a.noticed, team_a.answered), (20, false), "ca was not asked again since the change");
        assert_eq!(revoked.answer(db), Some(false));

        book.begin_round();
        book.noticed(&notices(&["team-a"], false));
        book.record(&question(db), false);
        book.record(&question(ca), true);
        let answered = next_status(&node, &revoked, &notices(&["team-a"], false), 30, &book).unwrap();
        assert!(answered.namespaces[0].answered);
        assert_eq!(answered.namespaces[1], revoked.namespaces[1], "team-b untouched");
        book.begin_round();
        book.noticed(&notices(&[], true));
        book.record(&question(db), false);
        book.record(&question(ca), true);
        let every = next_status(&node, &answered, &notices(&[], true), 40, &book).unwrap();
        assert!(!every.every_namespace_answered, "team-b's question was not asked since the change");
    }

    #[test]
    fn a_status_read_back_from_its_map_needs_no_second_write() {
        let (db, ca) = ("team-a/web/sharedsecrets/db", "team-a/web/sharedconfigmaps/ca");
        // Listed out of key order, one twice: the map on the wire holds each once, sorted.
        let node = SharedResourceNodeSpec {
            namespaces: vec!["team-a".into()],
            questions: vec![db.into(), ca.into(), db.into()],
            ..SharedResourceNodeSpec::default()
        };
        let mut book = AnswerBook::default();
        book.begin_round();
        for key in [db, ca] {
            book.record(&AccessQuestion::parse(key).unwrap(), true);
        }
        let written = next_status(&node, &NodeNotices::default(), &Notices::default(), 10, &book).unwrap();
        assert_eq!(written.answers.iter().map(|a| a.question.as_str()).collect::<Vec<_>>(), [ca, db]);
        let read_back: NodeNotices = serde_json::from_value(serde_json::to_value(&written).unwrap()).unwrap();
        assert_eq!(read_back, written);
        assert_eq!(next_status(&node, &read_back, &Notices::default(), 20, &book), None);
    }
}
