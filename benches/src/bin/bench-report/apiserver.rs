//! Pod creation through a real kube-apiserver and etcd (`apiserver_pods`): no policy, the
//! hand-written CEL policy, the generated webhooks, a floor webhook, and the generated native
//! policies, in alternating rounds.

use std::fmt::Write as _;

use serde_json::Value;

use crate::results::{Results, met, number};

/// Every phase `apiserver_pods` runs, in the table's order, with what it is.
const PHASES: [(&str, &str); 7] = [
    ("none", "no admission policy"),
    ("cel", "ValidatingAdmissionPolicy in CEL doing the enforce check (hand-written)"),
    ("webhooks", "the generated webhooks (a driver not forced read-only: /validate only)"),
    ("webhooks-forcing", "the generated webhooks on pods forcing patches (/mutate and /validate)"),
    ("floor-webhook", "a floor webhook allowing everything, same rules and conditions (one call)"),
    ("generated-validating", "the generated ValidatingAdmissionPolicies (`policy` without forcing)"),
    ("generated-policies", "everything `policy` prints, with the read-only MutatingAdmissionPolicy"),
];

/// Writes the apiserver section, or says it was not measured.
pub fn write(w: &mut String, results: &Results) {
    let Some(apiserver) = &results.apiserver else {
        let _ =
            writeln!(w, "## Through a real kube-apiserver\n\nNot measured in this run: it needs Go for the peers.\n");
        return;
    };
    let _ = writeln!(
        w,
        "## Through a real kube-apiserver and etcd\n\n{} sequential pod creations per policy in {} alternating rounds; \
         every pod has one inline CSI volume its namespace allows; the control plane, the webhook and the client share \
         the machine's cores.\n",
        apiserver["pods_per_policy"], apiserver["rounds"]
    );
    let _ = writeln!(w, "| policy | p50 | p99 |");
    let _ = writeln!(w, "|---|---|---|");
    for (name, what) in PHASES {
        if apiserver["policies"].get(name).is_some() {
            let _ = writeln!(
                w,
                "| {what} | {:.2} ms | {:.2} ms |",
                policy(apiserver, name, "p50_ms"),
                policy(apiserver, name, "p99_ms")
            );
        }
    }
    webhooks(w, apiserver);
    floor(w, apiserver);
    forcing(w, apiserver);
    native_policies(w, apiserver);
}

fn policy(apiserver: &Value, name: &str, key: &str) -> f64 {
    number(&apiserver["policies"][name][key])
}

/// The webhooks against no policy and against CEL, judged on the paired p99 (the median over
/// rounds of each round's difference): the pooled p99 of a thousand creations moves with any one
/// stall of the VM.
fn webhooks(w: &mut String, apiserver: &Value) {
    let of = |name: &str, key: &str| policy(apiserver, name, key);
    let pooled_p99 = of("webhooks", "p99_ms") - of("none", "p99_ms");
    let paired_p99 = of("webhooks", "p99_added_paired_ms");
    let judged_p99 = if paired_p99.is_nan() { pooled_p99 } else { paired_p99 };
    let _ = writeln!(
        w,
        "\nThe webhooks add {:+.2} ms at p50 and {pooled_p99:+.2} ms at p99 over no policy; the median over rounds of the \
         p99 difference is {paired_p99:+.2} ms (target < 2 ms at p99: {}). Against CEL they cost {:.2}× at p50 and {:.2}× \
         at p99 (target: no more than CEL: {}).\n",
        of("webhooks", "p50_ms") - of("none", "p50_ms"),
        met(judged_p99 < 2.0),
        of("webhooks", "p50_ms") / of("cel", "p50_ms"),
        of("webhooks", "p99_ms") / of("cel", "p99_ms"),
        met(of("webhooks", "p50_ms") <= of("cel", "p50_ms") && of("webhooks", "p99_ms") <= of("cel", "p99_ms"))
    );
}

/// What calling any webhook costs: the floor that only allows, and where a call's time goes.
fn floor(w: &mut String, apiserver: &Value) {
    if apiserver["policies"].get("floor-webhook").is_none() {
        return;
    }
    let of = |name: &str, key: &str| policy(apiserver, name, key);
    let call = |name: &str, key: &str| number(&apiserver["calls"][name][key]);
    let _ = writeln!(
        w,
        "What bounds it: a webhook that does nothing but allow adds {:+.2} ms at p50 and {:+.2} ms at p99 (median over \
         rounds) over no policy, while the CEL policy adds {:+.2} ms at p50. Ours adds {:+.2} ms at p50 over that floor. \
         The apiserver measures a call to /validate at {:.3} ms on average (to the floor: {:.3} ms), of which the server \
         spends {:.3} ms from request head to response; the rest is the apiserver encoding the review, TLS and the loopback.\n",
        of("floor-webhook", "p50_ms") - of("none", "p50_ms"),
        of("floor-webhook", "p99_added_paired_ms"),
        of("cel", "p50_ms") - of("none", "p50_ms"),
        of("webhooks", "p50_ms") - of("floor-webhook", "p50_ms"),
        call("pods.csi-volume-admission.inlineguard.dev", "apiserver_mean_ms"),
        call("floor.bench.inlineguard.dev", "apiserver_mean_ms"),
        call("/validate", "server_mean_ms"),
    );
}

fn forcing(w: &mut String, apiserver: &Value) {
    if apiserver["policies"].get("webhooks-forcing").is_none() {
        return;
    }
    let _ = writeln!(
        w,
        "Pods that forcing patches pay both calls: {:+.2} ms at p50 and {:+.2} ms at p99 (median over rounds) over no \
         policy. The generated conditions spare the /mutate call for every other pod with CSI volumes.\n",
        policy(apiserver, "webhooks-forcing", "p50_ms") - policy(apiserver, "none", "p50_ms"),
        policy(apiserver, "webhooks-forcing", "p99_added_paired_ms"),
    );
}

/// The generated native policies against the hand-written CEL policy, judged on the median over
/// rounds of each round's p50 ratio (phases run moments apart); target ≤ 1.10×.
fn native_policies(w: &mut String, apiserver: &Value) {
    let names = ["generated-validating", "generated-policies"];
    if names.iter().any(|name| apiserver["policies"].get(*name).is_none()) {
        let _ = writeln!(w, "The generated native policies: not measured in this run.\n");
        return;
    }
    let _ = writeln!(w, "### The generated native policies against the hand-written CEL policy\n");
    let _ = writeln!(w, "| phase | p50 over CEL's, median of rounds | pooled p50 over CEL's | target |");
    let _ = writeln!(w, "|---|---|---|---|");
    for name in names {
        let paired = policy(apiserver, name, "p50_to_cel_paired");
        let pooled = policy(apiserver, name, "p50_ms") / policy(apiserver, "cel", "p50_ms");
        let _ = writeln!(w, "| `{name}` | {paired:.2}× | {pooled:.2}× | ≤ 1.10×: {} |", met(paired <= 1.10));
    }
    let _ = writeln!(
        w,
        "\nThe hand-written policy checks enforce alone (one evaluation, the profiles in one ConfigMap, a fixed \
         message); the generated ones make every decision the webhook makes, warn and audit included.\n"
    );
}
