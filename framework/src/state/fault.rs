//! A store layer that injects faults, for tests and demos of the exactly-once guarantee:
//! an invocation that crashes part-way through its state writes (as a timeout or an out-of-
//! memory kill would), and random delays that make concurrent invocations (zombies, several
//! partitions on one key) interleave their writes at the store.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    ClaimedWindow, Clock, ClosedWindow, ClosingClaim, ClosingItem, ItemState, ItemWrite,
    StateError, StateErrorKind, Store, WriteStats,
};
use crate::event::TopicPartition;

/// What happens once the first `after` writes went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    /// No crash.
    Never,
    /// The next write fails; later writes go through (a transient fault).
    Once,
    /// Every later write fails (the invocation is dead).
    Dead,
}

/// Wraps a store to inject faults. Each write either goes through (after an optional
/// random delay) or fails with [`StateErrorKind::Injected`].
pub struct FaultyStore<S> {
    inner: S,
    crash: Crash,
    remaining: AtomicI64,
    max_delay: Duration,
    rng: Mutex<StdRng>,
    writes: AtomicU64,
    hook: Option<WriteHook>,
}

/// Called before each write with the number of writes before it.
type WriteHook = Box<dyn Fn(u64) + Send + Sync>;

impl<S: Store> FaultyStore<S> {
    /// A transparent layer (add faults with the builder methods).
    pub fn new(inner: S) -> Self {
        FaultyStore {
            inner,
            crash: Crash::Never,
            remaining: AtomicI64::new(i64::MAX),
            max_delay: Duration::ZERO,
            rng: Mutex::new(StdRng::seed_from_u64(0)),
            writes: AtomicU64::new(0),
            hook: None,
        }
    }

    /// Lets `after` item writes through, fails the next one, then behaves normally.
    pub fn fail_once_after(inner: S, after: u64) -> Self {
        let mut store = Self::new(inner);
        store.crash = Crash::Once;
        store.remaining = AtomicI64::new(i64::try_from(after).unwrap_or(i64::MAX));
        store
    }

    /// Lets `after` item writes through, then fails every later one: the invocation
    /// crashed after `after` writes.
    pub fn crash_after(mut self, after: u64) -> Self {
        self.crash = Crash::Dead;
        self.remaining = AtomicI64::new(i64::try_from(after).unwrap_or(i64::MAX));
        self
    }

    /// Delays every write by a random duration up to `max` (from `seed`, so a failing
    /// scenario can be replayed; the interleaving itself still depends on the scheduler).
    pub fn with_delays(mut self, max: Duration, seed: u64) -> Self {
        self.max_delay = max;
        self.rng = Mutex::new(StdRng::seed_from_u64(seed));
        self
    }

    /// Calls `hook` before every write with the number of writes before it: to cause an
    /// outside fault at a chosen point (take the network down after the k-th write, say).
    pub fn on_write(mut self, hook: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.hook = Some(Box::new(hook));
        self
    }

    /// The writes tried through this layer so far, the failed ones included: what a test
    /// reports when a crash point it chose was never reached.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Whether a failure has been injected yet.
    pub fn fired(&self) -> bool {
        self.crash != Crash::Never && self.remaining.load(Ordering::SeqCst) < 0
    }
}

