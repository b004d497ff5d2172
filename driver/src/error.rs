//! Why the driver could not start, or stopped serving. These reach the log and the exit status,
//! never a gRPC client, so nothing here has a status code (the wire's mapping is
//! `csi::error`).

use crate::volume;

/// Why the driver could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The state directory's lock could not be taken (another driver holds it).
    #[error(transparent)]
    Lock(#[from] volume::lock::LockError),
    /// A step of starting or serving failed. The message says both what the driver was doing
    /// and how it failed; `source` keeps the cause.
    #[error("{context}: {source}")]
    Step {
        /// What the driver was doing, naming the path or address.
        context: String,
        /// The underlying failure.
        #[source]
        source: volume::error::Cause,
    },
    /// Another driver holds the node and offered a handover, which failed: that driver keeps
    /// serving everything.
    #[error("{0}")]
    Handover(String),
    /// The configuration cannot be run as it stands (checked again where it is used).
    #[error("{0}")]
    Config(String),
    /// A socket could not be bound, taken over or served.
    #[error(transparent)]
    Socket(#[from] crate::csi::socket::SocketError),
    /// The volume records of an earlier run could not be read.
    #[error(transparent)]
    Records(#[from] volume::error::Error),
}

/// Result with a run error.
pub type Result<T, E = RunError> = std::result::Result<T, E>;

impl RunError {
    /// A step that failed: `context` says what the driver was doing, `source` how it failed.
    pub fn step(context: impl Into<String>, source: impl Into<volume::error::Cause>) -> RunError {
        RunError::Step { context: context.into(), source: source.into() }
    }
}
