//! `benches/REPORT.md`'s figures are of the code as it is: every area of `benches/areas.tsv` was
//! measured, its committed record names the digest of every file of the code it measured, and
//! none of that code changed since (a rename, a new file or a deleted one included). The
//! comparison reads no history, so it holds in a shallow clone. When it fails it names the area,
//! the report's sections whose figures are stale, the files that changed, and the command that
//! measures the area again.

use std::path::Path;

use inline_guard_tests::bench_areas::{BenchArea, Recorded, bench_areas, changed_since_measured, recorded};
use inline_guard_tests::code_digest::tracked_files;
use inline_guard_tests::repo_root;

/// Why `area`'s figures are not current; `None` when they are.
fn stale(root: &Path, area: &BenchArea, record: Option<&Recorded>) -> Option<String> {
    let Some(record) = record else {
        return Some(format!("area {}: never measured (`benches/run --only {}`)", area.name, area.name));
    };
    let changed = changed_since_measured(root, area, record).expect("the area's code can be read");
    if changed.is_empty() {
        return None;
    }
    let mut files = changed.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
    if changed.len() > 8 {
        files.push_str(&format!(" and {} more", changed.len() - 8));
    }
    Some(format!(
        "area {} ({}): measured at {}, and since then its code changed: {files}. Measure it again: \
         `benches/run --only {}` (it took {} min last time), then commit benches/results/, benches/REPORT.md and benches/report/",
        area.name,
        area.sections,
        record.commit,
        area.name,
        record.seconds.div_ceil(60)
    ))
}

#[test]
fn every_area_was_measured_on_the_code_as_it_is() {
    let root = repo_root();
    let areas = bench_areas(&root).expect("benches/areas.tsv");
    assert!(areas.len() >= 4, "benches/areas.tsv lost its areas: {areas:?}");
    let problems: Vec<String> =
        areas.iter().filter_map(|area| stale(&root, area, recorded(&root, &area.name).unwrap().as_ref())).collect();
    assert!(problems.is_empty(), "benches/REPORT.md holds figures older than their code:\n{}", problems.join("\n"));
}

#[test]
fn each_area_names_code_of_the_tree_and_the_report_names_each_area_as_recorded() {
    let root = repo_root();
    let tracked = tracked_files(&root).expect("git ls-files: the suite runs in a git checkout");
    let report = std::fs::read_to_string(root.join("benches/REPORT.md")).expect("benches/REPORT.md");
    for area in bench_areas(&root).unwrap() {
        for pattern in &area.code {
            assert!(
                tracked.iter().any(|file| inline_guard_tests::code_digest::path_matches(pattern, file)),
                "benches/areas.tsv: area {}: {pattern} names no file of the tree (a rename must not shrink what an area measures)",
                area.name
            );
        }
        let record = recorded(&root, &area.name).unwrap().unwrap_or_else(|| panic!("area {} has no record", area.name));
        let row = format!("| {} | {} | {} |", area.name, record.commit, record.measured);
        assert!(
            report.lines().any(|line| line.starts_with(&row)),
            "benches/REPORT.md does not name area {} as benches/results/{}/recorded.json records it ({row}): rewrite it with benches/run",
            area.name,
            area.name
        );
    }
    for entry in std::fs::read_dir(root.join("benches/results")).expect("benches/results").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            bench_areas(&root).unwrap().iter().any(|area| area.name == name),
            "benches/results/{name} is of no area of benches/areas.tsv: remove it"
        );
    }
}

/// A checkout of its own (git, one commit, no other history), so that the check is seen to fail.
fn scratch_checkout(dir: &Path) {
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git").args(args).current_dir(dir).status().expect("git runs");
        assert!(status.success(), "git {args:?}");
    };
    std::fs::create_dir_all(dir.join("benches")).unwrap();
    std::fs::create_dir_all(dir.join("driver/src")).unwrap();
    std::fs::write(
        dir.join("benches/areas.tsv"),
        "# area\tresults\tcode\tsections\ndriver\tdriver.json\tdriver/src/** Cargo.lock\tthe driver\n",
    )
    .unwrap();
    std::fs::write(dir.join("driver/src/publish.rs"), "fn publish() {}\n\n#[cfg(test)]\nmod tests {}\n").unwrap();
    std::fs::write(dir.join("Cargo.lock"), "version = 4\n").unwrap();
    git(&["init", "-q"]);
    git(&["add", "-A"]);
}

#[test]
fn a_change_to_an_areas_code_makes_it_stale_and_a_change_to_its_tests_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    scratch_checkout(root);
    let area = bench_areas(root).unwrap().remove(0);
    assert!(stale(root, &area, None).unwrap().contains("never measured"));
    let record = Recorded {
        commit: "0123456789ab".into(),
        measured: "today".into(),
        seconds: 60,
        machine: "this one".into(),
        code: inline_guard_tests::bench_areas::code_now(root, &area).unwrap(),
    };
    assert_eq!(record.code.len(), 2, "both files of the area were seen: {:?}", record.code);
    assert_eq!(stale(root, &area, Some(&record)), None, "nothing changed yet");

    let publish = root.join("driver/src/publish.rs");
    std::fs::write(&publish, "fn publish() {}\n\n#[cfg(test)]\nmod tests { fn another() {} }\n").unwrap();
    assert_eq!(stale(root, &area, Some(&record)), None, "a test's change is no code change");

    std::fs::write(&publish, "fn publish() { slower() }\n").unwrap();
    let why = stale(root, &area, Some(&record)).expect("a code change makes the area stale");
    assert!(why.contains("driver/src/publish.rs") && why.contains("benches/run --only driver"), "{why}");

    std::fs::write(&publish, "fn publish() {}\n\n#[cfg(test)]\nmod tests {}\n").unwrap();
    std::fs::write(root.join("Cargo.lock"), "version = 4\n[[package]]\nname = \"faster\"\n").unwrap();
    let why = stale(root, &area, Some(&record)).expect("a dependency's change makes the area stale");
    assert!(why.contains("Cargo.lock"), "{why}");

    std::fs::write(root.join("Cargo.lock"), "version = 4\n").unwrap();
    std::fs::write(root.join("driver/src/new.rs"), "fn new() {}\n").unwrap();
    let untracked = stale(root, &area, Some(&record));
    assert_eq!(untracked, None, "a file git does not track is not the tree's code");
    let status =
        std::process::Command::new("git").args(["add", "driver/src/new.rs"]).current_dir(root).status().unwrap();
    assert!(status.success());
    let why = stale(root, &area, Some(&record)).expect("a new file of the area makes it stale");
    assert!(why.contains("driver/src/new.rs"), "{why}");
}
