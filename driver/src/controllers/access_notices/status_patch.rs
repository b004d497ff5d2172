//! The merge patch that makes a node's stored status say what the controller decided. A JSON
//! merge patch merges maps key by key and keeps what it does not name, so the answers and the
//! objects' values (maps on the wire) would keep every entry of a question or object the node
//! no longer lists, and a field the status leaves out (an emptied list, a flag turned false)
//! would keep its last value: the patch names each field and entry the status had, by what the
//! controller wrote last or saw stored, and the new status no longer has, as `null`, which
//! removes it. The waiting pods' registration entry is not the notices' to write, and is never
//! named.

use serde_json::{Map, Value};
use sharedresource_api::node_view::NodeNotices;

/// The status fields that are maps of entries on the wire.
const MAPS: [&str; 2] = ["accessAnswers", "objectsNoticed"];
/// Written by the waiting pods' teller alone.
const NOT_OURS: &str = "registrationTold";

/// `{"status": ...}`: `next`, with `null` for what any of `before` has that `next` has not: a
/// field it leaves out (an emptied list, a flag turned false, which the status leaves out too:
/// kept, a stale `everyNamespaceAnswered` would have a node take answers asked before a change
/// as current), and each entry of a map it no longer has.
pub fn status_patch(next: &NodeNotices, before: &[&NodeNotices]) -> Value {
    let mut status = match serde_json::to_value(next) {
        Ok(Value::Object(status)) => status,
        // A struct of plain fields always serialises as an object.
        _ => Map::new(),
    };
    status.remove(NOT_OURS);
    for earlier in before {
        let Ok(Value::Object(earlier)) = serde_json::to_value(earlier) else { continue };
        for (field, value) in earlier {
            if field == NOT_OURS {
                continue;
            }
            match (status.get_mut(&field), value) {
                (None, _) => {
                    status.insert(field, Value::Null);
                }
                (Some(Value::Object(now)), Value::Object(entries)) if MAPS.contains(&field.as_str()) => {
                    for key in entries.keys() {
                        now.entry(key.clone()).or_insert(Value::Null);
                    }
                }
                _ => {}
            }
        }
    }
    serde_json::json!({ "status": status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sharedresource_api::node_view::{CentralAnswer, NamespaceGrantChanges, ObjectChanges};

    fn status(questions: &[(&str, bool)], objects: &[(&str, i64)], namespaces: &[&str]) -> NodeNotices {
        NodeNotices {
            answers: questions
                .iter()
                .map(|(question, allowed)| CentralAnswer { question: question.to_string(), allowed: *allowed })
                .collect(),
            objects: objects
                .iter()
                .map(|(object, noticed)| ObjectChanges { object: object.to_string(), noticed: *noticed })
                .collect(),
            namespaces: namespaces
                .iter()
                .map(|namespace| NamespaceGrantChanges {
                    namespace: namespace.to_string(),
                    noticed: 1,
                    answered: false,
                })
                .collect(),
            every_namespace: 5,
            every_namespace_answered: !questions.is_empty(),
            registration_told: Some(9),
            ..NodeNotices::default()
        }
    }

    /// RFC 7386, as the apiserver applies a merge patch.
    fn merged(target: &mut Value, patch: &Value) {
        let Value::Object(patch) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = Value::Object(Map::new());
        }
        let Value::Object(target) = target else { return };
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merged(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }

    #[test]
    fn entries_and_lists_the_status_no_longer_has_are_removed_and_the_registration_is_left_alone() {
        let stored =
            status(&[("a/w/sharedsecrets/x", true), ("a/w/sharedsecrets/y", false)], &[("SharedSecret/x", 3)], &["a"]);
        let next = NodeNotices {
            registration_told: None,
            every_namespace_answered: false,
            ..status(&[("a/w/sharedsecrets/x", false)], &[], &[])
        };
        let patch = status_patch(&next, &[&stored]);
        assert_eq!(
            patch["status"]["accessAnswers"],
            json!({"a/w/sharedsecrets/x": false, "a/w/sharedsecrets/y": null})
        );
        // A map emptied is left out of the status, and removed whole.
        assert_eq!(patch["status"]["objectsNoticed"], Value::Null);
        assert!(patch["status"].as_object().unwrap().contains_key("objectsNoticed"));
        assert_eq!(patch["status"]["namespaces"], Value::Null);
        // Answered before, not now: the flag the status leaves out when false is removed.
        assert_eq!(patch["status"]["everyNamespaceAnswered"], Value::Null);
        assert!(patch["status"].get("registrationTold").is_none());
        let mut object = json!({"status": serde_json::to_value(&stored).unwrap()});
        merged(&mut object, &patch);
        let read: NodeNotices = serde_json::from_value(object["status"].clone()).unwrap();
        assert_eq!(read, NodeNotices { registration_told: Some(9), ..next });
    }

    #[test]
    fn what_was_written_last_and_what_is_stored_are_both_cleared() {
        let stored = status(&[("a/w/sharedsecrets/old", true)], &[], &[]);
        let written = status(&[("a/w/sharedsecrets/newer", true)], &[], &[]);
        let next = status(&[("a/w/sharedsecrets/now", true)], &[], &[]);
        let patch = status_patch(&next, &[&written, &stored]);
        assert_eq!(
            patch["status"]["accessAnswers"],
            json!({"a/w/sharedsecrets/now": true, "a/w/sharedsecrets/newer": null, "a/w/sharedsecrets/old": null})
        );
    }
}
