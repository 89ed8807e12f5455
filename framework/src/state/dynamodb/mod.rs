//! The DynamoDB store: exactly-once effect with one conditional write per touched item
//! per batch in the common case (docs/state.md, "Per batch").
//!
//! # Write path
//! *Fast path*: `ADD v :delta, ver :1 SET w:<tp> = :last, …` on the condition
//! `attribute_not_exists(w:<tp>) OR w:<tp> < :first` for every partition the batch
//! contributes from, with `ReturnValues=UPDATED_NEW` (the new value for emission,
//! without a read). *Fallback*, when the condition fails (a redelivery, a retry with
//! other boundaries, a zombie): DynamoDB returns the current item with the failure
//! (`ReturnValuesOnConditionCheckFailure=ALL_OLD`, no extra read), the store keeps
//! only the contributions above the stored watermarks and writes them on the
//! condition `ver = :read`, retrying with backoff and jitter on conflict.
//!
//! DynamoDB's limits are checked before every request (`state/limits.rs`): a record that
//! would break one is rejected, for the batch to treat as a poison record.
//!
//! The item layout and the update expressions are in `item.rs`, the aggregate cache in
//! `cache.rs`, table administration (and the emulator's client) in `admin.rs`, the lean
//! request path of the writes in `lean.rs` (on its own HTTP/1.1 exchange, `http1.rs`).

mod admin;
mod cache;
mod claim_pages;
mod item;
mod lean;
mod request;
mod retry;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::event::TopicPartition;
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use futures::{StreamExt, TryStreamExt};

use super::{
    ClaimState, ClaimedWindow, Clock, ClosedWindow, ClosingClaim, ClosingItem, Guarantee,
    ItemState, ItemWrite, PartitionTime, StateError, StateErrorKind, Store, WriteStats,
    above_watermarks, limits, offset_ranges,
};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The HTTPS client of the AWS SDK clients, now owned by [`crate::aws`].
pub use crate::aws::https_client;
use crate::state::outbox::{self, Emission, Entry, Outbox};
pub use admin::{create_table, emulator_client, emulator_client_with, emulator_lean_client};
use cache::Cache;
pub use cache::DEFAULT_CACHE_BYTES;
use claim_pages::{Pages, pages_attribute};
pub use item::{
    CLOSING_INDEX, CLOSING_STORE, CLOSING_TIME, FORMAT_VERSION, NEWEST_TIME, STREAM_TIME_KEY,
    ScannedItem, TTL_ATTRIBUTE, WATERMARK_PREFIX, item_key,
};
pub use item::{OUTBOX_PREFIX, SLOT_PREFIXES};
use item::{
    cache_key, expired, number, parse_outbox, parse_state, parse_watermarks, watermark_name,
};
pub use lean::LeanClient;
use lean::{Attributes, LeanError, Read};
use request::{Returned, Update, Value, placeholder, watermark_condition, watermark_set};
use retry::describe_request;
pub use retry::{RetrySettings, retry_config};

/// How many times the fallback path retries a conflicting write before giving up.
const MAX_CONFLICT_ATTEMPTS: u32 = 16;

/// A [`Store`] on a DynamoDB table (see the module docs for the layout).
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    guarantee: Guarantee,
    /// General aggregates' items as last written by this container: a batch folds onto
    /// them and writes once, conditioned on the cached version (a stale entry costs one
    /// refused write, which returns the current item). Bounded by bytes (`cache.rs`).
    cache: Arc<Mutex<Cache>>,
    /// The lean request path of the state writes, when chosen ([`DynamoStore::with_lean_client`]).
    lean: Option<Arc<LeanClient>>,
}

/// A DynamoDB item's attributes.
type Item = HashMap<String, AttributeValue>;

/// A closed window's claiming event partition (`topic-partition`), under exactly-once
/// output.
const CLAIM_PARTITION: &str = "ck";
/// The attempts that claimed a closed window (space-separated ids, the first first).
const CLAIM_ATTEMPTS: &str = "ca";

/// The partition key of `tp`'s claim register for `store`: `__claims#<store>@<tp>` (no
/// item of a store has `@` in its partition key: base64url has none).
fn claims_key(store: &str, tp: &TopicPartition) -> String {
    format!("__claims#{store}@{tp}")
}

/// The pages of a claim register: items `sk = 1..=REGISTER_PAGES` under its partition key,
/// each entry on the page its name hashes to. One item would pass DynamoDB's 400 KB at
/// about 8,000 pending claims (a batch closing that many windows would then fail on every
/// retry), and each write to it costs WCUs by the whole item's size; 64 pages hold about
/// 500,000 claims, and an entry's write costs by its page's size. Read all at once by one
/// strongly consistent `Query` of the partition key. (Page 0, the single register item
/// before pages, is read too, and its entries moved to their pages.)
const REGISTER_PAGES: u64 = 64;

/// The page of register entry `entry` (FNV-1a: stable across builds and versions, as the
/// page must be found again by every later deployment).
fn register_page(entry: &str) -> i64 {
    let hash = entry.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (hash % REGISTER_PAGES) as i64 + 1
}

/// A window's attribute in a claim register: `w:<key in base64url>:<start>`.
fn claim_entry(key: &[u8], start: i64) -> String {
    format!("w:{}:{start}", URL_SAFE_NO_PAD.encode(key))
}

/// A claim's attribute in a claim register: a window's (`w:<key>:<start>`) or a closing
/// pass's (`c:<key in base64url>:<slot>`).
fn register_entry(claimed: &ClaimedWindow) -> String {
    let (key, at) = (&claimed.window.key, claimed.window.start);
    match claimed.outputs {
        None => claim_entry(key, at),
        Some(_) => format!("c:{}:{at}", URL_SAFE_NO_PAD.encode(key)),
    }
}

/// The attributes of a closing pass's claim of slot `slot` on the item it rewrote: the
/// claiming partition `ck:<slot>`, the attempts `ca:<slot>`, the records emitted `cp:<slot>`.
fn slot_attributes(slot: i64) -> (String, String, String) {
    (
        format!("{CLAIM_PARTITION}:{slot}"),
        format!("{CLAIM_ATTEMPTS}:{slot}"),
        format!("cp:{slot}"),
    )
}

/// Where a claim's attributes are: the item's sort key, and the names of its partition
/// and attempts attributes (a closing pass's claim: on the unwindowed item, by slot).
fn claim_place(claimed: &ClaimedWindow) -> (i64, String, String) {
    match claimed.outputs {
        None => (
            claimed.window.start,
            CLAIM_PARTITION.to_owned(),
            CLAIM_ATTEMPTS.to_owned(),
        ),
        Some(_) => {
            let (ck, ca, _) = slot_attributes(claimed.window.start);
            (0, ck, ca)
        }
    }
}

/// A closing pass's claim of slot `slot` on `key`'s item (`None`: no item), as it stands,
/// and the pages that hold its records when the item does not (`claim_pages.rs`).
fn closing_claim(
    store: &str,
    key: Vec<u8>,
    slot: i64,
    item: Option<&Item>,
) -> Result<(ClaimedWindow, Option<Pages>), StateError> {
    let corrupt = |e: String| StateError::new(store, &key, StateErrorKind::Corrupt(e));
    let state = match item {
        Some(item) => parse_state(item).map_err(corrupt)?,
        None => ItemState::number(0, 0),
    };
    let (ck, ca, cp) = slot_attributes(slot);
    let cg = pages_attribute(slot);
    let found = item.map(|i| (i.get(&ck), i.get(&ca), i.get(&cp), i.get(&cg)));
    let claimed = |tp: &String, attempts: &String| ClaimState::Claimed {
        tp: tp.clone(),
        attempts: attempts.split(' ').map(str::to_owned).collect(),
    };
    let (claim, outputs, pages) = match found {
        Some((
            Some(AttributeValue::S(tp)),
            Some(AttributeValue::S(attempts)),
            Some(AttributeValue::B(outputs)),
            _,
        )) => (claimed(tp, attempts), outputs.as_ref().to_vec(), None),
        // The records in pages of their own (`claim_pages.rs`), read by the caller.
        Some((
            Some(AttributeValue::S(tp)),
            Some(AttributeValue::S(attempts)),
            None,
            Some(AttributeValue::S(pages)),
        )) => {
            let pages = Pages::parse(pages)
                .ok_or_else(|| corrupt(format!("{cg} is not a claim's pages: {pages:?}")))?;
            (claimed(tp, attempts), Vec::new(), Some(pages))
        }
        // A claim of the slot may still land while the item's version is the slot.
        Some(_) if i64::try_from(state.version).is_ok_and(|v| v <= slot) => {
            (ClaimState::Open, Vec::new(), None)
        }
        _ => (ClaimState::Closed, Vec::new(), None),
    };
    Ok((
        ClaimedWindow {
            window: ClosedWindow {
                key,
                start: slot,
                state,
            },
            claim,
            outputs: Some(outputs),
        },
        pages,
    ))
}

/// A primary key (`pk`, `sk`) for `BatchGetItem`.
fn primary_key(pk: &str, sk: i64) -> Item {
    HashMap::from([
        ("pk".to_owned(), AttributeValue::S(pk.to_owned())),
        ("sk".to_owned(), AttributeValue::N(sk.to_string())),
    ])
}

/// An `UpdateItem` that failed other than on its condition: what it means.
struct UpdateRefused {
    kind: StateErrorKind,
}

