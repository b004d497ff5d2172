//! The revocations' broadcast: the access-notices controller writes the access questions whose
//! answer it has just seen turn from allowed to denied into one annotation of the Lease every
//! node already watches by name, before it writes each node's status. Each node that asks one of
//! them holds it denied at once, so a revocation reaches every node serving it after one write
//! the apiserver sends to every watcher, where the nodes' statuses are one write each, several
//! milliseconds of the apiserver's CPU apiece.
//!
//! It only hastens, and only denies: a line the node misses (its watch restarted, more
//! revocations than the log holds) is told by its status as before; a denial taken from a line
//! is doubted until the status says the same (the node's side: the driver's
//! `content/cluster/broadcast_denials.rs`), so a line older than a grant given again costs a
//! moment's denial and one review, never an allow.
//!
//! The value is one line per revoked account and resource, `SEQUENCE NAMESPACE/ACCOUNT/RESOURCE/NAMES`
//! (the names comma-separated: a name of a share or provider never holds a comma; a line of one
//! name is a question's own key), oldest first, at most [`MAX_LINES`] and [`MAX_VALUE`] bytes; the
//! sequence (the controller's clock in milliseconds, raised past the last line) makes a revocation
//! of a question revoked before a new line. A node compares the lines with the value it saw
//! last: the new ones are the revocations since. One binding deleted commonly revokes one
//! account's use of many shares at once: as one line, it fits in its namespace's part of the log
//! (a line per question once let such a revocation push its own first questions out).

use std::collections::{HashSet, VecDeque};

use crate::access::AccessQuestion;
use crate::node_view::MAX_QUESTION_LENGTH;

/// The Lease annotation holding the log.
pub const ANNOTATION: &str = "sharedresource.inlineguard.dev/revoked";
/// The most lines the log holds: the oldest go first. A round that revokes more leaves the rest
/// to the nodes' statuses.
pub const MAX_LINES: usize = 64;
/// The most lines of one namespace the log holds (its oldest go first): a tenant churning its
/// own grants cannot push other namespaces' revocations out of the log.
pub const MAX_LINES_PER_NAMESPACE: usize = 8;
/// The longest line: a sequence of 19 digits, a space, and an account's names of one resource
/// (a longer list is cut into several lines; one question always fits).
const MAX_LINE: usize = 20 + 2 * MAX_QUESTION_LENGTH;
/// The most bytes the value holds (its oldest lines go first): every node receives the Lease at
/// every renewal, so the log stays small; far under the 256 KiB the apiserver allows.
pub const MAX_VALUE: usize = 40 * 1024;
/// The most questions a reader takes from one value, whatever was written into it.
const MAX_READ: usize = 4096;

/// The log, as the controller keeps it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RevocationLog {
    lines: VecDeque<(i64, String)>,
}

impl RevocationLog {
    /// Adds `questions`, revoked at `now` (milliseconds): one line per account and resource
    /// (cut where a line would grow too long), each with its own sequence past the last one's;
    /// drops the oldest lines past [`MAX_LINES_PER_NAMESPACE`] of a namespace, [`MAX_LINES`] and
    /// [`MAX_VALUE`]. Whether anything was added.
    pub fn revoked<'a>(&mut self, questions: impl IntoIterator<Item = &'a AccessQuestion>, now: i64) -> bool {
        let mut added = false;
        for key in grouped(questions) {
            let namespace = key.split('/').next().unwrap_or_default().to_string();
            let last = self.lines.back().map_or(i64::MIN, |(sequence, _)| *sequence);
            let sequence = now.max(last.saturating_add(1));
            let of_namespace = |key: &String| key.split('/').next() == Some(namespace.as_str());
            if self.lines.iter().filter(|(_, key)| of_namespace(key)).count() >= MAX_LINES_PER_NAMESPACE
                && let Some(oldest) = self.lines.iter().position(|(_, key)| of_namespace(key))
            {
                self.lines.remove(oldest);
            }
            self.lines.push_back((sequence, key));
            added = true;
        }
        while self.lines.len() > MAX_LINES || self.value_len() > MAX_VALUE {
            self.lines.pop_front();
        }
        added
    }

    /// The annotation's value.
    pub fn value(&self) -> String {
        self.lines.iter().map(|(sequence, key)| format!("{sequence} {key}\n")).collect()
    }

    fn value_len(&self) -> usize {
        self.lines.iter().map(|(sequence, key)| sequence.to_string().len() + key.len() + 2).sum()
    }
}

