//! The driver's rendering of a projection's `metadata.labels` / `metadata.annotations` files
//! against kubelet's own (`fieldpath.FormatMap`, built from the kubelet release the suite runs),
//! for every Unicode scalar value: Go escapes what its Unicode 15 tables do not call printable,
//! and a newer table in the driver once printed U+1C89 raw where kubelet writes `\u1c89`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};

use inline_guard_tests::peers::peers;
use sharedresource_csi_driver::content::projection::downward::format_map;

/// Code points per value: a value per block keeps a difference easy to place.
const CHUNK: u32 = 0x1000;

#[test]
fn every_code_point_renders_as_kubelet_renders_it() {
    let peers = peers().expect("building the peers (Go on PATH)");
    let mut values = BTreeMap::new();
    for start in (0..=0x10FFFFu32).step_by(CHUNK as usize) {
        let value: String = (start..start + CHUNK).filter_map(char::from_u32).collect();
        values.insert(format!("block-{start:06x}"), value);
    }
    assert!(values["block-001000"].contains('\u{1c89}'), "the positive control: U+1C89 is in the input");
    let mut child = Command::new(&peers.downward_render)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running downward-render");
    let input = serde_json::to_vec(&values).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let kubelets = String::from_utf8(output.stdout).unwrap();
    let ours = format_map(&values);
    for (theirs, mine) in kubelets.lines().zip(ours.lines()) {
        if theirs != mine {
            let at = theirs.chars().zip(mine.chars()).position(|(a, b)| a != b).unwrap_or(0);
            let context = |line: &str| line.chars().skip(at.saturating_sub(20)).take(60).collect::<String>();
            panic!(
                "the renderings differ in {}: kubelet {:?}, driver {:?}",
                &theirs[..12],
                context(theirs),
                context(mine)
            );
        }
    }
    assert_eq!(kubelets.lines().count(), values.len());
    assert_eq!(kubelets, ours);
    assert!(kubelets.contains("\\u1c89"), "kubelet escapes U+1C89");
}
