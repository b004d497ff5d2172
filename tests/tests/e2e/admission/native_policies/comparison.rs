//! One object created (dry run) where the webhook judges it and where only the policies do, the
//! answers compared (`inline_guard_tests::policy_equivalence`); a disagreement is reported with
//! the input, reduced to the fewest volumes that still disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use inline_guard_tests::policy_equivalence::{
    agree, drivers_of, shown_name, without_evaluation_only_annotations, without_volume,
};
use serde_json::Value;

use super::cases::collection;
use crate::support::{Answer, Suite, create};

/// One object, and the two namespaces (same labels) it is created in.
#[derive(Clone)]
pub struct Case {
    /// The object's resource, e.g. `deployments`.
    pub plural: &'static str,
    pub object: Value,
    /// Judged by the webhook.
    pub webhook_namespace: String,
    /// Judged by the policies only.
    pub policy_namespace: String,
    /// Where the object comes from and its namespace's labels, for a disagreement's report.
    pub origin: String,
    /// Created by the configuration's exempt user rather than the admin.
    pub by_exempt_user: bool,
}

/// One configuration's pass: who creates the objects, and what its policies evaluate.
pub struct Pass<'a> {
    pub admin: &'a kube::Client,
    /// A user the configuration under test exempts (the admin where nothing is exempt).
    pub exempt_user: &'a kube::Client,
    /// The drivers that can violate something under the configuration: the only CSIDrivers the
    /// policies' bindings select, so an object with none of them is never evaluated.
    pub evaluated_drivers: &'a BTreeSet<String>,
}

/// The webhook's answer as the policies can give it: without the annotations only an evaluation
/// gives, for an object the policies do not evaluate.
fn as_policies_can(pass: &Pass<'_>, object: &Value, webhook: &Value) -> Value {
    if drivers_of(object).iter().any(|driver| pass.evaluated_drivers.contains(driver)) {
        webhook.clone()
    } else {
        without_evaluation_only_annotations(webhook)
    }
}

/// What the answers held, for the scenario's proof that its table is not vacuous.
#[derive(Debug, Default)]
pub struct Tally {
    pub answers: usize,
    pub denied: usize,
    pub warned: usize,
    pub annotated: usize,
    pub exempt: usize,
}

/// [`inline_guard_tests::policy_equivalence::observed`] of an answer.
fn observed(answer: &Answer, namespace: &str, object: &Value, annotations: &BTreeMap<String, String>) -> Value {
    inline_guard_tests::policy_equivalence::observed(
        answer.status,
        &answer.warnings,
        answer.message(),
        namespace,
        object,
        annotations,
    )
}

/// Creates every case both ways, then reads each answer's audit annotations (by its audit id)
/// once the log has them all (up to 60 s). Returns `(webhook, policy)` per case, observed.
async fn judge(suite: &Suite, pass: &Pass<'_>, cases: &[Case]) -> Result<Vec<(Value, Value)>, String> {
    let mut answers = Vec::with_capacity(cases.len());
    for case in cases {
        let client = if case.by_exempt_user { pass.exempt_user } else { pass.admin };
        let by_webhook = create(client, &collection(&case.webhook_namespace, case.plural), &case.object, true).await?;
        let by_policy = create(client, &collection(&case.policy_namespace, case.plural), &case.object, true).await?;
        answers.push((by_webhook, by_policy));
    }
    let mut ids = Vec::with_capacity(answers.len() * 2);
    for (webhook, policy) in &answers {
        for answer in [webhook, policy] {
            ids.push(answer.audit_id.clone().ok_or("the apiserver answered without an Audit-Id header")?);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let annotations = loop {
        let mut found: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for event in suite.cluster.audit_events()? {
            if event.stage == "ResponseComplete" {
                found.insert(event.audit_id, event.annotations);
            }
        }
        if ids.iter().all(|id| found.contains_key(id)) {
            break found;
        }
        if Instant::now() > deadline {
            let missing = ids.iter().filter(|id| !found.contains_key(*id)).count();
            return Err(format!("the audit log lacks {missing} of {} answers after 60 s", ids.len()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let of = |answer: &Answer| answer.audit_id.as_ref().and_then(|id| annotations.get(id)).cloned().unwrap_or_default();
    Ok(cases
        .iter()
        .zip(&answers)
        .map(|(case, (by_webhook, by_policy))| {
            (
                observed(by_webhook, &case.webhook_namespace, &case.object, &of(by_webhook)),
                observed(by_policy, &case.policy_namespace, &case.object, &of(by_policy)),
            )
        })
        .collect())
}

/// The disagreeing `case` with as few volumes as still disagree: each volume dropped in turn,
/// a smaller object kept whenever it disagrees too.
async fn shrunk(suite: &Suite, pass: &Pass<'_>, case: &Case) -> Result<Case, String> {
    let mut smallest = case.clone();
    let mut index = 0;
    while let Some(object) = without_volume(&smallest.object, index) {
        let candidate = Case { object, ..smallest.clone() };
        let answers = judge(suite, pass, std::slice::from_ref(&candidate)).await?;
        if answers.iter().any(|(webhook, policy)| !agree(&as_policies_can(pass, &candidate.object, webhook), policy)) {
            smallest = candidate;
            index = 0;
        } else {
            index += 1;
        }
    }
    Ok(smallest)
}

/// How many disagreements are reported in full, and shrunk: each shrinking step creates objects
/// and waits for their audit events, and a broken generator makes every case disagree.
const REPORTED: usize = 5;

/// Creates every case both ways and fails unless all agree, reporting the disagreements with the
/// fewest volumes first: [`REPORTED`] of them in full (input, both answers, the seed, the
/// smallest object that still disagrees), and how many there are.
pub async fn all_agree(suite: &Suite, pass: &Pass<'_>, cases: &[Case], seed: u64) -> Result<Tally, String> {
    let observed = judge(suite, pass, cases).await?;
    let mut tally = Tally { answers: cases.len(), ..Tally::default() };
    let mut disagreeing = Vec::new();
    for (case, (webhook, policy)) in cases.iter().zip(&observed) {
        let webhook = as_policies_can(pass, &case.object, webhook);
        tally.denied += usize::from(webhook["status"] == 403);
        tally.warned += usize::from(webhook["warnings"].as_array().is_some_and(|w| !w.is_empty()));
        let annotations = webhook["auditAnnotations"].as_object();
        tally.annotated += usize::from(annotations.is_some_and(|a| !a.is_empty()));
        tally.exempt += usize::from(annotations.is_some_and(|a| a.keys().any(|k| k.ends_with("/exempt"))));
        if !agree(&webhook, policy) {
            disagreeing.push((case, webhook, policy));
        }
    }
    if disagreeing.is_empty() {
        return Ok(tally);
    }
    disagreeing.sort_by_key(|(case, _, _)| drivers_of(&case.object).len());
    let mut reports = Vec::new();
    for (case, webhook, policy) in disagreeing.iter().take(REPORTED) {
        let smallest = shrunk(suite, pass, case).await?;
        let reduced = if smallest.object == case.object {
            String::new()
        } else {
            format!("\n  smallest object still disagreeing: {}", smallest.object)
        };
        reports.push(format!(
            "{} {} from {} (seed {seed}):\n  object:  {}\n  webhook: {webhook}\n  policy:  {policy}{reduced}",
            case.plural,
            shown_name(&case.object),
            case.origin,
            case.object
        ));
    }
    Err(format!(
        "{} of {} objects answered differently; the {} with the fewest volumes:\n{}",
        disagreeing.len(),
        cases.len(),
        reports.len(),
        reports.join("\n")
    ))
}