impl DynamoStore {
    /// A store on `table`, through `client`, with the given guarantee, and an aggregate
    /// cache of [`DEFAULT_CACHE_BYTES`].
    pub fn new(client: Client, table: impl Into<String>, guarantee: Guarantee) -> Self {
        DynamoStore {
            client,
            table: table.into(),
            guarantee,
            cache: Arc::new(Mutex::new(Cache::new(DEFAULT_CACHE_BYTES))),
            lean: None,
        }
    }

    /// The same store with its state writes (the conditional `UpdateItem`s of every batch)
    /// sent through `lean` ([`LeanClient`]: the same requests, without the SDK's
    /// per-request machinery); reads, queries and table administration stay on the SDK
    /// client. `lean` must sign for the same table and endpoint as the client.
    pub fn with_lean_client(mut self, lean: LeanClient) -> Self {
        self.lean = Some(Arc::new(lean));
        self
    }

    /// [`with_lean_client`](Self::with_lean_client) with a client shared by several stores
    /// (one connection pool and retry budget for all of them).
    pub fn with_shared_lean_client(mut self, lean: Arc<LeanClient>) -> Self {
        self.lean = Some(lean);
        self
    }

    /// Whether state writes go through a [`LeanClient`].
    pub fn uses_lean_client(&self) -> bool {
        self.lean.is_some()
    }

    /// The same store with an aggregate cache of at most `bytes` (0: no cache; see
    /// `cache.rs`). The cache keeps general aggregates' items as this container last wrote
    /// them, so that a batch writes each once, conditioned on the cached version; an item
    /// not cached costs one refused write more (which returns the current item), never
    /// another result. Counts are not cached.
    pub fn with_cache_bytes(self, bytes: usize) -> Self {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_budget(bytes);
        self
    }

    /// What the aggregate cache holds now, in bytes as it counts them (at most its budget).
    pub fn cached_bytes(&self) -> usize {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes()
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// [`describe_sdk_error`], naming the table when the request was throttled.
    fn describe<E, R>(&self, error: &SdkError<E, R>) -> String
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        describe_request(&self.table, error.code(), describe_sdk_error(error))
    }

    /// Sends one `UpdateItem` through the lean client when the store has one, else through
    /// the SDK: every write of the store goes through here. `Ok(Err(item))` is a failed
    /// condition with the item as it is (when the request asked for it); a success or a
    /// refusal adds its write units and conditional failure to `stats`.
    async fn update_item(
        &self,
        request: Update<'_>,
        stats: &mut WriteStats,
    ) -> Result<Result<Item, Option<Item>>, UpdateRefused> {
        Ok(
            match self.update_item_reading(request, stats, Read::Item).await? {
                Ok(Attributes::Item(item)) => Ok(item),
                // `Read::Item` never reads a state alone.
                Ok(Attributes::State(_)) => Ok(Item::new()),
                Err(item) => Err(item),
            },
        )
    }

    /// [`update_item`](Self::update_item), a success's attributes read as `read` asks
    /// (the lean client reads [`Read::State`] straight from the response; the SDK's
    /// response is an item map either way).
    async fn update_item_reading(
        &self,
        request: Update<'_>,
        stats: &mut WriteStats,
        read: Read,
    ) -> Result<Result<Attributes, Option<Item>>, UpdateRefused> {
        if let Some(lean) = &self.lean {
            // Boxed: the HTTP client's future is large, and the store's futures (boxed by
            // `async_trait` per write) would otherwise carry and copy it.
            let body = request.body();
            return match Box::pin(lean.update_item_reading(&body, read)).await {
                Ok(out) => {
                    if let Some(units) = out.capacity_units {
                        stats.consumed_write_units += units;
                    }
                    Ok(Ok(out.attributes))
                }
                Err(LeanError::ConditionFailed(item)) => {
                    stats.conditional_failures += 1;
                    Ok(Err(item))
                }
                Err(LeanError::Service { code, message }) => Err(UpdateRefused {
                    kind: classify_code(&self.table, Some(&code), &message),
                }),
                Err(LeanError::Transport(text)) => Err(UpdateRefused {
                    kind: StateErrorKind::Request(text),
                }),
            };
        }
        match Box::pin(request.to_sdk(&self.client).send()).await {
            Ok(out) => {
                if let Some(units) = out.consumed_capacity().and_then(|c| c.capacity_units()) {
                    stats.consumed_write_units += units;
                }
                Ok(Ok(Attributes::Item(out.attributes.unwrap_or_default())))
            }
            Err(SdkError::ServiceError(e)) => match e.into_err() {
                UpdateItemError::ConditionalCheckFailedException(failed) => {
                    stats.conditional_failures += 1;
                    Ok(Err(failed.item))
                }
                other => Err(UpdateRefused {
                    kind: classify(&self.table, &other),
                }),
            },
            Err(other) => Err(UpdateRefused {
                kind: StateErrorKind::Request(self.describe(&other)),
            }),
        }
    }

    /// [`update_item`](Self::update_item) of a record's write, counted as a request;
    /// errors name the write's store and key. A success returns what
    /// [`written`](Self::written) needs: the item of a general aggregate (it is cached),
    /// else the state alone.
    async fn send(
        &self,
        request: Update<'_>,
        write: &ItemWrite<'_>,
        stats: &mut WriteStats,
    ) -> Result<Result<Attributes, Option<Item>>, StateError> {
        stats.requests += 1;
        let read = if write.fold.is_some() {
            Read::Item
        } else {
            Read::State
        };
        self.update_item_reading(request, stats, read)
            .await
            .map_err(|refused| StateError::new(write.store, write.key, refused.kind))
    }

    fn corrupt(write: &ItemWrite<'_>, reason: String) -> StateError {
        StateError::new(write.store, write.key, StateErrorKind::Corrupt(reason))
    }

    /// Parses a written item's state; for a general aggregate, also caches the item.
    fn written(
        &self,
        write: &ItemWrite<'_>,
        attributes: Attributes,
    ) -> Result<ItemState, StateError> {
        let item = match attributes {
            Attributes::State(state) => return state.map_err(|e| Self::corrupt(write, e)),
            Attributes::Item(item) => item,
        };
        let state = parse_state(&item).map_err(|e| Self::corrupt(write, e))?;
        if write.fold.is_some() {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            cache.insert(cache_key(write), item);
        }
        Ok(state)
    }

    async fn apply_at_least_once(
        &self,
        write: &ItemWrite<'_>,
    ) -> Result<(ItemState, WriteStats), StateError> {
        if write.fold.is_some() {
            // A general aggregate needs the current value: the version-conditioned
            // read-modify-write is already as cheap as it gets.
            let mut stats = WriteStats::default();
            let state = self.merge(write, self.cached(write), &mut stats).await?;
            return Ok((state, stats));
        }
        let delta: i64 = write.contributions.iter().map(|c| c.delta).sum();
        let mut request = self
            .update(write, false)
            .update_expression(format!(
                "ADD #v :d, #ver :one SET {}",
                Self::base_set(write).join(", ")
            ))
            .value(":d", Value::N(delta));
        if write.timestamp.is_some() {
            // The newest record time only moves forward (see `apply_additive`).
            request = request.condition_expression("attribute_not_exists(#mt) OR #mt <= :mt");
        }
        let mut stats = WriteStats::default();
        match self.send(request, write, &mut stats).await? {
            Ok(item) => Ok((self.written(write, item)?, stats)),
            Err(_) if write.timestamp.is_some() => {
                // The item holds a newer record time than the batch's: add the batch all
                // the same (at least once: a redelivery is applied again, no watermark is
                // read or written), keeping the stored time, which the update returns.
                let set: Vec<Cow<'static, str>> = Self::base_set(write)
                    .into_iter()
                    .map(|s| {
                        if s == "#mt = :mt" {
                            Cow::Borrowed("#mt = if_not_exists(#mt, :mt)")
                        } else {
                            s
                        }
                    })
                    .collect();
                let request = self
                    .update(write, false)
                    .update_expression(format!("ADD #v :d, #ver :one SET {}", set.join(", ")))
                    .value(":d", Value::N(delta));
                match self.send(request, write, &mut stats).await? {
                    Ok(item) => Ok((self.written(write, item)?, stats)),
                    Err(_) => Err(StateError::new(
                        write.store,
                        write.key,
                        StateErrorKind::Request(
                            "an unconditional write reported a failed condition".into(),
                        ),
                    )),
                }
            }
            Err(_) => Err(StateError::new(
                write.store,
                write.key,
                StateErrorKind::Request(
                    "an unconditional write reported a failed condition".into(),
                ),
            )),
        }
    }

    /// The item as this container last wrote it, if it is cached.
    fn cached(&self, write: &ItemWrite<'_>) -> Option<Item> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.get(&cache_key(write)).cloned()
    }

    /// Read-modify-write: merge what the item (as last seen: `current`) does not hold yet,
    /// conditioned on its version (or on its absence), retrying with the item that a
    /// refused write returns. Also the fallback of the additive fast path.
    async fn merge(
        &self,
        write: &ItemWrite<'_>,
        current: Option<Item>,
        stats: &mut WriteStats,
    ) -> Result<ItemState, StateError> {
        self.merge_outboxed(write, current, stats, None)
            .await
            .map(|(state, _)| state)
    }

