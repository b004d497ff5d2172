//! Multi-document manifests: YAML streams separated by `---`, concatenated JSON values, and
//! `kind: List` wrappers (what `kubectl get -o yaml` prints), flattened into one object each.

use std::fmt;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::format::Format;

/// One Kubernetes object from a manifest, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// Where the object sits in its file.
    pub position: Position,
    /// The object, as JSON.
    pub value: Value,
    /// The object's own JSON text, when the input was JSON and the object a whole document (not
    /// an item of a `List`): decoding these bytes instead of `value` treats duplicate keys as a
    /// server decoding the same bytes would (a duplicate field is an error), where `value` has
    /// already kept the last one silently.
    pub raw_json: Option<String>,
}

/// The place of an object in a file: the 1-based document, and its 1-based item within a `List`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Document number in the stream.
    pub document: usize,
    /// Item number when the document is a `List`.
    pub item: Option<usize>,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(item) = self.item {
            write!(f, " item {item}")?;
        }
        Ok(())
    }
}

/// Splits a manifest text into objects. `name` labels errors (a path, or `-` for stdin).
pub fn read_documents(name: &std::path::Path, text: &str) -> Result<Vec<Document>> {
    let decode_error = |field: String, message: String| Error::Decode { path: name.to_path_buf(), field, message };
    let values: Vec<(Value, Option<String>)> = match Format::detect(text) {
        Format::Json => {
            let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
            let mut values = Vec::new();
            let mut start = 0;
            while let Some(value) = stream.next() {
                let value = value.map_err(|e| decode_error(format!("document {}", values.len() + 1), e.to_string()))?;
                let end = stream.byte_offset();
                values.push((value, Some(text[start..end].trim().to_string())));
                start = end;
            }
            values
        }
        Format::Yaml => serde_saphyr::from_multiple::<Value>(text)
            .map_err(|e| decode_error(".".into(), e.without_snippet().to_string()))?
            .into_iter()
            .map(|value| (value, None))
            .collect(),
    };

    let mut documents = Vec::new();
    for (index, (value, raw_json)) in values.into_iter().enumerate() {
        let document = index + 1;
        match value {
            Value::Null => continue,
            Value::Object(ref map) if is_list(map) => {
                let Some(Value::Array(items)) = map.get("items") else {
                    return Err(decode_error(format!("document {document}"), "a List needs an `items` array".into()));
                };
                for (item_index, item) in items.iter().enumerate() {
                    let position = Position { document, item: Some(item_index + 1) };
                    require_object(item).map_err(|m| decode_error(position.to_string(), m))?;
                    documents.push(Document { position, value: item.clone(), raw_json: None });
                }
            }
            value => {
                let position = Position { document, item: None };
                require_object(&value).map_err(|m| decode_error(position.to_string(), m))?;
                documents.push(Document { position, value, raw_json });
            }
        }
    }
    Ok(documents)
}

/// `kind: List`, or a typed list such as `NamespaceList` as the API returns it.
fn is_list(map: &serde_json::Map<String, Value>) -> bool {
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
    kind == "List" || (kind.ends_with("List") && map.contains_key("items"))
}

fn require_object(value: &Value) -> std::result::Result<(), String> {
    let Value::Object(map) = value else {
        return Err("expected a Kubernetes object (a mapping with apiVersion and kind)".into());
    };
    for key in ["apiVersion", "kind"] {
        match map.get(key) {
            Some(Value::String(s)) if !s.is_empty() => {}
            _ => return Err(format!("missing `{key}`: expected a Kubernetes object")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn yaml_stream_skips_empty_documents_and_flattens_lists() {
        let text = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: c}}\n";
        let documents = read_documents(Path::new("s.yaml"), text).unwrap();
        let names: Vec<_> = documents.iter().map(|d| d.value["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(documents[2].position.to_string(), "document 2 item 2");
    }

    #[test]
    fn concatenated_json_values_are_separate_documents() {
        let text = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}
{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"b"}}"#;
        assert_eq!(read_documents(Path::new("s.json"), text).unwrap().len(), 2);
    }

    #[test]
    fn a_scalar_document_is_refused_with_its_position() {
        let error =
            read_documents(Path::new("s.yaml"), "apiVersion: v1\nkind: Namespace\n---\njust text\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "s.yaml: document 2: expected a Kubernetes object (a mapping with apiVersion and kind)"
        );
    }

    #[test]
    fn an_object_without_kind_is_refused() {
        let error = read_documents(Path::new("s.yaml"), "apiVersion: v1\nmetadata: {}\n").unwrap_err();
        assert_eq!(error.to_string(), "s.yaml: document 1: missing `kind`: expected a Kubernetes object");
    }

    #[test]
    fn broken_yaml_names_the_file_and_line() {
        let error = read_documents(Path::new("s.yaml"), "a: [1, 2\nb: 3\n").unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("s.yaml: "), "{message}");
        assert!(message.contains("line"), "{message}");
    }

    #[test]
    fn broken_json_names_the_document() {
        let error =
            read_documents(Path::new("s.json"), "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\"}\n{\"a\":").unwrap_err();
        assert!(error.to_string().starts_with("s.json: document 2: EOF while parsing"), "{error}");
    }

    #[test]
    fn an_alias_bomb_is_refused_not_expanded() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..12 {
            let previous = level - 1;
            let refs = std::iter::repeat_n(format!("*a{previous}"), 10).collect::<Vec<_>>().join(", ");
            text.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
        }
        let started = std::time::Instant::now();
        let result = read_documents(Path::new("bomb.yaml"), &text);
        let message = result.unwrap_err().to_string();
        assert!(message.starts_with("bomb.yaml: .: "), "{message}");
        assert!(message.to_lowercase().contains("budget"), "refused by the alias budget: {message}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused promptly, not after expanding");
    }
}
