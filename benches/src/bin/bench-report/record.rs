//! One area's run, from its start to its committed results: `start` notes the code it is about to
//! measure, `record` keeps what its benches wrote under `benches/results/AREA/` with that note, and
//! refuses when the code changed while the benches ran (the figures would be of neither tree).

use std::path::Path;

use inline_guard_benches::report::{Machine, criterion_medians};
use inline_guard_tests::bench_areas::{BenchArea, Recorded, bench_areas, code_now};
use inline_guard_tests::code_digest::changed_files;

/// Where `start` notes the code, and when.
const CODE: &str = "code.json";
const STARTED: &str = "started.txt";
/// Written by `benches/run` before the area's first bench: the commit, and whether the tree
/// differed from it.
const COMMIT: &str = "commit.txt";
/// Criterion's medians of the area's in-process benches, as the report reads them.
pub const MEDIANS: &str = "medians.json";
/// The record of an area's results.
pub const RECORDED: &str = "recorded.json";

/// The area of `benches/areas.tsv` named `name`.
pub fn area(root: &Path, name: &str) -> Result<BenchArea, String> {
    let areas = bench_areas(root)?;
    let names: Vec<&str> = areas.iter().map(|a| a.name.as_str()).collect();
    let names = names.join(", ");
    areas
        .into_iter()
        .find(|a| a.name == name)
        .ok_or_else(|| format!("no area {name:?} in benches/areas.tsv (areas: {names})"))
}

/// Notes in `run_dir` the digests of `area`'s code now and the time.
pub fn start(root: &Path, area: &BenchArea, run_dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
    let code = serde_json::to_string_pretty(&code_now(root, area)?).map_err(|e| e.to_string())?;
    write(&run_dir.join(CODE), &code)?;
    write(&run_dir.join(STARTED), &now_seconds().to_string())
}

/// Replaces `results_dir` with the files of `area` that its run left in `run_dir`, criterion's
/// medians under `criterion` when the area has any, and the record. Fails, recording nothing,
/// when the area's code now differs from the code noted at its start.
pub fn record(
    root: &Path,
    area: &BenchArea,
    run_dir: &Path,
    criterion: &Path,
    results_dir: &Path,
) -> Result<(), String> {
    let read = |file: &str| {
        std::fs::read_to_string(run_dir.join(file))
            .map_err(|e| format!("{}/{file}: {e} (was `bench-report start` run?)", run_dir.display()))
    };
    let at_start = serde_json::from_str(&read(CODE)?).map_err(|e| format!("{}/{CODE}: {e}", run_dir.display()))?;
    let now = code_now(root, area)?;
    let changed = changed_files(&at_start, &now);
    if !changed.is_empty() {
        return Err(format!(
            "area {}: its code changed while its benches ran, so its figures are of neither tree; nothing recorded. Changed: {}",
            area.name,
            shown(&changed)
        ));
    }
    let started: u64 = read(STARTED)?.trim().parse().map_err(|e| format!("{}/{STARTED}: {e}", run_dir.display()))?;
    let commit = read(COMMIT).map(|text| text.trim().to_string()).unwrap_or_else(|_| "not recorded".to_string());
    let staged = results_dir.with_extension("new");
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged).map_err(|e| format!("{}: {e}", staged.display()))?;
    let mut kept = 0;
    for file in &area.results {
        let from = run_dir.join(file);
        if file == MEDIANS {
            let medians = criterion_medians(criterion)?;
            if !medians.is_empty() {
                write(&staged.join(file), &serde_json::to_string_pretty(&medians).map_err(|e| e.to_string())?)?;
                kept += 1;
            }
        } else if from.exists() {
            std::fs::copy(&from, staged.join(file)).map_err(|e| format!("{}: {e}", from.display()))?;
            kept += 1;
        }
    }
    if kept == 0 {
        return Err(format!(
            "area {}: its run left none of {} in {}: nothing recorded",
            area.name,
            area.results.join(", "),
            run_dir.display()
        ));
    }
    let machine = Machine::this_one();
    let recorded = Recorded {
        commit,
        measured: machine.date.clone(),
        seconds: now_seconds().saturating_sub(started),
        machine: format!(
            "{} ({} cores), {}, Linux {}, {}",
            machine.cpu, machine.cores, machine.memory, machine.kernel, machine.rustc
        ),
        code: now,
    };
    write(&staged.join(RECORDED), &serde_json::to_string_pretty(&recorded).map_err(|e| e.to_string())?)?;
    // The area's old results go only once the new ones are whole.
    let _ = std::fs::remove_dir_all(results_dir);
    std::fs::rename(&staged, results_dir).map_err(|e| format!("{} -> {}: {e}", staged.display(), results_dir.display()))
}

/// At most ten of `files`, and how many more.
fn shown(files: &[String]) -> String {
    let mut text = files.iter().take(10).cloned().collect::<Vec<_>>().join(", ");
    if files.len() > 10 {
        text.push_str(&format!(" and {} more", files.len() - 10));
    }
    text
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}
