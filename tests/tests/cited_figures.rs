//! A figure the README or docs/ cite is one a command wrote: every measured figure in them (a
//! time in ns, µs, ms, s or min or in words, a ratio, a size in MB or GB, a percentage, a rate)
//! appears, as written and not as a target (after `<`, `≤`, `>`, `≥`), in a report a command
//! makes (`benches/REPORT.md` from `benches/run`,
//! `tests/mutation/REPORT.md` from `tests/mutation/run`, `tests/cold/REPORT.md` from
//! `tests/cold/run`); a count of what a run saw (mutants, reads, watches, answers, ...) appears
//! there by its number on a line, or in a table, that counts the same thing. Targets and bounds
//! (`< 10 ms`, `≤ 1.5×`) are not measurements; sizes in KiB, MiB and GiB are, by the docs'
//! convention, configured limits, never measurements.
//! A number that is neither measured nor a target (a configured interval, a kernel's constant)
//! is listed in `docs/figures-not-measured.tsv` with why; a listed entry the docs no longer
//! contain fails too, so the list cannot outlive what it excuses.

use std::collections::BTreeSet;
use std::path::Path;

use inline_guard_tests::repo_root;

/// Where measured figures may come from: the reports the benchmark, mutation and cold-run
/// commands write.
const REPORTS: [&str; 3] = ["benches/REPORT.md", "tests/mutation/REPORT.md", "tests/cold/REPORT.md"];

/// The units of a measured figure, longest first where one is a prefix of another: `min` and
/// `s` after the shorter times they start (`ms` is not `m` then `s`; a whole word is needed).
/// Times written out in words count too (`5 minutes`); a unit that starts a longer word is not
/// one (`min` of `minutes`, `s` of `seconds`), so the order among them does not matter.
const UNITS: [&str; 16] = [
    "ns", "µs", "ms", "min", "s", "×", "MB", "GB", "%", "/s", "seconds", "second", "minutes", "minute", "hours", "hour",
];

/// The nouns a run counts what it saw in (`759 mutants`, `22004 watches`, `2 679 reads`, `900
/// passed`): a number before one is a measured count. A report's tables hold counts without
/// their noun (`105 / 2 / 22004`) under a header that names it, so a count is found by its
/// number standing alone (not part of a longer number) where the report names the noun
/// ([`counted_in`]); a count the docs configure or set up (`1000 volumes`, `200 nodes`) uses
/// other nouns, or is excused in the list like any configured figure.
const COUNTS: [&str; 15] = [
    "mutants",
    "reads",
    "watches",
    "answers",
    "passed",
    "failed",
    "caught",
    "survived",
    "registrations",
    "deregistrations",
    "restarts",
    "handovers",
    "writes",
    "requests",
    "differ",
];

/// One figure as the text writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Figure {
    text: String,
    line: usize,
    /// Written after `<`, `≤`, `>` or `≥`: a target or a bound, not a measurement.
    bound: bool,
    /// A count's number and its noun (one of `COUNTS`), by which a report is searched.
    count: Option<(String, String)>,
}

/// The figures in `text`: a number (digits, `5 000`-style groups, a decimal part, an optional
/// range `1.04–1.07`) directly followed by one of `UNITS`, with its sign when it has one.
fn figures(text: &str) -> Vec<Figure> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut at = 0;
        while at < chars.len() {
            let starts = chars[at].is_ascii_digit()
                && (at == 0 || !(chars[at - 1].is_alphanumeric() || matches!(chars[at - 1], '.' | '_' | '-' | '/')));
            if !starts {
                at += 1;
                continue;
            }
            let begin = if at > 0 && matches!(chars[at - 1], '+' | '−') { at - 1 } else { at };
            let end = number_end(&chars, at);
            let number_ends = end;
            let (end, unit) = match unit_after(&chars, end, &UNITS) {
                Some(unit_end) => (unit_end, Some(false)),
                None => match unit_after(&chars, end, &COUNTS) {
                    Some(noun_end) => (noun_end, Some(true)),
                    None => (end, None),
                },
            };
            if let Some(count) = unit {
                let before: String = chars[..begin].iter().collect();
                let bound = ["<", "≤", ">", "≥"].iter().any(|c| before.trim_end().ends_with(c));
                let count = count.then(|| {
                    let noun = chars[number_ends..end].iter().collect::<String>().trim().to_string();
                    (chars[begin..number_ends].iter().collect(), noun)
                });
                found.push(Figure { text: chars[begin..end].iter().collect(), line: index + 1, bound, count });
            }
            at = end.max(at + 1);
        }
    }
    found
}

