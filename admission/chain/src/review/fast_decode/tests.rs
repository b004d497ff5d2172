//! The hand-written decoder against serde's derive, its reference: on the corpus both decode the
//! same envelope, and on any change to it (a byte, a cut, a value of another type, a field given
//! twice) the hand-written one either agrees with serde or declines.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::super::ReviewEnvelope;
use super::*;

type Envelope<'a> = ReviewEnvelope<'a, ObjectShape<'a>>;

fn serde_decode(text: &str) -> Result<Envelope<'_>, String> {
    serde_json::from_str(text).map_err(|error| error.to_string())
}

/// The property: whatever the hand-written decoder accepts, serde accepts as the same envelope.
fn agrees(text: &str) -> Result<bool, String> {
    match review_envelope(text) {
        Err(Declined) => Ok(false),
        Ok(fast) => match serde_decode(text) {
            Ok(reference) if reference == fast => Ok(true),
            Ok(reference) => Err(format!("different envelopes for {text}:\n{fast:?}\n{reference:?}")),
            Err(error) => Err(format!("accepted what serde refuses ({error}): {text}")),
        },
    }
}

fn request(resource: (&str, &str), kind: &str, operation: &str, object: Value, old_object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": resource.0, "version": "v1", "kind": kind},
            "resource": {"group": resource.0, "version": "v1", "resource": resource.1},
            "requestKind": {"group": resource.0, "version": "v1", "kind": kind},
            "namespace": "team-a",
            "name": "web",
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "a1b2",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/credential-id": ["JTI=1"], "scopes": []}
            },
            "object": object,
            "oldObject": old_object,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

fn pod_spec() -> Value {
    json!({
        "containers": [{
            "name": "app",
            "image": "registry.example.com/app:1",
            "env": [{"name": "A", "value": "x\"y\\z \u{e9} <&>"}],
            "volumeMounts": [{"name": "shared", "mountPath": "/s", "readOnly": false}, {"name": "t", "mountPath": "/t"}]
        }],
        "initContainers": null,
        "ephemeralContainers": [{"name": "debug", "volumeMounts": [{"name": "shared", "readOnly": true}]}],
        "volumes": [
            {"name": "shared", "csi": {"driver": "csi.example.com", "readOnly": null, "volumeAttributes": {"a": "b", "c": "d\u{e9}"}}},
            {"name": "t", "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"expirationSeconds": 3607}}]}},
            {"name": "e", "emptyDir": {}}
        ],
        "runtimeClassName": "kata",
        "serviceAccountName": "web",
        "securityContext": {"runAsUser": 1000, "fsGroup": 2.5e3},
        "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": -300}]
    })
}

