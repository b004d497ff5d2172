//! The benchmark areas of `benches/areas.tsv` and what each one's committed results record:
//! `benches/run` writes an area's results and its [`Recorded`] under `benches/results/AREA/`,
//! `bench-report` makes `benches/REPORT.md` from all of them, and `tests/tests/bench_staleness.rs`
//! fails when an area's code changed since its figures were measured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::code_digest::{changed_files, code_digests};

/// One line of `benches/areas.tsv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchArea {
    /// What `benches/run --only` takes.
    pub name: String,
    /// The files the area's benches write into its results directory.
    pub results: Vec<String>,
    /// The paths of the code its figures measure (`dir/**`, `dir/*`, or a file).
    pub code: Vec<String>,
    /// The report's sections it writes, for people.
    pub sections: String,
}

/// What an area's run recorded beside its results (`recorded.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// The commit checked out, as `git rev-parse --short=12 HEAD` printed it.
    pub commit: String,
    /// When the area's run began (UTC, as people read it).
    pub measured: String,
    /// How long the area's run took.
    pub seconds: u64,
    /// The machine, in one line.
    pub machine: String,
    /// `{file: digest}` of every file of the area's code as it was measured.
    pub code: BTreeMap<String, String>,
}

/// `benches/areas.tsv` of the checkout at `root`.
pub fn bench_areas(root: &Path) -> Result<Vec<BenchArea>, String> {
    let path = root.join("benches/areas.tsv");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut areas = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [name, results, code, sections] = fields.as_slice() else {
            return Err(format!(
                "benches/areas.tsv:{}: expected area, results, code and sections, TAB-separated; found {} fields",
                index + 1,
                fields.len()
            ));
        };
        let list = |field: &str| field.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        areas.push(BenchArea {
            name: name.to_string(),
            results: list(results),
            code: list(code),
            sections: sections.to_string(),
        });
    }
    Ok(areas)
}

/// Where an area's committed results lie.
pub fn results_dir(root: &Path, area: &str) -> PathBuf {
    root.join("benches/results").join(area)
}

/// An area's committed record; `None` when the area was never recorded.
pub fn recorded(root: &Path, area: &str) -> Result<Option<Recorded>, String> {
    let path = results_dir(root, area).join("recorded.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| format!("{}: {e}", path.display()))
}

/// The digests of `area`'s code as it is now in the checkout at `root`.
pub fn code_now(root: &Path, area: &BenchArea) -> Result<BTreeMap<String, String>, String> {
    code_digests(root, &area.code)
}

/// The files of `area`'s code that changed since its figures were measured (empty: current).
pub fn changed_since_measured(root: &Path, area: &BenchArea, recorded: &Recorded) -> Result<Vec<String>, String> {
    Ok(changed_files(&recorded.code, &code_now(root, area)?))
}