/// `questions` as the keys of lines: one per account and resource, in the order each was first
/// revoked, its names in the order revoked (each once), cut so that no line is too long.
fn grouped<'a>(questions: impl IntoIterator<Item = &'a AccessQuestion>) -> Vec<String> {
    let mut groups: Vec<(String, Vec<&'a str>)> = Vec::new();
    let mut seen = HashSet::new();
    for question in questions {
        if !seen.insert(question) {
            continue;
        }
        let prefix = format!("{}/{}/{}/", question.namespace, question.service_account, question.kind.resource());
        let fits = |(group, names): &(String, Vec<&str>)| {
            *group == prefix
                && prefix.len() + names.iter().map(|n| n.len() + 1).sum::<usize>() + question.name.len()
                    <= MAX_LINE - 20
        };
        match groups.iter_mut().rev().find(|group| group.0 == prefix) {
            Some(group) if fits(group) => group.1.push(&question.name),
            _ => groups.push((prefix, vec![&question.name])),
        }
    }
    groups.into_iter().map(|(prefix, names)| format!("{prefix}{}", names.join(","))).collect()
}

/// The questions in `now`'s lines that were not in `before`'s: revoked since the node saw
/// `before`. Lines of no known form, past [`MAX_LINES`] or longer than a line can be, and
/// questions past [`MAX_READ`], are passed over.
pub fn revoked_since(before: &str, now: &str) -> Vec<AccessQuestion> {
    let seen: HashSet<&str> = lines(before).collect();
    lines(now)
        .filter(|line| !seen.contains(line))
        .filter_map(|line| {
            let (sequence, key) = line.split_once(' ')?;
            sequence.parse::<i64>().ok()?;
            let (prefix, names) = key.rsplit_once('/')?;
            Some(names.split(',').filter_map(move |name| AccessQuestion::parse(&format!("{prefix}/{name}"))))
        })
        .flatten()
        .take(MAX_READ)
        .collect()
}

fn lines(value: &str) -> impl Iterator<Item = &str> {
    value.lines().filter(|line| !line.is_empty() && line.len() <= MAX_LINE).take(MAX_LINES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(key: &str) -> AccessQuestion {
        AccessQuestion::parse(key).unwrap()
    }

    fn keys(questions: &[AccessQuestion]) -> Vec<String> {
        questions.iter().map(AccessQuestion::key).collect()
    }

    const DB: &str = "team-a/web/sharedsecrets/db";
    const CA: &str = "team-b/api/sharedconfigmaps/ca";

    #[test]
    fn a_node_takes_the_lines_new_since_it_last_looked_and_a_question_revoked_again_is_new() {
        let mut log = RevocationLog::default();
        assert!(!log.revoked([], 1_000), "nothing revoked: nothing to write");
        let empty = log.value();
        assert!(log.revoked([&question(DB)], 1_000));
        let first = log.value();
        assert_eq!(first, format!("1000 {DB}\n"));
        assert_eq!(keys(&revoked_since(&empty, &first)), [DB]);
        assert!(revoked_since(&first, &first).is_empty(), "seen already");
        // The same clock reading (or one behind) still makes a new line.
        log.revoked([&question(CA), &question(DB)], 900);
        let second = log.value();
        assert_eq!(second, format!("1000 {DB}\n1001 {CA}\n1002 {DB}\n"));
        assert_eq!(keys(&revoked_since(&first, &second)), [CA, DB]);
    }

    #[test]
    fn one_namespace_keeps_at_most_its_part_of_the_log() {
        let mut log = RevocationLog::default();
        log.revoked([&question(CA)], 1);
        let churn: Vec<AccessQuestion> =
            (0..3 * MAX_LINES_PER_NAMESPACE).map(|i| question(&format!("team-a/sa{i}/sharedsecrets/db"))).collect();
        log.revoked(&churn, 2);
        let value = log.value();
        assert_eq!(value.lines().filter(|line| line.contains(" team-a/")).count(), MAX_LINES_PER_NAMESPACE);
        assert!(value.contains(CA), "another namespace's revocation stays: {value}");
        assert!(value.contains("team-a/sa23/") && !value.contains("team-a/sa15/"), "its newest kept: {value}");
    }

    #[test]
    fn one_accounts_many_shares_revoked_at_once_are_one_line_and_every_one_is_read() {
        let mut log = RevocationLog::default();
        let shares: Vec<AccessQuestion> = (0..2 * MAX_LINES_PER_NAMESPACE)
            .map(|i| question(&format!("team-a/web/sharedsecrets/share-{i}")))
            .collect();
        log.revoked(shares.iter().chain([&question(CA)]), 5);
        let value = log.value();
        assert_eq!(value.lines().count(), 2, "{value}");
        assert!(value.starts_with("5 team-a/web/sharedsecrets/share-0,share-1,"), "{value}");
        assert_eq!(
            keys(&revoked_since("", &value)),
            keys(&shares).into_iter().chain([CA.to_string()]).collect::<Vec<_>>()
        );
        // Names too many for one line are cut into several, each read whole.
        let long: Vec<AccessQuestion> =
            (0..40).map(|i| question(&format!("team-b/web/sharedsecrets/{i:0>60}"))).collect();
        let mut log = RevocationLog::default();
        log.revoked(&long, 6);
        let value = log.value();
        assert!(value.lines().count() > 1 && value.lines().all(|line| line.len() <= MAX_LINE), "{value}");
        assert_eq!(keys(&revoked_since("", &value)), keys(&long));
    }

    #[test]
    fn the_value_stays_under_its_byte_bound() {
        let mut log = RevocationLog::default();
        for i in 0..MAX_LINES {
            let names: Vec<AccessQuestion> =
                (0..20).map(|n| question(&format!("team-{i}/web/sharedsecrets/{n:0>50}"))).collect();
            log.revoked(&names, i as i64);
        }
        assert!(log.value().len() <= MAX_VALUE, "{}", log.value().len());
        assert!(log.value().contains("team-63/"), "the newest kept");
    }

    #[test]
    fn the_log_keeps_its_newest_lines_and_a_reader_bounds_what_it_reads() {
        let mut log = RevocationLog::default();
        let many: Vec<AccessQuestion> =
            (0..MAX_LINES + 10).map(|i| question(&format!("team-{i}/sa/sharedsecrets/db"))).collect();
        log.revoked(&many, 1);
        let value = log.value();
        assert_eq!(value.lines().count(), MAX_LINES);
        assert!(value.starts_with("11 team-10/"), "the oldest dropped: {}", &value[..40]);
        assert_eq!(revoked_since("", &value).len(), MAX_LINES);
        // Written by hand, or by something else: what is not a line of the log is passed over.
        let odd = format!("x {DB}\n12 not-a-question\n\n13 {CA}\n14 {}\n", "a".repeat(MAX_LINE));
        assert_eq!(keys(&revoked_since("", &odd)), [CA]);
        let flood = format!("1 {DB}\n").repeat(10 * MAX_LINES);
        assert!(revoked_since("", &flood).len() <= MAX_LINES);
    }
}
