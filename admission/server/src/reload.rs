//! Polling files for changes: serving certificates and the standalone cluster state are both
//! re-read on an interval and swapped in only when valid.

use std::time::Duration;

use tokio::sync::watch;

/// What a reload check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The file is as last seen.
    Unchanged,
    /// New content is now in use.
    Reloaded,
    /// The file changed but is unusable; the previous content is still in use.
    Rejected(String),
}

/// Runs `check` every `interval` until `shutdown` turns true.
pub async fn poll(interval: Duration, mut shutdown: watch::Receiver<bool>, check: impl Fn()) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => check(),
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}
