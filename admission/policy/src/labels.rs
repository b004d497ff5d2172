//! Label and audit-annotation keys: the vocabulary that users, runbooks and audit queries share with us.

/// The CSIDriver label that declares the Pod Security level a driver's inline volumes need.
pub const DRIVER_PROFILE: &str = "security.openshift.io/csi-ephemeral-volume-profile";

/// Pod Security Admission's namespace label for the enforce level.
pub const ENFORCE_LEVEL: &str = "pod-security.kubernetes.io/enforce";
/// Pod Security Admission's namespace label for the enforce version (validated, not used).
pub const ENFORCE_VERSION: &str = "pod-security.kubernetes.io/enforce-version";
/// Pod Security Admission's namespace label for the warn level.
pub const WARN_LEVEL: &str = "pod-security.kubernetes.io/warn";
/// Pod Security Admission's namespace label for the warn version (validated, not used).
pub const WARN_VERSION: &str = "pod-security.kubernetes.io/warn-version";
/// Pod Security Admission's namespace label for the audit level.
pub const AUDIT_LEVEL: &str = "pod-security.kubernetes.io/audit";
/// Pod Security Admission's namespace label for the audit version (validated, not used).
pub const AUDIT_VERSION: &str = "pod-security.kubernetes.io/audit-version";

/// Audit-annotation keys. kube-apiserver prefixes a webhook's keys with the webhook's name, so these
/// are bare qualified-name parts.
pub mod audit {
    /// Why an exempt request was not evaluated: `namespace`, `user` or `runtimeClass`.
    pub const EXEMPT: &str = "exempt";
    /// Every enforce-level violation, whether it denied the request or was downgraded to a warning.
    pub const ENFORCE_VIOLATIONS: &str = "enforce-violations";
    /// Every audit-level violation.
    pub const AUDIT_VIOLATIONS: &str = "audit-violations";
    /// Invalid Pod Security labels on the namespace, and the level assumed instead.
    pub const NAMESPACE_LABEL_ERRORS: &str = "namespace-label-errors";
}
