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

/// A line chart of `series` (name, points (x, y)) against a linear x axis: the x values of the
/// points are ticked, y runs from 0 to the largest value.
pub fn line_chart(title: &str, x_label: &str, unit: &str, series: &[(&str, Vec<(f64, f64)>)]) -> String {
    const LEFT: f64 = 60.0;
    const TOP: f64 = 36.0;
    const PLOT_W: f64 = 420.0;
    const PLOT_H: f64 = 220.0;
    const COLOURS: [&str; 5] = ["#4878a8", "#d0743c", "#6a9f58", "#b04a5a", "#7b5ea7"];
    let finite = |v: &f64| v.is_finite();
    let points = || series.iter().flat_map(|(_, p)| p.iter());
    let x_max = points().map(|(x, _)| *x).filter(finite).fold(0.0_f64, f64::max).max(f64::MIN_POSITIVE);
    let y_max = points().map(|(_, y)| *y).filter(finite).fold(0.0_f64, f64::max).max(f64::MIN_POSITIVE);
    let at = |x: f64, y: f64| (LEFT + PLOT_W * x / x_max, TOP + PLOT_H * (1.0 - y / y_max));
    let escape = |text: &str| text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let (width, height) = (LEFT + PLOT_W + 200.0, TOP + PLOT_H + 50.0);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n\
         <line x1=\"{LEFT}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{}\" stroke=\"#333\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{y_max:.2} {}</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n",
        escape(title),
        TOP + PLOT_H,
        LEFT + PLOT_W,
        TOP + PLOT_H,
        TOP + PLOT_H,
        LEFT + PLOT_W / 2.0,
        TOP + PLOT_H + 38.0,
        escape(x_label),
        LEFT - 4.0,
        TOP + 4.0,
        escape(unit),
        LEFT - 4.0,
        TOP + PLOT_H,
    );
    let mut ticks: Vec<f64> = points().map(|(x, _)| *x).filter(finite).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let (px, _) = at(x, 0.0);
        svg.push_str(&format!("<text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{x}</text>\n", TOP + PLOT_H + 16.0));
    }
    for (index, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let path: Vec<String> = points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| {
                let (px, py) = at(*x, *y);
                format!("{px:.1},{py:.1}")
            })
            .collect();
        svg.push_str(&format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>\n",
            path.join(" "),
            LEFT + PLOT_W + 12.0,
            TOP + 14.0 + 18.0 * index as f64,
            escape(name)
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_chart_places_each_series_on_shared_axes() {
        let svg = line_chart(
            "CPU <by N>",
            "nodes",
            "cores",
            &[("idle", vec![(10.0, 0.5), (200.0, 1.0)]), ("churn", vec![(10.0, 0.25)])],
        );
        assert!(svg.contains("CPU &lt;by N&gt;"));
        // The largest x at the plot's right edge, the largest y at its top.
        assert!(svg.contains("<polyline points=\"81.0,146.0 480.0,36.0\""), "{svg}");
        assert!(svg.contains(">idle</text>") && svg.contains(">churn</text>"));
        assert!(svg.contains(">200</text>") && svg.contains(">10</text>"));
    }

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
