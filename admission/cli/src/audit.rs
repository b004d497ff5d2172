//! `audit`: every Pod and pod-template workload of a live cluster, evaluated as if created now
//! under the current labels and configuration, the way `kubectl label --dry-run=server` reports
//! Pod Security violations before an admin tightens a namespace. Only objects with something to
//! report are listed.

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;

use inline_guard_admission::plugins::standard_chain;
use inline_guard_admission::review::AdmissionResponse;
use inline_guard_admission::review::ReviewResponse;
use inline_guard_admission::{
    AdmissionObject, Chain, GroupVersionKind, GroupVersionResource, Phase, StaticClusterFacts,
};
use inline_guard_config::AdmissionConfig;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Namespace, Pod, PodTemplate, ReplicationController};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Api, ListParams, PartialObjectMeta};
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

use crate::check::{Evaluation, Prepared, anonymous_create, evaluate_all, table};
use crate::cli::Output;
use crate::serve::{FactsSource, ServeError, kube_client};
use inline_guard_server::metrics::Metrics;
use inline_guard_server::share_lookup::{LiveShareFacts, LookupSettings};

/// The arguments of `audit`.
#[derive(Debug, Clone)]
pub struct AuditArgs {
    /// The cluster: this kubeconfig, or in-cluster.
    pub source: FactsSource,
    /// The configuration to judge with.
    pub config: Option<PathBuf>,
    /// Table or JSON lines.
    pub output: Output,
}

/// Why `audit` could not report.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Bad configuration file.
    #[error(transparent)]
    Config(#[from] inline_guard_config::Error),
    /// No cluster to talk to.
    #[error(transparent)]
    Client(#[from] ServeError),
    /// A list failed.
    #[error("listing {resource}: {message}")]
    List {
        /// What was being listed.
        resource: String,
        /// Why it failed.
        message: String,
    },
    /// The report could not be written.
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// What `audit` found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditSummary {
    /// Objects with inline CSI volumes or not, all evaluated.
    pub scanned: usize,
    /// Objects with something to report.
    pub reported: usize,
    /// Objects that would be denied.
    pub denied: usize,
}

/// Lists the cluster, evaluates everything and writes the report.
pub fn run(args: &AuditArgs, stdout: &mut dyn std::io::Write) -> Result<AuditSummary, AuditError> {
    let config = AdmissionConfig::load_or_default(args.config.as_deref())?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let settings = Arc::new(config.settings);
    let (scanned, findings) = runtime.block_on(async {
        let client = kube_client(&args.source).await?;
        let (facts, objects) = (fetch_facts(&client).await?, fetch_objects(&client).await?);
        // Access and shares are asked live, each (service account, share) once.
        let shares = LiveShareFacts::new(client, LookupSettings::default(), Arc::new(Metrics::new()));
        let chain = standard_chain(settings, Arc::new(facts), Arc::new(shares));
        Ok::<_, AuditError>((objects.len(), findings(&chain, objects).await))
    })?;
    write_report(stdout, args.output, &findings)?;
    let summary = AuditSummary {
        scanned,
        reported: findings.len(),
        denied: findings.iter().filter(|e| !e.outcome.is_allowed()).count(),
    };
    if args.output == Output::Table {
        writeln!(
            stdout,
            "\n{} objects scanned: {} to report, {} would be denied",
            summary.scanned, summary.reported, summary.denied
        )?;
    }
    Ok(summary)
}

/// Evaluates every object as a CREATE through the whole chain, forcing first as the apiserver
/// would (an existing pod made before forcing was deployed is not a denial: it would be forced
/// today), and keeps those with something to report: a denial, a warning or an audit annotation.
pub async fn findings(chain: &Chain, objects: Vec<(String, Prepared)>) -> Vec<Evaluation> {
    evaluate_all(chain, Phase::Both, objects)
        .await
        .into_iter()
        .filter(|evaluation| {
            let outcome = &evaluation.outcome;
            !outcome.is_allowed() || !outcome.warnings.is_empty() || !outcome.audit_annotations.is_empty()
        })
        .collect()
}

/// One JSON line per finding: which object, and the answer it would get.
#[derive(serde::Serialize)]
struct Finding<'a> {
    object: &'a str,
    response: &'a AdmissionResponse,
}

/// Writes findings as a table or JSON lines.
pub fn write_report(out: &mut dyn std::io::Write, output: Output, findings: &[Evaluation]) -> std::io::Result<()> {
    match output {
        Output::Table => table::write(out, findings),
        Output::Json => {
            for finding in findings {
                let review = ReviewResponse::from_outcome(&finding.uid, finding.outcome.clone());
                let line = serde_json::to_string(&Finding { object: &finding.label, response: &review.response })
                    .map_err(std::io::Error::other)?;
                writeln!(out, "{line}")?;
            }
            Ok(())
        }
    }
}

async fn fetch_facts(client: &Client) -> Result<StaticClusterFacts, AuditError> {
    let mut facts = StaticClusterFacts::new();
    for namespace in list_all(Api::<PartialObjectMeta<Namespace>>::all(client.clone()), "namespaces").await? {
        facts.insert_namespace(&namespace.name_any(), namespace.metadata.labels.unwrap_or_default());
    }
    for driver in list_all(Api::<PartialObjectMeta<CSIDriver>>::all(client.clone()), "csidrivers").await? {
        facts.insert_csi_driver(&driver.name_any(), driver.metadata.labels.unwrap_or_default());
    }
    Ok(facts)
}

