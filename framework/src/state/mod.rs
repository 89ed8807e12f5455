//! State: where aggregations keep their values, with an exactly-once effect.
//!
//! A batch folds its records per state item in memory, then asks the [`Store`] to apply
//! each item's contributions once ([`ItemWrite`]). Every item keeps a *watermark* per
//! source topic-partition: the highest source offset whose effect it already holds.
//! A store applies a contribution only if its offset is above the item's watermark for
//! its partition, so a batch delivered twice, retried with other boundaries, or racing
//! a zombie invocation changes the item once (docs/state.md, "Per batch").
//!
//! Two stores ship: [`DynamoStore`](dynamodb::DynamoStore) for Lambda, and
//! [`MemoryStore`](memory::MemoryStore) for unit tests. [`fault::FaultyStore`] wraps
//! either to inject failures in tests and demos. Every one checks DynamoDB's limits before
//! a write from [`limits`], so that the test driver refuses what Lambda would.

pub mod dynamodb;
pub mod fault;
pub mod limits;
pub mod memory;
pub mod outbox;

use std::collections::HashMap;
use std::fmt;

use async_trait::async_trait;

use crate::event::TopicPartition;

/// How many state writes a batch keeps in flight at once: DynamoDB answers in
/// milliseconds, so a batch must not pay that latency once per item in series.
pub(crate) const WRITE_CONCURRENCY: usize = 32;

/// The contribution of one source record to one state item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contribution {
    /// Index of the record's topic-partition in [`ItemWrite::partitions`].
    pub tp: u32,
    /// The record's offset.
    pub offset: i64,
    /// What it adds to the item (for a count: how many times it was counted).
    pub delta: i64,
}

/// One state item's contributions from one batch, in offset order per partition.
#[derive(Clone, Copy)]
pub struct ItemWrite<'a> {
    /// The store (named by the aggregation) the item belongs to.
    pub store: &'a str,
    /// The item's key, as the aggregation's key serde encoded it.
    pub key: &'a [u8],
    /// The window start (epoch ms) of a windowed item; `None` for a key's only item.
    pub window: Option<i64>,
    /// When a windowed item may be deleted (epoch seconds, DynamoDB TTL): past the
    /// window's end, grace and retention.
    pub expires_at: Option<i64>,
    /// For an item that keeps its newest record time (a time window: Kafka Streams'
    /// window timestamp), the newest timestamp among the write's records; the item keeps
    /// the highest it was given ([`ItemState::timestamp`]).
    pub timestamp: Option<i64>,
    /// The contributions of the batch's records, by source record.
    pub contributions: &'a [Contribution],
    /// The batch's topic-partitions, indexed by [`Contribution::tp`].
    pub partitions: &'a [TopicPartition],
    /// For a window of an emit-on-close store: when it closes (end + grace, epoch ms).
    /// The store keeps the item findable by [`Store::closed_windows`] until it is marked
    /// closed.
    pub close_at: Option<i64>,
    /// `None`: the contributions' deltas are added (count, sum: commutative, written with
    /// DynamoDB's `ADD`). `Some`: a general aggregate, folded onto the stored one
    /// (read-modify-write conditioned on the version).
    pub fold: Option<&'a dyn Fold>,
}

impl std::fmt::Debug for ItemWrite<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemWrite")
            .field("store", &self.store)
            .field("key", &printable_key(self.key))
            .field("window", &self.window)
            .field("contributions", &self.contributions)
            .field("fold", &self.fold.is_some())
            .finish()
    }
}

/// A general aggregate's pending values for one item: folds the values of the records
/// that `include` accepts (by partition index and offset) onto the current aggregate.
pub trait Fold: Send + Sync {
    /// The new aggregate bytes from the current ones (`None`: the item does not exist yet).
    /// An error (a stored aggregate that does not decode, a user function that fails) is
    /// a message; the store adds the store and key.
    fn fold(
        &self,
        current: Option<&[u8]>,
        include: &dyn Fn(u32, i64) -> bool,
    ) -> Result<Vec<u8>, String>;

