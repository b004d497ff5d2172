//! The node-scale section of the benchmark report: per node count, what each load cost the
//! apiserver, etcd and the drivers; a plot of the apiserver's CPU against the node count; and
//! the extrapolation to 5 000 nodes with its model, from slopes fitted to the measured runs.

use std::fmt::Write as _;

use serde_json::Value;

use crate::report::line_chart;

/// The cluster the extrapolation is for.
pub const NODES: f64 = 5_000.0;
/// The shipped `accessRecheckSeconds`.
const ACCESS_RECHECK_SECONDS: f64 = 600.0;

/// The node writes (the access-notices controller's patches of SharedResourceNodes) of a phase.
fn node_writes(phase: &Value) -> f64 {
    phase["requests"]["PATCH sharedresourcenodes"].as_f64().unwrap_or(0.0)
}

/// The apiserver's CPU milliseconds per node write in `phase` (a revocation's: what telling one
/// node costs, the write and its delivery to the node's watch); NaN without writes.
fn per_node_write(phase: &Value) -> f64 {
    let writes = node_writes(phase);
    if writes == 0.0 { f64::NAN } else { number(&phase["apiserver_cpu_s"]) * 1e3 / writes }
}

fn number(value: &Value) -> f64 {
    value.as_f64().unwrap_or(f64::NAN)
}

/// The least-squares slope and intercept of `points`.
pub fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in points {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (slope, my - slope * mx)
}

/// Per run: the node count and `value` of it.
fn series(runs: &[Value], value: impl Fn(&Value) -> f64) -> Vec<(f64, f64)> {
    runs.iter().map(|run| (number(&run["nodes"]), value(run))).collect()
}

/// CPU per second of a phase, in cores.
fn cores(run: &Value, phase: &str, of: &str) -> f64 {
    number(&run["phases"][phase][of]) / number(&run["phases"][phase]["seconds"])
}

