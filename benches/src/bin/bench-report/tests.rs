//! The report computed from a results directory written by hand: the headline judged, the
//! sections of benches that did not run saying so, every quoted phase present when it ran.

use std::path::Path;

use serde_json::{Value, json};

use inline_guard_tests::bench_areas::{Recorded, bench_areas};

use super::write_report;

fn sample(throughput: f64, cpu: f64) -> Value {
    serde_json::json!({"throughput": throughput, "cpu_per_request_us": cpu, "server_busy": 0.99, "generator_busy": 0.5,
                       "p50_us": 40.0, "p99_us": 80.0, "p999_us": 900.0})
}

/// A results directory with the one file the report requires, `https.json`.
fn https_results(dir: &Path) -> std::path::PathBuf {
    let results = dir.join("results");
    std::fs::create_dir_all(&results).unwrap();
    let mut fixed = Vec::new();
    for (server, cpu, ratio) in [("webhook", 30.0, 1.5), ("nginx", 20.0, 1.0)] {
        for rate in [1000, 5000, 10000] {
            let result = sample(f64::from(rate), cpu);
            fixed.push(json!({"server": server, "rate": rate, "result": result,
                              "cpu_per_request_vs_nginx": ratio, "p99_vs_nginx": ratio}));
        }
    }
    let https = json!({
        "placement": "servers pinned to CPU 0, load generator to CPU 1", "nginx": "nginx/1.22.1", "rounds": 5, "seconds_per_round": 1.0,
        "saturation_connections": 32, "fixed_rate_connections": 16, "fixed": fixed,
        "saturation": [
            {"server": "webhook", "result": sample(70000.0, 14.0), "cpu_per_request_vs_nginx": 1.4, "throughput_vs_nginx": 0.7},
            {"server": "nginx", "result": sample(100000.0, 10.0), "cpu_per_request_vs_nginx": 1.0, "throughput_vs_nginx": 1.0},
            {"server": "pod security (Go)", "result": sample(7000.0, 140.0), "cpu_per_request_vs_nginx": 14.0, "throughput_vs_nginx": 0.07}
        ]
    });
    std::fs::write(results.join("https.json"), https.to_string()).unwrap();
    results
}

fn report_of(dir: &Path, results: &Path) -> String {
    let report = dir.join("REPORT.md");
    let areas = bench_areas(&inline_guard_tests::repo_root()).unwrap();
    write_report(results, areas, &report).unwrap();
    std::fs::read_to_string(&report).unwrap()
}

fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(line), "the report lacks {line:?}:\n{text}");
    }
}

#[test]
fn the_headline_is_computed_from_the_results_and_judged_against_the_targets() {
    let dir = tempfile::tempdir().unwrap();
    let results = https_results(dir.path());
    let text = report_of(dir.path(), &results);
    assert_lines(
        &text,
        &[
            "| webhook | not measured | | |",
            "| scale | not measured | | |",
            "| CPU per request at saturation | 1.40× | ≤ 1.5×: met |",
            "| CPU per request at 5 000/s | 1.50× | ≤ 1.5×: met |",
            "| saturation throughput | 70 % | ≥ 67 %: met; long goal 80 %: **not met** |",
            "| p99 at 5 000/s | 1.50× | ≤ 1.5×: met |",
            "Not measured in this run: `driver_latency` needs root.",
            "Not measured in this run: `lazy_read` needs root.",
            "Not measured in this run: `handover_read` needs root.",
            "Not measured in this run: it needs Go for the peers.",
            "Not measured in this run: it needs root and Go.",
            "SharedResourceAdmission and share injection: not measured in this run.",
            "Not profiled in this run: `perf` is not installed or could not attach.",
            "| pod security (Go) | 7000 | 140.0 | 14.00× |",
            "same review and core: 140 µs of CPU per request and 7000 requests/s at saturation. Ours answers 10.0× as many requests per second, at 10.00× less CPU per request.",
        ],
    );
    assert!(dir.path().join("report/cpu-per-request.svg").exists());
}

