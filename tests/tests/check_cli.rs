//! `check` as a user meets it: exit codes, the table, standard input, and an error naming the file
//! and document for every kind of bad input.

use inline_guard_tests::{repo_root, run};

const CLUSTER: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: locked\n  labels:\n    pod-security.kubernetes.io/enforce: restricted\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: csi.example.com\n  labels:\n    security.openshift.io/csi-ephemeral-volume-profile: privileged\n";

fn pod(namespace: &str, driver: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: {namespace}\nspec:\n  containers:\n  - name: app\n    image: nginx\n  volumes:\n  - name: v\n    csi:\n      driver: {driver}\n"
    )
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let files = Files { dir: tempfile::tempdir().unwrap() };
        files.write("cluster.yaml", CLUSTER);
        files
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
}

#[test]
fn admitted_input_exits_zero_and_prints_a_table() {
    let files = Files::new();
    let input = files.write("pod.yaml", &pod("open", "csi.example.com"));
    let result = run(&["check", "--cluster-state", &files.path("cluster.yaml"), &input], "");
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert_eq!(
        result.stdout,
        format!(
            "OBJECT        DECISION  SOURCE\nPod open/web  admitted  {input}:document 1\n\n1 objects: 1 admitted, 0 denied\n"
        )
    );
}

#[test]
fn denied_input_exits_one_and_the_table_says_why() {
    let files = Files::new();
    let result =
        run(&["check", "--cluster-state", &files.path("cluster.yaml"), "-"], &pod("locked", "csi.example.com"));
    assert_eq!(result.code, 1, "{}", result.stderr);
    let message = "web uses an inline volume provided by CSIDriver csi.example.com and namespace locked has a pod security enforce level that is lower than privileged";
    assert_eq!(
        result.stdout,
        format!(
            "OBJECT          DECISION  SOURCE\nPod locked/web  denied    <stdin>:document 1\n    deny     {message}\n    audit    enforce-violations: {message}\n\n1 objects: 0 admitted, 1 denied\n"
        )
    );
}

#[test]
fn json_output_is_one_review_response_per_input_in_order() {
    let files = Files::new();
    let input = files
        .write("pods.yaml", &format!("{}---\n{}", pod("open", "csi.example.com"), pod("locked", "csi.example.com")));
    let result = run(&["check", "-o", "json", "--cluster-state", &files.path("cluster.yaml"), &input], "");
    assert_eq!(result.code, 1);
    let lines: Vec<serde_json::Value> = result.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0]["response"],
        serde_json::json!({"uid": "00000000-0000-0000-0000-000000000001", "allowed": true})
    );
    assert_eq!(lines[1]["response"]["status"]["code"], 403);
}

#[test]
fn the_shipped_openshift_configuration_is_accepted() {
    let files = Files::new();
    let config = repo_root().join("config/openshift-compatible.yaml");
    let input = files.write("pod.yaml", &pod("open", "unlabeled.example.com"));
    let result = run(
        &["check", "--config", config.to_str().unwrap(), "--cluster-state", &files.path("cluster.yaml"), &input],
        "",
    );
    // Unlabeled namespace → restricted, unlabeled driver → privileged: denied, as on OpenShift.
    assert_eq!(result.code, 1, "{}", result.stderr);
}

fn bad_input(args: &[&str], stdin: &str) -> String {
    let result = run(args, stdin);
    assert_eq!(result.code, 2, "stdout: {}", result.stdout);
    assert_eq!(result.stdout, "", "bad input must not produce half an answer");
    result.stderr
}

#[test]
fn a_bad_configuration_names_file_field_and_line() {
    let files = Files::new();
    let config = files.write("admission.yaml", "defaults:\n  pod-security-enforce-profile: strict\n");
    let stderr = bad_input(&["check", "--config", &config, "--cluster-state", &files.path("cluster.yaml"), "-"], "");
    assert_eq!(
        stderr,
        format!(
            "csi-volume-admission check: {config}: defaults.pod-security-enforce-profile: invalid level \"strict\": must be one of privileged, baseline, restricted at line 2, column 33\n"
        )
    );
}

#[test]
fn a_cluster_state_with_another_kind_names_the_document() {
    let files = Files::new();
    let state = files.write("state.yaml", &format!("{CLUSTER}---\n{}", pod("locked", "x")));
    let stderr = bad_input(&["check", "--cluster-state", &state, "-"], "");
    assert_eq!(
        stderr,
        format!(
            "csi-volume-admission check: {state}: document 3: expected a v1 Namespace, a storage.k8s.io/v1 CSIDriver, or a sharedresource.inlineguard.dev/v1alpha1 SharedSecret, SharedConfigMap or SharedProjection, found v1 Pod\n"
        )
    );
}

