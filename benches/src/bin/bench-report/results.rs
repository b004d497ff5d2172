//! One run's results as the report reads them, and the few ways every section formats them.

use std::path::{Path, PathBuf};

use inline_guard_tests::bench_areas::{BenchArea, Recorded};

use serde_json::Value;

use crate::record::{MEDIANS, RECORDED};

/// What `benches/run` left in `benches/results/`: each area's files in its own directory, and
/// the record of its run. A bench that did not run (no root, no Go) left no file: its field is
/// `None` and its section says it was not measured.
pub struct Results {
    /// Every area of `benches/areas.tsv` and its record (`None`: never measured).
    pub areas: Vec<(BenchArea, Option<Recorded>)>,
    /// `https_pinned`: the webhook beside nginx and the floors. Required: it is the headline.
    pub https: Value,
    /// `cache_memory`.
    pub cache: Option<Value>,
    /// `apiserver_pods`, every policy phase.
    pub apiserver: Option<Value>,
    /// `driver_latency`.
    pub driver: Option<Value>,
    /// `lazy_read`.
    pub lazy_read: Option<Value>,
    /// `handover_read`.
    pub handover_read: Option<Value>,
    /// `shares_latency`.
    pub shares: Option<Value>,
    /// `providers_latency`.
    pub providers: Option<Value>,
    /// `node_scale`.
    pub scale: Option<Value>,
    /// The node-scale run at the largest node count, on its own (`SCALE_LARGE_NODES`).
    pub scale_large: Option<Value>,
    /// Why that run did not finish, when it did not (the end of its output).
    pub scale_large_failed: Option<String>,
    /// Criterion's medians: full benchmark id and nanoseconds, sorted by id.
    pub medians: Vec<(String, f64)>,
}

impl Results {
    /// Reads `dir`: the files of each area's directory below it (or, written by hand, in it).
    pub fn read(dir: &Path, areas: Vec<BenchArea>) -> Result<Results, String> {
        let find = |file: &str| -> Option<PathBuf> {
            std::iter::once(dir.join(file))
                .chain(areas.iter().map(|area| dir.join(&area.name).join(file)))
                .find(|path| path.exists())
        };
        let optional = |file: &str| find(file).and_then(|path| read_json(&path).ok());
        let mut recorded = Vec::new();
        for area in areas.iter().cloned() {
            let path = dir.join(&area.name).join(RECORDED);
            let record = match std::fs::read_to_string(&path) {
                Ok(text) => Some(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?),
                Err(_) => None,
            };
            recorded.push((area, record));
        }
        let https = find("https.json")
            .ok_or_else(|| format!("{}: no https.json (the webhook area's headline)", dir.display()))?;
        let medians: Vec<(String, f64)> = match find(MEDIANS) {
            Some(path) => serde_json::from_value(read_json(&path)?).map_err(|e| format!("{}: {e}", path.display()))?,
            None => Vec::new(),
        };
        Ok(Results {
            https: read_json(&https)?,
            cache: optional("cache.json"),
            apiserver: optional("apiserver.json"),
            driver: optional("driver.json"),
            lazy_read: optional("lazy-read.json"),
            handover_read: optional("handover-read.json"),
            shares: optional("shares.json"),
            providers: optional("providers.json"),
            scale: optional("scale.json"),
            scale_large: optional("scale-large.json"),
            scale_large_failed: find("scale-large-failed.txt").and_then(|path| std::fs::read_to_string(path).ok()),
            areas: recorded,
            medians,
        })
    }

    /// The criterion median whose id is exactly `id`.
    pub fn median(&self, id: &str) -> Option<f64> {
        self.medians.iter().find(|(name, _)| name == id).map(|(_, nanos)| *nanos)
    }

    /// The first criterion median whose id contains `part`.
    pub fn median_containing(&self, part: &str) -> Option<f64> {
        self.medians.iter().find(|(name, _)| name.contains(part)).map(|(_, nanos)| *nanos)
    }
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A JSON number, NaN when absent (printed as NaN: a missing field shows rather than reading 0).
pub fn number(value: &Value) -> f64 {
    value.as_f64().unwrap_or(f64::NAN)
}

/// How a target is judged in the report's words.
pub fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

/// Nanoseconds as people read them: `73 ns`, `3.92 µs`.
pub fn human_ns(nanos: f64) -> String {
    if nanos >= 1000.0 { format!("{:.2} µs", nanos / 1000.0) } else { format!("{nanos:.0} ns") }
}

/// Writes one SVG plot beside the report.
pub fn write_plot(dir: &Path, name: &str, svg: &str) -> Result<(), String> {
    let path = dir.join(name);
    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))
}
