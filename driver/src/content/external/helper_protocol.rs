//! The helper protocol of the FUSE flexVolume design, kept exactly so that a helper written for
//! it runs unchanged: `HELPER mount MOUNTPOINT JSON` (the JSON carries the pod's identity and the
//! volume's attributes; the helper answers which directories it serves and which of the JSON's
//! keys to pass back on each read), then `HELPER get PATH VALUE...` (prints one file). Pure: the
//! arguments and the parsing of answers, no process is run here.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use sharedresource_api::volume_attributes::check_parameter;

use crate::content::ask::VolumeAsk;
use crate::content::payload::check_key;
use crate::quote::quote;

/// The design's keys, filled from kubelet's pod information.
pub const POD_NAME: &str = "kubernetes.io/pod.name";
/// The pod's namespace.
pub const POD_NAMESPACE: &str = "kubernetes.io/pod.namespace";
/// The pod's uid.
pub const POD_UID: &str = "kubernetes.io/pod.uid";
/// The pod's service account.
pub const SERVICE_ACCOUNT: &str = "kubernetes.io/serviceAccount.name";
/// The pod's name for the volume.
pub const VOLUME_NAME: &str = "kubernetes.io/pvOrVolumeName";
/// Always `ro`: the driver serves read-only volumes only.
pub const READ_WRITE: &str = "kubernetes.io/readwrite";
/// Always empty: there is no block device.
pub const FS_TYPE: &str = "kubernetes.io/fsType";
pub use sharedresource_api::volume_attributes::PROVIDER_ATTRIBUTE;

/// The most files one answer to `mount` may list: each is one helper call per publish and
/// refresh, so an answer listing a million cannot turn one volume into a million calls.
pub const MAX_LISTED_FILES: usize = 1024;

/// The JSON options of `HELPER mount`: the design's keys, kubelet's CSI keys (with the
/// service-account tokens when the CSIDriver requests them), and the volume's other attributes.
/// An attribute under a reserved prefix is refused, naming it.
pub fn mount_options(ask: &VolumeAsk) -> Result<Map<String, Value>, String> {
    let mut options = Map::new();
    for (key, value) in &ask.attributes {
        if key == PROVIDER_ATTRIBUTE {
            continue;
        }
        // Checked again here: a SecretProviderClass's parameters take the attributes' place.
        check_parameter(key).map_err(|refused| refused.0)?;
        options.insert(key.clone(), Value::String(value.clone()));
    }
    let pod = &ask.pod;
    let text = |value: &str| Value::String(value.to_string());
    for (key, value) in [
        (POD_NAME, text(&pod.name)),
        (POD_NAMESPACE, text(&pod.namespace)),
        (POD_UID, text(&pod.uid)),
        (SERVICE_ACCOUNT, text(&pod.service_account)),
        (VOLUME_NAME, text(&ask.volume_name)),
        (READ_WRITE, text("ro")),
        (FS_TYPE, text("")),
        ("csi.storage.k8s.io/pod.name", text(&pod.name)),
        ("csi.storage.k8s.io/pod.namespace", text(&pod.namespace)),
        ("csi.storage.k8s.io/pod.uid", text(&pod.uid)),
        ("csi.storage.k8s.io/serviceAccount.name", text(&pod.service_account)),
        ("csi.storage.k8s.io/ephemeral", text("true")),
    ] {
        options.insert(key.to_string(), value);
    }
    if ask.tokens.audiences().next().is_some() {
        // kubelet's own shape: audience to {"token": ...} (the expiry is not kept).
        let tokens: Map<String, Value> = ask
            .tokens
            .audiences()
            .map(|audience| {
                let token = ask.tokens.get(audience).unwrap_or_default();
                (audience.to_string(), serde_json::json!({ "token": token }))
            })
            .collect();
        options
            .insert(crate::content::tokens::TOKENS_KEY.to_string(), Value::String(Value::Object(tokens).to_string()));
    }
    Ok(options)
}

