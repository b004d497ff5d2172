//! What the native-policy scenario creates: the table of drivers and namespaces, the generated
//! namespaces and objects, and the golden corpus (`config/examples/`) as a cluster would hold it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use inline_guard_policy::namespace_policy::NamespacePolicy;
use inline_guard_policy::settings::Defaults;
use inline_guard_policy::{INJECT_ANNOTATION, Labels};
use inline_guard_tests::apply::objects;
use inline_guard_tests::repo_root;
use serde_json::{Value, json};

use crate::support::{SHARED_RESOURCE_DRIVER, deployment, pod};

/// The drivers of the table, by profile label (`None`: no label).
pub const DRIVERS: [(&str, Option<&str>); 5] = [
    ("restricted.native.e2e.inlineguard.dev", Some("restricted")),
    ("baseline.native.e2e.inlineguard.dev", Some("baseline")),
    ("privileged.native.e2e.inlineguard.dev", Some("privileged")),
    ("unlabeled.native.e2e.inlineguard.dev", None),
    ("invalid.native.e2e.inlineguard.dev", Some("trusted")),
];

/// Pod Security's label keys, short.
pub const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
pub const WARN: &str = "pod-security.kubernetes.io/warn";
pub const AUDIT: &str = "pod-security.kubernetes.io/audit";

/// A namespace's labels, as the scenario writes them.
pub type Row = Vec<(&'static str, &'static str)>;

/// Namespaces' Pod Security labels, one set per row. Only valid ones: this apiserver runs Pod
/// Security Admission, which refuses a namespace with an invalid level or version.
pub fn namespace_labels() -> Vec<Row> {
    vec![
        vec![],
        vec![(ENFORCE, "restricted")],
        vec![(ENFORCE, "baseline"), (WARN, "restricted")],
        vec![(WARN, "baseline"), (AUDIT, "restricted")],
        vec![(AUDIT, "baseline"), (WARN, "restricted"), ("pod-security.kubernetes.io/audit-version", "latest")],
        vec![(ENFORCE, "baseline"), ("pod-security.kubernetes.io/enforce-version", "v1.35"), (AUDIT, "restricted")],
        vec![(WARN, "baseline"), ("pod-security.kubernetes.io/warn-version", "v1.0"), (AUDIT, "privileged")],
    ]
}

/// A small deterministic generator (xorshift64*): seeded from `NATIVE_POLICIES_SEED`, else the
/// clock, and the seed printed, so that any disagreement it finds can be replayed.
pub struct Generator(u64);

impl Generator {
    pub fn seeded() -> (Generator, u64) {
        let seed = std::env::var("NATIVE_POLICIES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        (Generator(seed | 1), seed)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Generated namespaces: each mode's level set or not, and sometimes its version.
pub fn generated_rows(generator: &mut Generator, count: usize) -> Vec<Row> {
    let modes = [
        (ENFORCE, "pod-security.kubernetes.io/enforce-version"),
        (WARN, "pod-security.kubernetes.io/warn-version"),
        (AUDIT, "pod-security.kubernetes.io/audit-version"),
    ];
    (0..count)
        .map(|_| {
            let mut labels = Vec::new();
            for (level, version) in modes {
                if generator.below(3) > 0 {
                    labels.push((level, *generator.pick(&["privileged", "baseline", "restricted"])));
                }
                if generator.below(3) == 0 {
                    labels.push((version, *generator.pick(&["latest", "v1.0", "v1.28", "v1.35"])));
                }
            }
            labels
        })
        .collect()
}

/// A CronJob whose job template is a Deployment's pod template, restarting on failure (a job's
/// pods may not restart always: without this the apiserver refuses the CronJob as invalid before
/// any admission check sees it).
pub fn cronjob(name: &str, volumes: &[(&str, &str)]) -> Value {
    let mut template = deployment(name, volumes)["spec"]["template"].clone();
    template["spec"]["restartPolicy"] = json!("OnFailure");
    json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
        "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": template}}}})
}

