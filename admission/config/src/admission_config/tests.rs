//! Configuration file tests: the shipped files, every accepted shape, and the exact error for each
//! kind of bad file.

use std::path::Path;

use inline_guard_policy::settings::SHARED_RESOURCE_DRIVER;

use super::*;

fn parse(text: &str) -> Result<AdmissionConfig> {
    AdmissionConfig::parse(Path::new("conf.yaml"), text)
}

fn error(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn shipped_default_is_the_embedded_default() {
    let shipped = AdmissionConfig::parse(Path::new("config/admission.yaml"), EMBEDDED_DEFAULT).unwrap();
    assert_eq!(shipped, AdmissionConfig::embedded_default());
}

#[test]
fn shipped_openshift_compatible_file_matches_openshift_defaults() {
    let text = include_str!("../../../../config/openshift-compatible.yaml");
    let config = AdmissionConfig::parse(Path::new("config/openshift-compatible.yaml"), text).unwrap();
    let settings = config.settings;
    assert_eq!(
        settings.defaults,
        Defaults {
            driver_profile: Level::Privileged,
            enforce: Level::Restricted,
            warn: Level::Restricted,
            audit: Level::Restricted,
        }
    );
    assert!(settings.enforce_on_workloads);
}

#[test]
fn a_file_holding_only_the_design_block_is_valid() {
    let config = parse(
        "defaults:\n  csi-ephemeral-volume-profile: baseline\n  pod-security-enforce-profile: restricted\n  pod-security-warn-profile: baseline\n  pod-security-audit-profile: privileged\n",
    )
    .unwrap();
    assert_eq!(
        config.settings.defaults,
        Defaults {
            driver_profile: Level::Baseline,
            enforce: Level::Restricted,
            warn: Level::Baseline,
            audit: Level::Privileged,
        }
    );
    assert!(!config.settings.enforce_on_workloads);
    assert!(config.settings.read_only_drivers.contains(SHARED_RESOURCE_DRIVER));
}

#[test]
fn an_empty_file_is_the_default() {
    assert_eq!(parse("").unwrap(), AdmissionConfig::embedded_default());
    assert_eq!(parse("{}").unwrap(), AdmissionConfig::embedded_default());
}

#[test]
fn json_is_accepted() {
    let config = parse(
        r#"{"kind":"CSIVolumeAdmissionConfiguration","defaults":{"pod-security-warn-profile":"baseline"},"exemptions":{"namespaces":["kube-system"]},"readOnlyDrivers":[]}"#,
    )
    .unwrap();
    assert_eq!(config.settings.defaults.warn, Level::Baseline);
    assert!(config.settings.exemptions.namespaces.contains("kube-system"));
    assert!(!config.settings.read_only_drivers.contains(SHARED_RESOURCE_DRIVER));
}

#[test]
fn an_unknown_key_names_file_field_and_line() {
    assert_eq!(
        error("defaults:\n  csi-ephemeral-volume-profile: baseline\n  pod-security-enforce: restricted\n"),
        "conf.yaml: defaults.pod-security-enforce: unknown field `pod-security-enforce`, expected one of csi-ephemeral-volume-profile, pod-security-enforce-profile, pod-security-warn-profile, pod-security-audit-profile at line 3, column 3"
    );
    assert_eq!(
        error("enforceOnWorkload: true\n"),
        "conf.yaml: enforceOnWorkload: unknown field `enforceOnWorkload`, expected one of apiVersion, kind, defaults, exemptions, enforceOnWorkloads, readOnlyDrivers, podSecurityConfiguration at line 1, column 1"
    );
}

#[test]
fn an_invalid_level_names_file_field_and_line() {
    assert_eq!(
        error("defaults:\n  pod-security-warn-profile: Restricted\n"),
        "conf.yaml: defaults.pod-security-warn-profile: invalid level \"Restricted\": must be one of privileged, baseline, restricted at line 2, column 30"
    );
}

#[test]
fn an_invalid_level_in_json_names_the_line_too() {
    let message = AdmissionConfig::parse(
        Path::new("c.json"),
        "{\n  \"defaults\": {\"csi-ephemeral-volume-profile\": \"root\"}\n}",
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        message,
        "c.json: defaults.csi-ephemeral-volume-profile: invalid level \"root\": must be one of privileged, baseline, restricted at line 2 column 54"
    );
}

#[test]
fn a_malformed_file_is_refused_with_its_line() {
    let message = error("defaults: [\n");
    assert!(message.starts_with("conf.yaml: "), "{message}");
    assert!(message.contains("line 1"), "{message}");
    let message = error("exemptions:\n  namespaces: kube-system\n");
    assert!(message.starts_with("conf.yaml: exemptions.namespaces: "), "{message}");
}

#[test]
fn a_foreign_kind_or_version_is_refused() {
    assert_eq!(
        error("kind: PodSecurityConfiguration\n"),
        "conf.yaml: kind: \"PodSecurityConfiguration\" is not supported: use \"CSIVolumeAdmissionConfiguration\""
    );
    assert_eq!(
        error("apiVersion: v1\n"),
        "conf.yaml: apiVersion: \"v1\" is not supported: use \"admission.inlineguard.dev/v1\""
    );
}

#[test]
fn an_empty_read_only_driver_name_is_refused() {
    assert_eq!(
        error("readOnlyDrivers: [a.example.com, \"\"]\n"),
        "conf.yaml: readOnlyDrivers[1]: a driver name must not be empty"
    );
}

#[test]
fn a_missing_file_is_named() {
    let message = AdmissionConfig::load(Path::new("/nonexistent/inline-guard.yaml")).unwrap_err().to_string();
    assert!(message.starts_with("/nonexistent/inline-guard.yaml: cannot read: "), "{message}");
}

mod pod_security_configuration {
    use super::*;

    const POD_SECURITY: &str = "apiVersion: pod-security.admission.config.k8s.io/v1\nkind: PodSecurityConfiguration\ndefaults:\n  enforce: baseline\n  enforce-version: latest\n  warn: restricted\nexemptions:\n  usernames: [system:serviceaccount:kube-system:replicaset-controller]\n  namespaces: [kube-system]\n  runtimeClasses: [kata]\n";

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn assert_taken_from_pod_security(config: &AdmissionConfig) {
        let settings = &config.settings;
        assert_eq!(settings.defaults.enforce, Level::Baseline);
        assert_eq!(settings.defaults.warn, Level::Restricted);
        assert_eq!(settings.defaults.audit, Level::Privileged, "Pod Security's own default");
        assert!(settings.exemptions.namespaces.contains("kube-system"));
        assert!(settings.exemptions.runtime_classes.contains("kata"));
        assert!(settings.exemptions.usernames.contains("system:serviceaccount:kube-system:replicaset-controller"));
    }

    #[test]
    fn defaults_and_exemptions_come_from_the_pod_security_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "pod-security.yaml", POD_SECURITY);
        let config_path = write(
            dir.path(),
            "admission.yaml",
            "defaults:\n  csi-ephemeral-volume-profile: baseline\npodSecurityConfiguration: pod-security.yaml\n",
        );
        let config = AdmissionConfig::load(&config_path).unwrap();
        assert_taken_from_pod_security(&config);
        assert_eq!(config.settings.defaults.driver_profile, Level::Baseline);
        assert_eq!(config.pod_security_source, Some(dir.path().join("pod-security.yaml")));
    }

    #[test]
    fn an_admission_configuration_with_inline_pod_security_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let inline = POD_SECURITY.lines().map(|l| format!("      {l}\n")).collect::<String>();
        write(
            dir.path(),
            "apiserver-admission.yaml",
            &format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n  - name: ResourceQuota\n    configuration: {{anything: goes}}\n  - name: PodSecurity\n    configuration:\n{inline}"
            ),
        );
        let config_path = write(dir.path(), "admission.yaml", "podSecurityConfiguration: apiserver-admission.yaml\n");
        assert_taken_from_pod_security(&AdmissionConfig::load(&config_path).unwrap());
    }

    #[test]
    fn an_admission_configuration_pointing_at_a_path_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "pod-security.yaml", POD_SECURITY);
        write(
            dir.path(),
            "apiserver-admission.yaml",
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n  - name: PodSecurity\n    path: pod-security.yaml\n",
        );
        let config_path = write(dir.path(), "admission.yaml", "podSecurityConfiguration: apiserver-admission.yaml\n");
        assert_taken_from_pod_security(&AdmissionConfig::load(&config_path).unwrap());
    }

    #[test]
    fn setting_namespace_defaults_in_both_files_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "pod-security.yaml", POD_SECURITY);
        let config_path = write(
            dir.path(),
            "admission.yaml",
            "defaults:\n  pod-security-enforce-profile: restricted\npodSecurityConfiguration: pod-security.yaml\n",
        );
        let message = AdmissionConfig::load(&config_path).unwrap_err().to_string();
        assert!(message.ends_with("podSecurityConfiguration: takes the namespace defaults and exemptions from the Pod Security configuration; remove defaults.pod-security-*-profile and exemptions from this file"), "{message}");
    }

    #[test]
    fn errors_in_the_pod_security_file_name_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let bad = POD_SECURITY.replace("enforce-version: latest", "enforce-version: \"1.30\"");
        let pod_security_path = write(dir.path(), "pod-security.yaml", &bad);
        let config_path = write(dir.path(), "admission.yaml", "podSecurityConfiguration: pod-security.yaml\n");
        let message = AdmissionConfig::load(&config_path).unwrap_err().to_string();
        assert_eq!(
            message,
            format!(
                "{}: defaults.enforce-version: invalid version \"1.30\": must be \"latest\" or \"v1.x\" at line 5, column 20",
                pod_security_path.display()
            )
        );
    }

    #[test]
    fn a_file_of_another_kind_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "other.yaml", "apiVersion: v1\nkind: ConfigMap\n");
        let config_path = write(dir.path(), "admission.yaml", "podSecurityConfiguration: other.yaml\n");
        let message = AdmissionConfig::load(&config_path).unwrap_err().to_string();
        assert!(message.contains("other.yaml: kind: expected a PodSecurityConfiguration"), "{message}");
    }
}

#[test]
fn a_read_only_driver_that_is_not_a_csi_driver_name_is_refused() {
    assert_eq!(
        error("readOnlyDrivers: [a.example.com, \"x\\\" || true\"]\n"),
        "conf.yaml: readOnlyDrivers[1]: \"x\\\" || true\" is not a CSI driver name (at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)"
    );
    assert!(error(&format!("readOnlyDrivers: [{}]\n", "a".repeat(64))).contains("is not a CSI driver name"));
    assert!(parse(&format!("readOnlyDrivers: [{}, A_b-c.D]\n", "a".repeat(63))).is_ok());
}