    /// For an item of a store that closes on its content (a left or outer stream–stream
    /// join's, whose unmatched records are emitted alone when their window closes): when
    /// the folded `aggregate` next closes (`Some(None)`: nothing in it closes, so it leaves
    /// the closing index). `None` (the default): the write's own
    /// [`close_at`](ItemWrite::close_at) holds.
    fn close_at(&self, aggregate: &[u8]) -> Option<Option<i64>> {
        let _ = aggregate;
        None
    }

    /// Whether [`close_at`](Self::close_at) may set a closing time (the size limits then
    /// count the closing index's attributes).
    fn closes(&self) -> bool {
        false
    }
}

/// An item's value after a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemState {
    /// The number of an additive store (count, sum); 0 for a general aggregate.
    pub value: i64,
    /// The serialized aggregate of a general aggregate; `None` for an additive store.
    pub aggregate: Option<Vec<u8>>,
    /// The item's version: it grows by one with every write that changes it.
    pub version: u64,
    /// The newest record time the item holds, for an item written with
    /// [`ItemWrite::timestamp`] (`None` otherwise, and for items written before it was
    /// kept).
    pub timestamp: Option<i64>,
}

impl ItemState {
    /// The state of an additive item.
    pub fn number(value: i64, version: u64) -> Self {
        ItemState {
            value,
            aggregate: None,
            version,
            timestamp: None,
        }
    }
}

/// What writes cost: requests, conflicts, retries and write units.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WriteStats {
    /// Requests sent to the store.
    pub requests: u64,
    /// Conditional writes the store refused (duplicates, retries, zombies, races).
    pub conditional_failures: u64,
    /// Requests sent again after a conflict.
    pub retries: u64,
    /// Write capacity units consumed, as the store reported them.
    pub consumed_write_units: f64,
}

impl WriteStats {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &WriteStats) {
        self.requests += other.requests;
        self.conditional_failures += other.conditional_failures;
        self.retries += other.retries;
        self.consumed_write_units += other.consumed_write_units;
    }
}

/// The persisted time of one source partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionTime {
    /// The stream time: the highest record timestamp processed (epoch ms).
    pub stream_time: i64,
    /// When (wall clock, epoch ms) the stream time last moved forward.
    pub advanced_at: i64,
}

/// The persisted clock of a table: where every source partition's stream time is, and up
/// to which time each emit-on-close store has closed its windows. One strongly
/// consistent read per batch of a windowed topology.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Clock {
    /// Per source topic-partition seen so far.
    pub partitions: HashMap<TopicPartition, PartitionTime>,
    /// Per store: the windows that close (end + grace) at or before this time are
    /// closed and emitted; a record for one of them is late. For a left or outer
    /// stream–stream join's store: the highest closing time its closing pass applied.
    pub closed: HashMap<String, i64>,
    /// When (wall clock, epoch ms) the first stream time was recorded: a declared
    /// partition not seen yet counts as heard from at this time.
    pub started_at: Option<i64>,
    /// Per source topic-partition: the offset after the last record an at-least-once
    /// batch of a windowed topology processed (the highest recorded; exactly-once batches
    /// record none). Exactly-once output seeds a partition's stream time again when
    /// at-least-once batches read it past its committed progress (a switch back).
    pub at_least_once: HashMap<TopicPartition, i64>,
}

/// One partition's move of the persisted clock after a batch
/// ([`Store::advance_stream_times`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockAdvance {
    /// The partition.
    pub tp: TopicPartition,
    /// Its new stream time, when the batch moved it forward (never back: a lower value
    /// than the stored one changes nothing).
    pub stream_time: Option<i64>,
    /// Under at-least-once output: the offset after the partition's last record the
    /// batch processed ([`Clock::at_least_once`]; never back either).
    pub processed: Option<i64>,
}

/// A window whose close time has passed and that is not emitted yet: what an
/// emit-on-close store emits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedWindow {
    /// The item's key, as the aggregation's key serde encoded it.
    pub key: Vec<u8>,
    /// The window start (epoch ms).
    pub start: i64,
    /// The item's final state.
    pub state: ItemState,
}

