//! The Helm chart (`config/helm/inline-guard`) beside the kustomize bases it must agree with:
//! rendering either with the real `helm` and `kubectl kustomize` (peers), and comparing what they
//! render object by object.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::bounded::stdout_within;
use crate::repo_root;

/// Where the chart is.
pub fn chart_dir() -> PathBuf {
    repo_root().join("config/helm/inline-guard")
}

/// The chart's last release as a chart repository serves it (`helm package`'s archive), in
/// `tests/fixtures/charts/`: the one the deploy scenario installs before upgrading to this
/// checkout's chart. Each release replaces it with its own package.
pub fn last_release() -> Result<PathBuf, String> {
    let dir = repo_root().join("tests/fixtures/charts");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut packages: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "tgz"))
        .collect();
    match packages.len() {
        1 => Ok(packages.remove(0)),
        n => Err(format!("{} holds {n} chart packages; the last release's alone belongs there", dir.display())),
    }
}

/// A Chart.yaml's fields (as written, or as `helm show chart` and `helm package` rewrite it).
pub fn chart_metadata(chart_yaml: &str) -> Result<Value, String> {
    let metadata: Value = serde_saphyr::from_str(chart_yaml).map_err(|e| format!("Chart.yaml: {e}"))?;
    if !metadata.is_object() {
        return Err(format!("Chart.yaml is not a mapping: {metadata}"));
    }
    Ok(metadata)
}

/// Runs `helm ARGS` (with `KUBECONFIG` when given); its stdout, or its exit and stderr as the
/// error.
pub fn helm(binary: &Path, kubeconfig: Option<&Path>, args: &[&str]) -> Result<String, String> {
    let mut command = Command::new(binary);
    command.args(args);
    // helm keeps its caches, configuration and plugins under these; a run must not read or
    // write the user's, nor two calls at once each other's.
    let home = tempfile::tempdir().map_err(|e| format!("a directory for helm: {e}"))?;
    command
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"));
    match kubeconfig {
        Some(path) => command.env("KUBECONFIG", path),
        None => command.env_remove("KUBECONFIG"),
    };
    // An install waits for nothing (no --wait): minutes mean it is stuck.
    stdout_within(&mut command, Duration::from_secs(300), &format!("helm {}", args.join(" ")))
}

/// `helm template` of the chart with `--set` of each of `values`: its objects.
pub fn render(binary: &Path, values: &[&str]) -> Result<Vec<Value>, String> {
    let chart = chart_dir();
    let mut args = vec!["template", "inline-guard", chart.to_str().ok_or("non-UTF-8 path")?];
    for value in values {
        args.extend(["--set", value]);
    }
    parse(&helm(binary, None, &args)?, "helm template")
}

/// `kubectl kustomize DIR`: its objects.
pub fn kustomize(kubectl: &Path, dir: &Path) -> Result<Vec<Value>, String> {
    let mut command = Command::new(kubectl);
    command.arg("kustomize").arg(dir);
    let what = format!("kubectl kustomize {}", dir.display());
    parse(&stdout_within(&mut command, Duration::from_secs(120), &what)?, &what)
}

fn parse(text: &str, what: &str) -> Result<Vec<Value>, String> {
    let documents = inline_guard_config::read_documents(Path::new(what), text).map_err(|e| e.to_string())?;
    Ok(documents.into_iter().map(|d| d.value).filter(|v| !v.is_null()).collect())
}

/// The objects by `apiVersion kind namespace/name`, their numbers as one kind of number (the
/// generated CRDs say `511.0` where kustomize re-emits `511`: the same value to the apiserver).
/// Two objects of one identity are an error: neither tool may render one twice.
pub fn by_identity(objects: Vec<Value>) -> Result<BTreeMap<String, Value>, String> {
    let mut map = BTreeMap::new();
    for object in objects {
        let metadata = &object["metadata"];
        let identity = format!(
            "{} {} {}/{}",
            object["apiVersion"].as_str().unwrap_or_default(),
            object["kind"].as_str().unwrap_or_default(),
            metadata["namespace"].as_str().unwrap_or_default(),
            metadata["name"].as_str().unwrap_or_default()
        );
        if map.insert(identity.clone(), normalized(object)).is_some() {
            return Err(format!("{identity} is rendered twice"));
        }
    }
    Ok(map)
}

fn normalized(value: Value) -> Value {
    match value {
        Value::Number(number) => match number.as_f64() {
            Some(float) if float.fract() == 0.0 && float.abs() < 9.0e15 => Value::from(float as i64),
            _ => Value::Number(number),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(normalized).collect()),
        Value::Object(fields) => Value::Object(fields.into_iter().map(|(k, v)| (k, normalized(v))).collect()),
        other => other,
    }
}

/// Every difference between two renders, one line per object (at most a few hundred bytes of
/// each side); empty when they agree.
pub fn differences(left: (&str, &BTreeMap<String, Value>), right: (&str, &BTreeMap<String, Value>)) -> Vec<String> {
    let quote = |value: &Value| value.to_string().chars().take(300).collect::<String>();
    let mut found = Vec::new();
    for (identity, object) in left.1 {
        match right.1.get(identity) {
            None => found.push(format!("{identity}: only in {}", left.0)),
            Some(other) if other != object => found.push(format!(
                "{identity}: differs at {}",
                first_difference("", object, other).unwrap_or_else(|| format!("{} vs {}", quote(object), quote(other)))
            )),
            Some(_) => {}
        }
    }
    for identity in right.1.keys().filter(|identity| !left.1.contains_key(*identity)) {
        found.push(format!("{identity}: only in {}", right.0));
    }
    found
}

/// The path of the first field where `a` and `b` differ, with both values (bounded).
fn first_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    if a == b {
        return None;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|key| {
                first_difference(
                    &format!("{path}/{key}"),
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(&format!("{path}/{i}"), p, q))
        }
        _ => {
            let quote = |value: &Value| value.to_string().chars().take(300).collect::<String>();
            Some(format!("{path}: {} vs {}", quote(a), quote(b)))
        }
    }
}
