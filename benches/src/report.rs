//! What the benchmark report is made of: the machine it ran on, criterion's medians read from its
//! output directory, and horizontal bar charts drawn as plain SVG (no plotting dependency).

use std::path::Path;

/// The machine a report was measured on.
#[derive(Debug, Clone)]
pub struct Machine {
    /// The CPU model.
    pub cpu: String,
    /// Cores the benchmark may use.
    pub cores: usize,
    /// Total memory, for people.
    pub memory: String,
    /// The kernel release.
    pub kernel: String,
    /// The compiler that built the benchmarks.
    pub rustc: String,
    /// When the report was written (UTC).
    pub date: String,
}

impl Machine {
    /// This machine, now.
    pub fn this_one() -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|line| {
                line.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, v)| v.trim())
            })
            .unwrap_or("unknown CPU")
            .to_string();
        let memory_kb: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse().ok())
            .unwrap_or_default();
        let output = |program: &str, arg: &str| {
            std::process::Command::new(program)
                .arg(arg)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        };
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            memory: format!("{:.0} GiB", memory_kb / (1024.0 * 1024.0)),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            rustc: output("rustc", "--version"),
            date: output("date", "-u").to_string(),
        }
    }
}

/// Every benchmark criterion measured under `dir` (its `target/criterion`): the full id and the
/// median in nanoseconds, sorted by id.
pub fn criterion_medians(dir: &Path) -> Result<Vec<(String, f64)>, String> {
    let mut found = Vec::new();
    visit(dir, &mut found)?;
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

fn visit(dir: &Path, found: &mut Vec<(String, f64)>) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|name| name == "new") {
            let json = |file: &str| -> Result<serde_json::Value, String> {
                let text = std::fs::read_to_string(path.join(file)).map_err(|e| format!("{}: {e}", path.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{}/{file}: {e}", path.display()))
            };
            let (benchmark, estimates) = (json("benchmark.json")?, json("estimates.json")?);
            let id = benchmark["full_id"].as_str().unwrap_or_default().to_string();
            let median = estimates["median"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
            found.push((id, median));
        } else {
            visit(&path, found)?;
        }
    }
    Ok(())
}

/// One bar of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// What it measures.
    pub label: String,
    /// Its value, in the chart's unit.
    pub value: f64,
}

/// A horizontal bar chart: one labelled bar per value, scaled to the largest, the value printed
/// at its end.
pub fn bar_chart(title: &str, unit: &str, bars: &[Bar]) -> String {
    const LABEL_WIDTH: f64 = 170.0;
    const BAR_SPACE: f64 = 360.0;
    const ROW: f64 = 24.0;
    let width = LABEL_WIDTH + BAR_SPACE + 90.0;
    let height = 40.0 + ROW * bars.len() as f64;
    let largest = bars.iter().map(|b| b.value).filter(|v| v.is_finite()).fold(0.0_f64, f64::max).max(f64::MIN_POSITIVE);
    let escape = |text: &str| text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        escape(title)
    );
    for (index, bar) in bars.iter().enumerate() {
        let y = 32.0 + ROW * index as f64;
        let length = if bar.value.is_finite() { BAR_SPACE * bar.value / largest } else { 0.0 };
        svg.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
             <rect x=\"{LABEL_WIDTH}\" y=\"{y}\" width=\"{length:.1}\" height=\"{}\" fill=\"#4878a8\"/>\n\
             <text x=\"{:.1}\" y=\"{}\">{:.1} {}</text>\n",
            LABEL_WIDTH - 6.0,
            y + 14.0,
            escape(&bar.label),
            ROW - 6.0,
            LABEL_WIDTH + length + 6.0,
            y + 14.0,
            bar.value,
            escape(unit)
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_scaled_to_the_largest_and_labels_escaped() {
        let svg = bar_chart(
            "CPU <per> request",
            "µs",
            &[Bar { label: "nginx".into(), value: 10.0 }, Bar { label: "a&b".into(), value: 20.0 }],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("CPU &lt;per&gt; request") && svg.contains(">a&amp;b<"));
        assert!(svg.contains("width=\"180.0\""), "half of the largest: {svg}");
        assert!(svg.contains("width=\"360.0\""), "the largest fills the space: {svg}");
        assert!(svg.contains("20.0 µs"));
    }

    #[test]
    fn criterion_medians_are_read_with_their_full_ids() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("review/validate/3KB/new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(new.join("benchmark.json"), r#"{"full_id": "review/validate/3KB"}"#).unwrap();
        std::fs::write(new.join("estimates.json"), r#"{"median": {"point_estimate": 5200.5}}"#).unwrap();
        // A baseline criterion keeps beside `new` is not this run's.
        std::fs::create_dir_all(dir.path().join("review/validate/3KB/base")).unwrap();
        assert_eq!(criterion_medians(dir.path()).unwrap(), [("review/validate/3KB".to_string(), 5200.5)]);
    }
}