/// Where a window of an emit-on-close store stands under exactly-once output (see
/// [`Store::claim_window`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// Still in the closing index: not claimed (or not closable yet).
    Open,
    /// Claimed by attempts of the event partition `tp` (its `topic-partition`): the
    /// attempt ids of the batches that claimed it, in order (a batch re-claims a claim
    /// whose attempts did not commit).
    Claimed {
        /// The event partition whose transactions emit it.
        tp: String,
        /// The attempts that claimed it, the first one first.
        attempts: Vec<String>,
    },
    /// Emitted by a committed transaction and finished (or no longer there).
    Closed,
}

/// A claim named in an event partition's claim register, as it stands (strongly
/// consistent): a time window's ([`Store::claim_window`]), or a closing pass's rewrite of
/// an item that closes on its content (a session or sliding window's item,
/// [`Store::claim_closing_item`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedWindow {
    /// The window (its state as read). For a closing pass's claim: the item's key, its
    /// state as read, and as `start` the claim's *slot*: the item's version that the
    /// claiming rewrite replaced (unique per item: the rewrite is conditioned on it and
    /// moves the version past it).
    pub window: ClosedWindow,
    /// Its claim. A closing pass's slot not in the item is [`ClaimState::Open`] while the
    /// item's version is still the slot (a claim of it may be under way), otherwise
    /// [`ClaimState::Closed`].
    pub claim: ClaimState,
    /// For a closing pass's claim: the records its rewrite emitted, as
    /// [`ClosingClaim::outputs`] stored them (what a re-claim emits again, unchanged);
    /// `None` for a time window's claim.
    pub outputs: Option<Vec<u8>>,
}

/// The claim a closing pass's rewrite makes under exactly-once output
/// ([`Store::claim_closing_item`]).
#[derive(Debug, Clone, Copy)]
pub struct ClosingClaim<'a> {
    /// The event partition whose transactions emit the records.
    pub tp: &'a TopicPartition,
    /// The batch attempt that claims.
    pub attempt: &'a str,
    /// The records the rewrite emits, encoded by the runtime: kept in the claim so that an
    /// attempt that re-claims emits exactly them again.
    pub outputs: &'a [u8],
}

/// An item of a store that closes on its content (a left or outer stream–stream join's)
/// whose closing time has passed: what the closing pass reads, rewrites and emits from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosingItem {
    /// The item's key, as the aggregation's key serde encoded it.
    pub key: Vec<u8>,
    /// The item's state when it was read.
    pub state: ItemState,
}

/// The error of a store that keeps no claims of closed windows (the claim methods' default).
fn no_claims(store: &str) -> StateError {
    StateError::new(
        store,
        b"",
        StateErrorKind::Request(
            "this store keeps no claims of closed windows, which exactly-once output of window \
             closes needs"
                .into(),
        ),
    )
}

/// A state store with exactly-once application of contributions.
#[async_trait]
pub trait Store: Send + Sync {
    /// Applies the contributions the item does not hold yet and returns its new state.
    async fn apply(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError>;

    /// Under exactly-once output: [`apply`](Self::apply), keeping the item's outbox of
    /// updates ([`outbox`]) in the same write, and returning besides the item's state the
    /// updates the batch emits for it, in version order: the outbox's uncommitted entries
    /// of the batch's ranges, then the write's own. A store without an outbox refuses.
    async fn apply_outboxed(
        &self,
        write: ItemWrite<'_>,
        outbox: &outbox::Outbox<'_>,
    ) -> Result<(ItemState, Vec<outbox::Emission>, WriteStats), StateError> {
        let _ = outbox;
        Err(StateError::new(
            write.store,
            write.key,
            StateErrorKind::Request(
                "this store keeps no outbox of updates, which exactly-once output needs".into(),
            ),
        ))
    }

    /// Under exactly-once output: the windows of emit-on-close `store` named in the claim
    /// register of event partition `tp` (the windows its attempts claimed or meant to
    /// claim), each read strongly consistent with its claim. A store without claims
    /// refuses.
    async fn claimed_windows(
        &self,
        store: &str,
        tp: &TopicPartition,
    ) -> Result<(Vec<ClaimedWindow>, WriteStats), StateError> {
        let _ = tp;
        Err(no_claims(store))
    }

    /// Under exactly-once output: claims the closed `window` (as
    /// [`closed_windows`](Self::closed_windows) returned it) for event partition `tp` and
    /// the batch attempt `attempt`: first names it in `tp`'s claim register, then takes it
    /// out of the closing index into a claim by `[attempt]`, on the condition that it is
    /// still in the index with the version read. `Ok((false, _))`: another closer (or an
    /// update) came first.
    async fn claim_window(
        &self,
        store: &str,
        window: &ClosedWindow,
        tp: &TopicPartition,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        let _ = (window, tp, attempt);
        Err(no_claims(store))
    }

    /// Under exactly-once output: adds `attempt` to the claim of `window` (whose attempts
    /// did not commit), on the condition that its claim is still the one read.
    async fn reclaim_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        let _ = (window, attempt);
        Err(no_claims(store))
    }