#[test]
fn a_manifest_that_does_not_decode_names_file_and_document() {
    let files = Files::new();
    let input = files.write("pods.yaml", &format!("{}---\n{}", pod("open", "a"), pod("open", "[1, 2]")));
    let stderr = bad_input(&["check", "--cluster-state", &files.path("cluster.yaml"), &input], "");
    assert!(
        stderr.starts_with(&format!("csi-volume-admission check: {input}: document 2: object does not decode as Pod: spec.volumes[0].csi.driver: invalid type: sequence")),
        "{stderr}"
    );
}

#[test]
fn a_malformed_admission_review_names_file_and_document() {
    let files = Files::new();
    let input = files.write("review.yaml", "apiVersion: admission.k8s.io/v1\nkind: AdmissionReview\n");
    let stderr = bad_input(&["check", "--cluster-state", &files.path("cluster.yaml"), &input], "");
    assert_eq!(stderr, format!("csi-volume-admission check: {input}: document 1: AdmissionReview has no request\n"));
}

#[test]
fn broken_yaml_and_missing_files_are_named() {
    let files = Files::new();
    let input = files.write("broken.yaml", "kind: Pod\nmetadata: [\n");
    let stderr = bad_input(&["check", "--cluster-state", &files.path("cluster.yaml"), &input], "");
    assert!(stderr.starts_with(&format!("csi-volume-admission check: {input}: ")), "{stderr}");
    let missing = files.path("missing.yaml");
    let stderr = bad_input(&["check", "--cluster-state", &files.path("cluster.yaml"), &missing], "");
    assert!(stderr.starts_with(&format!("csi-volume-admission check: {missing}: cannot read: ")), "{stderr}");
}

#[test]
fn usage_errors_exit_two() {
    let stderr = bad_input(&["check", "pod.yaml"], "");
    assert!(stderr.contains("--cluster-state"), "{stderr}");
    let stderr = bad_input(&["check", "--cluster-state", "c.yaml"], "");
    assert!(stderr.contains("<INPUT>"), "{stderr}");
    let stderr = bad_input(&["check", "-o", "xml", "--cluster-state", "c.yaml", "-"], "");
    assert!(stderr.contains("xml"), "{stderr}");
    let files = Files::new();
    let stderr = bad_input(&["check", "--cluster-state", &files.path("cluster.yaml"), "-", "-"], "");
    assert_eq!(stderr, "csi-volume-admission check: standard input: `-` given more than once\n");
}

#[test]
fn help_exits_zero() {
    let result = run(&["check", "--help"], "");
    assert_eq!(result.code, 0);
    assert!(result.stdout.contains("--cluster-state <FILE>"));
}

#[test]
fn unreadable_directory_entries_exit_two_naming_each() {
    let files = Files::new();
    let dir = files.dir.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("good.yaml"), pod("open", "csi.example.com")).unwrap();
    std::os::unix::fs::symlink(dir.join("missing.yaml"), dir.join("dangling.yaml")).unwrap();
    std::os::unix::fs::symlink(dir.join("loop.yaml"), dir.join("loop.yaml")).unwrap();
    let fifo = dir.join("fifo.json");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::fs::write(dir.join("notes.txt"), "not a manifest: ignored").unwrap();
    let result = run(&["check", "--cluster-state", &files.path("cluster.yaml"), dir.to_str().unwrap()], "");
    assert_eq!(result.code, 2, "{}", result.stdout);
    assert_eq!(result.stdout, "", "no partial answer");
    let stderr = result.stderr;
    assert!(stderr.starts_with(&format!("csi-volume-admission check: {}: cannot read ", dir.display())), "{stderr}");
    assert!(stderr.contains("\"dangling.yaml\" (a symlink that leads nowhere: "), "{stderr}");
    assert!(stderr.contains("\"fifo.json\" (not a regular file: a FIFO, socket or device)"), "{stderr}");
    assert!(stderr.contains("\"loop.yaml\" (a symlink that leads nowhere: "), "{stderr}");
    assert!(!stderr.contains("good.yaml") && !stderr.contains("notes.txt"), "{stderr}");
}

