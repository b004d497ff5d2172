//! The Helm chart renders what the kustomize bases render: by default exactly (but the CRDs'
//! keep policy, which is the chart's own), and with each opt-in value what the same opt-in of
//! the kustomize files gives (the file added, and the change its comment asks for). Its values
//! schema refuses what it does not name. The real `helm` and `kubectl kustomize` (peers) render;
//! installing, upgrading and removing it on a node is the deploy scenario's (`tests/deploy`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use inline_guard_tests::chart::{
    by_identity, chart_dir, chart_metadata, differences, helm, kustomize, last_release, render,
};
use inline_guard_tests::peers::{Peers, peers};
use inline_guard_tests::repo_root;
use serde_json::Value;

/// One opt-in: the chart's values, and the kustomize overlay that opts in the same way.
struct Case {
    name: &'static str,
    values: &'static [&'static str],
    overlay: Overlay,
}

/// An overlay of both kustomize bases.
#[derive(Default)]
struct Overlay {
    /// Opt-in files, relative to the repository, added as resources.
    files: &'static [&'static str],
    /// Lines appended to the driver's driver.yaml, as the opt-in's comment asks.
    driver_config: &'static str,
    /// Arguments appended to the read-grants controller's.
    read_grants_args: &'static [&'static str],
    /// Components, relative to the repository.
    components: &'static [&'static str],
    /// Leave out the webhook's base, the driver's base.
    without_admission: bool,
    without_driver: bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case { name: "defaults, CRDs not kept", values: &["crds.keep=false"], overlay: Overlay::default() },
        Case {
            name: "cert-manager",
            values: &["crds.keep=false", "admission.certManager=true"],
            overlay: Overlay { files: &["config/deploy/certificate.yaml"], ..Default::default() },
        },
        Case {
            name: "monitoring and network policies",
            values: &[
                "crds.keep=false",
                "admission.podMonitor=true",
                "admission.networkPolicy=true",
                "driver.podMonitor=true",
            ],
            overlay: Overlay {
                files: &[
                    "config/deploy/pod-monitor.yaml",
                    "config/deploy/network-policy.yaml",
                    "config/deploy/driver/pod-monitor.yaml",
                ],
                ..Default::default()
            },
        },
        Case {
            name: "secret provider classes",
            values: &["crds.keep=false", "driver.secretProviderClasses=true"],
            overlay: Overlay { files: &["config/deploy/driver/secret-provider-classes.yaml"], ..Default::default() },
        },
        Case {
            name: "startup taint",
            values: &["crds.keep=false", "driver.startupTaint=true"],
            overlay: Overlay {
                files: &["config/deploy/driver/startup-taint.yaml"],
                driver_config: "startupTaint: true\n",
                ..Default::default()
            },
        },
        Case {
            name: "pod metadata",
            values: &["crds.keep=false", "driver.podMetadata=true"],
            overlay: Overlay {
                files: &["config/deploy/driver/pod-metadata.yaml"],
                driver_config: "podMetadata: true\n",
                ..Default::default()
            },
        },
        Case {
            name: "rollout on change",
            values: &["crds.keep=false", "readGrants.rolloutOnChange=true"],
            overlay: Overlay {
                files: &["config/deploy/driver/rollout-on-change.yaml"],
                read_grants_args: &["--rollout-on-change"],
                ..Default::default()
            },
        },
        Case {
            name: "example providers",
            values: &["crds.keep=false", "driver.exampleProviders.enabled=true"],
            overlay: Overlay { components: &["config/deploy/driver/example-providers"], ..Default::default() },
        },
        Case {
            name: "every opt-in at once",
            values: &[
                "crds.keep=false",
                "driver.startupTaint=true",
                "driver.podMetadata=true",
                "readGrants.rolloutOnChange=true",
                "driver.secretProviderClasses=true",
                "driver.exampleProviders.enabled=true",
                "admission.certManager=true",
            ],
            overlay: Overlay {
                files: &[
                    "config/deploy/driver/startup-taint.yaml",
                    "config/deploy/driver/pod-metadata.yaml",
                    "config/deploy/driver/rollout-on-change.yaml",
                    "config/deploy/driver/secret-provider-classes.yaml",
                    "config/deploy/certificate.yaml",
                ],
                driver_config: "startupTaint: true\npodMetadata: true\n",
                read_grants_args: &["--rollout-on-change"],
                components: &["config/deploy/driver/example-providers"],
                ..Default::default()
            },
        },
        Case {
            name: "the driver alone",
            values: &["crds.keep=false", "admission.enabled=false"],
            overlay: Overlay { without_admission: true, ..Default::default() },
        },
        Case {
            name: "the webhook alone",
            values: &["driver.enabled=false", "crds.install=false"],
            overlay: Overlay { without_driver: true, ..Default::default() },
        },
    ]
}