    /// Under exactly-once output: finishes the claim of `window` (one of its attempts
    /// committed): the window is closed, on the condition that its claim is still the one
    /// read, and leaves its partition's claim register.
    async fn finish_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
    ) -> Result<(bool, WriteStats), StateError> {
        let _ = window;
        Err(no_claims(store))
    }

    /// Under exactly-once output: takes `windows` out of `tp`'s claim register (closed, or
    /// claimed by another partition: never `tp`'s again).
    async fn forget_claims(
        &self,
        store: &str,
        tp: &TopicPartition,
        windows: &[ClaimedWindow],
    ) -> Result<WriteStats, StateError> {
        let _ = (tp, windows);
        Err(no_claims(store))
    }

    /// Under exactly-once output: [`close_item`](Self::close_item) as a claim. First names
    /// the claim's slot (the item's version read, `item.state.version`) in `claim.tp`'s
    /// claim register, then rewrites the item as `close_item` does, on the same condition
    /// (its version is the one read), keeping in the same write the claim of that slot: the
    /// partition, `[claim.attempt]` and the records emitted. `Ok((None, _))`: another
    /// writer changed the item first (nothing claimed).
    async fn claim_closing_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
        claim: ClosingClaim<'_>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        let _ = (item, aggregate, close_at, claim);
        Err(no_claims(store))
    }

    /// Reads an item (strongly consistent); `None` when it does not exist.
    async fn get(&self, store: &str, key: &[u8]) -> Result<Option<ItemState>, StateError>;

    /// Reads the items of `keys` (strongly consistent, batched); keys without an item are
    /// absent from the map.
    async fn get_many(
        &self,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Result<HashMap<Vec<u8>, ItemState>, StateError>;

    /// The windowed items of `key` in `store` whose window starts in `from..=to`, by
    /// start (strongly consistent; items past their TTL are left out).
    async fn windows(
        &self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, ItemState)>, StateError>;

    /// The table's clock: every partition's stream time, every store's closed time.
    async fn clock(&self) -> Result<Clock, StateError>;

    /// Moves the persisted clock of partitions forward: their stream time, stamped with
    /// `now_ms` (wall clock), and the offsets at-least-once batches processed up to;
    /// never back: a lower value than the stored one changes nothing.
    async fn advance_stream_times(
        &self,
        advances: &[ClockAdvance],
        now_ms: i64,
    ) -> Result<(), StateError>;

    /// The windows of emit-on-close `store` that close at or before `up_to` and are not
    /// marked closed yet, with their state (strongly consistent).
    async fn closed_windows(
        &self,
        store: &str,
        up_to: i64,
    ) -> Result<Vec<ClosedWindow>, StateError>;

    /// Marks `windows` (as [`closed_windows`](Self::closed_windows) returned them)
    /// emitted, each only if its version has not changed since, and moves the store's
    /// closed time forward to `up_to`.
    async fn mark_closed(
        &self,
        store: &str,
        windows: &[ClosedWindow],
        up_to: i64,
    ) -> Result<WriteStats, StateError>;

    /// The (unwindowed) items of `store` whose closing time (set by their last write, see
    /// [`Fold::close_at`]) is at or before `up_to`, with their state (strongly consistent).
    async fn closing_items(&self, store: &str, up_to: i64) -> Result<Vec<ClosingItem>, StateError>;

    /// Replaces the aggregate of `item` (as [`closing_items`](Self::closing_items) returned
    /// it) with `aggregate` and its closing time with `close_at` (`None`: it leaves the
    /// closing index), its version + 1, its watermarks unchanged, only if its version is
    /// still the one read: `Ok((None, _))` when another writer changed it first.
    async fn close_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError>;
}

