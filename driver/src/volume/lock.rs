//! One driver per state directory: an exclusive lock on `<stateDir>/driver.lock`, held for the
//! life of the process (the kernel drops it when the process dies, SIGKILL included). A second
//! instance refuses to start before it reads a record, recovers anything or touches a socket.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::quote::quote_path;

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another driver holds it.
    #[error("{0}")]
    Held(String),
    /// A step of taking it failed. The message says both what was done and how it failed.
    #[error("{context}: {source}")]
    Step {
        /// What the driver was doing, naming the path.
        context: String,
        /// The underlying failure.
        #[source]
        source: crate::volume::error::Cause,
    },
}

fn step(context: String, source: impl Into<crate::volume::error::Cause>) -> LockError {
    LockError::Step { context, source: source.into() }
}

/// The lock file's name in the state directory.
pub const LOCK_FILE: &str = "driver.lock";

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct StateLock {
    _lock: Flock<File>,
}

impl StateLock {
    /// Takes the lock of `state_dir` (created if missing) without waiting, and writes this
    /// process's id into the lock file for the next one's message.
    pub fn acquire(state_dir: &Path) -> Result<StateLock, LockError> {
        std::fs::create_dir_all(state_dir)
            .map_err(|e| step(format!("creating the state directory {}", quote_path(state_dir)), e))?;
        let path = state_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| step(format!("opening {}", quote_path(&path)), e))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let pid = if holder.is_empty() || holder.len() > 20 { "unknown".into() } else { holder.to_string() };
                return Err(LockError::Held(format!(
                    "another sharedresource-csi-driver (pid {pid}) is running on the state directory {}; refusing to start",
                    quote_path(state_dir)
                )));
            }
            Err((_, errno)) => return Err(step(format!("locking {}", quote_path(&path)), errno)),
        };
        let written = lock
            .set_len(0)
            .and_then(|()| lock.rewind())
            .and_then(|()| lock.write_all(std::process::id().to_string().as_bytes()));
        written.map_err(|e| step(format!("writing {}", quote_path(&path)), e))?;
        Ok(StateLock { _lock: lock })
    }
}

impl StateLock {
    /// [`StateLock::acquire`], waiting up to `patience` for a holder that is letting go of it
    /// (a predecessor after a handover).
    pub fn acquire_within(state_dir: &Path, patience: std::time::Duration) -> Result<StateLock, LockError> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            match StateLock::acquire(state_dir) {
                Err(LockError::Held(_)) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                taken => return taken,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        let refused = StateLock::acquire(dir.path()).unwrap_err();
        let message = refused.to_string();
        assert!(
            message.starts_with(&format!("another sharedresource-csi-driver (pid {}) is running", std::process::id())),
            "{message}"
        );
        drop(first);
        StateLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_holder_that_wrote_no_pid_or_more_than_a_pid_is_named_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        // What the holder wrote, as the next instance reads it: nothing yet (taken, not yet
        // written), twenty bytes (shown), twenty-one (not a pid: not shown).
        for (written, shown) in
            [("", "unknown"), ("12345678901234567890", "12345678901234567890"), ("123456789012345678901", "unknown")]
        {
            std::fs::write(dir.path().join(LOCK_FILE), written).unwrap();
            let message = StateLock::acquire(dir.path()).unwrap_err().to_string();
            assert!(
                message.starts_with(&format!("another sharedresource-csi-driver (pid {shown}) is running")),
                "{written:?}: {message}"
            );
        }
        drop(first);
    }

    #[test]
    fn a_holder_letting_go_is_waited_for_within_the_patience_and_not_beyond() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        let refused = StateLock::acquire_within(dir.path(), std::time::Duration::from_millis(100)).unwrap_err();
        assert!(matches!(refused, LockError::Held(_)), "{refused}");
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(first);
        });
        StateLock::acquire_within(dir.path(), std::time::Duration::from_secs(60)).unwrap();
        letting_go.join().unwrap();
    }
}
