//! Why a volume may not have its content, in the content layer's own terms. Which of them
//! withdraw content already served is decided here; which gRPC code each becomes is decided
//! at the wire (`csi::error`), never here.

/// Why a content source could not give a volume its files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The volume's attributes, a projection's spec or an object's data cannot be served as
    /// asked (a name that is no name, a key that is no file name, paths that collide).
    #[error("{0}")]
    Invalid(String),
    /// The share, projection, backing object or pod does not exist.
    #[error("{0}")]
    Missing(String),
    /// The pod's service account may not use the share.
    #[error("{0}")]
    Denied(String),
    /// What the volume asks for exists but cannot be served as it stands: a share naming an
    /// object that cannot exist, an item's key missing from its object, a pod field this
    /// node's driver does not read.
    #[error("{0}")]
    Unservable(String),
    /// The content is larger than a volume may hold: refused before it is held in memory
    /// (a refresh keeps the content the volume has).
    #[error("{0}")]
    TooLarge(String),
    /// The apiserver did not answer, or not in time: the content may be had later.
    #[error("{0}")]
    Unavailable(String),
    /// A fault of the driver itself (a step skipped that should have run).
    #[error("{0}")]
    Internal(String),
}

// A request the apiserver did not answer is content that may be had later.
impl From<crate::apiserver::request::RequestFailed> for Error {
    fn from(failed: crate::apiserver::request::RequestFailed) -> Error {
        Error::Unavailable(failed.0)
    }
}

// The vocabulary crate's refusal (attributes, a projection's spec, a key) is this layer's
// `Invalid`: the words stay, the code is decided at the wire.
impl From<sharedresource_api::Invalid> for Error {
    fn from(invalid: sharedresource_api::Invalid) -> Error {
        Error::Invalid(invalid.0)
    }
}

/// Result with a content error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The failure's kind as the metrics' `error_type` label names it (PascalCase, as the
    /// Secrets Store CSI Driver's are): a closed set, so the label's values are bounded.
    pub fn error_type(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "InvalidContentRequest",
            Error::Missing(_) => "ObjectNotFound",
            Error::Denied(_) => "AccessDenied",
            Error::Unservable(_) => "Unservable",
            Error::TooLarge(_) => "ContentTooLarge",
            Error::Unavailable(_) => "ApiserverUnavailable",
            Error::Internal(_) => "ContentInternal",
        }
    }

    /// Whether the error says the content may no longer be had (access refused; the share,
    /// projection or object gone; a request or object that cannot be served), as opposed to:
    /// not now (the apiserver did not answer, a fault of the driver). A refresh empties a
    /// volume on the first and keeps its content on the second. The one place this rule is
    /// written.
    pub fn withdraws_content(&self) -> bool {
        matches!(self, Error::Invalid(_) | Error::Missing(_) | Error::Denied(_) | Error::Unservable(_))
    }

    /// The same error with its message put in `context` (which projection, which source).
    pub fn in_context(self, context: impl FnOnce(String) -> String) -> Error {
        match self {
            Error::Invalid(message) => Error::Invalid(context(message)),
            Error::Missing(message) => Error::Missing(context(message)),
            Error::Denied(message) => Error::Denied(context(message)),
            Error::Unservable(message) => Error::Unservable(context(message)),
            Error::TooLarge(message) => Error::TooLarge(context(message)),
            Error::Unavailable(message) => Error::Unavailable(context(message)),
            Error::Internal(message) => Error::Internal(context(message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_absences_withdraw_content_and_outages_do_not() {
        for withdrawn in [
            Error::Invalid("a".into()),
            Error::Missing("a".into()),
            Error::Denied("a".into()),
            Error::Unservable("a".into()),
        ] {
            assert!(withdrawn.withdraws_content(), "{withdrawn:?}");
        }
        for kept in [Error::TooLarge("a".into()), Error::Unavailable("a".into()), Error::Internal("a".into())] {
            assert!(!kept.withdraws_content(), "{kept:?}");
        }
    }

    #[test]
    fn context_keeps_the_kind_of_error() {
        let error = Error::Unservable("no key".into()).in_context(|message| format!("projection p: {message}"));
        assert_eq!(error, Error::Unservable("projection p: no key".into()));
    }
}
