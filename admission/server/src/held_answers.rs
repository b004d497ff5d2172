//! Answers held for a short time and asked once: the first request for a key asks, the ones that
//! come while it asks wait for that answer, and the answer serves every request for the key for
//! `ttl`. A burst of pods from one Deployment so costs one question per key, and two keys never
//! wait for each other (no lock is held while asking). A failure is handed to the requests that
//! waited for it but not held, so the next request asks again.

use std::future::Future;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;
use tokio::sync::watch;

/// How a request was answered (its metric label is the variant's name in snake case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Served {
    /// From an answer held since an earlier question.
    Held,
    /// By waiting for a question another request was asking.
    Joined,
    /// By asking.
    Asked,
}

enum Slot<V> {
    Ready(Instant, V),
    Asking(watch::Receiver<Option<Result<V, String>>>),
}

/// What a request does, decided under the lock and done after it.
enum Next<V> {
    Held(V),
    Join(watch::Receiver<Option<Result<V, String>>>),
    Ask(watch::Sender<Option<Result<V, String>>>),
}

/// Answers by key, held for a time, asked once at a time per key.
pub struct HeldAnswers<K: Hash + Eq, V> {
    slots: Mutex<LruCache<K, Slot<V>>>,
    ttl: Duration,
}

impl<K: Hash + Eq + Clone, V: Clone> HeldAnswers<K, V> {
    /// At most `capacity` keys, each answer held for `ttl`.
    pub fn new(capacity: NonZeroUsize, ttl: Duration) -> HeldAnswers<K, V> {
        HeldAnswers { slots: Mutex::new(LruCache::new(capacity)), ttl }
    }

    /// The answer for `key`: held, joined, or asked by `ask`.
    pub async fn answer<F>(&self, key: &K, ask: impl FnOnce() -> F) -> (Result<V, String>, Served)
    where
        F: Future<Output = Result<V, String>>,
    {
        let mut ask = Some(ask);
        loop {
            let next = {
                let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                match slots.get(key) {
                    Some(Slot::Ready(at, value)) if at.elapsed() < self.ttl => Next::Held(value.clone()),
                    // `has_changed` fails once the asker is gone (its request dropped mid-question).
                    Some(Slot::Asking(receiver)) if receiver.has_changed().is_ok() => Next::Join(receiver.clone()),
                    _ => {
                        let (sender, receiver) = watch::channel(None);
                        slots.put(key.clone(), Slot::Asking(receiver));
                        Next::Ask(sender)
                    }
                }
            };
            match next {
                Next::Held(value) => return (Ok(value), Served::Held),
                Next::Ask(sender) => {
                    let Some(ask) = ask.take() else {
                        return (Err("the question was already asked once for this request".into()), Served::Asked);
                    };
                    return (self.ask(key, sender, ask).await, Served::Asked);
                }
                Next::Join(mut waiting) => {
                    if let Ok(answer) = waiting.wait_for(Option::is_some).await
                        && let Some(answer) = answer.clone()
                    {
                        return (answer, Served::Joined);
                    }
                    // The asker went away without an answer: ask in its place.
                }
            }
        }
    }

    async fn ask<F>(
        &self,
        key: &K,
        sender: watch::Sender<Option<Result<V, String>>>,
        ask: impl FnOnce() -> F,
    ) -> Result<V, String>
    where
        F: Future<Output = Result<V, String>>,
    {
        let answer = ask().await;
        {
            let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match &answer {
                Ok(value) => {
                    slots.put(key.clone(), Slot::Ready(Instant::now(), value.clone()));
                }
                Err(_) => {
                    slots.pop(key);
                }
            }
        }
        sender.send_replace(Some(answer.clone()));
        answer
    }
}

#[cfg(test)]
mod tests;
