//! Pod facts as the downward API shows them: the fields a projection may name, and their
//! rendering, byte for byte what kubelet writes (a map is `key="value"` lines sorted by key,
//! the value quoted as Go's `%q` quotes it), so a program reading kubelet's files reads ours.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::go_printable::go_printable;
use crate::content::error::{Error, Result};
use crate::quote::quote;

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

/// A pod field a projection may show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodField {
    /// `metadata.name`.
    Name,
    /// `metadata.namespace`.
    Namespace,
    /// `metadata.uid`.
    Uid,
    /// `spec.serviceAccountName`.
    ServiceAccountName,
    /// `metadata.labels`: every label.
    Labels,
    /// `metadata.annotations`: every annotation.
    Annotations,
    /// `metadata.labels['key']`: one label's value, empty when absent.
    Label(String),
    /// `metadata.annotations['key']`: one annotation's value, empty when absent.
    Annotation(String),
}

impl PodField {
    /// Parses a downward API field path; names what is supported when it is not.
    pub fn parse(field_path: &str) -> Result<PodField> {
        let field = match field_path {
            "metadata.name" => PodField::Name,
            "metadata.namespace" => PodField::Namespace,
            "metadata.uid" => PodField::Uid,
            "spec.serviceAccountName" => PodField::ServiceAccountName,
            "metadata.labels" => PodField::Labels,
            "metadata.annotations" => PodField::Annotations,
            other => {
                if let Some(key) = subscript(other, "metadata.labels") {
                    PodField::Label(key.to_string())
                } else if let Some(key) = subscript(other, "metadata.annotations") {
                    PodField::Annotation(key.to_string())
                } else {
                    return Err(Error::Invalid(format!(
                        "fieldPath {} is not supported: use metadata.name, metadata.namespace, metadata.uid, \
                         spec.serviceAccountName, metadata.labels, metadata.annotations, \
                         metadata.labels['<key>'] or metadata.annotations['<key>']",
                        quote(other)
                    )));
                }
            }
        };
        Ok(field)
    }

    /// Whether showing this field needs the pod object (labels and annotations are not in
    /// kubelet's publish request).
    pub fn needs_pod_object(&self) -> bool {
        matches!(self, PodField::Labels | PodField::Annotations | PodField::Label(_) | PodField::Annotation(_))
    }

    /// The file content kubelet would write for this field of `pod`.
    pub fn render(&self, pod: &PodFacts) -> String {
        match self {
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
}

/// `metadata.labels['key']` → `key`; the key must be non-empty and free of quotes.
fn subscript<'a>(field_path: &'a str, map: &str) -> Option<&'a str> {
    let key = field_path.strip_prefix(map)?.strip_prefix("['")?.strip_suffix("']")?;
    (!key.is_empty() && !key.contains('\'')).then_some(key)
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
            assert_eq!(field.render(&pod()), case.rendered, "{}", case.field_path);
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
