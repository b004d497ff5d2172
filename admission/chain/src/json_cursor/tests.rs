//! The cursor against serde_json: it never accepts what serde_json refuses, it accepts the JSON
//! it is meant for, and the strings it reads are serde_json's strings.

use proptest::prelude::*;
use serde::de::IgnoredAny;

use super::*;

/// The cursor's verdict on `text` as one value to skip.
fn skips(text: &str) -> bool {
    let mut cursor = JsonCursor::new(text);
    cursor.skip().and_then(|()| cursor.finish()).is_ok()
}

fn serde_accepts(text: &str) -> bool {
    serde_json::from_str::<IgnoredAny>(text).is_ok()
}

#[test]
fn skips_every_kind_of_value_serde_accepts() {
    let accepted = [
        "null",
        " true ",
        "false",
        "0",
        "-0",
        "12",
        "-12.5e+3",
        "1E9",
        "0.0e-0",
        r#""""#,
        r#""plain""#,
        r#""esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00 \ud800""#,
        "\"caf\u{e9} \u{1F600}\"",
        "[]",
        "[ 1 , [ ] , { } ]",
        r#"{"a":{"b":[{"c":null}]},"a":1}"#,
        "\t\r\n{ \"k\" : \"v\" }\n",
    ];
    for text in accepted {
        assert!(serde_accepts(text), "serde refuses {text:?}");
        assert!(skips(text), "the cursor declines {text:?}");
    }
}

#[test]
fn declines_what_serde_refuses() {
    let refused = [
        "",
        " ",
        "nul",
        "nulll",
        "True",
        "01",
        "-",
        "-a",
        "1.",
        "1.e5",
        "1e",
        "1e+",
        ".5",
        "+1",
        "NaN",
        "\"open",
        "\"bad escape \\x\"",
        "\"short \\u12\"",
        "\"not hex \\u12g4\"",
        "\"tab\tinside\"",
        "\"newline\ninside\"",
        "[1,]",
        "[,1]",
        "[1 2]",
        "[",
        "]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        r#"{a:1}"#,
        r#"{"a":}"#,
        r#"{,"a":1}"#,
        r#"{"a":1 "b":2}"#,
        "{} {}",
        "1 2",
        "[] x",
    ];
    for text in refused {
        assert!(!serde_accepts(text), "serde accepts {text:?}");
        assert!(!skips(text), "the cursor accepts {text:?}");
    }
}

#[test]
fn leaves_escaped_keys_and_deep_nesting_to_serde() {
    // serde reads both; the cursor declines them, so its caller asks serde.
    let escaped_key = r#"{"\u0061":1}"#;
    assert!(serde_accepts(escaped_key));
    assert!(!skips(escaped_key));

    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert!(skips(&nested(MAX_DEPTH as usize)));
    let too_deep = nested(MAX_DEPTH as usize + 1);
    assert!(serde_accepts(&too_deep));
    assert!(!skips(&too_deep));
    // Far past any stack: declined at the limit, never recursed into.
    assert!(!skips(&nested(1_000_000)));
}

#[test]
fn a_string_without_escapes_is_borrowed_from_the_text_and_one_with_escapes_is_owned() {
    let text = r#""plain""#;
    match JsonCursor::new(text).string() {
        Ok(Cow::Borrowed(plain)) => assert!(std::ptr::eq(plain.as_bytes(), &text.as_bytes()[1..6])),
        other => panic!("{other:?}"),
    }
    assert_eq!(JsonCursor::new(r#""a\nb""#).string(), Ok(Cow::Owned::<str>("a\nb".to_string())));
}

#[test]
fn strings_read_are_serde_strings_and_surrogates_are_left_to_serde() {
    let read = |text: &str| -> Result<String, Declined> {
        let mut cursor = JsonCursor::new(text);
        cursor.string().map(Cow::into_owned).and_then(|s| cursor.finish().map(|()| s))
    };
    for text in [r#""plain""#, r#""a\"b\\c\/d\be\ff\ng\rh\ti""#, r#""\u00e9\u0000\uFFFF""#, "\"caf\u{e9}\""] {
        assert_eq!(read(text), Ok(serde_json::from_str::<String>(text).unwrap()), "{text}");
    }
    // A pair, and a lone half: serde joins or refuses them; the cursor does neither itself.
    assert_eq!(read(r#""\uD83D\uDE00""#), Err(Declined));
    assert_eq!(read(r#""\uD800""#), Err(Declined));
    // Not a string at all.
    assert_eq!(read("7"), Err(Declined));
    assert_eq!(read("null"), Err(Declined));
}

#[test]
fn the_scan_finds_the_first_special_byte_in_every_position() {
    for special in [b'"', b'\\', 0x00, 0x1f] {
        for at in 0..20 {
            let mut bytes = vec![b'a'; 20];
            bytes.extend_from_slice(&[0xc3, 0xa9, 0x7f, 0x20]);
            bytes[at] = special;
            // A later special byte must not hide the first.
            bytes[19] = b'"';
            assert_eq!(next_quote_backslash_or_control(&bytes, 0), at, "{special:#x} at {at}");
        }
    }
    assert_eq!(next_quote_backslash_or_control(&[0xff, 0x80, 0x7f, b' '], 0), 4);
}

/// Bytes that make JSON interesting: its punctuation, its literals' letters, digits, escapes,
/// control characters and a multi-byte character.
fn json_ish() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "null", "true", "false", "-", "0", "7", ".", "e", "+", " ",
        "\n", "\t", "\u{1}", "a", "é", "\"k\":", "\"s\"",
    ]);
    prop::collection::vec(piece, 1..10).prop_map(|pieces| pieces.concat())
}

/// A JSON value whose keys need no escapes (the cursor leaves escaped keys to serde).
fn value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::Array),
            prop::collection::btree_map("[a-zA-Z0-9_.-]{0,8}", inner, 0..8)
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20000))]

    #[test]
    fn never_accepts_what_serde_refuses(text in json_ish()) {
        if skips(&text) {
            prop_assert!(serde_accepts(&text), "the cursor accepts {text:?}, serde refuses it");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn accepts_serde_json_output_compact_and_pretty(value in value()) {
        let compact = serde_json::to_string(&value).unwrap();
        prop_assert!(skips(&compact), "declined {compact}");
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        prop_assert!(skips(&pretty), "declined {pretty}");
    }

    #[test]
    fn every_truncation_and_one_byte_change_of_valid_json_agrees_with_serde(
        value in value(),
        at in any::<prop::sample::Index>(),
        byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b'}'), Just(b']'), Just(b'0'), Just(b'e'), Just(0x01u8), Just(b' ')],
    ) {
        let text = serde_json::to_string(&value).unwrap();
        for end in 0..text.len() {
            if let Some(prefix) = text.get(..end) {
                prop_assert!(!skips(prefix) || serde_accepts(prefix), "truncation {prefix:?}");
            }
        }
        let mut bytes = text.into_bytes();
        if !bytes.is_empty() {
            let index = at.index(bytes.len());
            bytes[index] = byte;
        }
        if let Ok(changed) = String::from_utf8(bytes) {
            prop_assert!(!skips(&changed) || serde_accepts(&changed), "changed {changed:?}");
        }
    }
}