/// Implements [`Store`] for a type that derefs to a store, forwarding every call.
macro_rules! forward_store {
    ($($generics:tt)*) => {
        #[async_trait]
        impl $($generics)* {
            async fn apply(
                &self,
                write: ItemWrite<'_>,
            ) -> Result<(ItemState, WriteStats), StateError> {
                (**self).apply(write).await
            }
            async fn apply_outboxed(
                &self,
                write: ItemWrite<'_>,
                outbox: &outbox::Outbox<'_>,
            ) -> Result<(ItemState, Vec<outbox::Emission>, WriteStats), StateError> {
                (**self).apply_outboxed(write, outbox).await
            }
            async fn get(&self, store: &str, key: &[u8]) -> Result<Option<ItemState>, StateError> {
                (**self).get(store, key).await
            }
            async fn claimed_windows(
                &self,
                store: &str,
                tp: &TopicPartition,
            ) -> Result<(Vec<ClaimedWindow>, WriteStats), StateError> {
                (**self).claimed_windows(store, tp).await
            }
            async fn claim_window(
                &self,
                store: &str,
                window: &ClosedWindow,
                tp: &TopicPartition,
                attempt: &str,
            ) -> Result<(bool, WriteStats), StateError> {
                (**self).claim_window(store, window, tp, attempt).await
            }
            async fn reclaim_window(
                &self,
                store: &str,
                window: &ClaimedWindow,
                attempt: &str,
            ) -> Result<(bool, WriteStats), StateError> {
                (**self).reclaim_window(store, window, attempt).await
            }
            async fn finish_window(
                &self,
                store: &str,
                window: &ClaimedWindow,
            ) -> Result<(bool, WriteStats), StateError> {
                (**self).finish_window(store, window).await
            }
            async fn forget_claims(
                &self,
                store: &str,
                tp: &TopicPartition,
                windows: &[ClaimedWindow],
            ) -> Result<WriteStats, StateError> {
                (**self).forget_claims(store, tp, windows).await
            }
            async fn claim_closing_item(
                &self,
                store: &str,
                item: &ClosingItem,
                aggregate: &[u8],
                close_at: Option<i64>,
                claim: ClosingClaim<'_>,
            ) -> Result<(Option<ItemState>, WriteStats), StateError> {
                (**self)
                    .claim_closing_item(store, item, aggregate, close_at, claim)
                    .await
            }
            async fn get_many(
                &self,
                store: &str,
                keys: &[Vec<u8>],
            ) -> Result<HashMap<Vec<u8>, ItemState>, StateError> {
                (**self).get_many(store, keys).await
            }
            async fn windows(
                &self,
                store: &str,
                key: &[u8],
                from: i64,
                to: i64,
            ) -> Result<Vec<(i64, ItemState)>, StateError> {
                (**self).windows(store, key, from, to).await
            }
            async fn clock(&self) -> Result<Clock, StateError> {
                (**self).clock().await
            }
            async fn advance_stream_times(
                &self,
                advances: &[ClockAdvance],
                now_ms: i64,
            ) -> Result<(), StateError> {
                (**self).advance_stream_times(advances, now_ms).await
            }
            async fn closed_windows(
                &self,
                store: &str,
                up_to: i64,
            ) -> Result<Vec<ClosedWindow>, StateError> {
                (**self).closed_windows(store, up_to).await
            }
            async fn mark_closed(
                &self,
                store: &str,
                windows: &[ClosedWindow],
                up_to: i64,
            ) -> Result<WriteStats, StateError> {
                (**self).mark_closed(store, windows, up_to).await
            }
            async fn closing_items(
                &self,
                store: &str,
                up_to: i64,
            ) -> Result<Vec<ClosingItem>, StateError> {
                (**self).closing_items(store, up_to).await
            }
            async fn close_item(
                &self,
                store: &str,
                item: &ClosingItem,
                aggregate: &[u8],
                close_at: Option<i64>,
            ) -> Result<(Option<ItemState>, WriteStats), StateError> {
                (**self).close_item(store, item, aggregate, close_at).await
            }
        }
    };
}