    /// [`merge`](Self::merge), under exactly-once output (`ob`) keeping the item's outbox:
    /// the committed entries of the batch's partitions pruned, the write's own entry
    /// added; returns the updates the batch emits for the item.
    async fn merge_outboxed(
        &self,
        write: &ItemWrite<'_>,
        mut current: Option<Item>,
        stats: &mut WriteStats,
        ob: Option<&Outbox<'_>>,
    ) -> Result<(ItemState, Vec<Emission>), StateError> {
        for attempt in 0..MAX_CONFLICT_ATTEMPTS {
            let item = current.take().unwrap_or_default();
            let watermarks = parse_watermarks(&item).map_err(|e| Self::corrupt(write, e))?;
            let (delta, marks) = above_watermarks(write, &watermarks);
            let stored = if item.is_empty() {
                None
            } else {
                Some(parse_state(&item).map_err(|e| Self::corrupt(write, e))?)
            };
            let stored_outbox = match ob {
                Some(_) => parse_outbox(&item).map_err(|e| Self::corrupt(write, e))?,
                None => HashMap::new(),
            };
            let mut emissions =
                ob.map_or_else(Vec::new, |ob| outbox::stored_emissions(ob, &stored_outbox));
            if marks.is_empty() {
                // The item holds every contribution already (a redelivery).
                return Ok((stored.unwrap_or(ItemState::number(0, 0)), emissions));
            }
            // Under exactly-once output: per event partition of the batch, the entries
            // kept (committed ones pruned), and where the write's own entry goes.
            let held = super::held_up_to(write, &watermarks);
            let mut kept: Vec<(u32, Vec<Entry>, bool)> = Vec::new();
            let mut own_letters: Vec<Emission> = Vec::new();
            let mut origin = None;
            if let Some(ob) = ob {
                origin = ob.entry_origin(
                    write
                        .contributions
                        .iter()
                        .filter(|c| super::is_new(&held, c.tp, c.offset)),
                );
                let letters = ob.dead_letters(write.contributions);
                for (i, tp) in ob.partitions.iter().enumerate() {
                    let i = i as u32;
                    let had = stored_outbox.get(&tp.to_string());
                    let mine: Vec<&Entry> = letters
                        .iter()
                        .filter(|(p, _)| *p == i)
                        .map(|(_, e)| e)
                        .collect();
                    if had.is_none() && origin.map(|o| o.0) != Some(i) && mine.is_empty() {
                        continue;
                    }
                    let mut entries = had.map_or_else(Vec::new, |e| outbox::kept(ob, i, e));
                    // The write's dead letters, kept until their transaction commits.
                    for entry in mine {
                        entries.push(entry.clone());
                        own_letters.push(Emission {
                            tp: i,
                            entry: entry.clone(),
                        });
                    }
                    let slot = item.contains_key(&format!("{}{tp}", SLOT_PREFIXES[0]));
                    kept.push((i, entries, slot));
                }
            }
            let kept_bytes: usize = kept
                .iter()
                .map(|(_, e, _)| 3 + 64 + outbox::encoded_len(e))
                .sum();
            // The write's own entry repeats the aggregate, when it keeps one (a store whose
            // updates reach a sink; the outbox of a store that keeps only dead letters
            // does not).
            let outbox_bytes = |aggregate: usize| match (ob, origin) {
                (None, _) => 0,
                (Some(_), None) => kept_bytes,
                (Some(_), Some(_)) => kept_bytes + 45 + 4 + aggregate,
            };
            let mut set = Self::base_set(write);
            let mut request = self.update(write, write.fold.is_some());
            let mut newest_time = None;
            if let Some(at) = write.timestamp {
                // The newest record time only moves forward.
                let newest = stored
                    .as_ref()
                    .and_then(|s| s.timestamp)
                    .map_or(at, |t| t.max(at));
                newest_time = Some(newest);
                request = request.value(":mt", Value::N(newest));
            }
            let mut add = "ADD #ver :one".to_owned();
            let mut remove: Vec<String> = Vec::new();
            let mut new_aggregate: Option<Vec<u8>> = None;
            match write.fold {
                Some(fold) => {
                    let held = super::held_up_to(write, &watermarks);
                    let include = |tp: u32, offset: i64| super::is_new(&held, tp, offset);
                    let current = stored.as_ref().and_then(|s| s.aggregate.as_deref());
                    let new_marks: Vec<(String, i64)> = marks
                        .iter()
                        .map(|(tp, last)| (write.partitions[*tp as usize].to_string(), *last))
                        .collect();
                    let mut marked = watermarks.clone();
                    marked.extend(new_marks.iter().cloned());
                    let version = stored.as_ref().map_or(0, |s| s.version) + 1;
                    // A closing pass's claims not finished yet stay in the item.
                    let claims: usize = item
                        .iter()
                        .filter(|(name, _)| {
                            name.split_once(':').is_some_and(|(prefix, _)| {
                                [CLAIM_PARTITION, CLAIM_ATTEMPTS, "cp", "cg"].contains(&prefix)
                            })
                        })
                        .map(|(name, value)| cache::attribute_bytes(name, value))
                        .sum();
                    let fits = |bytes: usize| {
                        limits::check_aggregate(
                            write,
                            bytes + outbox_bytes(bytes) + claims,
                            version,
                            marked.iter().map(|(tp, o)| (tp.as_str(), *o)),
                            new_marks.iter().map(|(tp, o)| (tp.as_str(), *o)),
                        )
                    };
                    let aggregate =
                        limits::fold_within_limits(write, fold, current, &include, &fits)?;
                    // A store that closes on its content: the item's closing time follows
                    // what the fold left in it.
                    match fold
                        .close_at(&aggregate)
                        .filter(|_| write.close_at.is_none())
                    {
                        Some(Some(at)) => {
                            request =
                                closing_names(request, write.store).value(":cl", Value::N(at));
                            set.push(Cow::Borrowed("#cq = :cq, #cl = :cl"));
                        }
                        Some(None) => {
                            request = request.name("#cq", CLOSING_STORE).name("#cl", CLOSING_TIME);
                            remove.push("#cq, #cl".to_owned());
                        }
                        None => {}
                    }
                    if ob.is_some() {
                        // The outbox keeps the state after the write.
                        new_aggregate = Some(aggregate.clone());
                    }
                    request = request.value(":a", Value::B(Cow::Owned(aggregate)));
                    set.push(Cow::Borrowed("#v = :a"));
                }
                None => {
                    request = request.value(":d", Value::N(delta));
                    add = "ADD #v :d, #ver :one".to_owned();
                }
            }
            for (i, (tp, last)) in marks.iter().enumerate() {
                let tp = &write.partitions[*tp as usize];
                request = request
                    .name(placeholder("#w", i), watermark_name(tp))
                    .value(placeholder(":l", i), Value::N(*last));
                set.push(watermark_set(i));
            }
            request = match &stored {
                Some(state) => request
                    .condition_expression("#ver = :read")
                    .value(":read", Value::U(state.version)),
                None => request.condition_expression("attribute_not_exists(#ver)"),
            };
            // The outbox: per event partition the entries kept, the write's own added, in
            // one list; the fast path's single entry folded into it.
            let mut own = None;
            if let Some(ob) = ob {
                let state = ItemState {
                    value: stored.as_ref().map_or(0, |s| s.value)
                        + if write.fold.is_some() { 0 } else { delta },
                    aggregate: new_aggregate,
                    version: stored.as_ref().map_or(0, |s| s.version) + 1,
                    timestamp: newest_time.or_else(|| stored.as_ref().and_then(|s| s.timestamp)),
                };
                for (n, (i, mut entries, slot)) in kept.into_iter().enumerate() {
                    let tp = &ob.partitions[i as usize];
                    request = request.name(format!("#ob{n}"), format!("{OUTBOX_PREFIX}{tp}"));
                    if let Some((_, offset)) = origin.filter(|o| o.0 == i) {
                        let entry = Entry {
                            offset,
                            time: state.timestamp.unwrap_or(ob.time),
                            state: state.clone(),
                            dead_letter: None,
                        };
                        own = Some(Emission {
                            tp: i,
                            entry: entry.clone(),
                        });
                        if write.fold.is_none() && entries.is_empty() {
                            // An additive item with nothing else uncommitted: the entry in
                            // the fast path's slot, so that the next batch's fast path
                            // holds (one request) rather than finding a list.
                            let numbers = [
                                entry.offset,
                                entry.state.value,
                                i64::try_from(entry.state.version).unwrap_or(i64::MAX),
                                entry.time,
                            ];
                            for (j, prefix) in SLOT_PREFIXES.iter().enumerate() {
                                request =
                                    request.name(format!("#os{n}x{j}"), format!("{prefix}{tp}"));
                            }
                            for (j, number) in numbers.iter().enumerate() {
                                request = request.value(format!(":os{n}x{j}"), Value::N(*number));
                                set.push(Cow::Owned(format!("#os{n}x{j} = :os{n}x{j}")));
                            }
                            match entry.state.timestamp {
                                Some(at) => {
                                    request = request.value(format!(":os{n}x4"), Value::N(at));
                                    set.push(Cow::Owned(format!("#os{n}x4 = :os{n}x4")));
                                }
                                None => remove.push(format!("#os{n}x4")),
                            }
                            remove.push(format!("#ob{n}"));
                            continue;
                        }
                        entries.push(entry);
                    }
                    if entries.is_empty() {
                        remove.push(format!("#ob{n}"));
                    } else {
                        request = request.value(
                            format!(":ob{n}"),
                            Value::B(Cow::Owned(outbox::encode(&entries))),
                        );
                        set.push(Cow::Owned(format!("#ob{n} = :ob{n}")));
                    }
                    if slot {
                        for (j, prefix) in SLOT_PREFIXES.iter().enumerate() {
                            request = request.name(format!("#os{n}x{j}"), format!("{prefix}{tp}"));
                            remove.push(format!("#os{n}x{j}"));
                        }
                    }
                }
            }
            let remove = if remove.is_empty() {
                String::new()
            } else {
                format!(" REMOVE {}", remove.join(", "))
            };
            let expression = format!("{add} SET {}{remove}", set.join(", "));
            limits::check_expression(write, &expression)?;
            let request = request.update_expression(expression);
            if attempt > 0 {
                stats.retries += 1;
                tokio::time::sleep(backoff(attempt)).await;
            }
            match self.send(request, write, stats).await? {
                Ok(item) => {
                    let state = self.written(write, item)?;
                    emissions.extend(own_letters);
                    emissions.extend(own);
                    return Ok((state, emissions));
                }
                Err(item) => current = item,
            }
        }
        Err(StateError::new(
            write.store,
            write.key,
            StateErrorKind::Conflict(MAX_CONFLICT_ATTEMPTS),
        ))
    }

