//! Driver errors, and the one place they become gRPC status codes.

use tonic::Status;

/// Why a CSI call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is malformed or asks for something this driver never does.
    #[error("{0}")]
    InvalidArgument(String),
    /// The share, or the object it is backed by, does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The pod's service account may not use the share.
    #[error("{0}")]
    PermissionDenied(String),
    /// The target is already published with different arguments.
    #[error("{0}")]
    AlreadyExists(String),
    /// The target is in a state the driver will not change: something it did not make is
    /// mounted there.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Another operation on the same volume or target is under way; retry.
    #[error("{0}")]
    Aborted(String),
    /// The volume's content cannot be served now.
    #[error("{0}")]
    Unavailable(String),
    /// The volume's content does not fit its size limit.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A local failure (a mount, a file).
    #[error("{0}")]
    Internal(String),
}

/// Result with a driver error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether a content source's error says the content may no longer be had (access refused,
    /// the share, projection or object gone, a request or object that is invalid), as opposed
    /// to: not now (the apiserver did not answer, a local failure). A refresh empties a volume
    /// on the first and keeps its content on the second. The one place this rule is written.
    pub fn withdraws_content(&self) -> bool {
        matches!(
            self,
            Error::InvalidArgument(_) | Error::NotFound(_) | Error::PermissionDenied(_) | Error::FailedPrecondition(_)
        )
    }
}

/// The longest message sent to a client. Messages quote input through `quote` already; this is
/// the backstop, so that no path through the code can echo a megabyte back, nor a `%` that
/// kubelet's event formatting would read as a verb.
const MAX_MESSAGE_BYTES: usize = 1024;

fn bounded(message: String) -> String {
    crate::quote::bounded(crate::quote::without_percent(message), MAX_MESSAGE_BYTES)
}

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        match error {
            Error::InvalidArgument(message) => Status::invalid_argument(bounded(message)),
            Error::NotFound(message) => Status::not_found(bounded(message)),
            Error::PermissionDenied(message) => Status::permission_denied(bounded(message)),
            Error::AlreadyExists(message) => Status::already_exists(bounded(message)),
            Error::FailedPrecondition(message) => Status::failed_precondition(bounded(message)),
            Error::Aborted(message) => Status::aborted(bounded(message)),
            Error::Unavailable(message) => Status::unavailable(bounded(message)),
            Error::ResourceExhausted(message) => Status::resource_exhausted(bounded(message)),
            Error::Internal(message) => Status::internal(bounded(message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn each_error_has_its_grpc_code() {
        assert_eq!(Status::from(Error::InvalidArgument("a".into())).code(), Code::InvalidArgument);
        assert_eq!(Status::from(Error::AlreadyExists("a".into())).code(), Code::AlreadyExists);
        assert_eq!(Status::from(Error::NotFound("a".into())).code(), Code::NotFound);
        assert_eq!(Status::from(Error::PermissionDenied("a".into())).code(), Code::PermissionDenied);
        assert_eq!(Status::from(Error::Aborted("a".into())).code(), Code::Aborted);
        assert_eq!(Status::from(Error::Unavailable("a".into())).code(), Code::Unavailable);
        assert_eq!(Status::from(Error::Internal("a".into())).code(), Code::Internal);
        assert_eq!(Status::from(Error::ResourceExhausted("a".into())).code(), Code::ResourceExhausted);
        assert_eq!(Status::from(Error::NotFound("a %2f".into())).message(), "a \\u{25}2f", "no raw % reaches kubelet");
        assert_eq!(Status::from(Error::FailedPrecondition("a".into())).code(), Code::FailedPrecondition);
        assert_eq!(Status::from(Error::Internal("disk full".into())).message(), "disk full");
        let huge = Status::from(Error::Internal("x".repeat(1 << 20)));
        assert_eq!(huge.message().len(), 1024 + 3, "no message reaches the wire unbounded");
    }
}