/// Criterion's layout under `dir`: `<group>/<function>/new/{benchmark,estimates}.json`.
fn criterion_median(dir: &Path, id: &str, nanos: f64) {
    let path = dir.join(id.replace('/', "_")).join("new");
    std::fs::create_dir_all(&path).unwrap();
    std::fs::write(path.join("benchmark.json"), json!({"full_id": id}).to_string()).unwrap();
    std::fs::write(path.join("estimates.json"), json!({"median": {"point_estimate": nanos}}).to_string()).unwrap();
}

#[test]
fn the_commit_the_native_policies_the_lazy_reads_the_providers_and_shared_admission_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let results = https_results(dir.path());
    let recorded = Recorded {
        commit: "0123abcd plus uncommitted changes".into(),
        measured: "Fri Dec  4 03:00:00 UTC 2026".into(),
        seconds: 61,
        machine: "AMD EPYC (2 cores)".into(),
        code: Default::default(),
    };
    std::fs::create_dir_all(results.join("webhook")).unwrap();
    std::fs::write(results.join("webhook/recorded.json"), serde_json::to_string(&recorded).unwrap()).unwrap();
    let elsewhere = Recorded { machine: "AMD EPYC (2 cores), another host".into(), ..recorded.clone() };
    std::fs::create_dir_all(results.join("driver")).unwrap();
    std::fs::write(results.join("driver/recorded.json"), serde_json::to_string(&elsewhere).unwrap()).unwrap();
    let phase = |p50: f64, to_cel: f64| json!({"p50_ms": p50, "p99_ms": 2.0 * p50, "p99_added_paired_ms": 0.5, "p50_to_cel_paired": to_cel});
    let apiserver = json!({"pods_per_policy": 1000, "rounds": 10, "calls": {}, "policies": {
        "none": phase(2.0, 0.9), "cel": phase(2.5, 1.0), "webhooks": phase(3.0, 1.2), "webhooks-forcing": phase(4.0, 1.6),
        "floor-webhook": phase(2.8, 1.1), "generated-validating": phase(2.6, 1.04), "generated-policies": phase(2.9, 1.12)}});
    std::fs::write(results.join("apiserver.json"), apiserver.to_string()).unwrap();
    let lazy = json!({"machine": "2 cores; pinned", "file_bytes": 4096, "reads": 25000, "fuse_p50_us": 51.5, "fuse_p99_us": 80.0,
        "tmpfs_p50_us": 4.5, "tmpfs_p99_us": 6.0, "round_trip_p50_us": 42.0, "round_trip_p99_us": 60.0, "gets": 1});
    std::fs::write(results.join("lazy-read.json"), lazy.to_string()).unwrap();
    let phase =
        |reads: u64, p50: f64, max: f64| json!({"reads": reads, "p50_us": p50, "p99_us": 2.0 * p50, "max_us": max});
    let handover = json!({"machine": "2 cores; pinned", "file_bytes": 4096, "handovers": 5, "reads": 90000,
        "before": phase(20000, 48.0, 900.0), "during": phase(60, 80.0, 7400.0), "after": phase(21000, 50.0, 1000.0),
        "handover_ms": [5.0, 2.94, 4.9]});
    std::fs::write(results.join("handover-read.json"), handover.to_string()).unwrap();
    let providers = json!({"apiserver": "v1.35.4", "publishes": 300, "files": 10, "placement": "pinned",
        "share": {"p50_ms": 3.0, "p99_ms": 7.0}, "exec": {"p50_ms": 27.0, "p99_ms": 33.0},
        "secrets-store": {"p50_ms": 3.6, "p99_ms": 21.0}});
    std::fs::write(results.join("providers.json"), providers.to_string()).unwrap();
    let criterion = dir.path().join("criterion");
    for (id, nanos) in [
        ("shared_admission/plugin/pod_without_the_driver", 41.2),
        ("shared_admission/chain_without_the_plugins/pod_without_the_driver", 527.7),
        ("shared_admission/chain_with_the_plugins/pod_without_the_driver", 613.2),
        ("shared_admission/plugin/pod_with_one_share_warm", 2500.0),
        ("shared_admission/chain_with_the_plugins/pod_asking_one_share_by_annotation_warm", 2580.0),
    ] {
        criterion_median(&criterion, id, nanos);
    }
    let medians = inline_guard_benches::report::criterion_medians(&criterion).unwrap();
    std::fs::write(results.join("webhook/medians.json"), serde_json::to_string(&medians).unwrap()).unwrap();
    let text = report_of(dir.path(), &results);
    assert_lines(
        &text,
        &[
            "| webhook | 0123abcd plus uncommitted changes | Fri Dec  4 03:00:00 UTC 2026 | 2 min |",
            "Machines: AMD EPYC (2 cores) (webhook); AMD EPYC (2 cores), another host (driver). servers pinned",
            "| everything `policy` prints, with the read-only MutatingAdmissionPolicy | 2.90 ms | 5.80 ms |",
            "| `generated-validating` | 1.04× | 1.04× | ≤ 1.10×: met |",
            "| `generated-policies` | 1.12× | 1.16× | ≤ 1.10×: **not met** |",
            "while the CEL policy adds +0.50 ms at p50",
            "| through FUSE | 51.5 µs | 80.0 µs | 11.4× | 1.23× | < 50 µs: **not met** |",
            "| tmpfs (floor) | 4.5 µs | 6.0 µs | 1× | | |",
            "| during a handover | 60 | 80.0 µs | 160.0 µs | 7400.0 µs |",
            "| after the last | 21000 | 50.0 µs | 100.0 µs | 1000.0 µs |",
            "Each handover, the successor's start to its first answer: 5.0 ms, 2.9 ms, 4.9 ms.",
            "| `exec` eager, a helper taking 5 ms per `get` | 27.00 ms | 33.00 ms | 9.00× | < 80 ms: met |",
            "| `secrets-store`, the e2e provider (1 KiB objects) | 3.60 ms | 21.00 ms | 1.20× | p99 < 20 ms: **not met** |",
            "| the chain with both, same pod | 613 ns (+85.5 ns) | < +100 ns: met |",
            "| SharedResourceAdmission, a pod with one share, answers held (warm) | 2.50 µs | < 2 µs: **not met** |",
        ],
    );
}

