//! Why an operation on a volume failed, in the volume layer's terms. Which gRPC code each
//! becomes is decided at the wire (`csi::error`), never here.

use crate::content;

/// What a local step failed on underneath: an I/O error, an errno from a mount call, a task
/// that panicked.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why publishing, unpublishing or refreshing a volume failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The content layer could not give the volume its files.
    #[error(transparent)]
    Content(#[from] content::error::Error),
    /// The request's volume id or target path is not one this driver accepts (outside
    /// kubelet's layout, a symbolic link on the way).
    #[error("{0}")]
    Refused(String),
    /// Another operation on the same volume or target is under way; retrying will do.
    #[error("{0}")]
    Busy(String),
    /// The target already holds this volume published with other arguments, or another volume.
    #[error("{0}")]
    Conflict(String),
    /// Something the driver did not make is mounted at the target; the driver will not touch it.
    #[error("{0}")]
    Foreign(String),
    /// The content does not fit the volume's tmpfs.
    #[error("{0}")]
    TooLarge(String),
    /// The content would take the node's volumes, or its namespace's, beyond the content budget.
    #[error("{0}")]
    OverBudget(String),
    /// A local step (a mount, a file, the mount table) failed. The message says both what the
    /// driver was doing and how it failed, as the wire and the log show messages whole;
    /// `source` keeps the cause for code that inspects it.
    #[error("{context}: {source}")]
    Local {
        /// What the driver was doing, naming the path.
        context: String,
        /// The underlying failure.
        #[source]
        source: Cause,
    },
    /// A local step left the node other than it should have, with no underlying error to show
    /// (a directory gone right after it was made, a mount a moment ago that is not there).
    #[error("{0}")]
    Fault(String),
    /// A lazy volume could not be handed to a successor process, or what a predecessor handed
    /// over does not hold together.
    #[error("{0}")]
    Handover(String),
}

/// Result with a volume error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The failure's kind as the metrics' `error_type` label names it; the content layer's
    /// failures by their own kinds.
    pub fn error_type(&self) -> &'static str {
        match self {
            Error::Content(content) => content.error_type(),
            Error::Refused(_) => "TargetRefused",
            Error::Busy(_) => "Busy",
            Error::Conflict(_) => "Conflict",
            Error::Foreign(_) => "ForeignMount",
            Error::TooLarge(_) => "TmpfsTooSmall",
            Error::OverBudget(_) => "OverBudget",
            Error::Local { .. } => "LocalFailure",
            Error::Fault(_) => "LocalFault",
            Error::Handover(_) => "Handover",
        }
    }

    /// A local step that failed: `context` says what the driver was doing, `source` how it failed.
    pub fn local(context: impl Into<String>, source: impl Into<Cause>) -> Error {
        Error::Local { context: context.into(), source: source.into() }
    }
}