forward_store!(<T: Store + ?Sized> Store for &T);
forward_store!(<T: Store + ?Sized> Store for std::sync::Arc<T>);
forward_store!(<T: Store + ?Sized> Store for Box<T>);

/// The processing guarantee a topology runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Guarantee {
    /// Every record's effect is applied once, whatever the redeliveries (the default).
    /// Costs one conditional write per touched item per batch, plus a retry on conflict.
    #[default]
    ExactlyOnce,
    /// Writes without conditions or watermarks: a redelivered record counts again. For
    /// counts it costs the same write units as `ExactlyOnce` (BENCHMARKS.md section 3); it
    /// saves only the refused writes of conflicts.
    AtLeastOnce,
}

impl std::str::FromStr for Guarantee {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exactly_once" => Ok(Guarantee::ExactlyOnce),
            "at_least_once" => Ok(Guarantee::AtLeastOnce),
            other => Err(format!(
                "unknown processing guarantee {other:?}: use exactly_once or at_least_once"
            )),
        }
    }
}

/// Whether `name` can name a store: 1 to 64 characters of `[A-Za-z0-9_.-]`. The
/// restriction keeps the store name and the key apart in an item key (`#` separates them).
pub fn valid_store_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A state operation that failed, naming the store and the key.
#[derive(Debug, thiserror::Error)]
#[error("state store {store:?}, key {key}: {kind}")]
pub struct StateError {
    /// The store.
    pub store: String,
    /// The key, printable (text in quotes, or hex).
    pub key: String,
    /// What went wrong.
    pub kind: StateErrorKind,
}

impl StateError {
    /// An error about `key` of `store`.
    pub fn new(store: &str, key: &[u8], kind: StateErrorKind) -> Self {
        StateError {
            store: store.to_owned(),
            key: printable_key(key),
            kind,
        }
    }
}

/// Why a state operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StateErrorKind {
    /// The store could not be reached or refused the request.
    #[error("request failed: {0}")]
    Request(String),
    /// DynamoDB refused the item as over its 400 KB item limit; nothing was written.
    /// The stores check the limit before the request ([`limits`]), so this means the
    /// item is over the limit by an accounting the check does not know.
    #[error("the item would exceed the 400 KB item size limit; nothing was written")]
    ItemTooLarge,
    /// Records the write cannot hold, each with why: a key over DynamoDB's key limits, an
    /// item that would pass 400 KB, a user fold function (adder, reducer, merger,
    /// aggregate serde) that failed or panicked on them. Nothing was written; the batch
    /// treats each as a poison record and writes the item without them ([`limits`]).
    #[error("{0}")]
    Rejected(limits::RejectedRecords),
    /// The stored item is not in a format this release reads.
    #[error("stored item is unreadable: {0}")]
    Corrupt(String),
    /// Concurrent writers kept changing the item.
    #[error("gave up after {0} conflicting attempts")]
    Conflict(u32),
    /// The aggregate could not be folded (a stored aggregate that does not decode, or a
    /// user aggregation function that failed).
    #[error("cannot aggregate: {0}")]
    Aggregate(String),
    /// A failure injected on purpose (tests, demos).
    #[error("injected failure: {0}")]
    Injected(String),
}

/// Renders a key for messages: UTF-8 text in quotes, otherwise hex; keys over 64 bytes
/// are cut, with their length.
pub fn printable_key(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    if key.len() > SHOWN {
        let mut cut = SHOWN;
        while std::str::from_utf8(&key[..cut]).is_err() && cut > SHOWN - 4 {
            cut -= 1;
        }
        return format!("{}… ({} bytes)", printable_key(&key[..cut]), key.len());
    }
    match std::str::from_utf8(key) {
        Ok(s) if !s.chars().any(char::is_control) => format!("{s:?}"),
        _ => key.iter().fold(String::from("0x"), |mut out, b| {
            use fmt::Write;
            let _ = write!(out, "{b:02x}");
            out
        }),
    }
}