    /// The additive fast path: one conditional `ADD`, applied only if no contributing
    /// partition's watermark has reached the batch's first offset for it.
    async fn apply_additive(
        &self,
        write: &ItemWrite<'_>,
        ob: Option<&Outbox<'_>>,
    ) -> Result<(ItemState, Vec<Emission>, WriteStats), StateError> {
        let delta: i64 = write.contributions.iter().map(|c| c.delta).sum();
        // The condition, its parts joined by `AND`: a single part stays a static string.
        let mut condition: Option<Cow<'static, str>> = None;
        let mut and = |part: Cow<'static, str>| {
            condition = Some(match condition.take() {
                None => part,
                Some(before) => {
                    let mut joined = before.into_owned();
                    joined.reserve(part.len() + 5);
                    joined.push_str(" AND ");
                    joined.push_str(&part);
                    Cow::Owned(joined)
                }
            });
        };
        let mut request = self.update(write, false).value(":d", Value::N(delta));
        // Under exactly-once output: the write's entry in the partition's single slot,
        // computed in the write (`v` and `ver` set, not added, so that the slot can
        // repeat them), on the condition that what the slot and the list of the
        // partition hold is committed (otherwise the read-modify-write keeps it).
        if ob.is_some_and(|ob| !ob.dead_letters(write.contributions).is_empty()) {
            // Dead letters to keep: the read-modify-write keeps them in the list.
            let mut stats = WriteStats::default();
            let (state, emissions) = self.merge_outboxed(write, None, &mut stats, ob).await?;
            return Ok((state, emissions, stats));
        }
        let slot = ob.and_then(|ob| ob.entry_origin(write.contributions).map(|o| (ob, o)));
        let mut own = None;
        let mut add = "ADD #v :d, #ver :one SET ";
        if let Some((ob, (i, offset))) = slot {
            let tp = &ob.partitions[i as usize];
            let time = write.timestamp.unwrap_or(ob.time);
            own = Some((i, offset, time));
            // The record time only with a window's (`om`, as `mt`).
            let named = if write.timestamp.is_some() { 5 } else { 4 };
            for (j, prefix) in SLOT_PREFIXES.iter().enumerate().take(named) {
                request = request.name(format!("#os{j}"), format!("{prefix}{tp}"));
            }
            request = request
                .name("#ob", format!("{OUTBOX_PREFIX}{tp}"))
                .value(":zero", Value::N(0))
                .value(":oo", Value::N(offset))
                .value(":ot", Value::N(time))
                .value(":s", Value::N(ob.shadow[i as usize]));
            add = if write.timestamp.is_some() {
                "SET #v = if_not_exists(#v, :zero) + :d, \
                 #ver = if_not_exists(#ver, :zero) + :one, #os0 = :oo, \
                 #os1 = if_not_exists(#v, :zero) + :d, \
                 #os2 = if_not_exists(#ver, :zero) + :one, #os3 = :ot, #os4 = :mt, "
            } else {
                "SET #v = if_not_exists(#v, :zero) + :d, \
                 #ver = if_not_exists(#ver, :zero) + :one, #os0 = :oo, \
                 #os1 = if_not_exists(#v, :zero) + :d, \
                 #os2 = if_not_exists(#ver, :zero) + :one, #os3 = :ot, "
            };
            and(Cow::Borrowed("attribute_not_exists(#ob)"));
            and(Cow::Borrowed("(attribute_not_exists(#os0) OR #os0 < :s)"));
        }
        // The update expression: `add`, then the base set and the watermarks' sets joined
        // by commas, written in one string.
        let ranges = offset_ranges(write);
        let mut expression = String::with_capacity(add.len() + 48 + 12 * ranges.len());
        expression.push_str(add);
        for (n, part) in Self::base_set_parts(write).enumerate() {
            if n > 0 {
                expression.push_str(", ");
            }
            expression.push_str(part);
        }
        for (i, &(tp, first, last)) in ranges.iter().enumerate() {
            let tp = &write.partitions[tp as usize];
            request = request
                .name(placeholder("#w", i), watermark_name(tp))
                .value(placeholder(":f", i), Value::N(first))
                .value(placeholder(":l", i), Value::N(last));
            expression.push_str(", ");
            expression.push_str(&watermark_set(i));
            and(watermark_condition(i));
        }
        if write.timestamp.is_some() {
            // The newest record time only moves forward: a batch whose records are all
            // older than the window's newest is refused and written by the fallback (one
            // more request), which keeps the stored time.
            and(Cow::Borrowed("(attribute_not_exists(#mt) OR #mt <= :mt)"));
        }
        let condition = condition.unwrap_or_default();
        limits::check_expression(write, &condition)?;
        let request = request
            .update_expression(expression)
            .condition_expression(condition);
        let mut stats = WriteStats::default();
        match self.send(request, write, &mut stats).await? {
            Ok(item) => {
                let state = self.written(write, item)?;
                let emissions = own
                    .map(|(tp, offset, time)| Emission {
                        tp,
                        entry: Entry {
                            offset,
                            state: state.clone(),
                            time,
                            dead_letter: None,
                        },
                    })
                    .into_iter()
                    .collect();
                Ok((state, emissions, stats))
            }
            Err(current) => {
                let (state, emissions) =
                    self.merge_outboxed(write, current, &mut stats, ob).await?;
                Ok((state, emissions, stats))
            }
        }
    }
}

