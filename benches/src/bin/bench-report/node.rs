//! The driver on the node: publish and unpublish on real tmpfs, a lazy file's read through FUSE
//! (and across the driver's handover), shares and providers against a real kube-apiserver, and
//! the node's view at scale.

use std::fmt::Write as _;
use std::path::Path;

use inline_guard_benches::scale_report;

use crate::results::{Results, met, number, write_plot};

/// Writes the node's sections; the scale plot goes to `plots`.
pub fn write(w: &mut String, results: &Results, plots: &Path) -> Result<(), String> {
    driver(w, results);
    lazy_read(w, results);
    handover_read(w, results);
    shares(w, results);
    providers(w, results);
    match &results.scale {
        Some(scale) => {
            let mut plot = String::new();
            let large = match (&results.scale_large, &results.scale_large_failed) {
                (Some(large), _) => scale_report::Large::Held(large),
                (None, Some(why)) => scale_report::Large::NotHeld(why),
                (None, None) => scale_report::Large::NotRun,
            };
            scale_report::write(w, (scale, large), &mut plot, "apiserver-cpu-by-nodes.svg");
            if !plot.is_empty() {
                write_plot(plots, "apiserver-cpu-by-nodes.svg", &plot)?;
            }
        }
        None => {
            let _ = writeln!(w, "## The node's view at scale\n\nNot measured in this run: it needs Go.\n");
        }
    }
    Ok(())
}

fn driver(w: &mut String, results: &Results) {
    let Some(driver) = &results.driver else {
        let _ = writeln!(w, "## The driver\n\nNot measured in this run: `driver_latency` needs root.\n");
        return;
    };
    let _ = writeln!(w, "## The driver (real tmpfs, CSI over its socket)\n");
    let _ = writeln!(w, "| operation | p50 | p99 | target |");
    let _ = writeln!(w, "|---|---|---|---|");
    let publish_p99 = number(&driver["publish"]["p99_ms"]);
    let _ = writeln!(
        w,
        "| NodePublishVolume | {:.2} ms | {publish_p99:.2} ms | p99 < 5 ms: {} |",
        number(&driver["publish"]["p50_ms"]),
        met(publish_p99 < 5.0)
    );
    let _ = writeln!(
        w,
        "| NodeUnpublishVolume | {:.2} ms | {:.2} ms | |",
        number(&driver["unpublish"]["p50_ms"]),
        number(&driver["unpublish"]["p99_ms"])
    );
    let _ = writeln!(
        w,
        "\n{} volumes; process resident set with all published: {:.1} MB.\n",
        driver["volumes"],
        number(&driver["resident_mb"])
    );
}

/// A lazy provider's cached file read through FUSE, beside tmpfs and one round trip between the
/// cores (the floor no FUSE open avoids). Target: < 50 µs per read.
fn lazy_read(w: &mut String, results: &Results) {
    let Some(lazy) = &results.lazy_read else {
        let _ =
            writeln!(w, "## A lazy file's read through FUSE\n\nNot measured in this run: `lazy_read` needs root.\n");
        return;
    };
    let us = |key: &str| number(&lazy[key]);
    let _ = writeln!(
        w,
        "## A lazy file's read through FUSE\n\nA cached {}-byte file of a lazy provider volume, read {} times (open, \
         read to the end, close) in alternating rounds beside the same read from tmpfs and one byte sent to the FUSE \
         session's CPU and back; {}.\n",
        lazy["file_bytes"],
        lazy["reads"],
        lazy["machine"].as_str().unwrap_or_default()
    );
    let _ = writeln!(w, "| read | p50 | p99 | p50 over tmpfs | p50 over one round trip | target |");
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    let _ = writeln!(w, "| tmpfs (floor) | {:.1} µs | {:.1} µs | 1× | | |", us("tmpfs_p50_us"), us("tmpfs_p99_us"));
    let _ = writeln!(
        w,
        "| one round trip between the cores (floor) | {:.1} µs | {:.1} µs | | 1× | |",
        us("round_trip_p50_us"),
        us("round_trip_p99_us")
    );
    let _ = writeln!(
        w,
        "| through FUSE | {:.1} µs | {:.1} µs | {:.1}× | {:.2}× | < 50 µs: {} |",
        us("fuse_p50_us"),
        us("fuse_p99_us"),
        us("fuse_p50_us") / us("tmpfs_p50_us"),
        us("fuse_p50_us") / us("round_trip_p50_us"),
        met(us("fuse_p50_us") < 50.0)
    );
    let _ = writeln!(
        w,
        "\n`get` calls to the helper in all: {} (one per file); every other read was served from the driver's cache.\n",
        lazy["gets"]
    );
}