#[test]
fn an_area_is_recorded_with_the_code_it_measured_and_not_when_that_code_changed_during_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkout");
    std::fs::create_dir_all(root.join("driver/src")).unwrap();
    let code = root.join("driver/src/publish.rs");
    std::fs::write(&code, "fn publish() {}\n").unwrap();
    let git = std::process::Command::new("git").args(["init", "-q"]).current_dir(&root).status().unwrap();
    assert!(git.success());
    let add = std::process::Command::new("git").args(["add", "-A"]).current_dir(&root).status().unwrap();
    assert!(add.success());
    let area = inline_guard_tests::bench_areas::BenchArea {
        name: "driver".into(),
        results: vec!["driver.json".into(), "shares.json".into()],
        code: vec!["driver/src/**".into()],
        sections: "the driver".into(),
    };
    let run = dir.path().join("run");
    let kept = dir.path().join("results/driver");
    super::record::start(&root, &area, &run).unwrap();
    std::fs::write(run.join("driver.json"), r#"{"p50_ms": 1.0}"#).unwrap();
    std::fs::write(&code, "fn publish() { changed() }\n").unwrap();
    let refused = super::record::record(&root, &area, &run, &dir.path().join("criterion"), &kept).unwrap_err();
    assert!(refused.contains("driver/src/publish.rs") && refused.contains("nothing recorded"), "{refused}");
    assert!(!kept.exists(), "nothing is kept of a run whose code changed under it");

    std::fs::write(&code, "fn publish() {}\n").unwrap();
    std::fs::write(run.join("commit.txt"), "0123456789ab\n").unwrap();
    super::record::record(&root, &area, &run, &dir.path().join("criterion"), &kept).unwrap();
    assert_eq!(std::fs::read_to_string(kept.join("driver.json")).unwrap(), r#"{"p50_ms": 1.0}"#);
    assert!(!kept.join("shares.json").exists(), "a bench that did not run leaves no file");
    let recorded: Recorded =
        serde_json::from_str(&std::fs::read_to_string(kept.join("recorded.json")).unwrap()).unwrap();
    assert_eq!(recorded.commit, "0123456789ab");
    assert_eq!(recorded.code.keys().collect::<Vec<_>>(), ["driver/src/publish.rs"]);
    assert_eq!(recorded.code, inline_guard_tests::bench_areas::code_now(&root, &area).unwrap());
}