/// Where the number starting at `at` ends: digits, `␠ddd` groups, one decimal part, and a range.
fn number_end(chars: &[char], at: usize) -> usize {
    let digits = |mut i: usize| {
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut end = digits(at);
    // `5 000`: a group of exactly three digits after a space.
    while chars.get(end) == Some(&' ') && digits(end + 1) == end + 4 {
        end += 4;
    }
    if end + 1 < chars.len() && chars[end] == '.' && chars[end + 1].is_ascii_digit() {
        end = digits(end + 1);
    }
    if end + 1 < chars.len() && chars[end] == '–' && chars[end + 1].is_ascii_digit() {
        end = number_end(chars, end + 1);
    }
    end
}

/// The end of one of `units` after `end` (one space allowed before it, except before `×`,
/// which after a space multiplies: `8 000 × 250`), when one follows and is not the start of a
/// longer word (`ms` of `msgs`, `MB` of `MBps`).
fn unit_after(chars: &[char], end: usize, units: &[&str]) -> Option<usize> {
    let from = if chars.get(end) == Some(&' ') { end + 1 } else { end };
    units.iter().filter(|unit| from == end || **unit != "×").find_map(|unit| {
        let unit: Vec<char> = unit.chars().collect();
        let stop = from + unit.len();
        let whole_word = chars.get(stop).is_none_or(|c| !c.is_alphanumeric());
        (chars.get(from..stop) == Some(unit.as_slice()) && whole_word).then_some(stop)
    })
}

/// Whether `number` is in `text` as a number of its own: not part of a longer one (`2204` is
/// not in `22004`, nor `3` in `3.5` or `v1.3`).
fn stands_alone(text: &str, number: &str) -> bool {
    let part_of_a_number = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit() || c == '.' || c == ',');
    text.match_indices(number).any(|(at, _)| {
        !part_of_a_number(text[..at].chars().next_back()) && !part_of_a_number(text[at + number.len()..].chars().next())
    })
}

/// Whether a report holds `figure` as a measurement: not only after `<`, `≤`, `>` or `≥`, where
/// a report writes its targets (`≤ 1.10×: met`), so that a docs figure left from an older run
/// cannot pass by equalling a target.
fn measured_in(reports: &str, figure: &str) -> bool {
    reports.match_indices(figure).any(|(at, _)| {
        let before = reports[..at].trim_end();
        !["<", "≤", ">", "≥"].iter().any(|bound| before.ends_with(bound))
    })
}

/// Whether a report counts `number` of `noun`: the number stands alone on a line that names
/// the noun, or in a table whose header names it (`| piece | caught | … |` above `| 19 |`). A
/// number alone anywhere would let a small count pass by coincidence (`0 failed` found in
/// `0.41 s`'s neighbour, `3 handovers` in a table of milliseconds).
fn counted_in(reports: &str, number: &str, noun: &str) -> bool {
    let named = |line: &str| line.to_lowercase().contains(&noun_stem(noun));
    let lines: Vec<&str> = reports.lines().collect();
    let mut header: Option<&str> = None;
    for (index, line) in lines.iter().enumerate() {
        let in_table = line.trim_start().starts_with('|');
        if !in_table {
            header = None;
        } else if header.is_none() && lines.get(index + 1).is_some_and(|next| next.trim_start().starts_with("|-")) {
            header = Some(line);
        }
        if stands_alone(line, number) && (named(line) || header.is_some_and(named)) {
            return true;
        }
    }
    false
}