async fn fetch_objects(client: &Client) -> Result<Vec<(String, Prepared)>, AuditError> {
    let mut objects = Vec::new();
    collect::<Pod>(client, &mut objects).await?;
    collect::<PodTemplate>(client, &mut objects).await?;
    collect::<ReplicationController>(client, &mut objects).await?;
    collect::<ReplicaSet>(client, &mut objects).await?;
    collect::<Deployment>(client, &mut objects).await?;
    collect::<StatefulSet>(client, &mut objects).await?;
    collect::<DaemonSet>(client, &mut objects).await?;
    collect::<Job>(client, &mut objects).await?;
    collect::<CronJob>(client, &mut objects).await?;
    Ok(objects)
}

async fn collect<K>(client: &Client, into: &mut Vec<(String, Prepared)>) -> Result<(), AuditError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + serde::Serialize + Debug,
{
    let resource = GroupVersionResource {
        group: K::group(&()).into_owned().into(),
        version: K::version(&()).into_owned().into(),
        resource: K::plural(&()).into_owned().into(),
    };
    let kind = GroupVersionKind {
        group: resource.group.clone(),
        version: resource.version.clone(),
        kind: K::kind(&()).into_owned().into(),
    };
    let source = if resource.group.is_empty() {
        resource.resource.to_string()
    } else {
        format!("{}.{}", resource.resource, resource.group)
    };
    for object in list_all(Api::<K>::all(client.clone()), &source).await? {
        // Through JSON, so listed objects are read exactly as webhook requests are.
        let value = serde_json::to_value(&object)
            .map_err(|error| AuditError::List { resource: source.clone(), message: error.to_string() })?;
        let object = AdmissionObject::from_value(&resource, &value)
            .map_err(|error| AuditError::List { resource: source.clone(), message: error.to_string() })?;
        // Who will create the object next is unknown: username exemptions cannot apply.
        let namespace = object.names.namespace.as_deref().unwrap_or_default().to_string();
        into.push((
            source.clone(),
            anonymous_create(kind.clone(), resource.clone(), namespace, object, into.len() + 1, true),
        ));
    }
    Ok(())
}

async fn list_all<K>(api: Api<K>, resource: &str) -> Result<Vec<K>, AuditError>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut params = ListParams::default().limit(500);
    let mut items = Vec::new();
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|error| AuditError::List { resource: resource.to_string(), message: error.to_string() })?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{CSIVolumeSource, PodSpec, Volume};
    use kube::api::ObjectMeta;

    use super::*;

    /// A typed Pod, as a list returns it, read the way `collect` reads it.
    fn pod(namespace: &str, name: &str, driver: Option<&str>) -> AdmissionObject<'static> {
        let volumes = driver.map(|driver| {
            vec![Volume {
                name: "v".into(),
                csi: Some(CSIVolumeSource { driver: driver.into(), ..Default::default() }),
                ..Default::default()
            }]
        });
        let pod = Pod {
            metadata: ObjectMeta { namespace: Some(namespace.into()), name: Some(name.into()), ..Default::default() },
            spec: Some(PodSpec { volumes, ..Default::default() }),
            ..Default::default()
        };
        AdmissionObject::from_value(&GroupVersionResource::v1("", "pods"), &serde_json::to_value(&pod).unwrap())
            .unwrap()
    }

    #[test]
    fn only_objects_with_something_to_report_are_listed_with_their_answer() {
        let mut facts = StaticClusterFacts::new();
        facts.insert_namespace("locked", [("pod-security.kubernetes.io/enforce".into(), "restricted".into())].into());
        facts.insert_namespace("watched", [("pod-security.kubernetes.io/warn".into(), "restricted".into())].into());
        facts.insert_csi_driver(
            "csi.example.com",
            [("security.openshift.io/csi-ephemeral-volume-profile".into(), "privileged".into())].into(),
        );
        let facts = Arc::new(facts);
        let chain = standard_chain(Arc::new(inline_guard_policy::PolicySettings::default()), facts.clone(), facts);
        let created = |object: AdmissionObject<'static>, ordinal| {
            let namespace = object.names.namespace.as_deref().unwrap_or_default().to_string();
            let kind = GroupVersionKind { group: "".into(), version: "v1".into(), kind: "Pod".into() };
            anonymous_create(kind, GroupVersionResource::v1("", "pods"), namespace, object, ordinal, true)
        };
        let objects = vec![
            ("pods".to_string(), created(pod("locked", "denied", Some("csi.example.com")), 1)),
            ("pods".to_string(), created(pod("watched", "warned", Some("csi.example.com")), 2)),
            ("pods".to_string(), created(pod("locked", "plain", None), 3)),
            ("pods".to_string(), created(pod("open", "fine", Some("csi.example.com")), 4)),
        ];
        let found = futures_executor::block_on(findings(&chain, objects));
        assert_eq!(
            found.iter().map(|f| f.label.as_str()).collect::<Vec<_>>(),
            ["Pod locked/denied", "Pod watched/warned"]
        );

        let mut out = Vec::new();
        write_report(&mut out, Output::Json, &found).unwrap();
        let lines: Vec<serde_json::Value> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0]["object"], "Pod locked/denied");
        assert_eq!(lines[0]["response"]["status"]["code"], 403);
        assert_eq!(
            lines[1]["response"]["warnings"][0],
            "warned uses an inline volume provided by CSIDriver csi.example.com and namespace watched has a pod security warn level that is lower than privileged"
        );
    }
}