/// A lazy file read in a loop while the driver hands the node over to a successor: each read's
/// time before, during and after the handovers.
fn handover_read(w: &mut String, results: &Results) {
    let title = "## A lazy file's read across the driver's handover";
    let Some(handover) = &results.handover_read else {
        let _ = writeln!(w, "{title}\n\nNot measured in this run: `handover_read` needs root.\n");
        return;
    };
    let _ = writeln!(
        w,
        "{title}\n\nA cached {}-byte file of a lazy provider volume, read in a loop (open, read to the end, close) \
         while the driver serving it hands the node to a successor started beside it, {} times in a row (two whole \
         drivers, real FUSE); {} reads, none failed; {}. A read is during a handover when it overlaps one: from the \
         successor's start to its first answer on the node's CSI socket.\n",
        handover["file_bytes"],
        handover["handovers"],
        handover["reads"],
        handover["machine"].as_str().unwrap_or_default()
    );
    let _ = writeln!(w, "| reads | count | p50 | p99 | max |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    let phases =
        [("before", "before the first handover"), ("during", "during a handover"), ("after", "after the last")];
    for (phase, name) in phases {
        let phase = &handover[phase];
        let _ = writeln!(
            w,
            "| {name} | {} | {:.1} µs | {:.1} µs | {:.1} µs |",
            phase["reads"],
            number(&phase["p50_us"]),
            number(&phase["p99_us"]),
            number(&phase["max_us"])
        );
    }
    let took: Vec<String> = handover["handover_ms"]
        .as_array()
        .map(|all| all.iter().map(|ms| format!("{:.1} ms", number(ms))).collect())
        .unwrap_or_default();
    let _ = writeln!(w, "\nEach handover, the successor's start to its first answer: {}.\n", took.join(", "));
}

fn shares(w: &mut String, results: &Results) {
    let Some(shares) = &results.shares else {
        let _ =
            writeln!(w, "## Shares from a real kube-apiserver\n\nNot measured in this run: it needs root and Go.\n");
        return;
    };
    let _ = writeln!(
        w,
        "## Shares from a real kube-apiserver\n\nThe driver in process as its ServiceAccount, {} volumes over {} \
         SharedSecrets, real tmpfs; {}.\n",
        shares["volumes"],
        shares["shares"],
        shares["placement"].as_str().unwrap_or_default()
    );
    let _ = writeln!(w, "| measure | p50 | p99 | target |");
    let _ = writeln!(w, "|---|---|---|---|");
    let publish_p99 = number(&shares["publish"]["p99_ms"]);
    let update_p99 = number(&shares["update_to_files"]["p99_ms"]);
    let _ = writeln!(
        w,
        "| NodePublishVolume with its access check | {:.2} ms | {publish_p99:.2} ms | p99 < 10 ms: {} |",
        number(&shares["publish"]["p50_ms"]),
        met(publish_p99 < 10.0)
    );
    let _ = writeln!(
        w,
        "| Secret update to a volume's files ({} updates) | {:.2} ms | {update_p99:.2} ms | p99 < 200 ms: {} |",
        shares["updates"],
        number(&shares["update_to_files"]["p50_ms"]),
        met(update_p99 < 200.0)
    );
    let resident = number(&shares["resident_mb"]);
    let _ = writeln!(
        w,
        "\nProcess resident set with every volume published: {resident:.1} MB ({:.1} MB before the driver); \
         target < 60 MB: {}.\n",
        number(&shares["resident_mb_before"]),
        met(resident < 60.0)
    );
}

/// Providers of secrets kept outside Kubernetes beside a SharedSecret's publish, the floor: the
/// same access check, mount and writer.
fn providers(w: &mut String, results: &Results) {
    let Some(providers) = &results.providers else {
        let _ = writeln!(w, "## Providers\n\nNot measured in this run: it needs root and Go.\n");
        return;
    };
    let _ = writeln!(
        w,
        "## Providers: an eager helper and a Secrets Store provider\n\nThe driver in process as its ServiceAccount \
         against kube-apiserver {}, {} publishes of each kind in alternating rounds, {} files per volume, real tmpfs; \
         {}.\n",
        providers["apiserver"].as_str().unwrap_or_default(),
        providers["publishes"],
        providers["files"],
        providers["placement"].as_str().unwrap_or_default()
    );
    let _ = writeln!(w, "| NodePublishVolume | p50 | p99 | p50 over the share's | target |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    let share_p50 = number(&providers["share"]["p50_ms"]);
    for (kind, what, target_ms) in [
        ("share", "SharedSecret (floor)", None),
        ("exec", "`exec` eager, a helper taking 5 ms per `get`", Some(("p50", 80.0))),
        ("secrets-store", "`secrets-store`, the e2e provider (1 KiB objects)", Some(("p99", 20.0))),
    ] {
        let (p50, p99) = (number(&providers[kind]["p50_ms"]), number(&providers[kind]["p99_ms"]));
        let target = match target_ms {
            Some(("p50", bound)) => format!("< {bound:.0} ms: {}", met(p50 < bound)),
            Some((_, bound)) => format!("p99 < {bound:.0} ms: {}", met(p99 < bound)),
            None => String::new(),
        };
        let _ = writeln!(w, "| {what} | {p50:.2} ms | {p99:.2} ms | {:.2}× | {target} |", p50 / share_p50);
    }
    let _ = writeln!(w);
}