#[test]
fn each_value_renders_what_the_same_kustomize_opt_in_applies() {
    let peers = peers().expect("the peers");
    let mut failures = Vec::new();
    for case in cases() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        write_overlay(dir.path(), &case.overlay).expect("the overlay");
        let kustomized = by_identity(kustomize(&peers.kubectl, dir.path()).expect("kubectl kustomize"));
        let rendered = by_identity(render(&peers.helm, case.values).expect("helm template"));
        let (kustomized, rendered) = (kustomized.expect("kustomize's objects"), rendered.expect("helm's objects"));
        // The positive control: what is compared is there.
        assert!(kustomized.len() >= 5, "{}: kustomize rendered only {} objects", case.name, kustomized.len());
        let found = differences(("kustomize", &kustomized), ("the chart", &rendered));
        if found.is_empty() {
            eprintln!("chart: {}: {} objects, the same", case.name, rendered.len());
        } else {
            failures.push(format!("{} ({}):\n  {}", case.name, case.values.join(" "), found.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "the chart and the kustomize files disagree:\n{}", failures.join("\n"));
}

#[test]
fn by_default_the_crds_are_kept_and_nothing_else_differs() {
    let peers = peers().expect("the peers");
    let kept = by_identity(render(&peers.helm, &[]).expect("helm template")).expect("helm's objects");
    let plain = by_identity(render(&peers.helm, &["crds.keep=false"]).expect("helm template")).expect("objects");
    let crds: Vec<&String> = kept.keys().filter(|identity| identity.contains(" CustomResourceDefinition ")).collect();
    assert_eq!(crds.len(), 4, "the chart renders the four CRDs: {crds:?}");
    let mut unkept = kept.clone();
    for identity in &crds {
        let annotations = &kept[*identity]["metadata"]["annotations"];
        assert_eq!(annotations["helm.sh/resource-policy"], "keep", "{identity}: not kept by default");
        unkept.get_mut(*identity).unwrap()["metadata"].as_object_mut().unwrap().remove("annotations");
    }
    let found = differences(("crds.keep=true", &unkept), ("crds.keep=false", &plain));
    assert!(found.is_empty(), "the keep policy changed more than the CRDs' annotation:\n{}", found.join("\n"));
}

/// The values no kustomize file has (empty by default, so the default render stays the
/// kustomize one): each reaches the pods it names, and only those.
#[test]
fn pull_secrets_reach_every_pod_and_the_drivers_placement_only_its_daemonset() {
    let peers = peers().expect("the peers");
    let values = [
        "imagePullSecrets[0].name=mirror",
        "driver.nodeSelector.pool=tenants",
        "driver.tolerations[0].key=dedicated",
        "driver.tolerations[0].operator=Exists",
    ];
    let objects = by_identity(render(&peers.helm, &values).expect("render")).expect("objects");
    let workloads: Vec<(&String, &Value)> = objects
        .iter()
        .filter(|(_, object)| ["Deployment", "DaemonSet"].contains(&object["kind"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(workloads.len(), 3, "the webhook's, the driver's, the controller's: {:?}", objects.keys());
    for (identity, workload) in workloads {
        let pod = &workload["spec"]["template"]["spec"];
        assert_eq!(pod["imagePullSecrets"], serde_json::json!([{"name": "mirror"}]), "{identity}");
        if workload["kind"] == "DaemonSet" {
            assert_eq!(pod["nodeSelector"], serde_json::json!({"pool": "tenants"}), "{identity}");
            assert_eq!(
                pod["tolerations"],
                serde_json::json!([
                    {"key": "sharedresource.csi.inlineguard.dev/agent-not-ready", "operator": "Exists"},
                    {"key": "dedicated", "operator": "Exists"}
                ]),
                "{identity}: its own toleration, then the value's"
            );
        } else {
            assert!(
                !pod["nodeSelector"].as_object().is_some_and(|selector| selector.contains_key("pool")),
                "{identity}"
            );
            let tolerations = serde_json::to_string(&pod["tolerations"]).unwrap();
            assert!(!tolerations.contains("dedicated"), "{identity}: {tolerations}");
        }
    }
}

#[test]
fn the_values_schema_refuses_what_it_does_not_name_saying_which() {
    let peers = peers().expect("the peers");
    let cases: [(&str, &[&str]); 5] = [
        ("driver.kubeletdir=/srv/kubelet", &["kubeletdir"]),
        ("admission.podmonitor=true", &["podmonitor"]),
        ("driver.tmpfsSize=lots", &["tmpfsSize", "lots"]),
        ("admission.replicas=0", &["replicas"]),
        ("driver.providers[0].name=vault", &["kind"]),
    ];
    for (value, named) in cases {
        let refused = render(&peers.helm, &[value]).expect_err(value);
        assert!(refused.contains("schema"), "{value}: refused, but not by the schema: {refused}");
        for word in named {
            assert!(refused.contains(word), "{value}: the refusal does not name {word}: {refused}");
        }
    }
    // The positive control: a value the schema names, set to something it allows, renders.
    let rendered = render(&peers.helm, &["driver.kubeletDir=/srv/kubelet"]).expect("a known value");
    let text = serde_json::to_string(&rendered).unwrap();
    assert!(text.contains("/srv/kubelet/plugins_registry"), "kubeletDir did not reach driver.yaml");
    assert!(!text.contains("/var/lib/kubelet"), "kubeletDir left a path at kubelet's default");
}

/// The chart refuses to render a driver whose memory limit is below what its configuration lets
/// it hold, as the driver computes it (`DriverConfig::memory_needed`) from the driver.yaml the
/// chart renders: the chart's own arithmetic cannot drift from the driver's.
#[test]
fn the_chart_refuses_a_driver_memory_limit_below_what_its_configuration_lets_it_hold() {
    let peers = peers().expect("the peers");
    let needed = |values: &[&str]| {
        let objects = render(&peers.helm, values).expect("renders");
        let config_map = objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "sharedresource-csi-driver")
            .expect("the driver's ConfigMap");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("driver.yaml");
        std::fs::write(&path, config_map["data"]["driver.yaml"].as_str().unwrap()).unwrap();
        sharedresource_csi_driver::config::DriverConfig::load(&path).unwrap().memory_needed()
    };
    for values in
        [&[][..], &["driver.contentBudget=100Mi", "driver.namespaceContentBudget=50Mi", "driver.tmpfsSize=1Mi"][..]]
    {
        let needed = needed(values);
        let at = format!("driver.resources.limits.memory={needed}");
        let below = format!("driver.resources.limits.memory={}", needed - 1);
        render(&peers.helm, &[values, &[at.as_str()]].concat())
            .unwrap_or_else(|e| panic!("{values:?} at {needed}: {e}"));
        let refused = render(&peers.helm, &[values, &[below.as_str()]].concat()).expect_err(&below);
        assert!(
            refused.contains("driver.resources.limits.memory")
                && refused.contains(&format!("below the {needed} bytes")),
            "{values:?}: {refused}"
        );
    }
    // The mistake it is for: a budget raised without the limit.
    let refused = render(&peers.helm, &["driver.contentBudget=400Mi"]).expect_err("400Mi of budget in 640Mi");
    assert!(refused.contains("raise the limit, or lower contentBudget or tmpfsSize"), "{refused}");
    let refused = render(&peers.helm, &["driver.resources.limits.memory=lots"]).expect_err("lots");
    assert!(refused.contains("\"lots\" is not a quantity of bytes"), "{refused}");
    // No limit: nothing to hold it to.
    render(&peers.helm, &["driver.resources.limits=null"]).expect("no limit");
}

#[test]
fn the_chart_serves_the_workspace_version_and_lints_clean() {
    let peers = peers().expect("the peers");
    let chart = std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml");
    let workspace = env!("CARGO_PKG_VERSION");
    assert_eq!(chart_metadata(&chart).expect("Chart.yaml")["appVersion"], workspace, "Chart.yaml's appVersion");
    let linted = helm(&peers.helm, None, &["lint", "--strict", chart_dir().to_str().unwrap()]).expect("helm lint");
    assert!(linted.contains("1 chart(s) linted, 0 chart(s) failed"), "{linted}");
    check_images(&peers, workspace);
}

/// A chart repository never serves two contents under one version: this checkout's chart, if
/// any of its files differs from the last release's package (Chart.yaml compared field by
/// field: `helm package` rewrites it), carries a newer version than that release.
#[test]
fn a_chart_changed_since_its_last_release_carries_a_newer_version() {
    let package = last_release().unwrap_or_else(|e| panic!("{e}"));
    let unpacked = tempfile::tempdir().expect("a directory");
    let status = Command::new("tar").arg("-xzf").arg(&package).arg("-C").arg(unpacked.path()).status().expect("tar");
    assert!(status.success(), "tar could not unpack {}", package.display());
    let released = files_under(&unpacked.path().join("inline-guard"));
    let current = files_under(&chart_dir());
    // The positive control: the package holds a whole chart.
    for name in ["Chart.yaml", "values.yaml", "values.schema.json", "templates/driver/daemonset.yaml"] {
        assert!(released.contains_key(name), "{} holds no {name}: {:?}", package.display(), released.keys());
    }
    let metadata = |files: &BTreeMap<String, Vec<u8>>| {
        let text = String::from_utf8_lossy(&files["Chart.yaml"]).into_owned();
        let mut fields = chart_metadata(&text).unwrap_or_else(|e| panic!("{e}"));
        let version = fields["version"].as_str().expect("a version").to_string();
        fields.as_object_mut().expect("a mapping").remove("version");
        (release_number(&version), version, fields)
    };
    let (released_number, released_version, released_fields) = metadata(&released);
    // What the deploy scenario reads of each chart it installs: `helm show chart` of the package.
    let peers = peers().expect("the peers");
    let shown = helm(&peers.helm, None, &["show", "chart", package.to_str().unwrap()]).expect("helm show chart");
    let shown = chart_metadata(&shown).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (&shown["name"], &shown["version"]),
        (&Value::from("inline-guard"), &Value::from(released_version.as_str()))
    );
    let (current_number, current_version, current_fields) = metadata(&current);
    let mut changed: BTreeSet<&str> = released
        .keys()
        .chain(current.keys())
        .map(String::as_str)
        .filter(|name| *name != "Chart.yaml" && released.get(*name) != current.get(*name))
        .collect();
    if released_fields != current_fields {
        changed.insert("Chart.yaml");
    }
    assert!(
        current_number >= released_number,
        "the chart's version {current_version} is older than its last release's, {released_version}"
    );
    if !changed.is_empty() {
        assert!(
            current_number > released_number,
            "{changed:?} changed since release {released_version} ({}), but Chart.yaml's version is still \
             {current_version}: bump it",
            package.display()
        );
    }
    println!("chart {current_version}, last released {released_version}; changed since: {changed:?}");
}

/// `MAJOR.MINOR.PATCH` as numbers, compared in that order (the chart's versions carry no
/// pre-release part).
fn release_number(version: &str) -> [u64; 3] {
    let parts: Vec<u64> =
        version.split('.').map(|part| part.parse().unwrap_or_else(|_| panic!("version {version}"))).collect();
    parts.try_into().unwrap_or_else(|_| panic!("version {version} is not MAJOR.MINOR.PATCH"))
}

/// Every file under `dir`, by its path relative to it, with its bytes.
fn files_under(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    inline_guard_tests::walk::files_under(dir)
        .into_iter()
        .map(|path| (path.strip_prefix(dir).unwrap().display().to_string(), std::fs::read(&path).unwrap()))
        .collect()
}

/// Every image the chart names is one `images/build` makes, at the workspace's version.
fn check_images(peers: &Peers, version: &str) {
    let everything =
        render(&peers.helm, &["driver.exampleProviders.enabled=true", "admission.certManager=true"]).expect("render");
    let mut images = Vec::new();
    collect_images(&Value::Array(everything), &mut images);
    images.sort();
    images.dedup();
    assert_eq!(
        images,
        ["csi-volume-admission", "example-providers", "sharedresource-csi-driver"]
            .map(|name| format!("ghcr.io/inline-guard/{name}:{version}")),
        "the chart's images"
    );
}

fn collect_images(value: &Value, images: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                match (key.as_str(), field) {
                    ("image", Value::String(image)) => images.push(image.clone()),
                    _ => collect_images(field, images),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_images(item, images)),
        _ => {}
    }
}

/// Writes `dir/kustomization.yaml`: the bases, and `overlay`'s opt-ins as their comments say.
fn write_overlay(dir: &Path, overlay: &Overlay) -> Result<(), String> {
    // Kustomize takes no absolute path for a base: up to `/` from here, then down to it.
    let up = dir.components().filter(|c| matches!(c, std::path::Component::Normal(_))).count();
    let repo = |relative: &str| {
        format!("{}{}", "../".repeat(up), repo_root().join(relative).display().to_string().trim_start_matches('/'))
    };
    let mut resources = Vec::new();
    if !overlay.without_admission {
        resources.push(repo("config/deploy"));
    }
    if !overlay.without_driver {
        resources.push(repo("config/deploy/driver"));
    }
    // Opt-in files copied beside the overlay (kustomize loads no file from outside its root),
    // under names of their own: two are called pod-monitor.yaml.
    for (index, file) in overlay.files.iter().enumerate() {
        let copy = format!("{index}-{}", file.rsplit('/').next().unwrap_or(file));
        std::fs::copy(repo_root().join(file), dir.join(&copy)).map_err(|e| format!("{file}: {e}"))?;
        resources.push(copy);
    }
    let mut text = String::from("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n");
    for resource in resources {
        text += &format!("  - {resource}\n");
    }
    if !overlay.components.is_empty() {
        text += "components:\n";
        for component in overlay.components {
            text += &format!("  - {}\n", repo(component));
        }
    }
    let mut patches = String::new();
    if !overlay.driver_config.is_empty() {
        let shipped = inline_guard_tests::apply::objects(&repo_root().join("config/deploy/driver/daemonset.yaml"))?;
        let config = shipped
            .iter()
            .find_map(|o| o["data"]["driver.yaml"].as_str())
            .ok_or("daemonset.yaml has no driver.yaml")?
            .to_string()
            + overlay.driver_config;
        patches += &format!(
            "  - target: {{kind: ConfigMap, name: sharedresource-csi-driver}}\n    patch: |\n      - {}\n",
            serde_json::json!({"op": "replace", "path": "/data/driver.yaml", "value": config})
        );
    }
    if !overlay.read_grants_args.is_empty() {
        patches += "  - target: {kind: Deployment, name: sharedresource-read-grants}\n    patch: |\n";
        for arg in overlay.read_grants_args {
            patches += &format!(
                "      - {}\n",
                serde_json::json!({"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": arg})
            );
        }
    }
    if !patches.is_empty() {
        text += "patches:\n";
        text += &patches;
    }
    std::fs::write(dir.join("kustomization.yaml"), text).map_err(|e| e.to_string())
}