#[test]
fn an_endless_input_is_refused_not_read_forever() {
    let files = Files::new();
    let result = run(&["check", "--cluster-state", &files.path("cluster.yaml"), "/dev/zero"], "");
    assert_eq!(result.code, 2);
    assert_eq!(
        result.stderr,
        "csi-volume-admission check: /dev/zero: larger than 67108864 bytes; refusing to read it\n"
    );
    let result = run(&["check", "--cluster-state", "/dev/zero", &files.write("p.yaml", &pod("open", "d"))], "");
    assert_eq!(result.code, 2);
    assert!(result.stderr.ends_with("larger than 67108864 bytes; refusing to read it\n"), "{}", result.stderr);
}

#[test]
fn duplicate_json_keys_are_answered_as_the_webhook_answers_them() {
    let files = Files::new();
    // A duplicate field of the object: the webhook answers allowed: false, status 400, naming
    // it; so does check -o json, byte for byte.
    let review = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"open","operation":"CREATE","userInfo":{"username":"alice"},"object":{"metadata":{"name":"web"},"spec":{"containers":[],"volumes":[],"volumes":[{"name":"v","csi":{"driver":"csi.example.com"}}]}}}}"#;
    let input = files.write("review.json", review);
    let result = run(&["check", "-o", "json", "--cluster-state", &files.path("cluster.yaml"), &input], "");
    let facts =
        inline_guard_admission::StaticClusterFacts::load(std::path::Path::new(&files.path("cluster.yaml"))).unwrap();
    let chain = inline_guard_admission::plugins::standard_chain(
        std::sync::Arc::new(inline_guard_policy::PolicySettings::default()),
        std::sync::Arc::new(facts),
        std::sync::Arc::new(inline_guard_admission::NothingChecked),
    );
    let webhook = futures_executor::block_on(inline_guard_admission::review::answer(
        &chain,
        inline_guard_admission::Phase::Both,
        review.as_bytes(),
    ))
    .unwrap();
    assert_eq!(result.stdout.trim_end(), webhook.to_json());
    assert!(
        result.stdout.contains(r#""allowed":false"#) && result.stdout.contains("duplicate field `volumes`"),
        "{}",
        result.stdout
    );

    // A duplicate in the review itself: the webhook cannot answer it (HTTP 400), check exits 2.
    let envelope = files.write("envelope.json", &review.replacen(r#""uid":"u-1","#, r#""uid":"u-1","uid":"u-2","#, 1));
    let result = run(&["check", "--cluster-state", &files.path("cluster.yaml"), &envelope], "");
    assert_eq!(result.code, 2);
    assert!(result.stderr.contains("malformed AdmissionReview: duplicate field `uid`"), "{}", result.stderr);
    // And in a plain object: unusable input, as a YAML duplicate already was.
    let object = files.write(
        "pod.json",
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[],"containers":[]}}"#,
    );
    let result = run(&["check", "--cluster-state", &files.path("cluster.yaml"), &object], "");
    assert_eq!(result.code, 2);
    assert!(result.stderr.contains("spec: duplicate field `containers`"), "{}", result.stderr);
}

#[test]
fn policy_prints_the_native_policies_as_yaml_or_a_json_list_and_refuses_a_bad_configuration() {
    let yaml = run(&["policy"], "");
    assert_eq!((yaml.code, yaml.stderr.as_str()), (0, ""));
    assert!(yaml.stdout.starts_with("# Generated by `csi-volume-admission policy"), "{}", yaml.stdout);
    assert_eq!(yaml.stdout.matches("\nkind: ValidatingAdmissionPolicy\n").count(), 8);
    assert_eq!(yaml.stdout.matches("\nkind: ValidatingAdmissionPolicyBinding\n").count(), 8);

    let json = run(&["policy", "-o", "json"], "");
    assert_eq!(json.code, 0);
    let list: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    // 8 validating policies and their bindings, the read-only policy and its binding.
    assert_eq!(list["items"].as_array().map(Vec::len), Some(18));
    assert_eq!(yaml.stdout.matches("\nkind: MutatingAdmissionPolicy\n").count(), 1);

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("admission.yaml");
    std::fs::write(&bad, "defaults: {enforce: strict}\n").unwrap();
    let refused = run(&["policy", "--config", bad.to_str().unwrap()], "");
    assert_eq!(refused.code, 2);
    assert!(refused.stdout.is_empty(), "nothing printed on bad input");
    assert!(refused.stderr.starts_with("csi-volume-admission policy: "), "{}", refused.stderr);
    assert!(refused.stderr.contains("admission.yaml"), "names the file: {}", refused.stderr);
}
