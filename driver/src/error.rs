//! Driver errors, and the one place they become gRPC status codes.

use tonic::Status;

/// Why a CSI call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is malformed or asks for something this driver never does.
    #[error("{0}")]
    InvalidArgument(String),
    /// The target is already published with different arguments.
    #[error("{0}")]
    AlreadyExists(String),
    /// Another operation on the same target is under way; retry.
    #[error("{0}")]
    Aborted(String),
    /// The volume's content cannot be served now.
    #[error("{0}")]
    Unavailable(String),
    /// A local failure (a mount, a file).
    #[error("{0}")]
    Internal(String),
}

/// Result with a driver error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        match error {
            Error::InvalidArgument(message) => Status::invalid_argument(message),
            Error::AlreadyExists(message) => Status::already_exists(message),
            Error::Aborted(message) => Status::aborted(message),
            Error::Unavailable(message) => Status::unavailable(message),
            Error::Internal(message) => Status::internal(message),
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
        assert_eq!(Status::from(Error::Aborted("a".into())).code(), Code::Aborted);
        assert_eq!(Status::from(Error::Unavailable("a".into())).code(), Code::Unavailable);
        assert_eq!(Status::from(Error::Internal("a".into())).code(), Code::Internal);
        assert_eq!(Status::from(Error::Internal("disk full".into())).message(), "disk full");
    }
}
