//! Writes `benches/REPORT.md` and its plots from the committed results of every area of
//! `benches/areas.tsv` (`benches/results/AREA/`: the JSON each bench wrote and criterion's
//! medians), and takes one area's run into them. Nothing in the report is typed in by hand; a
//! section whose bench did not run says so. Each area names the commit and the machine it was
//! measured on, so a figure quoted from the report can be traced to both.
//!
//! `bench-report start AREA RUN_DIR`: notes the area's code before its benches run.
//! `bench-report record AREA RUN_DIR CRITERION_DIR`: keeps the run's results in `benches/results/AREA/`.
//! `bench-report report`: writes `benches/REPORT.md` from `benches/results/`.

mod apiserver;
mod https;
mod in_process;
mod node;
mod record;
mod results;
mod webhook_cache;

use std::fmt::Write as _;
use std::path::Path;

use inline_guard_tests::bench_areas::{BenchArea, bench_areas};
use results::Results;

const USAGE: &str = "usage: bench-report start AREA RUN_DIR | record AREA RUN_DIR CRITERION_DIR | report";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let root = inline_guard_tests::repo_root();
    let results = root.join("benches/results");
    let outcome = match args.as_slice() {
        ["start", area, run_dir] => {
            record::area(&root, area).and_then(|area| record::start(&root, &area, Path::new(run_dir)))
        }
        ["record", name, run_dir, criterion] => record::area(&root, name).and_then(|area| {
            record::record(&root, &area, Path::new(run_dir), Path::new(criterion), &results.join(name))
        }),
        ["report"] => {
            bench_areas(&root).and_then(|areas| write_report(&results, areas, &root.join("benches/REPORT.md")))
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(error) = outcome {
        eprintln!("bench-report: {error}");
        std::process::exit(1);
    }
}

/// The whole report, section by section, in the order a reader asks: what was measured when, the
/// webhook, the apiserver, the node, the memory of the webhook's cache.
fn write_report(results_dir: &Path, areas: Vec<BenchArea>, report: &Path) -> Result<(), String> {
    let results = Results::read(results_dir, areas)?;
    let plots = report.parent().unwrap_or(Path::new(".")).join("report");
    std::fs::create_dir_all(&plots).map_err(|e| format!("{}: {e}", plots.display()))?;
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# Benchmark report\n");
    let _ = writeln!(
        w,
        "Written by `benches/run` from the committed results in `benches/results/`, one directory per area of \
         `benches/areas.tsv`; do not edit by hand. `benches/run --only AREA` measures one area again. The suite \
         fails when the code an area measures changed since its figures were measured \
         (`tests/tests/bench_staleness.rs`).\n"
    );
    let _ = writeln!(w, "| area | commit measured | measured on | took | sections |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    // Each machine with the areas measured on it: areas measured on different days may have run
    // on different hosts, and a reader comparing figures across sections must see it.
    let mut machines: Vec<(&str, Vec<&str>)> = Vec::new();
    for (area, recorded) in &results.areas {
        match recorded {
            Some(r) => {
                let _ = writeln!(
                    w,
                    "| {} | {} | {} | {} min | {} |",
                    area.name,
                    r.commit,
                    r.measured,
                    r.seconds.div_ceil(60),
                    area.sections
                );
                match machines.iter_mut().find(|(machine, _)| *machine == r.machine) {
                    Some((_, names)) => names.push(&area.name),
                    None => machines.push((&r.machine, vec![&area.name])),
                }
            }
            None => {
                let _ = writeln!(w, "| {} | not measured | | | {} |", area.name, area.sections);
            }
        }
    }
    let machines = match machines.as_slice() {
        [] => "Machine: not recorded".to_string(),
        [(machine, _)] => format!("Machine: {machine}"),
        several => format!(
            "Machines: {}",
            several
                .iter()
                .map(|(machine, names)| format!("{machine} ({})", names.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    let _ = writeln!(
        w,
        "\n{machines}. {}. nginx {}.\n",
        results.https["placement"].as_str().unwrap_or_default(),
        results.https["nginx"].as_str().unwrap_or_default()
    );
    https::write(w, &results, &plots)?;
    in_process::write(w, &results);
    apiserver::write(w, &results);
    node::write(w, &results, &plots)?;
    webhook_cache::write(w, &results);
    std::fs::write(report, md).map_err(|e| format!("{}: {e}", report.display()))
}

#[cfg(test)]
mod tests;
