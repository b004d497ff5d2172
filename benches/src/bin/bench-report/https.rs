//! The webhook over HTTPS beside nginx and the floors, pinned: the headline ratios, saturation,
//! what bounds it (`perf`), and open-loop fixed rates.

use std::fmt::Write as _;
use std::path::Path;

use inline_guard_benches::report::{Bar, bar_chart};
use serde_json::Value;

use crate::results::{Results, met, number, write_plot};

/// The reference webhook, when measured, goes in the tables but not the plots, where its bars
/// would flatten everyone else's.
const REFERENCE: &str = "pod security (Go)";

/// The fixed rates `https_pinned` runs, per second.
const RATES: [u64; 3] = [1000, 5000, 10000];

/// Writes the HTTPS sections; the plots go to `plots`.
pub fn write(w: &mut String, results: &Results, plots: &Path) -> Result<(), String> {
    let https = &results.https;
    let servers: Vec<&str> =
        https["saturation"].as_array().into_iter().flatten().filter_map(|s| s["server"].as_str()).collect();
    headline(w, https);
    saturation_table(w, https, &servers, plots)?;
    profile(w, https);
    fixed_rates(w, https, &servers, plots)
}

/// A server's saturation entry: its ratios to nginx and its `result`.
fn saturation(https: &Value, server: &str) -> Value {
    https["saturation"].as_array().into_iter().flatten().find(|s| s["server"] == server).cloned().unwrap_or_default()
}

/// A fixed-rate entry: its ratios to nginx, and its `result`.
fn fixed_entry(https: &Value, server: &str, rate: u64) -> Value {
    https["fixed"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["server"] == server && s["rate"] == rate)
        .cloned()
        .unwrap_or_default()
}

/// Ratios to nginx, measured in the same run, judged against the targets.
fn headline(w: &mut String, https: &Value) {
    let webhook = saturation(https, "webhook");
    let cpu_ratio = number(&webhook["cpu_per_request_vs_nginx"]);
    let throughput_ratio = number(&webhook["throughput_vs_nginx"]);
    let p99_ratio = number(&fixed_entry(https, "webhook", 5000)["p99_vs_nginx"]);
    let cpu_5000 = number(&fixed_entry(https, "webhook", 5000)["cpu_per_request_vs_nginx"]);
    let _ = writeln!(w, "## Headline: the webhook against nginx, same run\n");
    let _ = writeln!(w, "| measure | webhook / nginx | target |");
    let _ = writeln!(w, "|---|---|---|");
    let _ = writeln!(w, "| CPU per request at saturation | {cpu_ratio:.2}× | ≤ 1.5×: {} |", met(cpu_ratio <= 1.5));
    let _ = writeln!(w, "| CPU per request at 5 000/s | {cpu_5000:.2}× | ≤ 1.5×: {} |", met(cpu_5000 <= 1.5));
    let _ = writeln!(
        w,
        "| saturation throughput | {:.0} % | ≥ 67 %: {}; long goal 80 %: {} |",
        100.0 * throughput_ratio,
        met(throughput_ratio >= 0.67),
        met(throughput_ratio >= 0.8)
    );
    let _ = writeln!(w, "| p99 at 5 000/s | {p99_ratio:.2}× | ≤ 1.5×: {} |\n", met(p99_ratio <= 1.5));
    let _ = writeln!(
        w,
        "Ratios are medians of per-round ratios: {} alternating rounds per load (one second each at saturation, {} s \
         at each fixed rate), so the VM's drift falls on every server alike; absolute numbers move with the machine \
         between days, the ratios much less.\n",
        https["rounds"], https["seconds_per_round"]
    );
}