/// What a report writes of `noun` wherever it counts it: `watch` of `watches`, `mutant` of
/// `mutants`; a mutant that survived is one the reports call missed.
fn noun_stem(noun: &str) -> String {
    let noun = noun.to_lowercase();
    match noun.as_str() {
        "survived" => "missed".to_string(),
        _ if noun.ends_with("ches") => noun.trim_end_matches("es").to_string(),
        _ => noun.strip_suffix('s').unwrap_or(&noun).to_string(),
    }
}

/// The documents whose figures must come from a report: the README and every page of docs/,
/// its folders' pages included.
fn documents() -> Vec<String> {
    inline_guard_tests::walk::doc_pages(&repo_root())
}

/// `(document, figure)` pairs excused, each with its reason.
fn not_measured() -> Vec<(String, String)> {
    let path = repo_root().join("docs/figures-not-measured.tsv");
    let text = std::fs::read_to_string(&path).expect("docs/figures-not-measured.tsv");
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert!(
                fields.len() == 3 && !fields[2].trim().is_empty(),
                "figures-not-measured.tsv: expected <document>TAB<figure>TAB<why>: {line:?}"
            );
            (fields[0].to_string(), fields[1].to_string())
        })
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_measured_figure_in_the_readme_and_docs_is_in_a_report_a_command_writes() {
    let root = repo_root();
    let reports: String = REPORTS.iter().map(|report| read(&root.join(report))).collect();
    let excused = not_measured();
    let mut unexplained = Vec::new();
    let mut seen = 0;
    for document in documents() {
        for figure in figures(&read(&root.join(&document))) {
            seen += 1;
            let listed = excused.iter().any(|(d, f)| *d == document && *f == figure.text);
            let reported = match &figure.count {
                Some((number, noun)) => counted_in(&reports, number, noun),
                None => measured_in(&reports, &figure.text),
            };
            if !figure.bound && !listed && !reported {
                unexplained.push(format!("{document}:{}: {}", figure.line, figure.text));
            }
        }
    }
    // The positive control: the scan finds figures at all (the README quotes the report).
    assert!(seen > 0, "no figure found in the README and docs/: the scanner is broken");
    assert!(
        unexplained.is_empty(),
        "{} figure(s) in the README or docs/ that no report contains: quote benches/REPORT.md (rerun benches/run) \
         or list a figure that is not a measurement in docs/figures-not-measured.tsv with why:\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
}

#[test]
fn every_excused_figure_is_still_in_its_document() {
    let root = repo_root();
    let mut stale = Vec::new();
    for (document, figure) in not_measured() {
        let cited: BTreeSet<String> = figures(&read(&root.join(&document))).into_iter().map(|f| f.text).collect();
        if !cited.contains(&figure) {
            stale.push(format!("{document}: {figure}"));
        }
    }
    assert!(stale.is_empty(), "docs/figures-not-measured.tsv excuses figures no longer cited:\n{}", stale.join("\n"));
}

#[test]
fn the_scanner_finds_figures_as_the_docs_write_them() {
    let found = |text: &str| figures(text).into_iter().map(|f| (f.text, f.bound)).collect::<Vec<_>>();
    let figure = |text: &str, bound: bool| (text.to_string(), bound);
    assert_eq!(
        found("p50 1.37 ms, p99 +2.48 ms; 1.31× nginx's at 5 000/s, 77 % of it (< 50 µs), 21.7 MB"),
        vec![
            figure("1.37 ms", false),
            figure("+2.48 ms", false),
            figure("1.31×", false),
            figure("5 000/s", false),
            figure("77 %", false),
            figure("50 µs", true),
            figure("21.7 MB", false),
        ]
    );
    assert_eq!(found("1.04–1.07× and 42–45 µs"), vec![figure("1.04–1.07×", false), figure("42–45 µs", false)]);
    // Not figures: configured sizes, words that start like a unit, versions, identifiers.
    assert!(found("16 MiB, 3 msgs, v1.35.4, p99, 4 KiB, x86_64, sha256:1f35, 2 cores, 8 000 × 250").is_empty());
    assert_eq!(found("≤ 1.5×: met"), vec![figure("1.5×", true)]);
    // Times in words.
    assert_eq!(
        found("every 5 minutes, 1 minute, 30 seconds and 2 hours"),
        vec![
            figure("5 minutes", false),
            figure("1 minute", false),
            figure("30 seconds", false),
            figure("2 hours", false)
        ]
    );
    // Seconds and minutes, with or without the space; not the start of a word, nor `ms`.
    assert_eq!(
        found("2.5–5.6 s (seven runs), 290 s, 10s, 87 min; 3 ms"),
        vec![
            figure("2.5–5.6 s", false),
            figure("290 s", false),
            figure("10s", false),
            figure("87 min", false),
            figure("3 ms", false)
        ]
    );
    assert!(found("3 steps, 5 mins, 2 secondary, v1 spec").is_empty());
    // Counts of what a run saw, each with the number a report is searched for.
    let counts = |text: &str| figures(text).into_iter().map(|f| (f.text, f.count)).collect::<Vec<_>>();
    let count = |text: &str, number: &str| {
        let noun = text[number.len()..].trim().to_string();
        (text.to_string(), Some((number.to_string(), noun)))
    };
    assert_eq!(
        counts(
            "759 of 759 mutants, 2 679 reads, 22004 watches, 48 answers differ, 900 passed, 0 failed; 3 readers, 2 ms"
        ),
        vec![
            count("759 mutants", "759"),
            count("2 679 reads", "2 679"),
            count("22004 watches", "22004"),
            count("48 answers", "48"),
            count("900 passed", "900"),
            count("0 failed", "0"),
            ("2 ms".to_string(), None)
        ]
    );
}

#[test]
fn a_count_is_found_by_its_number_standing_alone() {
    let table = "| 1000, idle 60 s | 105 / 2 / 22004 | 3.5 ms | v1.35.4 |";
    assert!(stands_alone(table, "22004"));
    assert!(stands_alone(table, "105"));
    assert!(!stands_alone(table, "2204"), "a part of a longer number");
    assert!(!stands_alone(table, "3"), "a whole part of a decimal");
    assert!(!stands_alone(table, "35"), "a part of a version");
}

#[test]
fn a_count_is_found_only_where_the_report_counts_that_noun() {
    let report = "\
tests: 924 passed, 0 failed

| area | volumes | watches / pods / reads | p50 |
|---|---:|---|---:|
| idle | 1000 | 105 / 2 / 22004 | 3 ms |

took 7 s over 3 steps";
    assert!(counted_in(report, "924", "passed"), "on a line naming the noun");
    assert!(counted_in(report, "0", "failed"));
    assert!(counted_in(report, "22004", "watches"), "in a table whose header names it");
    assert!(counted_in(report, "2", "reads"));
    assert!(!counted_in(report, "7", "handovers"), "a number of a line that counts something else");
    assert!(!counted_in(report, "1000", "mutants"), "a table that counts other things");

    assert!(counted_in("| piece | caught | missed |\n|---|---:|---:|\n| isolation | 19 | 1 |", "1", "survived"));
}

#[test]
fn a_figure_is_measured_only_where_a_report_does_not_write_it_as_a_target() {
    let report =
        "| `generated-policies` | 1.47× | 1.35× | ≤ 1.10×: **not met** |\ntarget < 2 ms at p99, measured 2.5 ms";
    assert!(measured_in(report, "1.47×"));
    assert!(measured_in(report, "2.5 ms"));
    assert!(!measured_in(report, "1.10×"), "only the target");
    assert!(!measured_in(report, "2 ms"), "only the target");
}
