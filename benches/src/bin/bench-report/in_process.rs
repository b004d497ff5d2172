//! In-process figures from criterion: every median, the review's decode + decide + encode against
//! its floors, and what SharedResourceAdmission and share injection add to the chain.

use std::fmt::Write as _;

use crate::results::{Results, human_ns, met};

/// Writes the criterion table and the narratives computed from it.
pub fn write(w: &mut String, results: &Results) {
    let _ = writeln!(w, "## In process (criterion medians)\n");
    let _ = writeln!(w, "| benchmark | median |");
    let _ = writeln!(w, "|---|---|");
    for (name, nanos) in &results.medians {
        let _ = writeln!(w, "| `{name}` | {} |", human_ns(*nanos));
    }
    review(w, results);
    shared_admission(w, results);
}

/// The 3.4 KB review against a bare scan of its bytes, and where its time goes.
fn review(w: &mut String, results: &Results) {
    let (Some(scan), Some(validate)) =
        (results.median_containing("scan only, serde"), results.median("review/validate/3KB"))
    else {
        return;
    };
    let _ = writeln!(
        w,
        "\nDecode + decide + encode of the 3.4 KB review: {} = {:.1}× a bare serde scan of the same bytes ({}); \
         target ≤ 3 µs (set on a 2-vCPU AMD EPYC; on another CPU the ratio to the bare scan is the figure that travels): {}.\n",
        human_ns(validate),
        validate / scan,
        human_ns(scan),
        met(validate <= 3000.0)
    );
    if let (Some(hand), Some(serde)) =
        (results.median_containing("decode, hand-written"), results.median_containing("decode, serde derive"))
    {
        let _ = writeln!(
            w,
            "The review is decoded by a hand-written single-pass reader that borrows every string without escapes from the body: \
             {} against {} for serde's derive on the same bytes ({:.2}×); serde still decides every body the reader declines.\n",
            human_ns(hand),
            human_ns(serde),
            hand / serde
        );
    }
    let (Some(parse), Some(floor)) =
        (results.median_containing("parse review"), results.median_containing("lower bound"))
    else {
        return;
    };
    // The narrative holds only while its premises do: a lower bound below what it bounds, and a
    // parse that is part of the whole.
    if floor <= parse && parse <= validate {
        let _ = writeln!(
            w,
            "What bounds it: parsing is {} of it, and the reader must at least scan every byte ({}); \
             the rest, {}, is the chain and encoding the answer. Even a parse as cheap as the bare scan would leave {}.\n",
            human_ns(parse),
            human_ns(floor),
            human_ns(validate - parse),
            human_ns(validate - parse + floor),
        );
    } else {
        let _ = writeln!(
            w,
            "What bounds it cannot be told from this run: the measures are inconsistent on this machine \
             (bare scan {}, parse {}, whole {}; a lower bound must not exceed what it bounds). Rerun on an idle machine.\n",
            human_ns(floor),
            human_ns(parse),
            human_ns(validate),
        );
    }
}

/// The `shared_admission` bench's targets: a pod without the driver's volumes pays under 100 ns
/// for the two plugins; a pod with one share, its answers held, under 2 µs.
fn shared_admission(w: &mut String, results: &Results) {
    let id = |case: &str| results.median(&format!("shared_admission/{case}"));
    let (Some(without), Some(with), Some(plugin), Some(warm), Some(annotated)) = (
        id("chain_without_the_plugins/pod_without_the_driver"),
        id("chain_with_the_plugins/pod_without_the_driver"),
        id("plugin/pod_without_the_driver"),
        id("plugin/pod_with_one_share_warm"),
        id("chain_with_the_plugins/pod_asking_one_share_by_annotation_warm"),
    ) else {
        let _ = writeln!(w, "SharedResourceAdmission and share injection: not measured in this run.\n");
        return;
    };
    let added = with - without;
    let _ = writeln!(w, "### SharedResourceAdmission and share injection\n");
    let _ = writeln!(w, "| case | median | target |");
    let _ = writeln!(w, "|---|---|---|");
    let _ = writeln!(
        w,
        "| SharedResourceAdmission alone, a pod whose only CSI volume is another driver's | {} | |",
        human_ns(plugin)
    );
    let _ = writeln!(
        w,
        "| the chain without share injection and SharedResourceAdmission, same pod | {} | |",
        human_ns(without)
    );
    let _ = writeln!(
        w,
        "| the chain with both, same pod | {} ({added:+.1} ns) | < +100 ns: {} |",
        human_ns(with),
        met(added < 100.0)
    );
    let _ = writeln!(
        w,
        "| SharedResourceAdmission, a pod with one share, answers held (warm) | {} | < 2 µs: {} |",
        human_ns(warm),
        met(warm < 2000.0)
    );
    let _ = writeln!(
        w,
        "| the whole chain, a pod asking for one share by annotation (injected, then judged warm) | {} | |\n",
        human_ns(annotated)
    );
}
