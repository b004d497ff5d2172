//! Why a plugin rejected a request, in kube-apiserver's terms.

/// An admission failure. Each variant becomes one HTTP status in [`crate::review`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The request violates policy (403 Forbidden).
    #[error("{0}")]
    Forbidden(String),
    /// The object is well-formed but its content is not acceptable (422 Invalid).
    #[error("{0}")]
    Invalid(String),
    /// The request is malformed (400 BadRequest), e.g. an object that does not decode as its kind.
    #[error("{0}")]
    BadRequest(String),
    /// The request cannot be judged right now (500 InternalError), e.g. cluster facts unavailable.
    #[error("{0}")]
    Internal(String),
}

/// Result with an admission error.
pub type Result<T, E = AdmissionError> = std::result::Result<T, E>;
