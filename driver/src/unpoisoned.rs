//! Locks taken as a panicking holder left them. Every lock of the driver guards data that each
//! step keeps whole (an entry inserted or removed, a count moved, a flag set), so a thread that
//! panicked while holding one leaves it usable: the next holder takes it as it is, rather than
//! panicking in turn and taking every volume of the node down with one bug.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] that takes a poisoned mutex as it is.
pub trait UnpoisonedMutex<T> {
    /// The mutex, held.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> UnpoisonedMutex<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] that take a poisoned lock as it is.
pub trait UnpoisonedRwLock<T> {
    /// The lock, held shared.
    fn shared(&self) -> RwLockReadGuard<'_, T>;
    /// The lock, held exclusively.
    fn exclusive(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> UnpoisonedRwLock<T> for RwLock<T> {
    fn shared(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn exclusive(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, RwLock};

    use super::*;

    #[test]
    fn a_mutex_poisoned_by_a_panicking_holder_is_taken_as_it_was_left() {
        let shared = Arc::new(Mutex::new(vec![1]));
        let holder = shared.clone();
        let _ = std::thread::spawn(move || {
            let mut held = holder.lock().unwrap();
            held.push(2);
            panic!("a bug while holding the lock");
        })
        .join();
        assert!(shared.is_poisoned());
        assert_eq!(*shared.locked(), vec![1, 2]);
    }

    #[test]
    fn a_poisoned_rwlock_is_read_and_written_as_it_was_left() {
        let shared = Arc::new(RwLock::new(1));
        let holder = shared.clone();
        let _ = std::thread::spawn(move || {
            let mut held = holder.write().unwrap();
            *held = 2;
            panic!("a bug while holding the lock");
        })
        .join();
        assert!(shared.is_poisoned());
        assert_eq!(*shared.shared(), 2);
        *shared.exclusive() = 3;
        assert_eq!(*shared.shared(), 3);
    }
}
