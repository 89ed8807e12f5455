//! A store layer that injects failures, for tests and demos of the exactly-once
//! guarantee: it makes an invocation fail part-way through its state writes, as a
//! crash or a timeout would.

use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;

use super::{ItemState, ItemWrite, StateError, StateErrorKind, Store, WriteStats};

/// Wraps a store; the write after the first `after` successful ones fails, once.
pub struct FaultyStore<S> {
    inner: S,
    remaining: AtomicI64,
}

impl<S: Store> FaultyStore<S> {
    /// Lets `after` item writes through, fails the next one, then behaves normally.
    pub fn fail_once_after(inner: S, after: u64) -> Self {
        FaultyStore {
            inner,
            remaining: AtomicI64::new(i64::try_from(after).unwrap_or(i64::MAX)),
        }
    }

    /// Whether the failure has been injected yet.
    pub fn fired(&self) -> bool {
        self.remaining.load(Ordering::SeqCst) < 0
    }
}

#[async_trait]
impl<S: Store> Store for FaultyStore<S> {
    async fn apply(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError> {
        if self.remaining.fetch_sub(1, Ordering::SeqCst) == 0 {
            return Err(StateError::new(
                write.store,
                write.key,
                StateErrorKind::Injected(
                    "the invocation crashed part-way through its state writes".into(),
                ),
            ));
        }
        self.inner.apply(write).await
    }

    async fn get(&self, store: &str, key: &[u8]) -> Result<Option<ItemState>, StateError> {
        self.inner.get(store, key).await
    }
}
