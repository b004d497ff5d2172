//! Every rule of the attributes, with the exact message a user reads (at mount and at creation).

use super::*;

const RULE: &str = "an object name is at most 253 characters of lowercase letters, digits, '-' and '.', \
                    each '.'-separated part starting and ending with a letter or digit";

fn parse(pairs: &[(&str, &str)]) -> Result<VolumeAttributes> {
    VolumeAttributes::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

fn name(text: &str) -> ObjectName {
    ObjectName::parse(text).unwrap()
}

#[test]
fn a_volume_names_exactly_one_valid_share_projection_or_provider() {
    let selected = |pairs: &[(&str, &str)]| parse(pairs).map(|attributes| attributes.selection);
    assert_eq!(selected(&[("sharedSecret", "db")]), Ok(Selection::Share(ShareKind::Secret, name("db"))));
    assert_eq!(
        selected(&[("sharedConfigMap", "ca.bundle")]),
        Ok(Selection::Share(ShareKind::ConfigMap, name("ca.bundle")))
    );
    assert_eq!(selected(&[("projection", "app")]), Ok(Selection::Projection(name("app"))));
    assert_eq!(selected(&[("provider", "vault"), ("objects", "x")]), Ok(Selection::Provider(name("vault"))));
    // The parameters providers take, as their documentation names them.
    let parameters = [("provider", "vault"), ("roleName", "db"), ("vault.example.com/skip_tls", "x"), ("a-b", "")];
    assert_eq!(selected(&parameters), Ok(Selection::Provider(name("vault"))));
    let longest = "k".repeat(MAX_PARAMETER_KEY);
    assert_eq!(selected(&[("provider", "vault"), (&longest, "x")]), Ok(Selection::Provider(name("vault"))));
    assert!(parse(&[("provider", "vault"), (&format!("{longest}k"), "x")]).is_err());
}

#[test]
fn each_refusal_names_what_is_wrong() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "volumeAttributes lacks \"sharedSecret\", \"sharedConfigMap\" or \"projection\": name what to mount"),
        (
            &[("sharedSecret", "a"), ("sharedConfigMap", "b")],
            "volumeAttributes names both \"sharedSecret\" and \"sharedConfigMap\": name one share, or one projection",
        ),
        (
            &[("projection", "a"), ("sharedConfigMap", "b")],
            "volumeAttributes names both \"sharedConfigMap\" and \"projection\": name one share, or one projection",
        ),
        (&[("sharedSecret", "../x")], "SharedSecret name \"../x\" is not a valid object name: RULE"),
        (&[("sharedConfigMap", "")], "SharedConfigMap name \"\" is not a valid object name: RULE"),
        (&[("projection", "A")], "SharedProjection name \"A\" is not a valid object name: RULE"),
        (&[("sharedSecret", "?watch=true")], "SharedSecret name \"?watch=true\" is not a valid object name: RULE"),
        (&[("projection", "..")], "SharedProjection name \"..\" is not a valid object name: RULE"),
        (&[("provider", "Vault")], "provider name \"Vault\" is not a valid object name: RULE"),
        (
            &[("sharedSecret", "db"), ("refreshResource", "no")],
            "volumeAttributes[\"refreshResource\"] is \"no\": it is \"true\" or \"false\" (the default: \"true\")",
        ),
        (
            &[("sharedSecret", "db"), ("refreshResouce", "false")],
            "volumeAttributes[\"refreshResouce\"] is not an attribute of this driver: a sharedSecret volume takes \"sharedSecret\", \"refreshResource\" and \"optional\" only",
        ),
        (
            &[("projection", "app"), ("csi.storage.k8s.io/pod.namespace", "kube-system")],
            "volumeAttributes[\"csi.storage.k8s.io/pod.namespace\"] is not an attribute of this driver: a projection volume takes \"projection\" and \"refreshResource\" only",
        ),
        (
            &[("provider", "vault"), ("kubernetes.io/pod.namespace", "kube-system")],
            "volumeAttributes[\"kubernetes.io/pod.namespace\"]: keys under kubernetes.io/ and csi.storage.k8s.io/ are the driver's to set (the pod's identity)",
        ),
        (
            &[("provider", "vault"), ("zz\",\"kubernetes.io/pod.namespace", "team-a")],
            "volumeAttributes[\"zz\\\",\\\"kubernetes.io/pod.namespace\"]: a provider parameter's key is 1 to 317 letters, digits, '-', '_', '.' and '/'",
        ),
        (
            &[("provider", "vault"), ("", "x")],
            "volumeAttributes[\"\"]: a provider parameter's key is 1 to 317 letters, digits, '-', '_', '.' and '/'",
        ),
        (
            &[("provider", "vault"), ("secretProviderClass", "db"), ("roleName", "x")],
            "volumeAttributes[\"roleName\"]: with \"secretProviderClass\", the provider's parameters come from the SecretProviderClass; set it there",
        ),
        (
            &[("provider", "vault"), ("secretProviderClass", "Not_A_Name")],
            "SecretProviderClass name \"Not_A_Name\" is not a valid object name: RULE",
        ),
    ];
    for (pairs, message) in cases {
        assert_eq!(parse(pairs), Err(Invalid(message.replace("RULE", RULE))), "{pairs:?}");
    }
}

#[test]
fn refresh_is_on_unless_the_volume_says_false() {
    assert!(parse(&[("sharedSecret", "db")]).unwrap().refresh);
    assert!(parse(&[("sharedSecret", "db"), ("refreshResource", "true")]).unwrap().refresh);
    assert!(!parse(&[("projection", "app"), ("refreshResource", "false")]).unwrap().refresh);
    let with_class = [("provider", "vault"), ("secretProviderClass", "db"), ("refreshResource", "false")];
    assert!(!parse(&with_class).unwrap().refresh, "the driver's own attribute is allowed beside a class");
}

#[test]
fn optional_is_a_shares_to_say_and_off_unless_it_says_true() {
    assert!(!parse(&[("sharedSecret", "db")]).unwrap().optional);
    assert!(parse(&[("sharedConfigMap", "ca"), ("optional", "true")]).unwrap().optional);
    assert!(!parse(&[("sharedSecret", "db"), ("optional", "false")]).unwrap().optional);
    assert_eq!(
        parse(&[("sharedSecret", "db"), ("optional", "yes")]).unwrap_err().0,
        "volumeAttributes[\"optional\"] is \"yes\": it is \"true\" or \"false\" (the default: \"false\")"
    );
    assert_eq!(
        parse(&[("projection", "app"), ("optional", "true")]).unwrap_err().0,
        "volumeAttributes[\"optional\"] is not an attribute of this driver: a projection volume takes \"projection\" \
         and \"refreshResource\" only (a projection marks each source optional in its spec)"
    );
    // A provider's other attributes are its parameters: `optional` is the provider's to read.
    let provider = parse(&[("provider", "vault"), ("optional", "true")]).unwrap();
    assert!(!provider.optional);
}

#[test]
fn a_hostile_key_is_quoted_bounded() {
    let key = format!("x{}", "%".repeat(100_000));
    let refused = parse(&[("sharedSecret", "db"), (&key, "v")]).unwrap_err().0;
    // 256 bytes of the key are quoted, each `%` escaped (kubelet's event formatter reads `%`).
    assert!(refused.len() < 256 * 6 + 200, "{} bytes", refused.len());
    assert!(refused.contains("(100001 bytes)"), "{refused}");
    assert!(!refused.contains('%'), "{refused}");
}