/// Generated objects: a pod, a Deployment or a CronJob with one to three inline volumes, each
/// of a driver of the table or (`missing_driver`) of one with no CSIDriver object.
pub fn generated_objects(generator: &mut Generator, count: usize, missing_driver: bool) -> Vec<Value> {
    let mut drivers: Vec<&str> = DRIVERS.iter().map(|(driver, _)| *driver).collect();
    if missing_driver {
        drivers.push("missing.native.e2e.inlineguard.dev");
    }
    (0..count)
        .map(|index| {
            let volumes: Vec<(String, &str)> =
                (0..=generator.below(3)).map(|v| (format!("v{v}"), *generator.pick(&drivers))).collect();
            let volumes: Vec<(&str, &str)> = volumes.iter().map(|(name, driver)| (name.as_str(), *driver)).collect();
            let name = format!("gen-{index}");
            match generator.below(3) {
                0 => pod(&name, &volumes),
                1 => deployment(&name, &volumes),
                _ => cronjob(&name, &volumes),
            }
        })
        .collect()
}

/// A pod far larger than any real one, for the policies' CEL cost: `per_driver` volumes of each
/// driver, every one mounted (without `readOnly`) in each of `containers` containers and as many
/// init containers. `attributes`: the volumes' `volumeAttributes`.
pub fn large_pod(name: &str, drivers: &[&str], per_driver: usize, containers: usize, attributes: &Value) -> Value {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (d, driver) in drivers.iter().enumerate() {
        for v in 0..per_driver {
            let volume = format!("v{d}-{v}");
            volumes.push(json!({"name": volume, "csi": {"driver": driver, "volumeAttributes": attributes}}));
            mounts.push(json!({"name": volume, "mountPath": format!("/mnt/{volume}")}));
        }
    }
    // The table's container (its security context passes Pod Security's restricted level).
    let container = |prefix: &str, index: usize| {
        let mut container = crate::support::container(&format!("{prefix}-{index}"), &[]);
        container["volumeMounts"] = json!(mounts);
        container
    };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": (0..containers).map(|i| container("app", i)).collect::<Vec<_>>(),
        "initContainers": (0..containers).map(|i| container("init", i)).collect::<Vec<_>>(),
        "volumes": volumes,
    }})
}

/// The table: a pod, a Deployment and a CronJob per driver of [`DRIVERS`], a pod and a
/// Deployment with two drivers (the policies see one per evaluation), and a large pod (40
/// volumes of each driver mounted in 8 containers and 8 init containers: 3 200 mounts).
pub fn table() -> Vec<Value> {
    let mut objects = Vec::new();
    for (index, (driver, _)) in DRIVERS.iter().enumerate() {
        objects.push(pod(&format!("pod-{index}"), &[("v", driver)]));
        objects.push(deployment(&format!("deploy-{index}"), &[("v", driver)]));
        objects.push(cronjob(&format!("cron-{index}"), &[("v", driver)]));
    }
    let two = [("v", DRIVERS[1].0), ("w", DRIVERS[2].0)];
    objects.push(pod("pod-two", &two));
    objects.push(deployment("deploy-two", &two));
    let drivers: Vec<&str> = DRIVERS.iter().map(|(driver, _)| *driver).collect();
    objects.push(large_pod("pod-large", &drivers, 40, 8, &json!({})));
    objects
}

/// The resource (plural) of a kind that carries a pod spec, if it is one.
pub fn plural(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Pod" => "pods",
        "PodTemplate" => "podtemplates",
        "ReplicationController" => "replicationcontrollers",
        "Deployment" => "deployments",
        "ReplicaSet" => "replicasets",
        "StatefulSet" => "statefulsets",
        "DaemonSet" => "daemonsets",
        "Job" => "jobs",
        "CronJob" => "cronjobs",
        _ => return None,
    })
}

/// The resource of `object`, whose kind the scenario only ever makes one that carries a pod spec.
pub fn plural_of(object: &Value) -> &'static str {
    object["kind"].as_str().and_then(plural).unwrap_or("pods")
}

/// The collection path of `plural` in `namespace`.
pub fn collection(namespace: &str, plural: &str) -> String {
    let group = match plural {
        "pods" | "podtemplates" | "replicationcontrollers" => "api/v1",
        "jobs" | "cronjobs" => "apis/batch/v1",
        _ => "apis/apps/v1",
    };
    format!("/{group}/namespaces/{namespace}/{plural}")
}

