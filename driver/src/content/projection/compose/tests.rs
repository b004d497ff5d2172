//! The composition table: items, modes, optional keys, pod facts, tokens, and where sources
//! meet (the design's collision cases).

use super::*;
use crate::content::tokens::TOKENS_KEY;
use sharedresource_api::projection::spec::{FieldItem, PodInfoProjection, TokenProjection};

fn secret(name: &str, items: Option<Vec<KeyItem>>) -> ProjectionSource {
    ProjectionSource {
        shared_secret: Some(ShareProjection { name: name.into(), items, optional: false }),
        ..Default::default()
    }
}

fn config_map(name: &str, items: Option<Vec<KeyItem>>) -> ProjectionSource {
    ProjectionSource {
        shared_config_map: Some(ShareProjection { name: name.into(), items, optional: false }),
        ..Default::default()
    }
}

fn item(key: &str, path: &str) -> KeyItem {
    KeyItem { key: key.into(), path: path.into(), ..Default::default() }
}

fn pod_info(items: &[(&str, &str)]) -> ProjectionSource {
    let items = items
        .iter()
        .map(|(path, field_path)| FieldItem { path: (*path).into(), field_path: (*field_path).into(), mode: None })
        .collect();
    ProjectionSource { pod_info: Some(PodInfoProjection { items }), ..Default::default() }
}

fn token(audience: &str, path: &str) -> ProjectionSource {
    let token = TokenProjection { audience: audience.into(), path: path.into() };
    ProjectionSource { service_account_token: Some(token), ..Default::default() }
}

fn spec(sources: Vec<ProjectionSource>) -> ProjectionSpec {
    ProjectionSpec { default_mode: None, sources }
}

