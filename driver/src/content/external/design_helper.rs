//! A helper written from the FUSE flexVolume design alone, for tests: its answer to `mount` is
//! the design's example answer character for character (`/db`, the trailing comma), and its
//! `get` prints the vault read the design's example helper would make (`-field` from the file's
//! name, the secret's path from the pod's identity and the file's directory), logging each call.

use std::path::{Path, PathBuf};

/// The design's example answer to `mount`, as its example helper prints it.
const DESIGN_ANSWER: &str = "echo \"{\"\n\
    echo \"\\\"mount-param\\\": [ \\\"kubernetes.io/pod.namespace\\\", \\\"kubernetes.io/pod.name\\\" ],\"\n\
    echo \"\\\"enable-dirs\\\": [ \\\"/db\\\" ],\"\n\
    echo \"}\"\n";

/// Writes the helper into `dir` and returns its path; `listed` adds the one line eager mode
/// needs (`"files": {"/db": ["password"]}`, named the design's way) before the closing brace.
pub(crate) fn write(dir: &Path, listed: bool) -> PathBuf {
    let answer = if listed {
        DESIGN_ANSWER
            .replace("echo \"}\"\n", "echo \"\\\"files\\\": { \\\"/db\\\": [ \\\"password\\\" ] },\"\necho \"}\"\n")
    } else {
        DESIGN_ANSWER.to_string()
    };
    let script = format!(
        "#!/bin/sh\n\
         echo \"$*\" >> {log}\n\
         case \"$1\" in\n\
         mount)\n{answer};;\n\
         get) printf 'read -field=%s secret/pod-secrets/%s/%s/%s' \"${{2##*/}}\" \"$3\" \"$4\" \"${{2%/*}}\" ;;\n\
         esac\n",
        log = dir.join("calls").display(),
    );
    let path = dir.join("design-helper");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The helper's calls so far, one line each (`get /db/password team-a web`).
pub(crate) fn calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls")).unwrap_or_default().lines().map(String::from).collect()
}

#[test]
fn its_answer_to_mount_is_the_designs_example_word_for_word() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(write(dir.path(), false)).arg("mount").output().unwrap();
    let expected = "{\n\"mount-param\": [ \"kubernetes.io/pod.namespace\", \"kubernetes.io/pod.name\" ],\n\"enable-dirs\": [ \"/db\" ],\n}\n";
    assert_eq!(String::from_utf8(output.stdout).unwrap(), expected);
}