/// Reviews of every resource that carries a pod spec and one that does not, written compactly
/// and pretty, beside the benchmarks' reviews and the README's example.
fn corpus() -> Vec<String> {
    let metadata = json!({"name": "web", "generateName": "web-", "namespace": "team-a", "labels": {"app": "web"},
        "annotations": {"a": "b", "sharedresource.inlineguard.dev/inject": "sharedsecret/db:/etc/db", "c": {"not": "a string"}}});
    let template = json!({"metadata": {"annotations": {"sharedresource.inlineguard.dev/inject": "projection/p:/p"}}, "spec": pod_spec()});
    let objects = [
        (("", "pods"), "Pod", json!({"metadata": metadata, "spec": pod_spec()})),
        (("", "podtemplates"), "PodTemplate", json!({"metadata": metadata, "template": template})),
        (
            ("", "replicationcontrollers"),
            "ReplicationController",
            json!({"spec": {"replicas": 1, "template": template}}),
        ),
        (
            ("apps", "deployments"),
            "Deployment",
            json!({"metadata": null, "spec": {"selector": {}, "template": template}}),
        ),
        (("apps", "statefulsets"), "StatefulSet", json!({"spec": {"template": {"spec": null}}})),
        (
            ("batch", "cronjobs"),
            "CronJob",
            json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}),
        ),
        (
            ("example.com", "widgets"),
            "Widget",
            json!({"metadata": {"name": "w"}, "spec": {"size": [1, 2, {"deep": [[[]]]}]}}),
        ),
    ];
    let mut corpus = Vec::new();
    for (resource, kind, object) in objects {
        for (operation, old) in [("CREATE", Value::Null), ("UPDATE", object.clone())] {
            let review = request(resource, kind, operation, object.clone(), old);
            corpus.push(serde_json::to_string(&review).unwrap());
            corpus.push(serde_json::to_string_pretty(&review).unwrap());
        }
    }
    let mut delete = request(("", "pods"), "Pod", "DELETE", Value::Null, json!({"spec": pod_spec()}));
    delete["request"]["subResource"] = json!("ephemeralcontainers");
    delete["request"]["dryRun"] = Value::Null;
    corpus.push(serde_json::to_string(&delete).unwrap());
    corpus.push(r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":null}"#.into());
    corpus.push(r#" {"apiVersion":"admission.k8s.io/v1"} "#.into());
    corpus.push(include_str!("../../../../../benches/fixtures/review-3k.json").into());
    corpus.push(include_str!("../../../../../benches/fixtures/review-30k.json").into());
    corpus.push(include_str!("../../../../../config/examples/review-denied.json").into());
    corpus
}

#[test]
fn decodes_the_whole_corpus_as_serde_does() {
    for text in corpus() {
        assert_eq!(agrees(&text), Ok(true), "declined or differs: {text}");
    }
}

#[test]
fn strings_with_escapes_are_read_as_serde_reads_them() {
    let text = r#"{"apiVersion":"admission.k8s.io\/v1","kind":"AdmissionReview","request":{"uid":"u\u0031","kind":{"version":"v1","kind":"Pod"},"resource":{"version":"v1","resource":"pods"},"operation":"CREATE","userInfo":{"username":"a\"b\\c\u00e9\t"},"object":{"metadata":{"name":"n\/m"},"spec":{"volumes":[{"name":"v\n","csi":{"driver":"d\u002ee"}}]}}}}"#;
    assert_eq!(agrees(text), Ok(true));
    let envelope = review_envelope(text).unwrap();
    assert_eq!(envelope.request.unwrap().user_info.username, "a\"b\\c\u{e9}\t");
}

#[test]
fn what_it_leaves_to_serde_is_what_serde_decides() {
    let base = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"resource":{"version":"v1","resource":"pods"},"operation":"CREATE"XX}}"#;
    // Each is accepted by serde (so parse_request still answers it) or refused by it (so it is
    // explained); the hand-written decoder declines all of them.
    let cases = [
        (r#","userInfo":{"username":"\ud83d\ude00"}"#, true),
        (r#","\u0075serInfo":{}"#, true),
        (r#","userInfo":{"username":"a","username":"b"}"#, false),
        (r#","uid":"again""#, false),
        (r#","userInfo":null"#, false),
        (r#","userInfo":{"groups":null}"#, false),
        (r#","object":{"spec":{"volumes":[{"name":null}]}}"#, false),
        (r#","object":{"spec":{"volumes":[{"name":"v","csi":{"driver":7}}]}}"#, false),
        (r#","object":{"spec":{"containers":[{"name":"c","volumeMounts":[{"readOnly":"yes"}]}]}}"#, false),
        (r#","object":{"metadata":{"name":"a"},"metadata":null}"#, false),
        (r#","userInfo":["alice"]"#, true),
        (r#","dryRun":0"#, false),
    ];
    for (extra, serde_accepts) in cases {
        let text = base.replace("XX", extra);
        assert_eq!(review_envelope(&text), Err(Declined), "{extra}");
        assert_eq!(serde_decode(&text).is_ok(), serde_accepts, "{extra}: {:?}", serde_decode(&text));
    }
    let missing_operation = base.replace(r#","operation":"CREATE"XX"#, "");
    assert_eq!(review_envelope(&missing_operation), Err(Declined));
    assert!(serde_decode(&missing_operation).unwrap_err().contains("missing field `operation`"));
    let other_operation = base.replace("CREATE", "PATCH").replace("XX", "");
    assert_eq!(review_envelope(&other_operation), Err(Declined));
    assert!(serde_decode(&other_operation).is_err());
}

#[test]
fn every_cut_of_a_review_is_declined_or_agreed() {
    let text = serde_json::to_string(&request(("", "pods"), "Pod", "CREATE", json!({"spec": pod_spec()}), Value::Null))
        .unwrap();
    for end in 0..text.len() {
        if let Some(prefix) = text.get(..end) {
            assert_eq!(agrees(prefix), Ok(false), "a cut at {end} was accepted");
        }
    }
}

/// Every value in `value`, by path, so a change can be aimed at any of them.
fn paths(value: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(path.clone());
    let children: Vec<(String, &Value)> = match value {
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Value::Array(items) => items.iter().enumerate().map(|(i, v)| (i.to_string(), v)).collect(),
        _ => Vec::new(),
    };
    for (key, child) in children {
        path.push(key);
        paths(child, path, out);
        path.pop();
    }
}

fn at_path<'v>(value: &'v mut Value, path: &[String]) -> &'v mut Value {
    path.iter().fold(value, |value, key| match value {
        Value::Array(items) => &mut items[key.parse::<usize>().unwrap()],
        other => &mut other[key.as_str()],
    })
}

/// Values of every JSON type, some of them the very values the decoder reads.
fn replacement() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        Just(json!(1.5e300)),
        "[a-z\\\\\"é\u{1}]{0,6}".prop_map(Value::String),
        Just(json!("CREATE")),
        Just(json!("v1")),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("name".to_string()),
                    Just("readOnly".to_string()),
                    Just("spec".to_string()),
                    "[a-z]{1,4}"
                ],
                inner,
                0..4
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// A review from the corpus, and an index to aim a change with.
fn corpus_review() -> impl Strategy<Value = (String, prop::sample::Index)> {
    let corpus = corpus();
    (0..corpus.len(), any::<prop::sample::Index>()).prop_map(move |(i, at)| (corpus[i].clone(), at))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn a_value_of_any_type_anywhere_is_declined_or_agreed(
        (text, at) in corpus_review(),
        new in replacement(),
        pretty in any::<bool>(),
    ) {
        let mut review: Value = serde_json::from_str(&text).unwrap();
        let mut all = Vec::new();
        paths(&review, &mut Vec::new(), &mut all);
        *at_path(&mut review, &all[at.index(all.len())]) = new;
        let text = if pretty { serde_json::to_string_pretty(&review) } else { serde_json::to_string(&review) }.unwrap();
        agrees(&text).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn a_changed_byte_is_declined_or_agreed(
        (text, at) in corpus_review(),
        byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b':'), Just(b'{'), Just(b'}'), Just(b'['), Just(b']'), Just(b'0'), Just(b'n'), Just(b' '), Just(0x01u8), Just(b'x')],
    ) {
        let mut bytes = text.into_bytes();
        let index = at.index(bytes.len());
        bytes[index] = byte;
        if let Ok(text) = String::from_utf8(bytes) {
            agrees(&text).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn a_member_given_twice_is_declined_or_agreed((text, at) in corpus_review()) {
        // Repeat the member that starts at a key: `"k": v` becomes `"k": v, "k": v`, spliced
        // textually so that every key, known or not, gets repeated somewhere.
        let review: Value = serde_json::from_str(&text).unwrap();
        let compact = serde_json::to_string(&review).unwrap();
        let starts: Vec<usize> = compact.match_indices("\":").map(|(i, _)| i).collect();
        prop_assume!(!starts.is_empty());
        let colon = starts[at.index(starts.len())];
        let key_start = compact[..colon].rfind(['{', ',']).unwrap() + 1;
        let mut cursor = JsonCursor::new(&compact[colon + 2..]);
        prop_assume!(cursor.skip().is_ok());
        let value_len = compact.len() - colon - 2 - cursor.remaining();
        let member = &compact[key_start..colon + 2 + value_len];
        let doubled = format!("{}{member},{}", &compact[..key_start], &compact[key_start..]);
        agrees(&doubled).map_err(TestCaseError::fail)?;
    }
}
