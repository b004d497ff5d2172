//! For the tests of helper concurrency: a shell fragment a test helper runs around each `get`
//! that records how many helpers run at that moment, after first waiting (bounded) until as many
//! as the test expects run at once. The wait is the positive control: a bound of two is proven
//! only if two are seen side by side, and a serial implementation would pass a test that looked
//! only for "no more than two". The wait ends early once every expected `get` has started, so the
//! last helper does not wait for company that will not come; it never depends on the machine's
//! speed beyond its 20 s bound.

use std::path::Path;

/// Writes the probe's settings into `dir`: helpers meet `meet` at a time, of `total` gets.
pub fn expect(dir: &Path, meet: usize, total: usize) {
    std::fs::write(dir.join("meet"), meet.to_string()).unwrap();
    std::fs::write(dir.join("total"), total.to_string()).unwrap();
}

/// The shell lines around one `get`, with their files in `dir` (`running/`, `started`,
/// `concurrent`); without [`expect`] a helper meets no one.
pub fn around_get(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "mkdir -p {dir}/running; mkdir {dir}/running/$$; echo $$ >> {dir}/started\n\
         meet=$(cat {dir}/meet 2>/dev/null || echo 1); total=$(cat {dir}/total 2>/dev/null || echo 0); i=0\n\
         while [ \"$(ls {dir}/running | wc -l)\" -lt \"$meet\" ] && [ \"$(wc -l < {dir}/started)\" -lt \"$total\" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done\n\
         ls {dir}/running | wc -l >> {dir}/concurrent; sleep 0.1; rmdir {dir}/running/$$\n"
    )
}

/// The most helpers seen running at once.
pub fn most(dir: &Path) -> usize {
    let text = std::fs::read_to_string(dir.join("concurrent")).unwrap_or_default();
    text.lines().filter_map(|line| line.trim().parse::<usize>().ok()).max().unwrap_or(0)
}

/// Forgets what was seen, for a second round in one directory.
pub fn reset(dir: &Path) {
    for file in ["concurrent", "started"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
}