/// What a helper answers to `mount`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MountReply {
    /// The directories of the volume the helper serves.
    #[serde(rename = "enable-dirs", default)]
    pub enable_dirs: Vec<String>,
    /// The keys of the mount options whose values are passed, in this order, on each `get`.
    #[serde(rename = "mount-param", default)]
    pub mount_param: Vec<String>,
    /// The files of each enabled directory, when the helper lists them (an extension of the
    /// design; eager mode needs it).
    #[serde(default)]
    pub files: BTreeMap<String, Vec<String>>,
    /// Whether the helper named its directories as the design's example does, from the root of
    /// the mount point (`/db` for `db`): its `get` is then passed paths the same way
    /// (`/db/password`), as the design's own driver passes FUSE's paths.
    #[serde(skip)]
    pub rooted: bool,
}

impl MountReply {
    /// Parses a helper's answer. The design's example answer has a trailing comma after its
    /// last member; trailing commas before `}` or `]` are accepted for that reason, and nothing
    /// else beyond JSON. A directory named from the mount point's root (`/db`, the design's
    /// example) is that directory under it (`db`); past that one `/`, a name is checked as any
    /// other (`..`, empty components and reserved names stay refused). The message says where
    /// the answer is malformed, never quoting it.
    pub fn parse(answer: &[u8]) -> Result<MountReply, String> {
        let text = std::str::from_utf8(answer).map_err(|_| "its answer to mount is not UTF-8".to_string())?;
        let mut reply: MountReply = serde_json::from_str(&without_trailing_commas(text)).map_err(|error| {
            format!(
                "its answer to mount is not the protocol's JSON object (line {}, column {})",
                error.line(),
                error.column()
            )
        })?;
        reply.rooted = reply.enable_dirs.iter().chain(reply.files.keys()).any(|dir| dir.starts_with('/'));
        for dir in &mut reply.enable_dirs {
            from_root(dir);
        }
        for (mut dir, files) in std::mem::take(&mut reply.files) {
            from_root(&mut dir);
            if reply.files.contains_key(&dir) {
                return Err(format!("files: directory {} is listed twice (once from the root)", quote(&dir)));
            }
            reply.files.insert(dir, files);
        }
        for dir in &reply.enable_dirs {
            check_key(dir).map_err(|error| format!("enable-dirs: {error}"))?;
        }
        let listed: usize = reply.files.values().map(Vec::len).sum();
        if listed > MAX_LISTED_FILES {
            return Err(format!("files: {listed} files listed, more than the {MAX_LISTED_FILES} a volume may hold"));
        }
        for (dir, files) in &reply.files {
            if !reply.enable_dirs.contains(dir) {
                return Err(format!("files: directory {} is not in enable-dirs", quote(dir)));
            }
            for file in files {
                check_key(&format!("{dir}/{file}")).map_err(|error| format!("files: {error}"))?;
            }
        }
        Ok(reply)
    }

    /// Every listed file as its path in the volume (`dir/file`), in order.
    pub fn listed_paths(&self) -> Vec<String> {
        self.files.iter().flat_map(|(dir, files)| files.iter().map(move |file| format!("{dir}/{file}"))).collect()
    }

    /// The arguments of `get` for the file at `path`: the path, then the value of each
    /// `mount-param` key in `options`. A key the options lack is an error naming it.
    /// A helper that named its directories from the mount point's root gets `/` before the path.
    pub fn get_arguments(&self, path: &str, options: &Map<String, Value>) -> Result<Vec<String>, String> {
        let path = if self.rooted { format!("/{path}") } else { path.to_string() };
        let mut arguments = vec!["get".to_string(), path];
        for key in &self.mount_param {
            match options.get(key) {
                Some(Value::String(value)) => arguments.push(value.clone()),
                _ => return Err(format!("mount-param names {}, which the mount options do not hold", quote(key))),
            }
        }
        Ok(arguments)
    }
}

/// `name` without the one `/` that names it from the mount point's root; a second one stays, and
/// is refused as an absolute path.
fn from_root(name: &mut String) {
    if name.starts_with('/') {
        name.remove(0);
    }
}

/// The arguments of `mount` for a volume at `mount_point` with `options`.
pub fn mount_arguments(mount_point: &std::path::Path, options: &Map<String, Value>) -> Vec<std::ffi::OsString> {
    vec!["mount".into(), mount_point.as_os_str().to_os_string(), Value::Object(options.clone()).to_string().into()]
}