/// Per topic-partition of an item write: the first and last offsets it contributes.
pub(crate) fn offset_ranges(write: &ItemWrite<'_>) -> Vec<(u32, i64, i64)> {
    let mut ranges: Vec<(u32, i64, i64)> = Vec::new();
    for c in write.contributions {
        match ranges.iter_mut().find(|r| r.0 == c.tp) {
            Some(r) => {
                r.1 = r.1.min(c.offset);
                r.2 = r.2.max(c.offset);
            }
            None => ranges.push((c.tp, c.offset, c.offset)),
        }
    }
    ranges
}

/// The part of a write the item does not hold yet, given its stored watermarks:
/// the sum of the new contributions, and the new watermark of each partition that
/// has any (empty when the item already holds everything).
pub(crate) fn above_watermarks(
    write: &ItemWrite<'_>,
    watermarks: &HashMap<String, i64>,
) -> (i64, Vec<(u32, i64)>) {
    let held = held_up_to(write, watermarks);
    let mut delta = 0;
    let mut marks: Vec<(u32, i64)> = Vec::new();
    for c in write.contributions {
        if !is_new(&held, c.tp, c.offset) {
            continue;
        }
        delta += c.delta;
        match marks.iter_mut().find(|m| m.0 == c.tp) {
            Some(m) => m.1 = m.1.max(c.offset),
            None => marks.push((c.tp, c.offset)),
        }
    }
    (delta, marks)
}

/// The stored watermark of each of the write's partitions (by partition index), looked up
/// once per item rather than once per contribution.
pub(crate) fn held_up_to(
    write: &ItemWrite<'_>,
    watermarks: &HashMap<String, i64>,
) -> Vec<Option<i64>> {
    // One key buffer for every partition's lookup.
    let mut key = String::new();
    write
        .partitions
        .iter()
        .map(|tp| {
            key.clear();
            tp.push_key(&mut key);
            watermarks.get(key.as_str()).copied()
        })
        .collect()
}

/// Whether the record at `offset` of partition index `tp` is above its stored watermark.
pub(crate) fn is_new(held: &[Option<i64>], tp: u32, offset: i64) -> bool {
    held.get(tp as usize)
        .copied()
        .flatten()
        .is_none_or(|wm| offset > wm)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tps() -> Vec<TopicPartition> {
        vec![
            TopicPartition {
                topic: "t".into(),
                partition: 0,
            },
            TopicPartition {
                topic: "t".into(),
                partition: 1,
            },
        ]
    }

    #[test]
    fn store_names() {
        assert!(valid_store_name("word-counts_v1.2"));
        assert!(!valid_store_name(""));
        assert!(!valid_store_name("a#b"));
        assert!(!valid_store_name(&"x".repeat(65)));
    }

    #[test]
    fn merges_only_above_the_stored_watermark() {
        let partitions = tps();
        let contributions = [
            Contribution {
                tp: 0,
                offset: 3,
                delta: 1,
            },
            Contribution {
                tp: 0,
                offset: 7,
                delta: 2,
            },
            Contribution {
                tp: 1,
                offset: 5,
                delta: 1,
            },
        ];
        let write = ItemWrite {
            store: "s",
            key: b"k",
            contributions: &contributions,
            partitions: &partitions,
            window: None,
            expires_at: None,
            timestamp: None,
            close_at: None,
            fold: None,
        };
        let stored = HashMap::from([("t-0".to_owned(), 3)]);
        // t-0@3 is held already; t-0@7 (2) and t-1@5 (1) are new.
        assert_eq!(above_watermarks(&write, &stored), (3, vec![(0, 7), (1, 5)]));
        let all = HashMap::from([("t-0".to_owned(), 9), ("t-1".to_owned(), 5)]);
        assert_eq!(above_watermarks(&write, &all), (0, vec![]));
        assert_eq!(offset_ranges(&write), vec![(0, 3, 7), (1, 5, 5)]);
    }

    #[test]
    fn printable_keys() {
        assert_eq!(printable_key(b"fox"), "\"fox\"");
        assert_eq!(printable_key(&[0xff, 0x01]), "0xff01");
        let long = "x".repeat(3000);
        assert_eq!(
            printable_key(long.as_bytes()),
            format!("{:?}… (3000 bytes)", "x".repeat(64))
        );
    }
}