/// The golden corpus as a cluster would hold it: `config/examples/cluster-state.yaml`'s
/// namespaces and CSIDrivers, and every object of `config/examples/manifests` both the webhook
/// and the policies judge, by namespace.
pub struct Corpus {
    /// Namespaces by name, with their labels: those Pod Security Admission lets exist.
    pub namespaces: BTreeMap<String, Labels>,
    /// The CSIDriver objects, as written.
    pub drivers: Vec<Value>,
    /// `(namespace, object)`, `metadata.namespace` taken off (the path says it).
    pub objects: Vec<(String, Value)>,
    /// Why each document left out is left out, one line each.
    pub left_out: Vec<String>,
}

/// `cluster-state.yaml`'s namespaces whose Pod Security labels are valid, the names of those
/// whose labels are not, and its CSIDrivers.
type ClusterState = (BTreeMap<String, Labels>, BTreeSet<String>, Vec<Value>);

fn cluster_state(path: &Path) -> Result<ClusterState, String> {
    let (mut namespaces, mut invalid, mut drivers) = (BTreeMap::new(), BTreeSet::new(), Vec::new());
    for object in objects(path)? {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        match object["kind"].as_str() {
            Some("Namespace") => {
                let labels: Labels = serde_json::from_value(object["metadata"]["labels"].clone()).unwrap_or_default();
                if NamespacePolicy::from_labels(&labels, &Defaults::default()).1.is_empty() {
                    namespaces.insert(name, labels);
                } else {
                    invalid.insert(name);
                }
            }
            Some("CSIDriver") => drivers.push(object),
            _ => {}
        }
    }
    Ok((namespaces, invalid, drivers))
}

/// Why a corpus object in `namespace` is not compared, if it is not.
fn why_left_out(object: &Value, namespace: &str, state: &ClusterState) -> Option<&'static str> {
    let (namespaces, invalid, _) = state;
    let text = object.to_string();
    if object["kind"].as_str().and_then(plural).is_none() {
        Some("carries no pod spec")
    } else if text.contains(SHARED_RESOURCE_DRIVER) || text.contains(INJECT_ANNOTATION) {
        Some("share checks are the webhook's only")
    } else if invalid.contains(namespace) {
        Some("its namespace's Pod Security labels are invalid")
    } else if !namespaces.contains_key(namespace) {
        Some("its namespace is not in cluster-state.yaml")
    } else {
        None
    }
}

/// Reads the corpus. Left out, and said why: documents that carry no pod spec; objects naming
/// the shared-resource driver or asking for share injection (share checks are the webhook's
/// only, docs/native-policies.md); objects in a namespace with invalid Pod Security labels
/// (this apiserver's Pod Security Admission refuses such a namespace).
pub fn golden_corpus() -> Result<Corpus, String> {
    let examples = repo_root().join("config/examples");
    let state = cluster_state(&examples.join("cluster-state.yaml"))?;
    let mut files: Vec<_> = std::fs::read_dir(examples.join("manifests"))
        .map_err(|e| format!("config/examples/manifests: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let (mut corpus_objects, mut left_out) = (Vec::new(), Vec::new());
    for file in files {
        let file_name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for document in objects(&file)? {
            let (namespace, mut object) = match document["kind"].as_str() {
                Some("AdmissionReview") if document["request"]["operation"] == "CREATE" => {
                    (document["request"]["namespace"].clone(), document["request"]["object"].clone())
                }
                _ => (document["metadata"]["namespace"].clone(), document.clone()),
            };
            let namespace = namespace.as_str().unwrap_or("default").to_string();
            if let Some(why) = why_left_out(&object, &namespace, &state) {
                let name = object["metadata"]["name"].as_str().or(object["metadata"]["generateName"].as_str());
                left_out.push(format!(
                    "{file_name}: {} {}: {why}",
                    object["kind"].as_str().unwrap_or("?"),
                    name.unwrap_or("?")
                ));
                continue;
            }
            if let Some(metadata) = object["metadata"].as_object_mut() {
                metadata.remove("namespace");
            }
            corpus_objects.push((namespace, object));
        }
    }
    let (namespaces, _, drivers) = state;
    Ok(Corpus { namespaces, drivers, objects: corpus_objects, left_out })
}
