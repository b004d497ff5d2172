//! The memory bound on request bodies: every body being read or decided holds a reservation of
//! its size against one budget for the whole server, so however many clients send 3 MiB reviews
//! at once, the bodies in memory never exceed the budget. A request that does not fit is answered
//! 429 with Retry-After at once, before any of its body is read; kube-apiserver's webhook client
//! then fails that call by the webhook's failurePolicy, never the whole process by OOM.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A budget of bytes shared by all requests.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: u32,
}

/// A reservation; dropping it gives the bytes back.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
}

impl BodyBudget {
    /// A budget of `total` bytes (at most 4 GiB).
    pub fn new(total: usize) -> BodyBudget {
        let total = u32::try_from(total).unwrap_or(u32::MAX);
        BodyBudget { bytes: Arc::new(Semaphore::new(total as usize)), total }
    }

    /// Reserves `size` bytes now, or `None` when they are not available.
    pub fn try_reserve(&self, size: usize) -> Option<Reservation> {
        let size = u32::try_from(size).ok()?.max(1);
        if size > self.total {
            return None;
        }
        self.bytes.clone().try_acquire_many_owned(size).ok().map(|permit| Reservation { _permit: permit })
    }

    /// Bytes not reserved right now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_the_budget_and_give_back_on_drop() {
        let budget = BodyBudget::new(10);
        assert_eq!(budget.available(), 10);
        let whole = budget.try_reserve(10).expect("a body as large as the whole budget fits an idle server");
        assert_eq!(budget.available(), 0);
        drop(whole);
        let six = budget.try_reserve(6).unwrap();
        assert_eq!(budget.available(), 4);
        assert!(budget.try_reserve(5).is_none(), "over budget");
        let four = budget.try_reserve(4).unwrap();
        assert_eq!(budget.available(), 0);
        drop(six);
        assert!(budget.try_reserve(5).is_some());
        drop(four);
        assert!(budget.try_reserve(11).is_none(), "larger than the whole budget");
        assert!(budget.try_reserve(0).is_some(), "an empty body still counts as one byte");
    }
}