impl DynamoStore {
    /// [`Store::apply`] for a write within the expression limits.
    async fn apply_one(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError> {
        match (self.guarantee, write.fold) {
            (Guarantee::AtLeastOnce, _) => self.apply_at_least_once(&write).await,
            _ => self
                .apply_exactly(&write, None)
                .await
                .map(|(state, _, stats)| (state, stats)),
        }
    }

    /// The exactly-once write of one update, keeping the outbox under `ob` (also when the
    /// store runs `at_least_once`: exactly-once output needs the exact state).
    async fn apply_exactly(
        &self,
        write: &ItemWrite<'_>,
        ob: Option<&Outbox<'_>>,
    ) -> Result<(ItemState, Vec<Emission>, WriteStats), StateError> {
        match write.fold {
            None => self.apply_additive(write, ob).await,
            Some(_) => {
                let mut stats = WriteStats::default();
                let (state, emissions) = self
                    .merge_outboxed(write, self.cached(write), &mut stats, ob)
                    .await?;
                Ok((state, emissions, stats))
            }
        }
    }
}

#[async_trait]
impl Store for DynamoStore {
    /// Additive stores: one conditional `ADD` per item (fast path), the read-merge-write
    /// fallback when it is refused. General aggregates: one write conditioned on the
    /// version of the item as this container last wrote it (cached), or on its absence
    /// for an item it has not seen; a refused write returns the current item to merge with.
    ///
    /// DynamoDB's limits are checked before any request ([`limits`]): a key over them, or
    /// records whose fold fails or would take the item past 400 KB, are rejected
    /// ([`StateErrorKind::Rejected`]) with nothing written. A write whose contributions come
    /// from more than [`limits::MAX_PARTITIONS_PER_UPDATE`] source partitions is sent as one
    /// update per that many partitions (in partition order; each is exact on its own
    /// partitions' watermarks, so a crash between them loses nothing), to stay within
    /// DynamoDB's 4 KB and 300-operator expression limits.
    async fn apply(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError> {
        limits::check_keys(&write)?;
        let parts = limits::split(&write);
        if parts.is_empty() {
            return self.apply_one(write).await;
        }
        let mut stats = WriteStats::default();
        let mut last = None;
        for part in &parts {
            let restricted = part.fold(&write);
            let part = part.write(&write, restricted.as_ref());
            let (state, part_stats) = self.apply_one(part).await?;
            stats.add(&part_stats);
            last = Some(state);
        }
        Ok((last.unwrap_or(ItemState::number(0, 0)), stats))
    }

    /// As [`apply`](Self::apply), in the same single write keeping the item's outbox
    /// ([`outbox`]): the fast path of an additive store keeps the write's entry in one slot
    /// per event partition (`oo:`/`ov:`/`on:`/`ot:`/`om:<tp>`) on the condition that the
    /// slot's entry is committed; the read-modify-write (general aggregates, and the fast
    /// path's fallback) keeps a list per event partition (`ob:<tp>`), pruned below the
    /// shadow offset. The entries count towards the 400 KB limit of general aggregates:
    /// a record whose aggregate would not fit with them is rejected as a poison record.
    async fn apply_outboxed(
        &self,
        write: ItemWrite<'_>,
        ob: &Outbox<'_>,
    ) -> Result<(ItemState, Vec<Emission>, WriteStats), StateError> {
        limits::check_keys(&write)?;
        let parts = limits::split(&write);
        if parts.is_empty() {
            return self.apply_exactly(&write, Some(ob)).await;
        }
        let mut stats = WriteStats::default();
        let mut last = None;
        let mut emissions: Vec<Emission> = Vec::new();
        for part in &parts {
            let restricted = part.fold(&write);
            let part = part.write(&write, restricted.as_ref());
            let (state, part_emissions, part_stats) = self.apply_exactly(&part, Some(ob)).await?;
            stats.add(&part_stats);
            last = Some(state);
            for e in part_emissions {
                if !emissions.contains(&e) {
                    emissions.push(e);
                }
            }
        }
        emissions.sort_by_key(|e| e.entry.state.version);
        Ok((last.unwrap_or(ItemState::number(0, 0)), emissions, stats))
    }

    /// Strongly consistent `BatchGetItem`s, 100 keys each. A key over DynamoDB's key
    /// limits is not asked for ([`limits::key_fits`]): no item can have it.
    async fn get_many(
        &self,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Result<HashMap<Vec<u8>, ItemState>, StateError> {
        let requests = keys
            .iter()
            .filter(|key| limits::key_fits(store, key))
            .map(|key| {
                HashMap::from([
                    ("pk".to_owned(), AttributeValue::S(item_key(store, key))),
                    ("sk".to_owned(), AttributeValue::N("0".into())),
                ])
            })
            .collect();
        let items = self
            .batch_get(requests)
            .await
            .map_err(|e| StateError::new(store, b"*", StateErrorKind::Request(e)))?;
        let mut out = HashMap::with_capacity(items.len());
        for item in items {
            let key = match item.get("k") {
                Some(AttributeValue::B(b)) => b.as_ref().to_vec(),
                _ => {
                    return Err(StateError::new(
                        store,
                        b"*",
                        StateErrorKind::Corrupt("an item has no key attribute k".into()),
                    ));
                }
            };
            let state = parse_state(&item)
                .map_err(|e| StateError::new(store, &key, StateErrorKind::Corrupt(e)))?;
            out.insert(key, state);
        }
        Ok(out)
    }

    async fn get(&self, store: &str, key: &[u8]) -> Result<Option<ItemState>, StateError> {
        if !limits::key_fits(store, key) {
            return Ok(None);
        }
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(item_key(store, key)))
            .key("sk", AttributeValue::N("0".into()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StateError::new(store, key, StateErrorKind::Request(self.describe(&e))))?;
        out.item()
            .map(parse_state)
            .transpose()
            .map_err(|e| StateError::new(store, key, StateErrorKind::Corrupt(e)))
    }

    /// Queries the key's items with `sk` (the window start) in `from..=to`.
    async fn windows(
        &self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, ItemState)>, StateError> {
        if !limits::key_fits(store, key) {
            return Ok(Vec::new());
        }
        let err = |e: String| StateError::new(store, key, StateErrorKind::Request(e));
        let now = unix_seconds();
        let mut out = Vec::new();
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :to")
            .expression_attribute_values(":pk", AttributeValue::S(item_key(store, key)))
            .expression_attribute_values(":from", AttributeValue::N(from.to_string()))
            .expression_attribute_values(":to", AttributeValue::N(to.to_string()))
            .consistent_read(true)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| err(self.describe(&e)))?;
            for item in page.items() {
                if expired(item, now) {
                    continue;
                }
                let start = number(item, "sk")
                    .map_err(|e| StateError::new(store, key, StateErrorKind::Corrupt(e)))?;
                let state = parse_state(item)
                    .map_err(|e| StateError::new(store, key, StateErrorKind::Corrupt(e)))?;
                out.push((start, state));
            }
        }
        Ok(out)
    }

    /// One item (`pk = "__stream-time"`) holds, per partition, `t:<topic>-<partition>`
    /// (stream time), `u:<topic>-<partition>` (when it advanced) and
    /// `a:<topic>-<partition>` (the offset at-least-once batches processed up to), per emit-on-close
    /// store `c:<store>` (closed up to), and `s` (when the first stream time was
    /// recorded): one strongly consistent read.
    async fn clock(&self) -> Result<Clock, StateError> {
        let corrupt = |e: String| StateError::new(STREAM_TIME_KEY, b"", StateErrorKind::Corrupt(e));
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(STREAM_TIME_KEY.to_owned()))
            .key("sk", AttributeValue::N("0".into()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| {
                StateError::new(
                    STREAM_TIME_KEY,
                    b"",
                    StateErrorKind::Request(self.describe(&e)),
                )
            })?;
        let item = out.item().cloned().unwrap_or_default();
        let mut clock = Clock::default();
        for name in item.keys() {
            if let Some(tp) = name.strip_prefix("t:") {
                let tp = TopicPartition::from_key(tp)
                    .ok_or_else(|| corrupt(format!("attribute {name:?} names no partition")))?;
                let stream_time = number(&item, name).map_err(corrupt)?;
                let advanced_at = match item.get(&format!("u:{tp}")) {
                    Some(_) => number(&item, &format!("u:{tp}")).map_err(corrupt)?,
                    None => 0,
                };
                clock.partitions.insert(
                    tp,
                    PartitionTime {
                        stream_time,
                        advanced_at,
                    },
                );
            } else if let Some(tp) = name.strip_prefix("a:") {
                let tp = TopicPartition::from_key(tp)
                    .ok_or_else(|| corrupt(format!("attribute {name:?} names no partition")))?;
                clock
                    .at_least_once
                    .insert(tp, number(&item, name).map_err(corrupt)?);
            } else if name == "s" {
                clock.started_at = Some(number(&item, name).map_err(corrupt)?);
            } else if let Some(store) = name.strip_prefix("c:") {
                clock
                    .closed
                    .insert(store.to_owned(), number(&item, name).map_err(corrupt)?);
            }
        }
        Ok(clock)
    }

