//! Golden tests: `check -o json` over every example manifest must answer exactly as checked in,
//! once with the default configuration and once with the OpenShift-compatible one.

use inline_guard_tests::{assert_golden, repo_root, run};

fn check_examples(config: Option<&str>) -> String {
    let root = repo_root();
    let cluster_state = root.join("config/examples/cluster-state.yaml");
    let manifests = root.join("config/examples/manifests");
    let config_path = config.map(|c| root.join(c));
    let mut args = vec!["check", "-o", "json", "--cluster-state", cluster_state.to_str().unwrap()];
    if let Some(path) = &config_path {
        args.extend(["--config", path.to_str().unwrap()]);
    }
    args.push(manifests.to_str().unwrap());
    let result = run(&args, "");
    assert_eq!(result.stderr, "");
    assert_eq!(result.code, 1, "the examples include denied pods");
    result.stdout
}

#[test]
fn examples_with_the_default_configuration() {
    assert_golden("check-examples-default.jsonl", &check_examples(None));
}

#[test]
fn examples_with_the_openshift_compatible_configuration() {
    assert_golden("check-examples-openshift.jsonl", &check_examples(Some("config/openshift-compatible.yaml")));
}

#[test]
fn the_default_configuration_file_answers_like_the_embedded_default() {
    assert_eq!(check_examples(Some("config/admission.yaml")), check_examples(None));
}

#[test]
fn every_line_is_an_admission_review_response_with_a_uid() {
    for line in check_examples(None).lines() {
        let review: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        assert!(review["response"]["uid"].as_str().is_some_and(|uid| uid.len() == 36), "{line}");
        assert!(review["response"]["allowed"].is_boolean(), "{line}");
    }
}