fn data() -> SourceData {
    let object = |pairs: &[(&str, &str)]| -> BTreeMap<String, Vec<u8>> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), v.as_bytes().to_vec())).collect()
    };
    SourceData {
        shares: [
            (
                (ShareKind::Secret, "db".to_string()),
                object(&[("user", "app"), ("password", "s3cret"), ("shared", "from-secret")]),
            ),
            ((ShareKind::ConfigMap, "settings".to_string()), object(&[("level", "debug"), ("shared", "from-config")])),
        ]
        .into(),
        pod: PodFacts {
            name: "web-0".into(),
            namespace: "team-a".into(),
            labels: [("app".into(), "web".into())].into(),
            ..Default::default()
        },
        tokens: Tokens::from_volume_context(
            &[(TOKENS_KEY.to_string(), r#"{"vault":{"token":"TOKEN-VALUE"}}"#.to_string())].into(),
        )
        .unwrap(),
    }
}

/// The payload as path → (text, mode), for comparing.
fn files(payload: &Payload) -> BTreeMap<&str, (String, u32)> {
    payload
        .iter()
        .map(|(path, file)| (path.as_str(), (String::from_utf8_lossy(&file.data).into_owned(), file.mode)))
        .collect()
}

#[test]
fn a_share_without_items_shows_every_key_under_its_name_with_the_default_mode() {
    let payload = compose(&spec(vec![config_map("settings", None)]), &data(), u64::MAX).unwrap();
    let expected = [("level", ("debug".to_string(), 0o644)), ("shared", ("from-config".to_string(), 0o644))];
    assert_eq!(files(&payload), expected.into());
}

#[test]
fn items_select_rename_and_set_modes_and_default_mode_covers_the_rest() {
    let mut password = item("password", "db/password");
    password.mode = Some(0o400);
    let mut projection = spec(vec![secret("db", Some(vec![password, item("user", "db/user")]))]);
    projection.default_mode = Some(0o440);
    let payload = compose(&projection, &data(), u64::MAX).unwrap();
    let expected = [("db/password", ("s3cret".to_string(), 0o400)), ("db/user", ("app".to_string(), 0o440))];
    assert_eq!(files(&payload), expected.into());
}

#[test]
fn a_missing_key_fails_the_volume_unless_its_item_is_optional() {
    let error = compose(&spec(vec![secret("db", Some(vec![item("absent", "x")]))]), &data(), u64::MAX).unwrap_err();
    assert!(matches!(error, Error::Unservable(_)));
    assert_eq!(
        error.to_string(),
        "sources[0] (sharedSecret \"db\"): the backing object has no key \"absent\" (mark the item, or the source, optional to skip it)"
    );

    let mut optional = item("absent", "x");
    optional.optional = true;
    let payload =
        compose(&spec(vec![secret("db", Some(vec![optional, item("user", "u")]))]), &data(), u64::MAX).unwrap();
    assert_eq!(payload.keys().collect::<Vec<_>>(), ["u"]);
}

#[test]
fn an_optional_source_skips_every_key_its_object_lacks_and_an_object_that_is_not_there() {
    let mut source = secret("db", Some(vec![item("absent", "x"), item("user", "u")]));
    source.shared_secret.as_mut().unwrap().optional = true;
    let payload = compose(&spec(vec![source.clone()]), &data(), u64::MAX).unwrap();
    assert_eq!(payload.keys().collect::<Vec<_>>(), ["u"], "the key it has is shown");
    // Its object absent: the caller hands an empty one, and the source shows nothing.
    let mut absent = data();
    absent.shares.insert((ShareKind::Secret, "db".into()), BTreeMap::new());
    let payload = compose(&spec(vec![source, token("vault", "token")]), &absent, u64::MAX).unwrap();
    assert_eq!(payload.keys().collect::<Vec<_>>(), ["token"], "the other sources are still laid out");
}

#[test]
fn pod_facts_and_the_token_are_laid_out_at_their_paths() {
    let projection = spec(vec![
        pod_info(&[("pod/name", "metadata.name"), ("pod/labels", "metadata.labels")]),
        token("vault", "token"),
    ]);
    let payload = compose(&projection, &data(), u64::MAX).unwrap();
    let expected = [
        ("pod/labels", ("app=\"web\"".to_string(), 0o644)),
        ("pod/name", ("web-0".to_string(), 0o644)),
        ("token", ("TOKEN-VALUE".to_string(), 0o644)),
    ];
    assert_eq!(files(&payload), expected.into());
}

#[test]
fn a_token_for_an_audience_kubelet_did_not_pass_is_refused_without_printing_any_token() {
    let error = compose(&spec(vec![token("other", "token")]), &data(), u64::MAX).unwrap_err().to_string();
    assert_eq!(
        error,
        "sources[0] (serviceAccountToken \"other\"): kubelet passed no token for audience \"other\": \
         the CSIDriver's tokenRequests must name it"
    );
    assert!(!error.contains("TOKEN-VALUE"));
}

#[test]
fn tokens_lost_to_a_restart_are_unavailable_not_invalid() {
    let lost = SourceData { tokens: Tokens::lost(), ..data() };
    // Unavailable leaves the volume as it is until kubelet's republish; invalid would empty it.
    match compose(&spec(vec![token("vault", "token")]), &lost, u64::MAX) {
        Err(Error::Unavailable(message)) => {
            assert!(message.contains("kubelet's next republish brings it"), "{message}")
        }
        other => panic!("expected UNAVAILABLE, got {other:?}"),
    }
}

#[test]
fn where_sources_meet_follows_the_collision_table() {
    struct Case {
        name: &'static str,
        sources: Vec<ProjectionSource>,
        /// `Ok(files at "shared" or the colliding path)` or the error message.
        outcome: Result<Vec<(&'static str, &'static str)>, &'static str>,
    }
    let cases = [
        Case {
            name: "implicit keys: the later source wins",
            sources: vec![secret("db", None), config_map("settings", None)],
            outcome: Ok(vec![("shared", "from-config")]),
        },
        Case {
            name: "implicit keys, the other order: still the later source",
            sources: vec![config_map("settings", None), secret("db", None)],
            outcome: Ok(vec![("shared", "from-secret")]),
        },
        Case {
            name: "an explicit path over an earlier implicit key: the later wins",
            sources: vec![secret("db", None), config_map("settings", Some(vec![item("level", "shared")]))],
            outcome: Ok(vec![("shared", "debug")]),
        },
        Case {
            name: "an implicit key over an earlier explicit path: the later wins",
            sources: vec![config_map("settings", Some(vec![item("level", "shared")])), secret("db", None)],
            outcome: Ok(vec![("shared", "from-secret")]),
        },
        Case {
            name: "two explicit paths in two sources",
            sources: vec![
                secret("db", Some(vec![item("user", "conf/name")])),
                config_map("settings", Some(vec![item("level", "conf/name")])),
            ],
            outcome: Err("sources[0] (sharedSecret \"db\") and sources[1] (sharedConfigMap \"settings\") \
                          collide at path \"conf/name\": both name it"),
        },
        Case {
            name: "two explicit paths in one source",
            sources: vec![secret("db", Some(vec![item("user", "x"), item("password", "x")]))],
            outcome: Err(
                "sources[0] (sharedSecret \"db\") and sources[0] (sharedSecret \"db\") collide at path \"x\": \
                          both name it",
            ),
        },
        Case {
            name: "a pod fact on a token's path",
            sources: vec![token("vault", "token"), pod_info(&[("token", "metadata.name")])],
            outcome: Err("sources[0] (serviceAccountToken \"vault\") and sources[1] (podInfo) collide at path \
                          \"token\": both name it"),
        },
        Case {
            name: "a file where a later path needs a directory",
            sources: vec![secret("db", Some(vec![item("user", "db")])), pod_info(&[("db/name", "metadata.name")])],
            outcome: Err("sources[0] (sharedSecret \"db\") and sources[1] (podInfo) collide at path \"db/name\": \
                          \"db\" is a file"),
        },
        Case {
            name: "a directory where a later path wants a file",
            sources: vec![pod_info(&[("db/name", "metadata.name")]), secret("db", Some(vec![item("user", "db")]))],
            outcome: Err("sources[0] (podInfo) and sources[1] (sharedSecret \"db\") collide at path \"db/name\": \
                          \"db\" is a file"),
        },
        Case {
            name: "an implicit key where a later path needs a directory",
            sources: vec![secret("db", None), pod_info(&[("user/name", "metadata.name")])],
            outcome: Err("sources[0] (sharedSecret \"db\") and sources[1] (podInfo) collide at path \"user/name\": \
                          \"user\" is a file"),
        },
        Case {
            name: "siblings under one directory do not collide",
            sources: vec![
                secret("db", Some(vec![item("user", "conf/user")])),
                config_map("settings", Some(vec![item("level", "conf/level")])),
            ],
            outcome: Ok(vec![("conf/level", "debug"), ("conf/user", "app")]),
        },
        Case {
            name: "a name that merely starts like another is no directory",
            sources: vec![
                secret("db", Some(vec![item("user", "conf")])),
                pod_info(&[("conf.d/name", "metadata.name")]),
            ],
            outcome: Ok(vec![("conf", "app"), ("conf.d/name", "web-0")]),
        },
    ];
    for case in cases {
        let result = compose(&spec(case.sources), &data(), u64::MAX);
        match (result, case.outcome) {
            (Ok(payload), Ok(expected)) => {
                for (path, text) in expected {
                    let file = payload.get(path).unwrap_or_else(|| panic!("{}: no file at {path}", case.name));
                    assert_eq!(file.data, text.as_bytes(), "{}", case.name);
                }
            }
            (Err(error), Err(expected)) => {
                assert!(matches!(error, Error::Invalid(_)), "{}: {error:?}", case.name);
                assert_eq!(error.to_string(), expected, "{}", case.name);
            }
            (result, expected) => panic!("{}: got {result:?}, expected {expected:?}", case.name),
        }
    }
}

#[test]
fn explicit_collisions_are_found_without_any_data() {
    // The admission refuses such an object at creation; it has no data to look at.
    let projection = spec(vec![token("vault", "token"), secret("db", Some(vec![item("absent", "token")]))]);
    let error = check_spec(&projection).unwrap_err().to_string();
    assert!(error.ends_with("collide at path \"token\": both name it"), "{error}");
}

#[test]
fn the_widest_mode_is_accepted() {
    let mut widest = item("user", "u");
    widest.mode = Some(0o777);
    let mut projection = spec(vec![secret("db", Some(vec![widest]))]);
    projection.default_mode = Some(0o777);
    assert_eq!(check_spec(&projection), Ok(()));
}

#[test]
fn a_bad_spec_is_refused_with_the_source_and_what_is_wrong() {
    let mut bad_mode = item("user", "u");
    bad_mode.mode = Some(0o1000);
    let two_kinds = ProjectionSource { pod_info: secret("db", None).pod_info, ..secret("db", None) };
    let two_kinds = ProjectionSource { pod_info: Some(PodInfoProjection::default()), ..two_kinds };
    let cases: [(ProjectionSpec, &str); 6] = [
        (spec(vec![]), "the projection has no sources"),
        (
            spec(vec![ProjectionSource::default()]),
            "sources[0] must set exactly one of sharedSecret, sharedConfigMap, podInfo, serviceAccountToken",
        ),
        (
            spec(vec![two_kinds]),
            "sources[0] must set exactly one of sharedSecret, sharedConfigMap, podInfo, serviceAccountToken",
        ),
        (
            spec(vec![secret("db", Some(vec![item("user", "../escape")]))]),
            "sources[0] (sharedSecret \"db\"): key \"../escape\" is refused: names starting with \"..\" are reserved",
        ),
        (
            spec(vec![secret("db", Some(vec![bad_mode]))]),
            "sources[0] (sharedSecret \"db\"): the mode of \"u\" 0o1000 is out of range: a mode is between 0 and 0777 (octal)",
        ),
        (
            spec(vec![pod_info(&[("ip", "status.podIP")])]),
            "sources[0] (podInfo): fieldPath \"status.podIP\" is not supported: use metadata.name, metadata.namespace, \
             metadata.uid, spec.serviceAccountName, metadata.labels, metadata.annotations, \
             metadata.labels['<key>'] or metadata.annotations['<key>']",
        ),
    ];
    for (projection, expected) in cases {
        let error = compose(&projection, &data(), u64::MAX).unwrap_err();
        assert!(matches!(error, Error::Invalid(_)), "{error:?}");
        assert_eq!(error.to_string(), expected);
    }
    let mut projection = spec(vec![secret("db", None)]);
    projection.default_mode = Some(0o7777);
    assert_eq!(
        compose(&projection, &data(), u64::MAX).unwrap_err().to_string(),
        "defaultMode 0o7777 is out of range: a mode is between 0 and 0777 (octal)"
    );
}

#[test]
fn the_spec_reads_from_the_yaml_users_write() {
    let yaml = r#"
defaultMode: 0o440
sources:
- sharedSecret:
    name: db
    items: [{key: password, path: db/password, mode: 0o400}]
- sharedConfigMap: {name: settings}
- podInfo:
    items: [{path: pod/name, fieldPath: metadata.name}]
- serviceAccountToken: {audience: vault, path: token}
"#;
    let projection: ProjectionSpec = serde_saphyr::from_str(yaml).unwrap();
    assert_eq!(projection.default_mode, Some(0o440));
    let payload = compose(&projection, &data(), u64::MAX).unwrap();
    assert_eq!(
        payload.keys().map(String::as_str).collect::<Vec<_>>(),
        ["db/password", "level", "pod/name", "shared", "token"]
    );
    assert_eq!(payload["db/password"].mode, 0o400);
    assert_eq!(payload["level"].mode, 0o440);
}

#[test]
fn debug_shows_keys_but_never_share_data_or_tokens() {
    let debug = format!("{:?}", data());
    assert!(debug.contains("password"), "{debug}");
    for secret in ["s3cret", "TOKEN-VALUE"] {
        assert!(!debug.contains(secret), "{secret} leaked: {debug}");
    }
}

#[test]
fn a_share_name_that_is_not_an_object_name_is_refused_naming_its_source() {
    let long = "x".repeat(30_003);
    for hostile in ["?watch=true", "s1/status", "..", ".", "a%2fb", "a#b", long.as_str()] {
        let projection = spec(vec![secret("db", None), config_map(hostile, None)]);
        let Err(sharedresource_api::Invalid(message)) = check_spec(&projection) else {
            panic!("{hostile:?} was accepted")
        };
        assert!(message.starts_with("sources[1] (sharedConfigMap \""), "{message}");
        assert!(message.contains("is not a valid object name: an object name is at most 253 characters"), "{message}");
        assert!(message.len() < 800 && !message.contains('%'), "{message}");
    }
    assert_eq!(
        check_spec(&spec(vec![secret("?watch=true", None)])).unwrap_err().to_string(),
        "sources[0] (sharedSecret \"?watch=true\"): \"?watch=true\" is not a valid object name: an object name is \
         at most 253 characters of lowercase letters, digits, '-' and '.', each '.'-separated part starting and \
         ending with a letter or digit"
    );
}

#[test]
fn a_projection_larger_than_its_volume_is_refused_as_it_is_composed() {
    let projection = spec(vec![secret("db", Some(vec![item("user", "u"), item("password", "p")]))]);
    // "app" and "s3cret": 9 bytes.
    assert_eq!(compose(&projection, &data(), 9).unwrap().len(), 2, "9 bytes fit 9");
    let error = compose(&projection, &data(), 8).unwrap_err();
    assert_eq!(
        error,
        Error::TooLarge(
            "sources[0] (sharedSecret \"db\"): the projection's files hold more than 8 bytes, the volume's size \
             (tmpfsSize); name fewer or smaller items"
                .into()
        )
    );
}

#[test]
fn a_projection_of_more_items_than_the_bound_is_refused_before_any_data() {
    let max = sharedresource_api::projection::check::MAX_PROJECTION_ITEMS;
    let paths: Vec<String> = (0..=max).map(|n| format!("name-{n}")).collect();
    let items: Vec<(&str, &str)> = paths.iter().map(|path| (path.as_str(), "metadata.name")).collect();
    let at_the_bound = spec(vec![pod_info(&items[..max])]);
    assert_eq!(compose(&at_the_bound, &data(), u64::MAX).unwrap().len(), max, "the bound itself is allowed");
    let error = compose(&spec(vec![pod_info(&items)]), &data(), u64::MAX).unwrap_err();
    assert_eq!(
        error,
        Error::Invalid(format!(
            "the projection names more than {max} items (counted up to sources[0] (podInfo)); a projection may name \
             at most {max} files"
        ))
    );
}
