//! Pod facts as the downward API shows them: the rendering of the fields a projection may name
//! ([`PodField`], the vocabulary crate's), byte for byte what kubelet writes (a map is `key="value"` lines sorted by key,
//! the value quoted as Go's `%q` quotes it), so a program reading kubelet's files reads ours.

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use sharedresource_api::projection::pod_field::PodField;

use super::go_printable::go_printable;

/// What the driver knows of the pod a volume is for: names from kubelet's publish request,
/// labels and annotations from the apiserver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.serviceAccountName`.
    pub service_account_name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

/// The file content kubelet would write for `field` of `pod`.
pub fn render(field: &PodField, pod: &PodFacts) -> String {
    match field {
        PodField::Name => pod.name.clone(),
        PodField::Namespace => pod.namespace.clone(),
        PodField::Uid => pod.uid.clone(),
        PodField::ServiceAccountName => pod.service_account_name.clone(),
        PodField::Labels => format_map(&pod.labels),
        PodField::Annotations => format_map(&pod.annotations),
        PodField::Label(key) => pod.labels.get(key).cloned().unwrap_or_default(),
        PodField::Annotation(key) => pod.annotations.get(key).cloned().unwrap_or_default(),
    }
}

/// A map as the downward API writes it: `key="value"` lines in key order, no final newline.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    let lines: Vec<String> = map.iter().map(|(key, value)| format!("{key}={}", go_quote(value))).collect();
    lines.join("\n")
}

/// `value` quoted as Go's `strconv.Quote` does: printable characters as they are, `"` and `\`
/// escaped, the C escapes, `\x` for other ASCII controls, `\u`/`\U` for other non-printables.
pub fn go_quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            c if go_printable(c) => quoted.push(c),
            '\u{7}' => quoted.push_str("\\a"),
            '\u{8}' => quoted.push_str("\\b"),
            '\u{c}' => quoted.push_str("\\f"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            '\u{b}' => quoted.push_str("\\v"),
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(quoted, "\\x{:02x}", u32::from(c));
            }
            c if u32::from(c) < 0x10000 => {
                let _ = write!(quoted, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(quoted, "\\U{:08x}", u32::from(c));
            }
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodFacts {
        PodFacts {
            name: "web-0".into(),
            namespace: "team-a".into(),
            uid: "0b7c".into(),
            service_account_name: "web".into(),
            labels: [("app".into(), "web".into()), ("tier".into(), "front".into())].into(),
            annotations: [("note".into(), "say \"hi\"\n".into())].into(),
        }
    }

    #[test]
    fn every_supported_field_path_parses_and_renders_like_kubelet() {
        struct Case {
            field_path: &'static str,
            rendered: &'static str,
        }
        let cases = [
            Case { field_path: "metadata.name", rendered: "web-0" },
            Case { field_path: "metadata.namespace", rendered: "team-a" },
            Case { field_path: "metadata.uid", rendered: "0b7c" },
            Case { field_path: "spec.serviceAccountName", rendered: "web" },
            Case { field_path: "metadata.labels", rendered: "app=\"web\"\ntier=\"front\"" },
            Case { field_path: "metadata.annotations", rendered: r#"note="say \"hi\"\n""# },
            Case { field_path: "metadata.labels['tier']", rendered: "front" },
            Case { field_path: "metadata.labels['absent']", rendered: "" },
            Case { field_path: "metadata.annotations['note']", rendered: "say \"hi\"\n" },
        ];
        for case in cases {
            let field = PodField::parse(case.field_path).unwrap();
            assert_eq!(render(&field, &pod()), case.rendered, "{}", case.field_path);
        }
    }

    #[test]
    fn unsupported_field_paths_are_refused_by_name() {
        for field_path in ["status.podIP", "metadata.labels[tier]", "metadata.labels['']", "metadata.labels['a'b']", ""]
        {
            let error = PodField::parse(field_path).unwrap_err().to_string();
            assert!(error.contains(&format!("fieldPath {field_path:?} is not supported")), "{error}");
        }
    }

    #[test]
    fn an_empty_map_renders_as_an_empty_file() {
        assert_eq!(format_map(&BTreeMap::new()), "");
    }

    #[test]
    fn values_are_quoted_as_go_quotes_them() {
        // Expected strings are Go's `strconv.Quote` of the same input.
        let cases = [
            ("plain", r#""plain""#),
            ("back\\slash", r#""back\\slash""#),
            ("\u{7}\u{8}\u{c}\r\t\u{b}", r#""\a\b\f\r\t\v""#),
            ("\u{0}\u{1b}\u{7f}", r#""\x00\x1b\x7f""#),
            ("héllo wörld ✓", "\"héllo wörld ✓\""),
            ("\u{a0}\u{ad}\u{200b}\u{feff}", r#""\u00a0\u00ad\u200b\ufeff""#),
            ("\u{e000}", r#""\ue000""#),
            ("\u{f0000}", r#""\U000f0000""#),
            ("😀", "\"😀\""),
        ];
        for (input, expected) in cases {
            assert_eq!(go_quote(input), expected, "{input:?}");
        }
    }
}