/// The run at the largest node count, made on its own (shorter idle) after the others.
pub enum Large<'a> {
    /// It finished: its JSON.
    Held(&'a Value),
    /// It did not: the end of its output.
    NotHeld(&'a str),
    /// It was not asked for.
    NotRun,
}

/// What the large run's text says of when its pods arrived.
fn paced(large: &Value) -> String {
    let rate = large["runs"].as_array().and_then(|runs| runs.first()).and_then(|run| run["pods_per_second"].as_f64());
    match rate {
        Some(rate) if rate > 0.0 => format!(
            "Its pods arrive one after another across the cluster at {rate} a second (`--pods-per-second`), \
             the pace kube-scheduler binds pods at with its client's default rate of 50 requests a second, \
             rather than all at once as in the runs above: at this count, every node's pods at once is more than \
             this machine's one apiserver core answers before the publishes' deadlines."
        ),
        _ => "Every node's pods arrive at once, as in the runs above.".to_string(),
    }
}

/// Writes the section for `scale` (the `node_scale` bench's JSON) and the large run into `w`,
/// and the plot's SVG into `plot`; the section links `plot_name`.
pub fn write(w: &mut String, (scale, large): (&Value, Large<'_>), plot: &mut String, plot_name: &str) {
    let all = scale["runs"].as_array().map(Vec::as_slice).unwrap_or_default();
    let (large_runs, large_idle) = match large {
        Large::Held(large) => (large["runs"].as_array().cloned().unwrap_or_default(), large["idle_seconds"].clone()),
        _ => (Vec::new(), Value::Null),
    };
    // A run whose controller did not answer the nodes' questions is the baseline: the design
    // before, shown beside the others and left out of the fits.
    let is_baseline = |run: &&Value| run["central_answers"] == Value::Bool(false);
    let runs: Vec<Value> = all.iter().filter(|run| !is_baseline(run)).cloned().collect();
    let baseline: Vec<&Value> = all.iter().filter(is_baseline).collect();
    let Some(first) = runs.first() else {
        let _ = writeln!(w, "## The node's view at scale\n\nNot measured in this run: it needs Go.\n");
        return;
    };
    let runs = runs.as_slice();
    let _ = writeln!(
        w,
        "## The node's view at scale\n\n`cargo bench -p inline-guard-benches --bench node_scale -- --nodes 10,50,200`: \
         one real kube-apiserver {} and etcd ({}), and N driver instances in one process, each its own node \
         (its own name, directories, socket, apiserver client, watches and access checks), each with {} volumes \
         over {} shares (the nodes' directories on {}); the read-grants controller running, answering the nodes' access questions. Idle {} s; \
         churns {} s each. The drivers' CPU includes the load generator's (small). A row marked *before* is the \
         same run with a controller that only tells the nodes (`--baseline-nodes`): each node then asks its own \
         questions after every notice, the design before the central answers.\n",
        first["apiserver"].as_str().unwrap_or_default(),
        first["placement"].as_str().unwrap_or_default(),
        first["volumes_per_node"],
        first["shares"],
        match first["nodes_directories"].as_str() {
            Some("tmpfs") => "a tmpfs, as each volume is on a node",
            _ => "the disk: not run as root",
        },
        scale["idle_seconds"],
        scale["churn_seconds"],
    );
    let _ = writeln!(
        w,
        "| N | watches open: cluster-wide / a namespace's / by name | apiserver RSS / Go heap in use / kept at idle (of it stacks) | idle: apiserver / etcd / drivers CPU (cores) | \
         node writes per binding change where no node serves | node writes per edit of a share no node reads | \
         relevant bindings: reviews per change per node | Secret update to every node p50 / p99 | \
         share edit to every node p50 / p99 | revocation to every node p50 / max ({} rounds) | revocation to each node p50 / p99 (every node, every round) | revocation, first round: apiserver CPU per node write / the drivers' CPU | a tenant's {} subjects: this process grew |",
        number(&first["phases"]["revocation"]["to_every_node_ms"]["rounds"]),
        number(&first["phases"]["tenant_fat_bindings"]["subjects"]),
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for run in runs.iter().chain(baseline.iter().copied()).chain(large_runs.iter()) {
        let nodes = number(&run["nodes"]);
        let large = large_runs.iter().any(|large| std::ptr::eq(large, run));
        let phase = |name: &str, of: &str| number(&run["phases"][name][of]);
        let ms = |name: &str, of: &str| number(&run["phases"][name]["to_every_node_ms"][of]);
        let relevant_changes = phase("relevant_bindings", "binding_changes");
        let scopes = &run["watches_by_scope"];
        let _ = writeln!(
            w,
            "| {nodes}{} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} ({:.0}) MB | {:.3} / {:.3} / {:.3} | {:.2} | {:.2} | {:.1} | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {:.1} ms / {:.2} s | {:.1} MB |",
            if is_baseline(&run) {
                ", *before*".to_string()
            } else if large {
                match run["pods_per_second"].as_f64() {
                    Some(rate) if rate > 0.0 => format!(", idle {large_idle} s, pods at {rate}/s"),
                    _ => format!(", idle {large_idle} s"),
                }
            } else {
                String::new()
            },
            number(&scopes["cluster"]),
            number(&scopes["namespace"]),
            number(&scopes["resource"]),
            number(&run["apiserver_rss_mb"]),
            number(&run["apiserver_heap_mb"]),
            number(&run["apiserver_retained_mb"]),
            number(&run["apiserver_retained_stacks_mb"]),
            cores(run, "idle", "apiserver_cpu_s"),
            cores(run, "idle", "etcd_cpu_s"),
            cores(run, "idle", "drivers_cpu_s"),
            node_writes(&run["phases"]["unrelated_bindings"]) / phase("unrelated_bindings", "binding_changes"),
            node_writes(&run["phases"]["unread_share_edits"]) / phase("unread_share_edits", "share_edits"),
            phase("relevant_bindings", "access_reviews") / relevant_changes / nodes,
            ms("secret_updates", "p50"),
            ms("secret_updates", "p99"),
            ms("share_edits", "p50"),
            ms("share_edits", "p99"),
            ms("revocation", "p50"),
            ms("revocation", "max"),
            number(&run["phases"]["revocation"]["to_each_node_ms"]["p50"]),
            number(&run["phases"]["revocation"]["to_each_node_ms"]["p99"]),
            per_node_write(&run["phases"]["revocation"]),
            phase("revocation", "drivers_cpu_s"),
            phase("tenant_fat_bindings", "drivers_and_controller_rss_growth_mb"),
        );
    }
    let _ = writeln!(
        w,
        "\nWatches by the apiserver's `scope`: `cluster` is a kind watched cluster-wide, `resource` one object by name \
         (the apiserver's own and the controllers' watches included). A revocation reaches *every* node when the last of the simulated nodes, \
         queued on this process's one core, has emptied its volume; *each* node's delay is its own, from the binding's deletion to its volume \
         emptied (queued, as every node's work, on this process's one core, where a cluster gives each node its own). \
         Each round starts from a settled cluster: this process and the apiserver each under 10 % of a core for \
         0.5 s, so that no round counts the last one's aftermath (the nodes opening their Secrets' watches again \
         after the grant made again, the controller writing their statuses). The drivers' CPU of a revocation's first round is every \
         simulated node's work (emptying its volumes, reading its object and the lease) on this process's one core: \
         when it nears the round's time, the figure is the simulation's, which a cluster spreads over its nodes. \
         The last column is this process's growth while \
         the tenant's bindings are made: every driver and the access-notices controller together. Before the node's \
         view by name (`git show 2610550465d9:benches/REPORT.md`), each node watched 7 kinds cluster-wide.\n"
    );
    match large {
        Large::Held(large) => {
            let _ = writeln!(
                w,
                "The row marked with its idle time is a run of its own after the others (`SCALE_LARGE_NODES`, \
                 idle {} s): shown, and left out of the fits below. {}\n",
                large["idle_seconds"],
                paced(large)
            );
        }
        Large::NotHeld(why) => {
            let _ = writeln!(
                w,
                "The run at the largest node count (`SCALE_LARGE_NODES`, its pods arriving at `SCALE_LARGE_PODS_PER_SECOND`) \
                 did not finish on this machine (a publish is tried again for 10 minutes, with backoff, where kubelet would \
                 keep trying); how it ended:\n\n```\n{}\n```\n",
                why.trim()
            );
        }
        Large::NotRun => {}
    }
    let idle = series(runs, |run| cores(run, "idle", "apiserver_cpu_s"));
    let unrelated = series(runs, |run| cores(run, "unrelated_bindings", "apiserver_cpu_s"));
    let relevant = series(runs, |run| cores(run, "relevant_bindings", "apiserver_cpu_s"));
    let updates = series(runs, |run| cores(run, "secret_updates", "apiserver_cpu_s"));
    *plot = line_chart(
        "kube-apiserver CPU against the node count",
        "nodes",
        "cores",
        &[
            ("idle", idle.clone()),
            ("10 unrelated bindings/s", unrelated.clone()),
            ("1 relevant binding/s", relevant),
            ("Secret updates", updates),
        ],
    );
    let _ = writeln!(w, "\n![apiserver CPU against N](report/{plot_name})\n");

    let (idle_slope, _) = fit(&idle);
    let watches = series(runs, |run| number(&run["watches_open"]));
    let (watch_slope, _) = fit(&watches);
    let (cluster_wide_slope, _) = fit(&series(runs, |run| number(&run["watches_by_scope"]["cluster"])));
    let (named_slope, _) = fit(&series(runs, |run| number(&run["watches_by_scope"]["resource"])));
    let worst = |per: &dyn Fn(&Value) -> f64| runs.iter().map(per).fold(0.0_f64, f64::max);
    let elsewhere_writes = worst(&|run| {
        node_writes(&run["phases"]["unrelated_bindings"])
            / number(&run["phases"]["unrelated_bindings"]["binding_changes"])
    });
    let unread_writes = worst(&|run| {
        node_writes(&run["phases"]["unread_share_edits"]) / number(&run["phases"]["unread_share_edits"]["share_edits"])
    });
    let per_change = series(runs, |run| {
        number(&run["phases"]["unrelated_bindings"]["apiserver_cpu_s"])
            / number(&run["phases"]["unrelated_bindings"]["binding_changes"])
    });
    let (change_slope, _) = fit(&per_change);
    let (memory_slope, _) = fit(&series(runs, |run| number(&run["apiserver_rss_mb"])));
    let (heap_slope, _) = fit(&series(runs, |run| number(&run["apiserver_heap_mb"])));
    let (retained_slope, _) = fit(&series(runs, |run| number(&run["apiserver_retained_mb"])));
    let (bare_slope, _) = fit(&series(runs, |run| number(&run["apiserver_retained_without_volumes_mb"])));
    let (live_slope, _) = fit(&series(runs, |run| number(&run["apiserver_live_mb"])));
    let (bare_live_slope, _) = fit(&series(runs, |run| number(&run["apiserver_live_without_volumes_mb"])));
    let named = |run: &Value, resources: &[&str]| {
        resources
            .iter()
            .map(|resource| run["named_watches_by_resource"][*resource].as_f64().unwrap_or(0.0))
            .sum::<f64>()
    };
    let (objects_slope, _) = fit(&series(runs, |run| named(run, &["secrets", "configmaps"])));
    let (own_slope, _) = fit(&series(runs, |run| named(run, &["sharedresourcenodes", "leases"])));
    let mean = |of: &str| runs.iter().map(|run| number(&run[of])).sum::<f64>() / runs.len() as f64;
    let (floor_kb, floor_live_kb) =
        (mean("apiserver_kept_per_named_watch_kb"), mean("apiserver_live_per_named_watch_kb"));
    let reviews_per_change = runs
        .iter()
        .map(|run| {
            number(&run["phases"]["relevant_bindings"]["access_reviews"])
                / number(&run["phases"]["relevant_bindings"]["binding_changes"])
                / number(&run["nodes"])
        })
        .fold(0.0_f64, f64::max);
    let pairs = number(&first["volumes_per_node"]);
    let _ = writeln!(
        w,
        "### Extrapolated to {NODES} nodes × {pairs} volumes\n\n\
         The model: each cost is linear in the node count, with the slopes fitted to the runs above (least squares).\n\n\
         | cost | per node (fitted) | at {NODES} nodes |\n|---|---|---|\n\
         | watches open | {watch_slope:.1} | {:.0} |\n\
         | of which cluster-wide | {cluster_wide_slope:.2} | {:.0} |\n\
         | of which one object by name | {named_slope:.1} | {:.0} |\n\
         | of which a Secret or ConfigMap a volume shows | {objects_slope:.1} | {:.0} |\n\
         | of which the node's own object and the access notices' lease | {own_slope:.1} | {:.0} |\n\
         | node writes per binding change where no node serves (the worst run) | {elsewhere_writes:.2} | {:.0} per change |\n\
         | node writes per edit of a share no node reads (the worst run) | {unread_writes:.2} | {:.0} per edit |\n\
         | apiserver resident set (mostly the watches) | {memory_slope:.1} MB | {:.0} MB |\n\
         | apiserver Go heap in use | {heap_slope:.1} MB | {:.0} MB |\n\
         | apiserver memory kept at idle, held / live (heap spans / objects after a collection, and stacks) | {retained_slope:.2} / {live_slope:.2} MB | {:.0} / {:.0} MB |\n\
         | of which the node before its volumes (its own two watches, its connections), held / live | {bare_slope:.2} / {bare_live_slope:.2} MB | {:.0} / {:.0} MB |\n\
         | of which each of its volumes (its object's watch, its part of the node's object and of that object's recent writes), held / live | {:.0} / {:.0} kB | |\n\
         | a watch of one Secret by name alone, as kubelet keeps one per Secret its pods mount (the mean of the runs), held / live | {floor_kb:.0} / {floor_live_kb:.0} kB | |\n\
         | apiserver CPU, idle | {:.2} millicores | {:.2} cores |\n\
         | access reviews, idle (model: pairs / `accessRecheckSeconds`) | {:.3}/s | {:.0}/s |\n\
         | apiserver CPU per binding change where no node serves | {:.3} ms | {:.1} CPU-seconds; at 10 changes/s, {:.1} cores |\n\
         | access reviews per relevant binding change, per node serving the account | {reviews_per_change:.1} | {:.0} if every node serves it |\n\
         | Secret reads per update of a shared Secret | 1 per node serving it | {NODES} if every node serves it |\n",
        NODES * watch_slope,
        NODES * cluster_wide_slope,
        NODES * named_slope,
        NODES * objects_slope,
        NODES * own_slope,
        elsewhere_writes,
        unread_writes,
        NODES * memory_slope,
        NODES * heap_slope,
        NODES * retained_slope,
        NODES * live_slope,
        NODES * bare_slope,
        NODES * bare_live_slope,
        (retained_slope - bare_slope) * 1e3 / pairs,
        (live_slope - bare_live_slope) * 1e3 / pairs,
        idle_slope * 1e3,
        NODES * idle_slope,
        pairs / ACCESS_RECHECK_SECONDS,
        NODES * pairs / ACCESS_RECHECK_SECONDS,
        change_slope * 1e3,
        NODES * change_slope,
        10.0 * NODES * change_slope,
        NODES * reviews_per_change,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_fitted_exactly() {
        let (slope, intercept) = fit(&[(10.0, 3.0), (50.0, 11.0), (200.0, 41.0)]);
        assert!((slope - 0.2).abs() < 1e-9 && (intercept - 1.0).abs() < 1e-9, "{slope} {intercept}");
    }
}
