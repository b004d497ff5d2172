//! How the cluster-wide controllers (`read_grants`, `rollout`) pace their passes: a pass after
//! any change, once the changes that come with it have arrived; a failed one again after a wait
//! that doubles up to a bound; otherwise every few minutes, to mend what no event told of.

use std::time::Duration;

use tokio::sync::Notify;

/// How long after a change a controller waits for the changes that come with it (objects created
/// together, its own writes coming back) before it acts.
const SETTLE: Duration = Duration::from_millis(200);
/// The first wait after a failed pass.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait before a failed pass is tried again.
const MAX_RETRY: Duration = Duration::from_secs(30);
/// How often everything is compared even when nothing was seen to change.
const RESYNC: Duration = Duration::from_secs(300);

/// The pacing of one controller's passes.
#[derive(Debug)]
pub struct PassPacing {
    retry: Duration,
}

impl Default for PassPacing {
    fn default() -> PassPacing {
        PassPacing { retry: FIRST_RETRY }
    }
}

impl PassPacing {
    /// How long to wait for a change after a pass that `failed` (or not) before the next pass.
    pub fn wait_after(&mut self, failed: bool) -> Duration {
        if failed {
            let wait = self.retry;
            self.retry = (self.retry * 2).min(MAX_RETRY);
            wait
        } else {
            self.retry = FIRST_RETRY;
            RESYNC
        }
    }

    /// Returns when the next pass is due: a change was told on `changed` (and settled), or the
    /// wait after a pass that `failed` (or not) is over.
    pub async fn next_pass(&mut self, changed: &Notify, failed: bool) {
        let wait = self.wait_after(failed);
        tokio::select! {
            _ = changed.notified() => tokio::time::sleep(SETTLE).await,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_to_the_bound_and_a_success_starts_over() {
        let mut pacing = PassPacing::default();
        let waits: Vec<u64> = (0..7).map(|_| pacing.wait_after(true).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(pacing.wait_after(false), RESYNC);
        assert_eq!(pacing.wait_after(true), FIRST_RETRY);
    }
}
