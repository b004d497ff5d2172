//! Errors on the CSI wire, and the one place any error of the driver becomes a gRPC status:
//! the request's own faults, the volume layer's and, through it, the content layer's.

use tonic::{Code, Status};

use crate::{content, volume};

/// Why a CSI call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed or asks for what this driver never does (a writable or block
    /// volume, a persistent one, missing pod information).
    #[error("{0}")]
    Request(String),
    /// The volume layer, or the content layer through it, refused or failed.
    #[error(transparent)]
    Volume(#[from] volume::error::Error),
    /// The blocking task that ran the operation did not finish (it panicked).
    #[error("the operation failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Result with a CSI error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<content::error::Error> for Error {
    fn from(error: content::error::Error) -> Error {
        Error::Volume(error.into())
    }
}

/// The longest message sent to a client. Messages quote input through `quote` already; this is
/// the backstop, so that no path through the code can echo a megabyte back, nor a `%` that
/// kubelet's event formatting would read as a verb.
const MAX_MESSAGE_BYTES: usize = 1024;

/// The code the CSI specification gives each failure; kubelet retries on every one, and the
/// code tells the operator (and csi-sanity) which kind of failure it was.
fn code(error: &Error) -> Code {
    use content::error::Error as Content;
    use volume::error::Error as Volume;
    match error {
        Error::Request(_) => Code::InvalidArgument,
        Error::Task(_) => Code::Internal,
        Error::Volume(volume) => match volume {
            Volume::Refused(_) => Code::InvalidArgument,
            Volume::Busy(_) => Code::Aborted,
            Volume::Conflict(_) => Code::AlreadyExists,
            Volume::Foreign(_) => Code::FailedPrecondition,
            Volume::TooLarge(_) | Volume::OverBudget(_) => Code::ResourceExhausted,
            Volume::Local { .. } | Volume::Fault(_) => Code::Internal,
            // The driver is being replaced: kubelet's retry reaches the successor.
            Volume::Handover(_) => Code::Unavailable,
            Volume::Content(content) => match content {
                Content::Invalid(_) => Code::InvalidArgument,
                Content::Missing(_) => Code::NotFound,
                Content::Denied(_) => Code::PermissionDenied,
                Content::Unservable(_) => Code::FailedPrecondition,
                Content::TooLarge(_) => Code::ResourceExhausted,
                Content::Unavailable(_) => Code::Unavailable,
                Content::Internal(_) => Code::Internal,
            },
        },
    }
}

impl Error {
    /// The failure's kind as the metrics' `error_type` label names it.
    pub fn error_type(&self) -> &'static str {
        match self {
            Error::Request(_) => "InvalidRequest",
            Error::Task(_) => "TaskFailed",
            Error::Volume(volume) => volume.error_type(),
        }
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        let message = crate::quote::without_percent(error.to_string());
        Status::new(code(&error), crate::quote::bounded(message, MAX_MESSAGE_BYTES))
    }
}

#[cfg(test)]
mod tests {
    use content::error::Error as Content;
    use volume::error::Error as Volume;

    use super::*;

    fn status(error: impl Into<Error>) -> Status {
        Status::from(error.into())
    }

    #[test]
    fn each_error_has_the_code_the_specification_gives_it() {
        let cases: Vec<(Error, Code)> = vec![
            (Error::Request("a".into()), Code::InvalidArgument),
            (Volume::Refused("a".into()).into(), Code::InvalidArgument),
            (Volume::Busy("a".into()).into(), Code::Aborted),
            (Volume::Conflict("a".into()).into(), Code::AlreadyExists),
            (Volume::Foreign("a".into()).into(), Code::FailedPrecondition),
            (Volume::TooLarge("a".into()).into(), Code::ResourceExhausted),
            (Volume::OverBudget("a".into()).into(), Code::ResourceExhausted),
            (Volume::local("a", std::io::Error::other("b")).into(), Code::Internal),
            (Volume::Fault("a".into()).into(), Code::Internal),
            (Volume::Handover("a".into()).into(), Code::Unavailable),
            (Content::Invalid("a".into()).into(), Code::InvalidArgument),
            (Content::Missing("a".into()).into(), Code::NotFound),
            (Content::Denied("a".into()).into(), Code::PermissionDenied),
            (Content::Unservable("a".into()).into(), Code::FailedPrecondition),
            (Content::TooLarge("a".into()).into(), Code::ResourceExhausted),
            (Content::Unavailable("a".into()).into(), Code::Unavailable),
            (Content::Internal("a".into()).into(), Code::Internal),
        ];
        let mut error_types = std::collections::BTreeSet::new();
        for (error, code) in cases {
            let described = format!("{error:?}");
            assert!(error_types.insert(error.error_type()), "{described}: error_type {} twice", error.error_type());
            assert_eq!(Status::from(error).code(), code, "{described}");
        }
    }

    #[test]
    fn error_types_name_the_failure_not_its_message() {
        let cases: Vec<(Error, &str)> = vec![
            (Error::Request("readonly is required".into()), "InvalidRequest"),
            (Volume::OverBudget("namespace a over 64 MiB".into()).into(), "OverBudget"),
            (Volume::TooLarge("6 MiB into a 4 MiB tmpfs".into()).into(), "TmpfsTooSmall"),
            (Content::Missing("Secret \"x\" not found".into()).into(), "ObjectNotFound"),
            (Content::Denied("may not use".into()).into(), "AccessDenied"),
            (Content::Unavailable("timed out".into()).into(), "ApiserverUnavailable"),
        ];
        for (error, error_type) in cases {
            assert_eq!(error.error_type(), error_type, "{error:?}");
        }
    }

    #[test]
    fn a_local_failure_says_what_was_done_and_how_it_failed() {
        let error = Volume::local("mounting \"/t\"", std::io::Error::from_raw_os_error(nix::libc::EPERM));
        assert!(std::error::Error::source(&error).is_some(), "the cause is kept");
        assert_eq!(status(error).message(), "mounting \"/t\": Operation not permitted (os error 1)");
    }

    #[test]
    fn messages_reach_the_wire_bounded_and_free_of_percent() {
        assert_eq!(status(Content::Missing("a %2f".into())).message(), "a \\u{25}2f", "no raw % reaches kubelet");
        assert_eq!(status(Volume::Fault("disk full".into())).message(), "disk full");
        let huge = status(Volume::Fault("x".repeat(1 << 20)));
        assert_eq!(huge.message().len(), 1024 + 3, "no message reaches the wire unbounded");
    }
}