    /// One conditional write per partition (`t:<tp> < :time`, and `a:<tp> < :offset` for
    /// the offset an at-least-once batch processed up to, in the same write); a refused one
    /// means another invocation already moved the partition's clock further. When both
    /// move and the write is refused (one of them was further already), each is written
    /// alone.
    async fn advance_stream_times(
        &self,
        advances: &[crate::state::ClockAdvance],
        now_ms: i64,
    ) -> Result<(), StateError> {
        for advance in advances {
            let tp = &advance.tp;
            let (time, mark) = (format!("t:{tp}"), format!("a:{tp}"));
            let stamp = format!("u:{tp}");
            let err = |e| StateError::new(STREAM_TIME_KEY, tp.to_string().as_bytes(), e);
            let both = match (advance.stream_time, advance.processed) {
                (Some(t), Some(a)) => self
                    .advance_clock(&time, t, Some((&stamp, now_ms)), Some((&mark, a)))
                    .await
                    .map_err(err)?,
                _ => false,
            };
            if both {
                continue;
            }
            if let Some(t) = advance.stream_time {
                self.advance_clock(&time, t, Some((&stamp, now_ms)), None)
                    .await
                    .map_err(err)?;
            }
            if let Some(a) = advance.processed {
                self.advance_clock(&mark, a, None, None)
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    /// Queries [`CLOSING_INDEX`] for the store's windows closing at or before `up_to`,
    /// then reads them (strongly consistent `BatchGetItem`, 100 at a time: the index is
    /// eventually consistent, the items are not), leaving out those already closed.
    async fn closed_windows(
        &self,
        store: &str,
        up_to: i64,
    ) -> Result<Vec<ClosedWindow>, StateError> {
        let mut windows = Vec::new();
        for (key, item) in self.closing(store, up_to).await? {
            let corrupt = |e: String| StateError::new(store, &key, StateErrorKind::Corrupt(e));
            windows.push(ClosedWindow {
                start: number(&item, "sk").map_err(corrupt)?,
                state: parse_state(&item).map_err(corrupt)?,
                key: key.clone(),
            });
        }
        windows.sort_by(|a, b| (&a.key, a.start).cmp(&(&b.key, b.start)));
        Ok(windows)
    }

    /// `tp`'s claim register (`pk = __claims#<store>@<topic>-<partition>`, its entries on
    /// `REGISTER_PAGES` items, an attribute `w:<key in base64url>:<window start>` per
    /// window), read strongly consistent, then its windows (strongly consistent `BatchGetItem`): a window with
    /// `ck` (the claiming partition) and `ca` (the attempts, space-separated) is claimed,
    /// one with `cq` open, any other closed.
    async fn claimed_windows(
        &self,
        store: &str,
        tp: &TopicPartition,
    ) -> Result<(Vec<ClaimedWindow>, WriteStats), StateError> {
        let err = |e: String| StateError::new(store, b"*", StateErrorKind::Request(e));
        let mut stats = WriteStats::default();
        let register = self.register(store, tp, &mut stats).await.map_err(&err)?;
        // (key, start or slot, whether a closing pass's claim)
        let mut named: Vec<(Vec<u8>, i64, bool)> = Vec::new();
        for name in register.iter().flat_map(|page| page.keys()) {
            let (entry, closing) = match (name.strip_prefix("w:"), name.strip_prefix("c:")) {
                (Some(entry), _) => (entry, false),
                (None, Some(entry)) => (entry, true),
                (None, None) => continue,
            };
            let parsed = entry.rsplit_once(':').and_then(|(key, start)| {
                Some((
                    URL_SAFE_NO_PAD.decode(key).ok()?,
                    start.parse::<i64>().ok()?,
                    closing,
                ))
            });
            match parsed {
                Some(window) => named.push(window),
                None => return Err(err(format!("claim register entry {name:?} unreadable"))),
            }
        }
        named.sort();
        if named.is_empty() {
            return Ok((Vec::new(), stats));
        }
        // One read per item (an item can hold several closing passes' claims).
        let unique: BTreeSet<(String, i64)> = named
            .iter()
            .map(|(key, start, closing)| (item_key(store, key), if *closing { 0 } else { *start }))
            .collect();
        let keys = unique.iter().map(|(pk, sk)| primary_key(pk, *sk)).collect();
        stats.requests += unique.len().div_ceil(100) as u64;
        let mut found: HashMap<(String, i64), Item> = HashMap::new();
        for item in self.batch_get(keys).await.map_err(&err)? {
            let pk = match item.get("pk") {
                Some(AttributeValue::S(pk)) => pk.clone(),
                _ => continue,
            };
            let sk = number::<i64>(&item, "sk").map_err(&err)?;
            found.insert((pk, sk), item);
        }
        let mut out = Vec::with_capacity(named.len());
        for (key, start, closing) in named {
            if closing {
                let pk = item_key(store, &key);
                let item = found.get(&(pk.clone(), 0));
                let (mut claimed, pages) = closing_claim(store, key, start, item)?;
                if let Some(pages) = pages {
                    let key = claimed.window.key.as_slice();
                    let outputs = self
                        .read_claim_pages((store, key, &pk), start, &pages, &mut stats)
                        .await?;
                    claimed.outputs = Some(outputs);
                }
                out.push(claimed);
                continue;
            }
            let item = found.remove(&(item_key(store, &key), start));
            let corrupt = |e: String| StateError::new(store, &key, StateErrorKind::Corrupt(e));
            let (state, claim) = match &item {
                None => (ItemState::number(0, 0), ClaimState::Closed),
                Some(item) => {
                    let state = parse_state(item).map_err(corrupt)?;
                    let claim = match (item.get(CLAIM_PARTITION), item.get(CLAIM_ATTEMPTS)) {
                        (Some(AttributeValue::S(tp)), Some(AttributeValue::S(attempts))) => {
                            ClaimState::Claimed {
                                tp: tp.clone(),
                                attempts: attempts.split(' ').map(str::to_owned).collect(),
                            }
                        }
                        _ if item.contains_key(CLOSING_STORE) => ClaimState::Open,
                        _ => ClaimState::Closed,
                    };
                    (state, claim)
                }
            };
            out.push(ClaimedWindow {
                window: ClosedWindow { key, start, state },
                claim,
                outputs: None,
            });
        }
        Ok((out, stats))
    }

    /// `SET w:<window> = 1` on `tp`'s claim register, then on the window
    /// `SET ck = :tp, ca = :attempt REMOVE cq, cl` on the condition
    /// `cq = :store AND ver = :read AND attribute_not_exists(ck)`.
    async fn claim_window(
        &self,
        store: &str,
        window: &ClosedWindow,
        tp: &TopicPartition,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        let mut stats = WriteStats::default();
        let entry = claim_entry(&window.key, window.start);
        let intent = Update::new(&self.table, claims_key(store, tp), register_page(&entry))
            .update_expression("SET #e = :one")
            .name("#e", entry.as_str())
            .value(":one", Value::N(1))
            .consumed_capacity();
        stats.requests += 1;
        if let Err(refused) = self.update_item(intent, &mut stats).await {
            return Err(StateError::new(store, &window.key, refused.kind));
        }
        let tp = tp.to_string();
        let claim = Update::new(&self.table, item_key(store, &window.key), window.start)
            .update_expression("SET #ck = :tp, #ca = :a REMOVE #cq, #cl")
            .condition_expression("#cq = :store AND #ver = :v AND attribute_not_exists(#ck)")
            .name("#ck", CLAIM_PARTITION)
            .name("#ca", CLAIM_ATTEMPTS)
            .name("#cq", CLOSING_STORE)
            .name("#cl", CLOSING_TIME)
            .name("#ver", "ver")
            .value(":tp", Value::S(Cow::Borrowed(tp.as_str())))
            .value(":a", Value::S(Cow::Borrowed(attempt)))
            .value(":store", Value::S(Cow::Borrowed(store)))
            .value(":v", Value::U(window.state.version))
            .consumed_capacity();
        stats.requests += 1;
        match self.update_item(claim, &mut stats).await {
            Ok(Ok(_)) => Ok((true, stats)),
            Ok(Err(_)) => {
                stats.conditional_failures += 1;
                Ok((false, stats))
            }
            Err(refused) => Err(StateError::new(store, &window.key, refused.kind)),
        }
    }

    /// `SET ca = :attempts` (the read ones and `attempt`) on the condition that `ck` and
    /// `ca` are the ones read.
    async fn reclaim_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        let mut stats = WriteStats::default();
        let ClaimState::Claimed { tp, attempts } = &window.claim else {
            return Ok((false, stats));
        };
        let (read, new) = (
            attempts.join(" "),
            format!("{} {attempt}", attempts.join(" ")),
        );
        let (sk, ck, ca) = claim_place(window);
        let request = Update::new(&self.table, item_key(store, &window.window.key), sk)
            .update_expression("SET #ca = :new")
            .condition_expression("#ck = :tp AND #ca = :read")
            .name("#ck", ck.as_str())
            .name("#ca", ca.as_str())
            .value(":tp", Value::S(Cow::Borrowed(tp.as_str())))
            .value(":read", Value::S(Cow::Borrowed(read.as_str())))
            .value(":new", Value::S(Cow::Borrowed(new.as_str())))
            .consumed_capacity();
        stats.requests += 1;
        match self.update_item(request, &mut stats).await {
            Ok(Ok(_)) => Ok((true, stats)),
            Ok(Err(_)) => {
                stats.conditional_failures += 1;
                Ok((false, stats))
            }
            Err(refused) => Err(StateError::new(store, &window.window.key, refused.kind)),
        }
    }

    /// `REMOVE ck, ca` (a closing pass's claim: `ck:<slot>, ca:<slot>, cp:<slot>`) on the
    /// condition that they are the ones read, then `REMOVE w:<window>` (`c:<key>:<slot>`)
    /// from the claiming partition's register.
    async fn finish_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
    ) -> Result<(bool, WriteStats), StateError> {
        let mut stats = WriteStats::default();
        let ClaimState::Claimed { tp, attempts } = &window.claim else {
            return Ok((false, stats));
        };
        let read = attempts.join(" ");
        let (sk, ck, ca) = claim_place(window);
        let cp = format!("cp:{}", window.window.start);
        let request = Update::new(&self.table, item_key(store, &window.window.key), sk)
            .condition_expression("#ck = :tp AND #ca = :read")
            .name("#ck", ck.as_str())
            .name("#ca", ca.as_str())
            .value(":tp", Value::S(Cow::Borrowed(tp.as_str())))
            .value(":read", Value::S(Cow::Borrowed(read.as_str())))
            .consumed_capacity();
        // A closing pass's claim also drops the records it kept, in the item or in pages
        // of their own (named by the removed `cg:<slot>`, deleted next).
        let cg = pages_attribute(window.window.start);
        let request = match window.outputs {
            Some(_) => request
                .update_expression("REMOVE #ck, #ca, #cp, #cg")
                .name("#cp", cp.as_str())
                .name("#cg", cg.as_str())
                .returned(Returned::UpdatedOld),
            None => request.update_expression("REMOVE #ck, #ca"),
        };
        stats.requests += 1;
        match self.update_item(request, &mut stats).await {
            Ok(Ok(old)) => {
                if let Some(AttributeValue::S(pages)) = old.get(&cg)
                    && let Some(pages) = Pages::parse(pages)
                {
                    let (key, pk) = (&window.window.key, item_key(store, &window.window.key));
                    self.delete_claim_pages(
                        (store, key, &pk),
                        window.window.start,
                        &pages,
                        &mut stats,
                    )
                    .await?;
                }
            }
            Ok(Err(_)) => {
                stats.conditional_failures += 1;
                return Ok((false, stats));
            }
            Err(refused) => return Err(StateError::new(store, &window.window.key, refused.kind)),
        }
        let entry = register_entry(window);
        let forget = Update::new(
            &self.table,
            format!("__claims#{store}@{tp}"),
            register_page(&entry),
        )
        .update_expression("REMOVE #e")
        .name("#e", entry.as_str())
        .consumed_capacity();
        stats.requests += 1;
        match self.update_item(forget, &mut stats).await {
            Ok(_) => Ok((true, stats)),
            Err(refused) => Err(StateError::new(store, &window.window.key, refused.kind)),
        }
    }

    /// `REMOVE w:<window>, …` from `tp`'s claim register, 50 entries a request.
    async fn forget_claims(
        &self,
        store: &str,
        tp: &TopicPartition,
        windows: &[ClaimedWindow],
    ) -> Result<WriteStats, StateError> {
        let mut stats = WriteStats::default();
        let mut pages: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for window in windows {
            let entry = register_entry(window);
            pages.entry(register_page(&entry)).or_default().push(entry);
        }
        for (page, entries) in pages {
            self.edit_register(store, tp, page, &entries, false, &mut stats)
                .await?;
        }
        Ok(stats)
    }

    /// Per window, `REMOVE cq, cl` on the condition that its version is the one read (an
    /// update since then keeps it in the index, to be emitted again); then `c:<store>`.
    async fn mark_closed(
        &self,
        store: &str,
        windows: &[ClosedWindow],
        up_to: i64,
    ) -> Result<WriteStats, StateError> {
        let marks: Vec<_> = windows.iter().map(|w| self.mark_one(store, w)).collect();
        let results: Vec<WriteStats> = futures::stream::iter(marks)
            .buffer_unordered(super::WRITE_CONCURRENCY)
            .try_collect()
            .await?;
        let mut stats = WriteStats::default();
        for s in &results {
            stats.add(s);
        }
        self.advance_clock(&format!("c:{store}"), up_to, None, None)
            .await
            .map_err(|e| StateError::new(STREAM_TIME_KEY, store.as_bytes(), e))?;
        stats.requests += 1;
        Ok(stats)
    }

    /// Queries [`CLOSING_INDEX`] as [`closed_windows`](Self::closed_windows) does, for the
    /// store's unwindowed items (`sk = 0`).
    async fn closing_items(&self, store: &str, up_to: i64) -> Result<Vec<ClosingItem>, StateError> {
        let mut out = Vec::new();
        for (key, item) in self.closing(store, up_to).await? {
            if number::<i64>(&item, "sk").is_ok_and(|sk| sk != 0) {
                continue;
            }
            let state = parse_state(&item)
                .map_err(|e| StateError::new(store, &key, StateErrorKind::Corrupt(e)))?;
            out.push(ClosingItem { key, state });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// `SET a = :a, cq/cl` (or `REMOVE cq, cl`) `ADD ver 1` on the condition `ver = :read`.
    async fn close_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        self.rewrite(store, item, aggregate, close_at, None).await
    }

    /// `SET c:<key>:<slot> = 1` on `tp`'s claim register, then the rewrite of
    /// [`close_item`](Self::close_item) with `SET ck:<slot> = :tp, ca:<slot> = :attempt,
    /// cp:<slot> = :outputs` (the slot: the version read).
    async fn claim_closing_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
        claim: ClosingClaim<'_>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        let mut stats = WriteStats::default();
        let slot = i64::try_from(item.state.version).unwrap_or(i64::MAX);
        let pk = item_key(store, &item.key);
        let entry = format!("c:{}:{slot}", URL_SAFE_NO_PAD.encode(&item.key));
        let intent = Update::new(
            &self.table,
            claims_key(store, claim.tp),
            register_page(&entry),
        )
        .update_expression("SET #e = :one")
        .name("#e", entry.as_str())
        .value(":one", Value::N(1))
        .consumed_capacity();
        stats.requests += 1;
        if let Err(refused) = self.update_item(intent, &mut stats).await {
            return Err(StateError::new(store, &item.key, refused.kind));
        }
        // The records in the item when they fit beside what it keeps (DynamoDB says), else
        // in pages of their own (`claim_pages.rs`): never a rewrite refused on every retry.
        if claim.outputs.len() <= claim_pages::PAGE_BYTES {
            match self
                .rewrite(store, item, aggregate, close_at, Some((claim, None)))
                .await
            {
                Err(e) if matches!(e.kind, StateErrorKind::ItemTooLarge) => stats.requests += 1,
                Ok((state, rewrite)) => {
                    stats.add(&rewrite);
                    return Ok((state, stats));
                }
                Err(e) => return Err(e),
            }
        }
        let place = (store, item.key.as_slice(), pk.as_str());
        let pages = self
            .put_claim_pages(place, slot, claim.attempt, claim.outputs, &mut stats)
            .await?;
        let reference = pages.attribute();
        let (state, rewrite) = self
            .rewrite(
                store,
                item,
                aggregate,
                close_at,
                Some((claim, Some(&reference))),
            )
            .await?;
        stats.add(&rewrite);
        if state.is_none() {
            // Another writer changed the item first: these pages are no claim's.
            self.delete_claim_pages(place, slot, &pages, &mut stats)
                .await?;
        }
        Ok((state, stats))
    }
}

impl DynamoStore {
    /// A closing pass's rewrite ([`Store::close_item`]), with `claim` kept in the slot of
    /// the version read ([`Store::claim_closing_item`]): its records in the item, or with
    /// `Some(pages)` the `cg:<slot>` naming the pages that hold them.
    async fn rewrite(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
        claim: Option<(ClosingClaim<'_>, Option<&str>)>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        let mut stats = WriteStats {
            requests: 1,
            ..WriteStats::default()
        };
        let pk = item_key(store, &item.key);
        let slot = i64::try_from(item.state.version).unwrap_or(i64::MAX);
        let (ck, ca, cp) = slot_attributes(slot);
        let tp = claim.map(|(c, _)| c.tp.to_string());
        let cg = pages_attribute(slot);
        let request = Update::new(&self.table, pk.as_str(), 0)
            .condition_expression("#ver = :read")
            .name("#ver", "ver")
            .name("#a", "a")
            .name("#cq", CLOSING_STORE)
            .name("#cl", CLOSING_TIME)
            .value(":read", Value::U(item.state.version))
            .value(":one", Value::N(1))
            .value(":a", Value::B(Cow::Borrowed(aggregate)))
            .returned(Returned::AllNew)
            .consumed_capacity();
        // Under exactly-once output, the claim of the slot in the same write.
        let (request, claimed) = match (claim, &tp) {
            (Some((claim, kept)), Some(tp)) => {
                let request = request
                    .name("#ck", ck.as_str())
                    .name("#ca", ca.as_str())
                    .value(":tp", Value::S(Cow::Borrowed(tp.as_str())))
                    .value(":at", Value::S(Cow::Borrowed(claim.attempt)));
                match kept {
                    None => (
                        request
                            .name("#cp", cp.as_str())
                            .value(":out", Value::B(Cow::Borrowed(claim.outputs))),
                        ", #ck = :tp, #ca = :at, #cp = :out",
                    ),
                    Some(pages) => (
                        request
                            .name("#cg", cg.as_str())
                            .value(":pg", Value::S(Cow::Borrowed(pages))),
                        ", #ck = :tp, #ca = :at, #cg = :pg",
                    ),
                }
            }
            _ => (request, ""),
        };
        let request = match close_at {
            Some(at) => request
                .update_expression(format!(
                    "SET #a = :a, #cq = :cq, #cl = :cl{claimed} ADD #ver :one"
                ))
                .value(":cq", Value::S(Cow::Borrowed(store)))
                .value(":cl", Value::N(at)),
            None => request.update_expression(format!(
                "SET #a = :a{claimed} ADD #ver :one REMOVE #cq, #cl"
            )),
        };
        let result = self.update_item(request, &mut stats).await;
        // The cached copy (if any) is stale now either way.
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&format!("{pk}#0"));
        match result {
            Ok(Ok(written)) => {
                let state = parse_state(&written)
                    .map_err(|e| StateError::new(store, &item.key, StateErrorKind::Corrupt(e)))?;
                Ok((Some(state), stats))
            }
            Ok(Err(_)) => Ok((None, stats)),
            Err(refused) => Err(StateError::new(store, &item.key, refused.kind)),
        }
    }
}

impl DynamoStore {
    /// The pages of `tp`'s claim register for `store` ([`REGISTER_PAGES`]): one strongly
    /// consistent `Query` of its partition key (one request a MB). Entries still on page 0
    /// (the one-item register of earlier versions) are first added to their pages, then
    /// removed from page 0, so that a claim is named somewhere at every point.
    async fn register(
        &self,
        store: &str,
        tp: &TopicPartition,
        stats: &mut WriteStats,
    ) -> Result<Vec<Item>, String> {
        let pk = claims_key(store, tp);
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", "pk")
            .expression_attribute_values(":pk", AttributeValue::S(pk.clone()))
            .consistent_read(true)
            .into_paginator()
            .send();
        let mut items = Vec::new();
        while let Some(page) = pages.next().await {
            stats.requests += 1;
            let page = page.map_err(|e| {
                format!(
                    "cannot read the claim register {pk:?}: {}",
                    self.describe(&e)
                )
            })?;
            items.extend(page.items().iter().cloned());
        }
        let legacy: Vec<String> = items
            .iter()
            .filter(|item| matches!(item.get("sk"), Some(AttributeValue::N(n)) if n == "0"))
            .flat_map(|item| item.keys())
            .filter(|name| name.starts_with("w:") || name.starts_with("c:"))
            .cloned()
            .collect();
        if !legacy.is_empty() {
            let mut moved: BTreeMap<i64, Vec<String>> = BTreeMap::new();
            for entry in &legacy {
                moved
                    .entry(register_page(entry))
                    .or_default()
                    .push(entry.clone());
            }
            let err = |e: StateError| e.to_string();
            for (page, entries) in moved {
                self.edit_register(store, tp, page, &entries, true, stats)
                    .await
                    .map_err(err)?;
            }
            self.edit_register(store, tp, 0, &legacy, false, stats)
                .await
                .map_err(err)?;
        }
        Ok(items)
    }

