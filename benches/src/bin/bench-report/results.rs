//! One run's results as the report reads them, and the few ways every section formats them.

use std::path::Path;

use serde_json::Value;

/// What `benches/run` left in its results directory. A bench that did not run (no root, no Go)
/// left no file: its field is `None` and its section says it was not measured.
pub struct Results {
    /// The commit `benches/run` measured, as it wrote it in `commit.txt` before the first bench.
    pub commit: String,
    /// Minutes from the first bench to the last one's results, when `benches/run` recorded its
    /// start.
    pub minutes: Option<f64>,
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
    /// Reads `dir` and criterion's output under `criterion`.
    pub fn read(dir: &Path, criterion: &Path) -> Result<Results, String> {
        let optional = |file: &str| read_json(&dir.join(file)).ok();
        let commit = std::fs::read_to_string(dir.join("commit.txt"))
            .map(|text| text.trim().to_string())
            .unwrap_or_else(|_| "not recorded (bench-report run without benches/run)".to_string());
        let minutes = std::fs::read_to_string(dir.join("started.txt")).ok().and_then(|text| {
            let started: u64 = text.trim().parse().ok()?;
            Some(last_written(dir)?.saturating_sub(started) as f64 / 60.0)
        });
        Ok(Results {
            commit,
            minutes,
            https: read_json(&dir.join("https.json"))?,
            cache: optional("cache.json"),
            apiserver: optional("apiserver.json"),
            driver: optional("driver.json"),
            lazy_read: optional("lazy-read.json"),
            handover_read: optional("handover-read.json"),
            shares: optional("shares.json"),
            providers: optional("providers.json"),
            scale: optional("scale.json"),
            scale_large: optional("scale-large.json"),
            scale_large_failed: std::fs::read_to_string(dir.join("scale-large-failed.txt")).ok(),
            medians: inline_guard_benches::report::criterion_medians(criterion)?,
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

/// When the last bench wrote its results (seconds since the epoch): the run's end, however
/// long after it the report is written.
fn last_written(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|extension| extension == "json"))
        .filter_map(|entry| entry.metadata().ok()?.modified().ok())
        .max()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|elapsed| elapsed.as_secs())
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