impl<S: Store> FaultyStore<S> {
    /// Counts one write and injects the faults into it: the hook, a delay, a crash.
    async fn inject(&self, store: &str, key: &[u8]) -> Result<(), StateError> {
        let before = self.writes.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = &self.hook {
            hook(before);
        }
        if !self.max_delay.is_zero() {
            let micros = {
                let mut rng = self
                    .rng
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                rng.random_range(0..=self.max_delay.as_micros() as u64)
            };
            tokio::time::sleep(Duration::from_micros(micros)).await;
        }
        let left = match self.crash {
            Crash::Never => 0,
            _ => self.remaining.fetch_sub(1, Ordering::SeqCst),
        };
        let fails = match self.crash {
            Crash::Never => false,
            Crash::Once => left == 0,
            Crash::Dead => left <= 0,
        };
        if fails {
            return Err(StateError::new(
                store,
                key,
                StateErrorKind::Injected(
                    "the invocation crashed part-way through its state writes".into(),
                ),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl<S: Store> Store for FaultyStore<S> {
    /// Checks the keys against DynamoDB's limits before anything else (a key rejected
    /// there is no request: it neither counts towards a crash nor is delayed), then injects
    /// the faults, then writes through the inner store, which checks the rest (a write the
    /// inner store rejects, an item past 400 KB or a fold that fails, counts as a write).
    async fn apply(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError> {
        super::limits::check_keys(&write)?;
        self.inject(write.store, write.key).await?;
        self.inner.apply(write).await
    }

    /// As [`apply`](Self::apply), keeping the outbox.
    async fn apply_outboxed(
        &self,
        write: ItemWrite<'_>,
        outbox: &super::outbox::Outbox<'_>,
    ) -> Result<(ItemState, Vec<super::outbox::Emission>, WriteStats), StateError> {
        super::limits::check_keys(&write)?;
        self.inject(write.store, write.key).await?;
        self.inner.apply_outboxed(write, outbox).await
    }

    async fn get(&self, store: &str, key: &[u8]) -> Result<Option<ItemState>, StateError> {
        self.inner.get(store, key).await
    }

    async fn claimed_windows(
        &self,
        store: &str,
        tp: &TopicPartition,
    ) -> Result<(Vec<ClaimedWindow>, WriteStats), StateError> {
        self.inner.claimed_windows(store, tp).await
    }

    /// A write: it counts towards a crash, and can be delayed.
    async fn claim_window(
        &self,
        store: &str,
        window: &ClosedWindow,
        tp: &TopicPartition,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        self.inject(store, &window.key).await?;
        self.inner.claim_window(store, window, tp, attempt).await
    }

    /// A write: it counts towards a crash, and can be delayed.
    async fn reclaim_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        self.inject(store, &window.window.key).await?;
        self.inner.reclaim_window(store, window, attempt).await
    }

    /// A write: it counts towards a crash, and can be delayed.
    async fn finish_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
    ) -> Result<(bool, WriteStats), StateError> {
        self.inject(store, &window.window.key).await?;
        self.inner.finish_window(store, window).await
    }

    async fn forget_claims(
        &self,
        store: &str,
        tp: &TopicPartition,
        windows: &[ClaimedWindow],
    ) -> Result<WriteStats, StateError> {
        self.inner.forget_claims(store, tp, windows).await
    }

    /// A write like [`apply`](Self::apply): it counts towards a crash, and can be delayed.
    async fn claim_closing_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
        claim: ClosingClaim<'_>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        self.inject(store, &item.key).await?;
        self.inner
            .claim_closing_item(store, item, aggregate, close_at, claim)
            .await
    }

    async fn get_many(
        &self,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Result<std::collections::HashMap<Vec<u8>, ItemState>, StateError> {
        self.inner.get_many(store, keys).await
    }

    async fn windows(
        &self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, ItemState)>, StateError> {
        self.inner.windows(store, key, from, to).await
    }

    async fn clock(&self) -> Result<Clock, StateError> {
        self.inner.clock().await
    }

    async fn advance_stream_times(
        &self,
        advances: &[crate::state::ClockAdvance],
        now_ms: i64,
    ) -> Result<(), StateError> {
        self.inner.advance_stream_times(advances, now_ms).await
    }

    async fn closed_windows(
        &self,
        store: &str,
        up_to: i64,
    ) -> Result<Vec<ClosedWindow>, StateError> {
        self.inner.closed_windows(store, up_to).await
    }

    async fn mark_closed(
        &self,
        store: &str,
        windows: &[ClosedWindow],
        up_to: i64,
    ) -> Result<WriteStats, StateError> {
        self.inner.mark_closed(store, windows, up_to).await
    }

    async fn closing_items(&self, store: &str, up_to: i64) -> Result<Vec<ClosingItem>, StateError> {
        self.inner.closing_items(store, up_to).await
    }

    /// A write like [`apply`](Self::apply): it counts towards a crash, and can be delayed.
    async fn close_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        self.inject(store, &item.key).await?;
        self.inner
            .close_item(store, item, aggregate, close_at)
            .await
    }
}
