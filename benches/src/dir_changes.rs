//! Changes of a set of directories, told by inotify: which of them changed since the last look.
//! A benchmark that waits for hundreds of simulated nodes' volumes to change looks at a volume
//! when the kernel says its directory changed, instead of looking at every volume every few
//! milliseconds: those looks ran on the core the simulated drivers share, and were a fifth of
//! its CPU samples (perf) while revocations were timed at 200 nodes.

use std::collections::HashMap;
use std::os::fd::AsFd as _;
use std::path::Path;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::mpsc;

/// What an atomic writer's content change does in a volume's directory: a link made or removed
/// (a key added or gone), `..data` renamed into place (the content swapped).
const CHANGES: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVED_FROM);

/// How long the reading thread waits on the kernel before it looks whether it is still wanted.
const STILL_WANTED_EVERY: u16 = 100;

/// Watches of directories `0..n`, by their index, read by a thread of their own (the kernel's
/// queue is waited on with poll(2), no async registration of a raw descriptor needed); the
/// thread ends within [`STILL_WANTED_EVERY`] ms of this being dropped.
pub struct DirChanges {
    told: mpsc::UnboundedReceiver<Changed>,
}

/// What one wait told.
#[derive(Debug, PartialEq, Eq)]
pub enum Changed {
    /// These directories (by index; an index may repeat) changed.
    Some(Vec<usize>),
    /// Any may have changed: the kernel's queue overflowed, or nothing was told within the wait
    /// (look at every directory).
    Any,
}

impl DirChanges {
    /// Watches `dirs`. A change made after this returns is told; look at each directory once
    /// after it, for what changed before.
    pub fn watch<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Result<DirChanges, String> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| format!("starting inotify: {e}"))?;
        let mut index_of = HashMap::new();
        for (index, dir) in dirs.into_iter().enumerate() {
            let watch = inotify.add_watch(dir, CHANGES).map_err(|e| format!("watching {}: {e}", dir.display()))?;
            index_of.insert(watch, index);
        }
        let (tell, told) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("dir-changes".into())
            .spawn(move || read(&inotify, &index_of, &tell))
            .map_err(|e| format!("starting inotify's reader: {e}"))?;
        Ok(DirChanges { told })
    }

    /// Waits at most `within` for changes; what changed (everything told by then).
    pub async fn next(&mut self, within: Duration) -> Result<Changed, String> {
        let first = match tokio::time::timeout(within, self.told.recv()).await {
            Err(_) => return Ok(Changed::Any),
            Ok(None) => return Err("inotify's reader ended".into()),
            Ok(Some(first)) => first,
        };
        let mut indices = Vec::new();
        let mut add = |changed: Changed| match changed {
            Changed::Some(more) => {
                indices.extend(more);
                true
            }
            Changed::Any => false,
        };
        if !add(first) {
            return Ok(Changed::Any);
        }
        while let Ok(more) = self.told.try_recv() {
            if !add(more) {
                return Ok(Changed::Any);
            }
        }
        Ok(Changed::Some(indices))
    }
}

/// The reading thread: tells each batch of events, until nobody listens or the kernel fails.
fn read(inotify: &Inotify, index_of: &HashMap<WatchDescriptor, usize>, tell: &mpsc::UnboundedSender<Changed>) {
    while !tell.is_closed() {
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(STILL_WANTED_EVERY)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let changed = match inotify.read_events() {
            Ok(events) if events.iter().any(|event| event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)) => Changed::Any,
            Ok(events) => Changed::Some(events.iter().filter_map(|event| index_of.get(&event.wd).copied()).collect()),
            Err(nix::errno::Errno::EAGAIN) => continue,
            // Said as "anything may have changed"; the receiver looks at every directory.
            Err(_) => Changed::Any,
        };
        if tell.send(changed).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_link_removed_in_one_directory_is_told_by_its_index() {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        std::os::unix::fs::symlink("..data/password", dirs[1].path().join("password")).unwrap();
        let mut changes = DirChanges::watch(dirs.iter().map(|dir| dir.path())).unwrap();
        assert_eq!(changes.next(Duration::from_millis(50)).await.unwrap(), Changed::Any, "nothing yet");
        std::fs::remove_file(dirs[1].path().join("password")).unwrap();
        // Waited on as the condition it is: `Any` (nothing told within a wait) waits again, and
        // only a cap far above any machine's delay ends the test.
        let started = std::time::Instant::now();
        let mut told = Vec::new();
        while told.is_empty() {
            assert!(started.elapsed() < Duration::from_secs(120), "the removal was not told");
            if let Changed::Some(indices) = changes.next(Duration::from_secs(1)).await.unwrap() {
                told = indices;
            }
        }
        assert_eq!(told, [1]);
    }
}
