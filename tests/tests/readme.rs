//! The README shows real output: the `check` example block is re-run and compared, and the two
//! README commands are the ones this repository actually provides.

use inline_guard_tests::{repo_root, run};

const BEGIN: &str = "<!-- readme-output:check -->\n```console\n";
const END: &str = "```\n<!-- /readme-output -->";

#[test]
fn the_check_example_in_the_readme_is_real_output() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.find(BEGIN).expect("README has the check example block") + BEGIN.len();
    let end = start + readme[start..].find(END).expect("the block is closed");
    let block = &readme[start..end];
    let (command, expected) = block.split_once('\n').unwrap();
    let args: Vec<&str> =
        command.strip_prefix("$ csi-volume-admission ").expect("a csi-volume-admission command").split(' ').collect();

    // Run from the repository root, as the README reader does, by making the paths absolute and
    // then showing them relative again.
    let prefix = format!("{}/", root.display());
    let absolute: Vec<String> =
        args.iter().map(|a| if a.starts_with("config/") { format!("{prefix}{a}") } else { a.to_string() }).collect();
    let result = run(&absolute.iter().map(String::as_str).collect::<Vec<_>>(), "");
    assert_eq!(result.stderr, "");
    let actual = result.stdout.replace(&prefix, "");
    assert!(actual == expected, "README drifted; paste this output:\n{actual}");
}

#[test]
fn the_readme_commands_exist() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(readme.contains("\ntests/run\n"), "README names tests/run as the test command");
    assert!(root.join("tests/run").is_file());
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(ci.lines().any(|line| line.trim() == "exec tests/run"), ".ci/run calls the README's test command");
    assert!(readme.contains(
        "cargo run -q -p csi-volume-admission -- serve --cluster-state config/examples/cluster-state.yaml\n"
    ));
    assert!(readme.contains(
        "cargo run -q -p csi-volume-admission -- check --cluster-state config/examples/cluster-state.yaml config/examples/manifests"
    ));
    assert!(root.join("config/examples/review-denied.json").is_file(), "the curl example's review exists");
}
