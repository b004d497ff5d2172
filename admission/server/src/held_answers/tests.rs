//! One question per key under a burst, held answers, failures not held, an asker that goes away.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

use super::*;

fn answers(ttl: Duration) -> Arc<HeldAnswers<&'static str, u32>> {
    Arc::new(HeldAnswers::new(NonZeroUsize::new(16).unwrap(), ttl))
}

#[tokio::test]
async fn a_burst_for_one_key_asks_once_and_every_request_gets_the_answer() {
    let held = answers(Duration::from_secs(60));
    let asked = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Notify::new());
    let mut requests = Vec::new();
    for _ in 0..100 {
        let (held, asked, release) = (held.clone(), asked.clone(), release.clone());
        requests.push(tokio::spawn(async move {
            held.answer(&"team-a/web:db", || async move {
                asked.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
                Ok(7)
            })
            .await
        }));
    }
    // Every request is waiting (one asking, the others joined) before the answer comes.
    while asked.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    release.notify_one();
    let mut served = Vec::new();
    for request in requests {
        let (answer, how) = request.await.unwrap();
        assert_eq!(answer, Ok(7));
        served.push(how);
    }
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(served.iter().filter(|s| **s == Served::Asked).count(), 1);
    assert_eq!(held.answer(&"team-a/web:db", || async { Ok(8) }).await, (Ok(7), Served::Held));
}

#[tokio::test]
async fn another_key_does_not_wait_for_a_slow_one() {
    let held = answers(Duration::from_secs(60));
    let slow = held.clone();
    let _stuck = tokio::spawn(async move { slow.answer(&"slow", std::future::pending).await });
    tokio::task::yield_now().await;
    assert_eq!(held.answer(&"fast", || async { Ok(1) }).await, (Ok(1), Served::Asked));
}

#[tokio::test]
async fn a_failure_reaches_the_waiters_and_is_not_held() {
    let held = answers(Duration::from_secs(60));
    assert_eq!(
        held.answer(&"k", || async { Err("timed out".to_string()) }).await,
        (Err("timed out".into()), Served::Asked)
    );
    assert_eq!(held.answer(&"k", || async { Ok(3) }).await, (Ok(3), Served::Asked), "asked again");
}

#[tokio::test]
async fn an_answer_is_held_within_its_ttl_and_a_zero_ttl_holds_nothing() {
    let held = answers(Duration::from_secs(3600));
    assert_eq!(held.answer(&"k", || async { Ok(1) }).await.1, Served::Asked);
    assert_eq!(held.answer(&"k", || async { Ok(2) }).await, (Ok(1), Served::Held));
    let expired = HeldAnswers::<&str, u32>::new(NonZeroUsize::new(1).unwrap(), Duration::ZERO);
    assert_eq!(expired.answer(&"k", || async { Ok(1) }).await.1, Served::Asked);
    assert_eq!(expired.answer(&"k", || async { Ok(2) }).await, (Ok(2), Served::Asked));
}

#[tokio::test]
async fn a_request_dropped_while_asking_leaves_the_key_to_be_asked_again() {
    let held = answers(Duration::from_secs(60));
    let dropped = held.clone();
    let (started, asked) = tokio::sync::oneshot::channel();
    let asking = tokio::spawn(async move {
        dropped
            .answer(&"k", move || {
                let _ = started.send(());
                std::future::pending()
            })
            .await
    });
    // The key is being asked about before the asker goes away, however busy the machine.
    asked.await.expect("the first request asks");
    asking.abort();
    let _ = asking.await;
    let answer = tokio::time::timeout(Duration::from_secs(10), held.answer(&"k", || async { Ok(4) })).await;
    assert_eq!(answer.unwrap(), (Ok(4), Served::Asked));
}
