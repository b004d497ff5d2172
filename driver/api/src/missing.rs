//! The words for a share or projection that does not exist: the driver's NOT_FOUND at mount and
//! the admission plugin's refusal at creation say the same.

use crate::object_name::ObjectName;
use crate::quote::quote;
use crate::share_kind::ShareKind;

/// `SharedSecret "db" not found`.
pub fn share_not_found(kind: ShareKind, name: &ObjectName) -> String {
    format!("{} {} not found", kind.kind(), quote(name.as_str()))
}

/// `SharedProjection team-a/"app" not found`.
pub fn projection_not_found(namespace: &str, name: &ObjectName) -> String {
    format!("SharedProjection {namespace}/{} not found", quote(name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_names_the_kind_and_the_object() {
        let name = ObjectName::parse("db").unwrap();
        assert_eq!(share_not_found(ShareKind::Secret, &name), "SharedSecret \"db\" not found");
        assert_eq!(projection_not_found("team-a", &name), "SharedProjection team-a/\"db\" not found");
    }
}