/// `text` with each comma that stands before a closing `}` or `]` (outside strings) removed.
fn without_trailing_commas(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for (index, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if c == ',' && text[index + 1..].trim_start().starts_with(['}', ']']) {
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::tokens::Tokens;

    fn ask(attributes: &[(&str, &str)]) -> VolumeAsk {
        VolumeAsk::example(attributes)
    }

    #[test]
    fn the_mount_options_carry_the_pods_identity_and_the_other_attributes() {
        let options = mount_options(&ask(&[("provider", "vault-cli"), ("role", "db-reader")])).unwrap();
        let expected = serde_json::json!({
            "kubernetes.io/pod.name": "web", "kubernetes.io/pod.namespace": "team-a",
            "kubernetes.io/pod.uid": "u1", "kubernetes.io/serviceAccount.name": "reader",
            "kubernetes.io/pvOrVolumeName": "secrets", "kubernetes.io/readwrite": "ro",
            "kubernetes.io/fsType": "",
            "csi.storage.k8s.io/pod.name": "web", "csi.storage.k8s.io/pod.namespace": "team-a",
            "csi.storage.k8s.io/pod.uid": "u1", "csi.storage.k8s.io/serviceAccount.name": "reader",
            "csi.storage.k8s.io/ephemeral": "true",
            "role": "db-reader"
        });
        assert_eq!(Value::Object(options), expected);
    }

    #[test]
    fn an_attribute_cannot_speak_for_another_pod() {
        let error = mount_options(&ask(&[("kubernetes.io/pod.namespace", "kube-system")])).unwrap_err();
        assert!(error.starts_with("volumeAttributes[\"kubernetes.io/pod.namespace\"]: keys under"), "{error}");
    }

    #[test]
    fn tokens_are_passed_in_kubelets_shape() {
        let context = [(
            crate::content::tokens::TOKENS_KEY.to_string(),
            r#"{"vault":{"token":"T1","expirationTimestamp":"2026-11-27T10:00:00Z"}}"#.to_string(),
        )]
        .into();
        let mut asked = ask(&[]);
        asked.tokens = Tokens::from_volume_context(&context).unwrap();
        let options = mount_options(&asked).unwrap();
        assert_eq!(options["csi.storage.k8s.io/serviceAccount.tokens"], r#"{"vault":{"token":"T1"}}"#);
    }

    #[test]
    fn the_designs_answer_with_its_trailing_comma_is_read() {
        let answer = b"{\n  \"enable-dirs\": [\"secrets\"],\n  \"mount-param\": [\"kubernetes.io/pod.namespace\", \"kubernetes.io/pod.name\"],\n}\n";
        let reply = MountReply::parse(answer).unwrap();
        assert_eq!(reply.enable_dirs, ["secrets"]);
        let options = mount_options(&ask(&[])).unwrap();
        assert_eq!(reply.get_arguments("secrets/db", &options).unwrap(), ["get", "secrets/db", "team-a", "web"]);
    }

    #[test]
    fn the_designs_example_answer_names_its_directory_from_the_mount_points_root() {
        // The design's example helper, word for word: `/db` is `db` under the mount point, and
        // its `get` is passed `/db/password`, as the design's driver passes FUSE's paths.
        let answer = b"{\n\"mount-param\": [ \"kubernetes.io/pod.namespace\", \"kubernetes.io/pod.name\" ],\n\"enable-dirs\": [ \"/db\" ],\n}\n";
        let reply = MountReply::parse(answer).unwrap();
        assert_eq!(reply.enable_dirs, ["db"]);
        assert!(reply.rooted);
        let options = mount_options(&ask(&[])).unwrap();
        assert_eq!(reply.get_arguments("db/password", &options).unwrap(), ["get", "/db/password", "team-a", "web"]);
        let listed = MountReply::parse(br#"{"enable-dirs": ["/db"], "files": {"/db": ["password"]}}"#).unwrap();
        assert_eq!(listed.files, BTreeMap::from([("db".to_string(), vec!["password".to_string()])]));
        assert_eq!(listed.listed_paths(), ["db/password"]);
    }

    #[test]
    fn past_the_roots_one_slash_a_directory_is_checked_as_any_other() {
        let cases: [(&[u8], &str); 7] = [
            (br#"{"enable-dirs": ["//etc"]}"#, "enable-dirs: key \"/etc\" is refused: it is an absolute path"),
            (br#"{"enable-dirs": ["/"]}"#, "enable-dirs: key \"\" is refused"),
            (br#"{"enable-dirs": ["/../etc"]}"#, "enable-dirs: key \"../etc\" is refused"),
            (br#"{"enable-dirs": ["/a//b"]}"#, "enable-dirs: key \"a//b\" is refused"),
            (br#"{"enable-dirs": ["/..data"]}"#, "enable-dirs: key \"..data\" is refused"),
            (br#"{"enable-dirs": ["/db"], "files": {"/db": ["/x"]}}"#, "files: key \"db//x\" is refused"),
            (
                br#"{"enable-dirs": ["db"], "files": {"/db": ["x"], "db": ["y"]}}"#,
                "files: directory \"db\" is listed twice",
            ),
        ];
        for (answer, message) in cases {
            let error = MountReply::parse(answer).unwrap_err();
            assert!(error.starts_with(message), "{error}");
        }
    }

    #[test]
    fn a_helper_naming_its_directories_plainly_gets_plain_paths() {
        let reply = MountReply::parse(br#"{"enable-dirs": ["db"]}"#).unwrap();
        assert!(!reply.rooted);
        assert_eq!(reply.get_arguments("db/password", &Map::new()).unwrap(), ["get", "db/password"]);
    }

    #[test]
    fn commas_inside_strings_are_kept() {
        assert_eq!(without_trailing_commas(r#"{"a": "x,]", "b": [1, 2,],}"#), r#"{"a": "x,]", "b": [1, 2]}"#);
        assert_eq!(without_trailing_commas(r#"{"a": "q\",}",}"#), r#"{"a": "q\",}"}"#);
    }

    #[test]
    fn a_malformed_or_hostile_answer_is_refused_without_quoting_it() {
        let cases: [(&[u8], &str); 6] = [
            (b"not json s3cret", "its answer to mount is not the protocol's JSON object (line 1, column 2)"),
            (b"\xff", "its answer to mount is not UTF-8"),
            (br#"{"enable-dirs": ["../etc"]}"#, "enable-dirs: key \"../etc\" is refused"),
            (br#"{"enable-dirs": ["a"], "files": {"b": ["x"]}}"#, "files: directory \"b\" is not in enable-dirs"),
            (br#"{"enable-dirs": ["a"], "files": {"a": ["../../x"]}}"#, "files: key \"a/../../x\" is refused"),
            (br#"{"enable-dirs": "a"}"#, "its answer to mount is not the protocol's JSON object"),
        ];
        for (answer, message) in cases {
            let error = MountReply::parse(answer).unwrap_err();
            assert!(error.starts_with(message), "{error}");
            assert!(!error.contains("s3cret"));
        }
    }

    #[test]
    fn an_answer_listing_more_files_than_a_volume_may_hold_is_refused() {
        let names = |count: usize| (0..count).map(|i| format!("\"f{i}\"")).collect::<Vec<_>>().join(",");
        let answer = |count| format!(r#"{{"enable-dirs": ["a"], "files": {{"a": [{}]}}}}"#, names(count));
        assert_eq!(
            MountReply::parse(answer(MAX_LISTED_FILES).as_bytes()).unwrap().listed_paths().len(),
            MAX_LISTED_FILES
        );
        let error = MountReply::parse(answer(MAX_LISTED_FILES + 1).as_bytes()).unwrap_err();
        assert_eq!(error, "files: 1025 files listed, more than the 1024 a volume may hold");
    }

    #[test]
    fn a_mount_param_the_options_lack_is_named() {
        let reply = MountReply { mount_param: vec!["vault/role".into()], ..MountReply::default() };
        let error = reply.get_arguments("a/b", &Map::new()).unwrap_err();
        assert_eq!(error, "mount-param names \"vault/role\", which the mount options do not hold");
    }
}
