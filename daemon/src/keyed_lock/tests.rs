use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_per_key_at_a_time() {
    let locks = KeyedLocks::new();
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let locks = locks.clone();
            let inside = Arc::clone(&inside);
            tokio::spawn(async move {
                let _g = locks.lock("vol-1").await;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    assert!(locks.is_empty());
}

#[tokio::test]
async fn other_keys_are_independent() {
    let locks = KeyedLocks::new();
    let _a = locks.lock("vol-1").await;
    let b = locks.lock_timeout("vol-2", Duration::from_millis(10)).await;
    assert!(b.is_ok());
    assert_eq!(locks.len(), 2);
}

#[tokio::test]
async fn a_bounded_wait_times_out_while_the_key_is_held() {
    let locks = KeyedLocks::new();
    let held = locks.lock("vol-1").await;
    let wait = Duration::from_millis(50);
    let err = locks
        .lock_timeout("vol-1", wait)
        .await
        .expect_err("held elsewhere");
    assert_eq!(err, TimedOut(wait));
    // The waiter that gave up left nothing behind.
    assert_eq!(locks.len(), 1);
    drop(held);
    assert!(locks.is_empty());
    assert!(locks.lock_timeout("vol-1", wait).await.is_ok());
}

#[tokio::test]
async fn a_waiter_gets_the_key_when_it_is_released() {
    let locks = KeyedLocks::new();
    let held = locks.lock("vol-1").await;
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .lock_timeout("vol-1", Duration::from_secs(10))
                .await
                .map(|g| *g.key())
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(held);
    assert_eq!(waiter.await.expect("task"), Ok("vol-1"));
    assert!(locks.is_empty());
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_nothing_behind() {
    let locks = KeyedLocks::new();
    let held = locks.lock("vol-1").await;
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let _g = locks.lock("vol-1").await;
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    waiter.abort();
    assert!(waiter.await.is_err());
    drop(held);
    assert!(locks.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_in_any_order_do_not_deadlock() {
    let locks = KeyedLocks::new();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let locks = locks.clone();
            tokio::spawn(async move {
                // Half the tasks name the keys backwards, with a duplicate.
                let keys = if i % 2 == 0 {
                    vec!["a", "b", "c"]
                } else {
                    vec!["c", "b", "a", "b"]
                };
                let guards = locks.lock_many(keys).await;
                let held: Vec<&str> = guards.iter().map(|g| *g.key()).collect();
                tokio::task::yield_now().await;
                held
            })
        })
        .collect();
    let all = async {
        for t in tasks {
            assert_eq!(t.await.expect("task"), ["a", "b", "c"]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect("no deadlock");
    assert!(locks.is_empty());
}

#[tokio::test]
async fn lock_many_of_nothing_holds_nothing() {
    let locks: KeyedLocks<&str> = KeyedLocks::new();
    assert!(locks.lock_many([]).await.is_empty());
    assert!(locks.is_empty());
}

#[test]
fn try_lock_refuses_a_held_key_and_takes_it_once_released() {
    let locks = KeyedLocks::new();
    let first = locks.try_lock("vol-1");
    assert!(first.is_some());
    assert!(locks.try_lock("vol-1").is_none());
    // Other keys are independent.
    assert!(locks.try_lock("vol-2").is_some());
    drop(first);
    assert!(locks.is_empty());
    assert!(locks.try_lock("vol-1").is_some());
}

#[tokio::test]
async fn try_lock_refuses_a_key_taken_by_lock() {
    let locks = KeyedLocks::new();
    let _held = locks.lock("vol-1").await;
    assert!(locks.try_lock("vol-1").is_none());
}

#[test]
fn the_key_is_released_when_the_operation_panics() {
    let locks = KeyedLocks::new();
    let cloned = locks.clone();
    let result = std::thread::spawn(move || {
        let _guard = cloned.try_lock("vol-1");
        panic!("operation failed");
    })
    .join();
    assert!(result.is_err());
    assert!(locks.is_empty());
    assert!(locks.try_lock("vol-1").is_some());
}

#[test]
fn only_one_of_many_concurrent_callers_gets_the_key() {
    let locks = KeyedLocks::new();
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let winners: Vec<_> = (0..8)
        .map(|_| {
            let locks = locks.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let guard = locks.try_lock(7u32);
                // Hold it until everyone has tried.
                barrier.wait();
                guard.is_some()
            })
        })
        .collect();
    let won = winners
        .into_iter()
        .map(|h| h.join().unwrap_or(false))
        .filter(|&w| w)
        .count();
    assert_eq!(won, 1);
    assert!(locks.is_empty());
}

#[test]
fn the_map_is_empty_once_every_guard_of_many_threads_drops() {
    let locks = KeyedLocks::new();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let locks = locks.clone();
            std::thread::spawn(move || {
                for i in 0..500u32 {
                    let _g = locks.try_lock((t + i) % 5);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert!(locks.is_empty());
}