fn saturation_table(w: &mut String, https: &Value, servers: &[&str], plots: &Path) -> Result<(), String> {
    let _ = writeln!(w, "## HTTPS: saturation ({} keep-alive connections)\n", https["saturation_connections"]);
    let _ = writeln!(
        w,
        "| server | requests/s | CPU µs/request | CPU vs nginx | server busy | generator busy | p50 µs | p99 µs |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
    for &server in servers {
        let s = saturation(https, server);
        let r = &s["result"];
        let _ = writeln!(
            w,
            "| {server} | {:.0} | {:.1} | {:.2}× | {:.0} % | {:.0} % | {:.0} | {:.0} |",
            number(&r["throughput"]),
            number(&r["cpu_per_request_us"]),
            number(&s["cpu_per_request_vs_nginx"]),
            100.0 * number(&r["server_busy"]),
            100.0 * number(&r["generator_busy"]),
            number(&r["p50_us"]),
            number(&r["p99_us"])
        );
    }
    if servers.contains(&REFERENCE) {
        let (reference, webhook) = (saturation(https, REFERENCE)["result"].clone(), saturation(https, "webhook"));
        let _ = writeln!(
            w,
            "\nPod Security Admission's own webhook (Go, the apiserver's release), doing the same kind of check on the \
             same review and core: {:.0} µs of CPU per request and {:.0} requests/s at saturation. Ours answers {:.1}× as \
             many requests per second, at {:.2}× less CPU per request.",
            number(&reference["cpu_per_request_us"]),
            number(&reference["throughput"]),
            number(&webhook["result"]["throughput"]) / number(&reference["throughput"]),
            number(&reference["cpu_per_request_us"]) / number(&webhook["result"]["cpu_per_request_us"]),
        );
    }
    let cpu_bars: Vec<Bar> = servers
        .iter()
        .filter(|server| **server != REFERENCE)
        .map(|server| Bar {
            label: server.to_string(),
            value: number(&saturation(https, server)["result"]["cpu_per_request_us"]),
        })
        .collect();
    write_plot(plots, "cpu-per-request.svg", &bar_chart("CPU per request at saturation", "µs", &cpu_bars))?;
    let _ = writeln!(w, "\n![CPU per request](report/cpu-per-request.svg)\n");
    Ok(())
}

/// What bounds the webhook: a flat `perf` profile at saturation, when one was taken.
fn profile(w: &mut String, https: &Value) {
    let _ = writeln!(w, "## What bounds the webhook: `perf` at saturation\n");
    let Some((objects, symbols)) = https["profile"]["objects"].as_array().zip(https["profile"]["symbols"].as_array())
    else {
        let _ = writeln!(w, "Not profiled in this run: `perf` is not installed or could not attach.\n");
        return;
    };
    let _ = writeln!(
        w,
        "A flat profile of the webhook process over three more saturation rounds (samples at 999 Hz). The \
         kernel's share is the loopback TCP path every server here pays; the rest is ours.\n"
    );
    let share = |w: &mut String, entry: &Value| {
        let _ = writeln!(w, "| {:.1} % | `{}` |", number(&entry["percent"]), entry["entry"].as_str().unwrap_or(""));
    };
    let _ = writeln!(w, "| share | object |\n|---|---|");
    objects.iter().for_each(|entry| share(w, entry));
    let _ = writeln!(w, "\n| share | object and symbol |\n|---|---|");
    symbols.iter().take(15).for_each(|entry| share(w, entry));
    let _ = writeln!(w);
}

fn fixed_rates(w: &mut String, https: &Value, servers: &[&str], plots: &Path) -> Result<(), String> {
    let _ = writeln!(
        w,
        "## HTTPS: open-loop fixed rates ({} connections; latency from when each request was due)\n",
        https["fixed_rate_connections"]
    );
    let _ = writeln!(w, "| server | rate/s | CPU µs/request | p50 µs | p99 µs | p99.9 µs |");
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    let mut latency_bars = Vec::new();
    for &server in servers {
        for rate in RATES {
            let r = fixed_entry(https, server, rate)["result"].clone();
            let _ = writeln!(
                w,
                "| {server} | {rate} | {:.1} | {:.0} | {:.0} | {:.0} |",
                number(&r["cpu_per_request_us"]),
                number(&r["p50_us"]),
                number(&r["p99_us"]),
                number(&r["p999_us"])
            );
            if rate == 5000 && server != REFERENCE {
                latency_bars.push(Bar { label: format!("{server} p50"), value: number(&r["p50_us"]) });
                latency_bars.push(Bar { label: format!("{server} p99"), value: number(&r["p99_us"]) });
            }
        }
    }
    write_plot(plots, "latency-5000.svg", &bar_chart("Latency at 5 000 requests/s", "µs", &latency_bars))?;
    let _ = writeln!(w, "\n![Latency at 5 000/s](report/latency-5000.svg)\n");
    Ok(())
}
