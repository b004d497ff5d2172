use super::*;

fn share(kind: ShareKind, name: &str) -> ShareRef {
    ShareRef { kind, name: name.to_owned() }
}

fn db() -> ShareRef {
    share(ShareKind::Secret, "db")
}

fn settings() -> ShareRef {
    share(ShareKind::ConfigMap, "settings")
}

fn versions(entries: &[(ShareRef, &str)]) -> BTreeMap<ShareRef, String> {
    entries.iter().map(|(share, version)| (share.clone(), (*version).to_owned())).collect()
}

fn spec(volumes: serde_json::Value) -> PodSpec {
    serde_json::from_value(serde_json::json!({"containers": [], "volumes": volumes})).unwrap()
}

#[test]
fn the_shares_a_template_mounts_are_its_valid_share_volumes_of_this_driver() {
    let spec = spec(serde_json::json!([
        {"name": "a", "csi": {"driver": DRIVER_NAME, "volumeAttributes": {"sharedSecret": "db"}}},
        {"name": "b", "csi": {"driver": DRIVER_NAME, "volumeAttributes": {"sharedConfigMap": "settings", "refreshResource": "false"}}},
        {"name": "c", "csi": {"driver": DRIVER_NAME, "volumeAttributes": {"sharedSecret": "db"}}},
        // Another driver's, a projection, an invalid share name: nothing followed.
        {"name": "d", "csi": {"driver": "other.example.com", "volumeAttributes": {"sharedSecret": "x"}}},
        {"name": "e", "csi": {"driver": DRIVER_NAME, "volumeAttributes": {"projection": "p"}}},
        {"name": "f", "csi": {"driver": DRIVER_NAME, "volumeAttributes": {"sharedSecret": "../x"}}},
        {"name": "g", "emptyDir": {}}
    ]));
    assert_eq!(mounted_shares(&spec), Some(BTreeSet::from([db(), settings()])));
}

#[test]
fn a_template_mounting_too_many_shares_is_not_followed() {
    let volumes: Vec<serde_json::Value> = (0..=MAX_SHARES_PER_WORKLOAD)
        .map(|i| serde_json::json!({"name": format!("v{i}"), "csi": {"driver": DRIVER_NAME, "volumeAttributes": {"sharedSecret": format!("s{i}")}}}))
        .collect();
    assert_eq!(
        mounted_shares(&spec(serde_json::Value::Array(volumes[1..].to_vec()))).map(|s| s.len()),
        Some(MAX_SHARES_PER_WORKLOAD)
    );
    assert_eq!(mounted_shares(&spec(serde_json::Value::Array(volumes))), None);
}

#[test]
fn the_record_reads_back_what_was_written_and_nothing_else() {
    let observed: Observed =
        [(db(), "0123456789abcdef".to_owned()), (settings(), "fedcba9876543210".to_owned())].into();
    let text = format_observed("0a1b2c3d", &observed);
    assert_eq!(text, "@0a1b2c3d,SharedSecret/db=0123456789abcdef,SharedConfigMap/settings=fedcba9876543210");
    assert_eq!(parse_observed(Some(&text), "0a1b2c3d"), observed);
    assert_eq!(parse_observed(Some("@0a1b2c3d"), "0a1b2c3d"), Observed::new(), "nothing recorded");
    for unreadable in [
        "",
        "@0a1b2c3d,SharedSecret/db",
        "@0a1b2c3d,Secret/db=1",
        "@0a1b2c3d,SharedSecret/=1",
        "@0a1b2c3d,SharedSecret/db=",
        "@0a1b2c3d,SharedSecret/db=1,junk",
    ] {
        assert_eq!(parse_observed(Some(unreadable), "0a1b2c3d"), Observed::new(), "{unreadable:?}");
    }
    // Made under another key, or under none (as versions before keys wrote it): no record.
    assert_eq!(parse_observed(Some(&text), "ffffffff"), Observed::new(), "another key");
    assert_eq!(parse_observed(Some("SharedSecret/db=0123456789abcdef"), "0a1b2c3d"), Observed::new(), "no key");
    let long = format!("@0a1b2c3d,{}", "SharedSecret/db=1,".repeat(4000));
    assert_eq!(parse_observed(Some(&long), "0a1b2c3d"), Observed::new(), "too long");
    assert_eq!(parse_observed(None, "0a1b2c3d"), Observed::new());
}

#[test]
fn a_changed_version_restarts_once_and_records_it() {
    let mounted = BTreeSet::from([db(), settings()]);
    let observed: Observed = versions(&[(db(), "v1"), (settings(), "s1")]);
    let decision = decide(&mounted, &observed, &versions(&[(db(), "v2"), (settings(), "s1")]));
    let recorded = versions(&[(db(), "v2"), (settings(), "s1")]);
    assert_eq!(decision, Decision::Restart { observed: recorded.clone(), changed: vec![db()] });
    // Once written, the same view is nothing to do: one change, one restart.
    assert_eq!(decide(&mounted, &recorded, &versions(&[(db(), "v2"), (settings(), "s1")])), Decision::Nothing);
}