    /// Adds (`SET <entry> = 1`) or removes (`REMOVE <entry>`) `entries` on page `page` of
    /// `tp`'s claim register for `store`, 50 a request.
    async fn edit_register(
        &self,
        store: &str,
        tp: &TopicPartition,
        page: i64,
        entries: &[String],
        add: bool,
        stats: &mut WriteStats,
    ) -> Result<(), StateError> {
        for chunk in entries.chunks(50) {
            let mut request = Update::new(&self.table, claims_key(store, tp), page);
            let mut parts = Vec::with_capacity(chunk.len());
            for (i, entry) in chunk.iter().enumerate() {
                let p = placeholder("#e", i);
                parts.push(if add {
                    format!("{p} = :one")
                } else {
                    p.to_string()
                });
                request = request.name(p, entry.as_str());
            }
            let request = if add {
                request
                    .update_expression(format!("SET {}", parts.join(", ")))
                    .value(":one", Value::N(1))
            } else {
                request.update_expression(format!("REMOVE {}", parts.join(", ")))
            }
            .consumed_capacity();
            stats.requests += 1;
            if let Err(refused) = self.update_item(request, stats).await {
                return Err(StateError::new(store, b"*", refused.kind));
            }
        }
        Ok(())
    }

    /// Reads items by primary key: strongly consistent `BatchGetItem`, 100 keys a request,
    /// unprocessed keys sent again with backoff.
    async fn batch_get(&self, keys: Vec<Item>) -> Result<Vec<Item>, String> {
        let mut items = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(100) {
            let mut pending = KeysAndAttributes::builder()
                .set_keys(Some(chunk.to_vec()))
                .consistent_read(true)
                .build()
                .map_err(|e| e.to_string())?;
            for attempt in 0u32.. {
                if attempt > 0 {
                    tokio::time::sleep(backoff(attempt.min(6))).await;
                }
                let mut out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, pending.clone())
                    .send()
                    .await
                    .map_err(|e| self.describe(&e))?;
                if let Some(found) = out.responses.as_mut().and_then(|r| r.remove(&self.table)) {
                    items.extend(found);
                }
                match out.unprocessed_keys().and_then(|u| u.get(&self.table)) {
                    Some(left) if !left.keys().is_empty() => pending = left.clone(),
                    _ => break,
                }
            }
        }
        Ok(items)
    }

