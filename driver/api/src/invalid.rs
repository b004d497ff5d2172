//! The one error of this crate: what a pod or an object asks is not valid. The driver turns it
//! into INVALID_ARGUMENT, the admission plugin into a denial (or a workload's warning); the
//! message is the same in both.

/// A volume's attributes, a projection's spec or a key cannot be served as written; the message
/// names what is wrong, quoting at most a few hundred bytes of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// Result with [`Invalid`].
pub type Result<T, E = Invalid> = std::result::Result<T, E>;

impl Invalid {
    /// The same refusal with its message put in `context` (which source, which volume).
    pub fn in_context(self, context: impl FnOnce(String) -> String) -> Invalid {
        Invalid(context(self.0))
    }
}