#[test]
fn a_first_sight_is_recorded_without_a_restart() {
    let mounted = BTreeSet::from([db(), settings()]);
    let now = versions(&[(db(), "v1"), (settings(), "s1")]);
    assert_eq!(decide(&mounted, &Observed::new(), &now), Decision::Record(now.clone()));
    // A share added to the template later: recorded, not restarted for.
    let before = versions(&[(db(), "v1")]);
    assert_eq!(decide(&mounted, &before, &now), Decision::Record(now));
}

#[test]
fn content_that_cannot_be_seen_keeps_its_record_so_a_revocation_restarts_nothing() {
    let mounted = BTreeSet::from([db()]);
    let observed = versions(&[(db(), "v1")]);
    // The share (or its Secret) deleted: nothing to do, the record kept.
    assert_eq!(decide(&mounted, &observed, &BTreeMap::new()), Decision::Nothing);
    // Back with the same content: still nothing.
    assert_eq!(decide(&mounted, &observed, &versions(&[(db(), "v1")])), Decision::Nothing);
    // Back with other content: that is a change.
    assert_eq!(
        decide(&mounted, &observed, &versions(&[(db(), "v9")])),
        Decision::Restart { observed: versions(&[(db(), "v9")]), changed: vec![db()] }
    );
}

#[test]
fn a_share_no_longer_mounted_is_forgotten_without_a_restart() {
    let mounted = BTreeSet::from([db()]);
    let observed = versions(&[(db(), "v1"), (settings(), "s1")]);
    let now = versions(&[(db(), "v1"), (settings(), "s2")]);
    assert_eq!(decide(&mounted, &observed, &now), Decision::Record(versions(&[(db(), "v1")])));
}

#[test]
fn what_is_checked_before_recording_is_every_new_or_changed_version_of_a_mounted_share() {
    let mounted = BTreeSet::from([db(), settings()]);
    let observed = versions(&[(db(), "v1"), (settings(), "s1")]);
    assert_eq!(unrecorded(&mounted, &observed, &versions(&[(db(), "v2"), (settings(), "s1")])), vec![db()]);
    assert_eq!(unrecorded(&mounted, &Observed::new(), &observed), vec![db(), settings()], "a first sight");
    assert_eq!(unrecorded(&mounted, &observed, &observed), Vec::<ShareRef>::new());
    // Unseen content, or a share not mounted: nothing to check.
    assert_eq!(unrecorded(&BTreeSet::from([db()]), &observed, &BTreeMap::new()), Vec::<ShareRef>::new());
    assert_eq!(
        unrecorded(&BTreeSet::from([db()]), &observed, &versions(&[(settings(), "s2")])),
        Vec::<ShareRef>::new()
    );
}

#[test]
fn a_share_the_pods_may_not_use_is_neither_recorded_nor_restarted_for() {
    // The controller leaves such a share out of what it decides on: as content it cannot see.
    let mounted = BTreeSet::from([db(), settings()]);
    let visible_to_pods = versions(&[(settings(), "s1")]);
    assert_eq!(decide(&mounted, &Observed::new(), &visible_to_pods), Decision::Record(visible_to_pods.clone()));
    // Recorded while it was granted, then changed after a revocation: the old version is kept.
    let observed = versions(&[(db(), "v1"), (settings(), "s1")]);
    assert_eq!(decide(&mounted, &observed, &visible_to_pods), Decision::Nothing);
}

#[test]
fn a_record_is_read_up_to_32_kib_and_a_longer_one_reads_as_none() {
    // A record of many long-named shares, each with a version: read whole while within the bound
    // (the longest a workload of MAX_SHARES_PER_WORKLOAD shares writes fits several times over).
    let record = |shares: usize| -> Observed {
        (0..shares)
            .map(|n| (share(ShareKind::Secret, &format!("{n:03}-{}", "s".repeat(200))), "0123456789abcdef".repeat(2)))
            .collect()
    };
    let within = record(MAX_SHARES_PER_WORKLOAD);
    let text = format_observed("0a1b2c3d", &within);
    assert!(text.len() > 4096 && text.len() <= 32 * 1024, "{}", text.len());
    assert_eq!(parse_observed(Some(&text), "0a1b2c3d"), within);
    // Past the bound, though every entry reads: none.
    let beyond = record(200);
    let text = format_observed("0a1b2c3d", &beyond);
    assert!(text.len() > 32 * 1024);
    assert_eq!(parse_observed(Some(&text), "0a1b2c3d"), Observed::new());
}