    /// The items of `store` in [`CLOSING_INDEX`] closing at or before `up_to`, read
    /// strongly consistent (the index is eventually consistent, the items are not), without
    /// those that left the index meanwhile: each with its raw key.
    async fn closing(&self, store: &str, up_to: i64) -> Result<Vec<(Vec<u8>, Item)>, StateError> {
        let err = |e: String| StateError::new(store, b"*", StateErrorKind::Request(e));
        let mut keys = Vec::new();
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(CLOSING_INDEX)
            .key_condition_expression("#cq = :cq AND #cl <= :t")
            .expression_attribute_names("#cq", CLOSING_STORE)
            .expression_attribute_names("#cl", CLOSING_TIME)
            .expression_attribute_values(":cq", AttributeValue::S(store.to_owned()))
            .expression_attribute_values(":t", AttributeValue::N(up_to.to_string()))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| {
                err(format!(
                    "cannot query index {CLOSING_INDEX:?} of table {:?} (emit-on-close \
                     stores and left or outer stream–stream joins need it; see create_table \
                     and template.yaml): {}",
                    self.table,
                    self.describe(&e)
                ))
            })?;
            for item in page.items() {
                let mut key = HashMap::new();
                for name in ["pk", "sk"] {
                    let value = item
                        .get(name)
                        .ok_or_else(|| err(format!("an index entry has no {name}")))?;
                    key.insert(name.to_owned(), value.clone());
                }
                keys.push(key);
            }
        }
        let mut out = Vec::new();
        for item in self.batch_get(keys).await.map_err(&err)? {
            let still_open = item.contains_key(CLOSING_STORE)
                && number::<i64>(&item, CLOSING_TIME).is_ok_and(|t| t <= up_to);
            if !still_open {
                continue;
            }
            let key = match item.get("k") {
                Some(AttributeValue::B(b)) => b.as_ref().to_vec(),
                _ => return Err(err("an item has no key attribute k".into())),
            };
            out.push((key, item));
        }
        Ok(out)
    }

    /// Removes one closed window from [`CLOSING_INDEX`] if its version is still `window`'s.
    async fn mark_one(&self, store: &str, window: &ClosedWindow) -> Result<WriteStats, StateError> {
        let mut stats = WriteStats {
            requests: 1,
            ..WriteStats::default()
        };
        let request = Update::new(&self.table, item_key(store, &window.key), window.start)
            .update_expression("REMOVE #cq, #cl")
            .condition_expression("#ver = :v")
            .name("#cq", CLOSING_STORE)
            .name("#cl", CLOSING_TIME)
            .name("#ver", "ver")
            .value(":v", Value::U(window.state.version))
            .consumed_capacity();
        match self.update_item(request, &mut stats).await {
            // Refused: the window changed since it was read, its next close marks it.
            Ok(_) => Ok(stats),
            Err(refused) => Err(StateError::new(store, &window.key, refused.kind)),
        }
    }

    /// Moves attribute `name` of the clock item forward to `time` (never back), and sets
    /// `stamp` with it.
    async fn advance_clock(
        &self,
        name: &str,
        time: i64,
        stamp: Option<(&str, i64)>,
        also: Option<(&str, i64)>,
    ) -> Result<bool, StateErrorKind> {
        let mut request = Update::new(&self.table, STREAM_TIME_KEY, 0)
            .update_expression("SET #t = :t")
            .condition_expression("attribute_not_exists(#t) OR #t < :t")
            .name("#t", name)
            .value(":t", Value::N(time));
        let mut set = String::from("SET #t = :t");
        if let Some((stamp, at)) = stamp {
            set.push_str(", #u = :u, #s = if_not_exists(#s, :u)");
            request = request
                .name("#u", stamp)
                .name("#s", "s")
                .value(":u", Value::N(at));
        }
        if let Some((other, value)) = also {
            // Another attribute moved forward in the same write, on the same condition.
            set.push_str(", #a = :a");
            request = request
                .condition_expression(
                    "(attribute_not_exists(#t) OR #t < :t) AND \
                     (attribute_not_exists(#a) OR #a < :a)",
                )
                .name("#a", other)
                .value(":a", Value::N(value));
        }
        let request = request.update_expression(set);
        // A refused condition: the clock is at `time` (or `also`'s value) or later already.
        let mut stats = WriteStats::default();
        match self.update_item(request, &mut stats).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(_)) => Ok(false),
            Err(refused) => Err(refused.kind),
        }
    }

    /// Every item of `store`, in no particular order: its key, its window start (windowed
    /// items, which carry a TTL), and its state; items past their TTL are left out. An
    /// interactive query: it scans the table, so it is for tools, not for batches.
    pub async fn scan(&self, store: &str) -> Result<Vec<ScannedItem>, StateError> {
        let err = |e: String| StateError::new(store, b"*", StateErrorKind::Request(e));
        let now = unix_seconds();
        let mut items = Vec::new();
        let mut pages = self
            .client
            .scan()
            .table_name(&self.table)
            .filter_expression("begins_with(pk, :prefix)")
            .expression_attribute_values(":prefix", AttributeValue::S(format!("{store}#")))
            .consistent_read(true)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| err(self.describe(&e)))?;
            for item in page.items() {
                if expired(item, now) {
                    continue;
                }
                let key = match item.get("k") {
                    Some(AttributeValue::B(b)) => b.as_ref().to_vec(),
                    _ => return Err(err("an item has no key attribute k".into())),
                };
                let corrupt = |e: String| StateError::new(store, &key, StateErrorKind::Corrupt(e));
                let window = match item.contains_key(TTL_ATTRIBUTE) {
                    true => Some(number(item, "sk").map_err(corrupt)?),
                    false => None,
                };
                let state = parse_state(item).map_err(corrupt)?;
                items.push(ScannedItem { key, window, state });
            }
        }
        Ok(items)
    }
}

fn classify(table: &str, error: &UpdateItemError) -> StateErrorKind {
    classify_code(table, error.code(), error.message().unwrap_or_default())
}

/// What a refused write means, from the service's error code and message.
fn classify_code(table: &str, code: Option<&str>, message: &str) -> StateErrorKind {
    if code == Some("ValidationException") && message.starts_with("Item size") {
        StateErrorKind::ItemTooLarge
    } else {
        StateErrorKind::Request(describe_request(
            table,
            code,
            format!("{}: {message}", code.unwrap_or("unknown error")),
        ))
    }
}

/// A one-line description of an SDK error, with the service's code and message when
/// there is one, and the cause chain otherwise (e.g. an unreachable endpoint).
pub fn describe_sdk_error<E, R>(error: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    if let Some(code) = error.code() {
        return format!("{code}: {}", error.message().unwrap_or_default());
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn unix_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn backoff(attempt: u32) -> Duration {
    let base = 10u64 << attempt.min(6);
    Duration::from_millis(base / 2 + rand::random_range(0..=base / 2))
}

/// Names the closing index's attributes (`#cq`, `#cl`) and the store (`:cq`) in `request`.
fn closing_names<'a>(request: Update<'a>, store: &'a str) -> Update<'a> {
    request
        .name("#cq", CLOSING_STORE)
        .name("#cl", CLOSING_TIME)
        .value(":cq", Value::S(Cow::Borrowed(store)))
}
