//! The DynamoDB store: exactly-once effect with one conditional write per touched item
//! per batch in the common case (design notes, section 4).
//!
//! # Item layout
//! One table holds every store of a function (on-demand billing). An item:
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `pk` | S | `<store>#<key as unpadded base64url>`; store names exclude `#`, so no two (store, key) pairs collide |
//! | `sk` | N | `0` for a key's item (windowed items will use the window start) |
//! | `v` | N | the aggregate |
//! | `ver` | N | the version, +1 per write that changes the item |
//! | `k` | B | the raw key, for queries and scans |
//! | `fv` | N | the item format version (`1`) |
//! | `w:<topic>-<partition>` | N | watermark: the highest source offset of that partition whose effect `v` holds |
//!
//! Watermarks are top-level attributes rather than entries of one map attribute: an
//! update can then create the item and set a watermark in the same request
//! (`SET wm.#p` fails on an item without `wm`), which keeps the first write of a key to
//! one request.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::event::TopicPartition;
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, KeysAndAttributes, Projection, ProjectionType, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TimeToLiveSpecification,
};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::{StreamExt, TryStreamExt};

use super::{
    Clock, ClosedWindow, Guarantee, ItemState, ItemWrite, PartitionTime, StateError,
    StateErrorKind, Store, WriteStats, above_watermarks, offset_ranges,
};

/// The item format this release writes and reads.
pub const FORMAT_VERSION: i64 = 1;
/// Prefix of the watermark attributes.
pub const WATERMARK_PREFIX: &str = "w:";
/// The partition key of the item holding the partitions' stream times.
pub const STREAM_TIME_KEY: &str = "__stream-time";
/// The TTL attribute of windowed items (epoch seconds).
pub const TTL_ATTRIBUTE: &str = "ttl";
/// The global secondary index that finds emit-on-close windows by close time: partition
/// key `cq` (the store name), sort key `cl` (the close time, epoch ms), keys only. A
/// window leaves the (sparse) index when it is marked closed.
pub const CLOSING_INDEX: &str = "closing";
/// The attributes of [`CLOSING_INDEX`].
pub const CLOSING_STORE: &str = "cq";
/// See [`CLOSING_STORE`].
pub const CLOSING_TIME: &str = "cl";

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
    /// refused write, which returns the current item).
    cache: Arc<Mutex<HashMap<String, Item>>>,
}

/// A DynamoDB item's attributes.
type Item = HashMap<String, AttributeValue>;

/// How many general-aggregate items the container keeps (then the cache starts over).
const CACHE_ITEMS: usize = 100_000;

impl DynamoStore {
    /// A store on `table`, through `client`, with the given guarantee.
    pub fn new(client: Client, table: impl Into<String>, guarantee: Guarantee) -> Self {
        DynamoStore {
            client,
            table: table.into(),
            guarantee,
            cache: Arc::new(Mutex::new(HashMap::new())),
        }
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

    /// The attributes every write sets besides the value and the watermarks.
    fn base_set(write: &ItemWrite<'_>) -> Vec<String> {
        let mut set = vec!["#k = :k".to_owned(), "#fv = :fv".to_owned()];
        if write.expires_at.is_some() {
            set.push("#ttl = :ttl".to_owned());
        }
        if write.close_at.is_some() {
            set.push("#cq = :cq, #cl = :cl".to_owned());
        }
        set
    }

    fn update(&self, write: &ItemWrite<'_>, fold: bool) -> UpdateItemFluentBuilder {
        let (store, key) = (write.store, write.key);
        let (value, returned) = if fold {
            ("a", ReturnValue::AllNew)
        } else {
            ("v", ReturnValue::UpdatedNew)
        };
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(item_key(store, key)))
            .key(
                "sk",
                AttributeValue::N(write.window.unwrap_or(0).to_string()),
            )
            .return_values(returned)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .expression_attribute_names("#v", value)
            .expression_attribute_names("#ver", "ver")
            .expression_attribute_names("#k", "k")
            .expression_attribute_names("#fv", "fv")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .expression_attribute_values(":k", AttributeValue::B(Blob::new(key)))
            .expression_attribute_values(":fv", AttributeValue::N(FORMAT_VERSION.to_string()));
        let request = match write.expires_at {
            Some(at) => request
                .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
                .expression_attribute_values(":ttl", AttributeValue::N(at.to_string())),
            None => request,
        };
        match write.close_at {
            Some(at) => request
                .expression_attribute_names("#cq", CLOSING_STORE)
                .expression_attribute_names("#cl", CLOSING_TIME)
                .expression_attribute_values(":cq", AttributeValue::S(store.to_owned()))
                .expression_attribute_values(":cl", AttributeValue::N(at.to_string())),
            None => request,
        }
    }

    /// Sends one update; `Ok(Err(item))` is a failed condition with the current item.
    async fn send(
        &self,
        request: UpdateItemFluentBuilder,
        write: &ItemWrite<'_>,
        stats: &mut WriteStats,
    ) -> Result<Result<Item, Option<Item>>, StateError> {
        stats.requests += 1;
        match request.send().await {
            Ok(out) => {
                if let Some(units) = out.consumed_capacity().and_then(|c| c.capacity_units()) {
                    stats.consumed_write_units += units;
                }
                Ok(Ok(out.attributes().cloned().unwrap_or_default()))
            }
            Err(SdkError::ServiceError(e)) => match e.into_err() {
                UpdateItemError::ConditionalCheckFailedException(failed) => {
                    stats.conditional_failures += 1;
                    Ok(Err(failed.item))
                }
                other => Err(StateError::new(
                    write.store,
                    write.key,
                    classify(&self.table, &other),
                )),
            },
            Err(other) => Err(StateError::new(
                write.store,
                write.key,
                StateErrorKind::Request(self.describe(&other)),
            )),
        }
    }

    fn corrupt(write: &ItemWrite<'_>, reason: String) -> StateError {
        StateError::new(write.store, write.key, StateErrorKind::Corrupt(reason))
    }

    /// Parses a written item's state; for a general aggregate, also caches the item.
    fn written(&self, write: &ItemWrite<'_>, item: Item) -> Result<ItemState, StateError> {
        let state = parse_state(&item).map_err(|e| Self::corrupt(write, e))?;
        if write.fold.is_some() {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.len() >= CACHE_ITEMS {
                cache.clear();
            }
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
        let request = self
            .update(write, false)
            .update_expression(format!(
                "ADD #v :d, #ver :one SET {}",
                Self::base_set(write).join(", ")
            ))
            .expression_attribute_values(":d", AttributeValue::N(delta.to_string()));
        let mut stats = WriteStats::default();
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
        mut current: Option<Item>,
        stats: &mut WriteStats,
    ) -> Result<ItemState, StateError> {
        for attempt in 0..MAX_CONFLICT_ATTEMPTS {
            let item = current.take().unwrap_or_default();
            let watermarks = parse_watermarks(&item).map_err(|e| Self::corrupt(write, e))?;
            let (delta, marks) = above_watermarks(write, &watermarks);
            let stored = if item.is_empty() {
                None
            } else {
                Some(parse_state(&item).map_err(|e| Self::corrupt(write, e))?)
            };
            if marks.is_empty() {
                // The item holds every contribution already (a redelivery).
                return Ok(stored.unwrap_or(ItemState::number(0, 0)));
            }
            let mut set = Self::base_set(write);
            let mut request = self.update(write, write.fold.is_some());
            let mut add = "ADD #ver :one".to_owned();
            match write.fold {
                Some(fold) => {
                    let held = super::held_up_to(write, &watermarks);
                    let include = |tp: u32, offset: i64| super::is_new(&held, tp, offset);
                    let current = stored.as_ref().and_then(|s| s.aggregate.as_deref());
                    let aggregate = fold.fold(current, &include).map_err(|e| {
                        StateError::new(write.store, write.key, StateErrorKind::Aggregate(e))
                    })?;
                    request = request
                        .expression_attribute_values(":a", AttributeValue::B(Blob::new(aggregate)));
                    set.push("#v = :a".to_owned());
                }
                None => {
                    request = request
                        .expression_attribute_values(":d", AttributeValue::N(delta.to_string()));
                    add = "ADD #v :d, #ver :one".to_owned();
                }
            }
            for (i, (tp, last)) in marks.iter().enumerate() {
                let tp = &write.partitions[*tp as usize];
                request = request
                    .expression_attribute_names(format!("#w{i}"), format!("{WATERMARK_PREFIX}{tp}"))
                    .expression_attribute_values(
                        format!(":l{i}"),
                        AttributeValue::N(last.to_string()),
                    );
                set.push(format!("#w{i} = :l{i}"));
            }
            request = match &stored {
                Some(state) => request
                    .condition_expression("#ver = :read")
                    .expression_attribute_values(
                        ":read",
                        AttributeValue::N(state.version.to_string()),
                    ),
                None => request.condition_expression("attribute_not_exists(#ver)"),
            };
            let request = request.update_expression(format!("{add} SET {}", set.join(", ")));
            if attempt > 0 {
                stats.retries += 1;
                tokio::time::sleep(backoff(attempt)).await;
            }
            match self.send(request, write, stats).await? {
                Ok(item) => return self.written(write, item),
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
    ) -> Result<(ItemState, WriteStats), StateError> {
        let delta: i64 = write.contributions.iter().map(|c| c.delta).sum();
        let mut set = Self::base_set(write);
        let mut conditions = Vec::new();
        let mut request = self
            .update(write, false)
            .expression_attribute_values(":d", AttributeValue::N(delta.to_string()));
        for (i, (tp, first, last)) in offset_ranges(write).into_iter().enumerate() {
            let tp = &write.partitions[tp as usize];
            request = request
                .expression_attribute_names(format!("#w{i}"), format!("{WATERMARK_PREFIX}{tp}"))
                .expression_attribute_values(format!(":f{i}"), AttributeValue::N(first.to_string()))
                .expression_attribute_values(format!(":l{i}"), AttributeValue::N(last.to_string()));
            set.push(format!("#w{i} = :l{i}"));
            conditions.push(format!("(attribute_not_exists(#w{i}) OR #w{i} < :f{i})"));
        }
        let request = request
            .update_expression(format!("ADD #v :d, #ver :one SET {}", set.join(", ")))
            .condition_expression(conditions.join(" AND "));
        let mut stats = WriteStats::default();
        let state = match self.send(request, write, &mut stats).await? {
            Ok(item) => self.written(write, item)?,
            Err(current) => self.merge(write, current, &mut stats).await?,
        };
        Ok((state, stats))
    }
}

#[async_trait]
impl Store for DynamoStore {
    /// Additive stores: one conditional `ADD` per item (fast path), the read-merge-write
    /// fallback when it is refused. General aggregates: one write conditioned on the
    /// version of the item as this container last wrote it (cached), or on its absence
    /// for an item it has not seen; a refused write returns the current item to merge with.
    async fn apply(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError> {
        match (self.guarantee, write.fold) {
            (Guarantee::AtLeastOnce, _) => self.apply_at_least_once(&write).await,
            (Guarantee::ExactlyOnce, None) => self.apply_additive(&write).await,
            (Guarantee::ExactlyOnce, Some(_)) => {
                let mut stats = WriteStats::default();
                let state = self.merge(&write, self.cached(&write), &mut stats).await?;
                Ok((state, stats))
            }
        }
    }

    /// Strongly consistent `BatchGetItem`s, 100 keys each.
    async fn get_many(
        &self,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Result<HashMap<Vec<u8>, ItemState>, StateError> {
        let requests = keys
            .iter()
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
    /// (stream time) and `u:<topic>-<partition>` (when it advanced), per emit-on-close
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

    /// One conditional write per partition (`t:<tp> < :time`); a refused one means
    /// another invocation already moved the partition's stream time further.
    async fn advance_stream_times(
        &self,
        times: &[(TopicPartition, i64)],
        now_ms: i64,
    ) -> Result<(), StateError> {
        for (tp, time) in times {
            self.advance_clock(
                &format!("t:{tp}"),
                *time,
                Some((&format!("u:{tp}"), now_ms)),
            )
            .await
            .map_err(|e| StateError::new(STREAM_TIME_KEY, tp.to_string().as_bytes(), e))?;
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
                     stores need it; see create_table and template.yaml): {}",
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
        let mut windows = Vec::new();
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
            .buffer_unordered(crate::runtime::batch::WRITE_CONCURRENCY)
            .try_collect()
            .await?;
        let mut stats = WriteStats::default();
        for s in &results {
            stats.add(s);
        }
        self.advance_clock(&format!("c:{store}"), up_to, None)
            .await
            .map_err(|e| StateError::new(STREAM_TIME_KEY, store.as_bytes(), e))?;
        stats.requests += 1;
        Ok(stats)
    }
}

impl DynamoStore {
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

    /// Removes one closed window from [`CLOSING_INDEX`] if its version is still `window`'s.
    async fn mark_one(&self, store: &str, window: &ClosedWindow) -> Result<WriteStats, StateError> {
        let mut stats = WriteStats {
            requests: 1,
            ..WriteStats::default()
        };
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(item_key(store, &window.key)))
            .key("sk", AttributeValue::N(window.start.to_string()))
            .update_expression("REMOVE #cq, #cl")
            .condition_expression("#ver = :v")
            .expression_attribute_names("#cq", CLOSING_STORE)
            .expression_attribute_names("#cl", CLOSING_TIME)
            .expression_attribute_names("#ver", "ver")
            .expression_attribute_values(":v", AttributeValue::N(window.state.version.to_string()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match result {
            Ok(out) => {
                if let Some(units) = out.consumed_capacity().and_then(|c| c.capacity_units()) {
                    stats.consumed_write_units += units;
                }
            }
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                stats.conditional_failures += 1;
            }
            Err(e) => {
                return Err(StateError::new(
                    store,
                    &window.key,
                    StateErrorKind::Request(self.describe(&e)),
                ));
            }
        }
        Ok(stats)
    }

    /// Moves attribute `name` of the clock item forward to `time` (never back), and sets
    /// `stamp` with it.
    async fn advance_clock(
        &self,
        name: &str,
        time: i64,
        stamp: Option<(&str, i64)>,
    ) -> Result<(), StateErrorKind> {
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(STREAM_TIME_KEY.to_owned()))
            .key("sk", AttributeValue::N("0".into()))
            .update_expression("SET #t = :t")
            .condition_expression("attribute_not_exists(#t) OR #t < :t")
            .expression_attribute_names("#t", name)
            .expression_attribute_values(":t", AttributeValue::N(time.to_string()));
        if let Some((stamp, at)) = stamp {
            request = request
                .update_expression("SET #t = :t, #u = :u, #s = if_not_exists(#s, :u)")
                .expression_attribute_names("#u", stamp)
                .expression_attribute_names("#s", "s")
                .expression_attribute_values(":u", AttributeValue::N(at.to_string()));
        }
        match request.send().await {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                Ok(())
            }
            Err(e) => Err(StateErrorKind::Request(self.describe(&e))),
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

/// An item as [`DynamoStore::scan`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedItem {
    /// The key, as the aggregation's key serde encoded it.
    pub key: Vec<u8>,
    /// The window start (epoch ms) of a windowed item.
    pub window: Option<i64>,
    /// The item's state.
    pub state: ItemState,
}

/// The cache key of an item: partition key and window.
fn cache_key(write: &ItemWrite<'_>) -> String {
    format!(
        "{}#{}",
        item_key(write.store, write.key),
        write.window.unwrap_or(0)
    )
}

/// The partition key of `key` in `store`.
pub fn item_key(store: &str, key: &[u8]) -> String {
    format!("{store}#{}", URL_SAFE_NO_PAD.encode(key))
}

fn number<T: std::str::FromStr>(
    item: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<T, String> {
    match item.get(name) {
        Some(AttributeValue::N(n)) => n
            .parse()
            .map_err(|_| format!("attribute {name} = {n} is out of range")),
        Some(_) => Err(format!("attribute {name} is not a number")),
        None => Err(format!("attribute {name} is missing")),
    }
}

fn parse_state(item: &Item) -> Result<ItemState, String> {
    if let Some(AttributeValue::N(fv)) = item.get("fv")
        && fv.parse::<i64>().ok() != Some(FORMAT_VERSION)
    {
        return Err(format!(
            "item format version {fv} is not supported (this release reads {FORMAT_VERSION})"
        ));
    }
    let (value, aggregate) = match item.get("a") {
        Some(AttributeValue::B(bytes)) => (0, Some(bytes.as_ref().to_vec())),
        Some(_) => return Err("attribute a is not binary".to_owned()),
        None => (number(item, "v")?, None),
    };
    Ok(ItemState {
        value,
        aggregate,
        version: number(item, "ver")?,
    })
}

fn parse_watermarks(
    item: &HashMap<String, AttributeValue>,
) -> Result<HashMap<String, i64>, String> {
    item.keys()
        .filter_map(|name| name.strip_prefix(WATERMARK_PREFIX).map(|tp| (name, tp)))
        .map(|(name, tp)| Ok((tp.to_owned(), number(item, name)?)))
        .collect()
}

fn classify(table: &str, error: &UpdateItemError) -> StateErrorKind {
    let message = error.message().unwrap_or_default();
    if error.code() == Some("ValidationException") && message.contains("size") {
        StateErrorKind::ItemTooLarge
    } else {
        StateErrorKind::Request(describe_request(
            table,
            error.code(),
            format!("{}: {message}", error.code().unwrap_or("unknown error")),
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

/// Whether an item is past its TTL: DynamoDB deletes such items lazily (within days),
/// so reads leave them out themselves.
fn expired(item: &Item, now_seconds: i64) -> bool {
    number::<i64>(item, TTL_ATTRIBUTE).is_ok_and(|ttl| ttl < now_seconds)
}

fn backoff(attempt: u32) -> Duration {
    let base = 10u64 << attempt.min(6);
    Duration::from_millis(base / 2 + rand::random_range(0..=base / 2))
}

/// Creates the state table (`pk` S + `sk` N, on-demand, TTL on `ttl`, the
/// [`CLOSING_INDEX`] for emit-on-close windows) if it does not exist.
/// For local runs and tests; in AWS, `template.yaml` creates it.
pub async fn create_table(client: &Client, table: &str) -> Result<(), StateError> {
    let err = |e: String| StateError::new("<table>", table.as_bytes(), StateErrorKind::Request(e));
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk", ScalarAttributeType::S))
        .attribute_definitions(attr("sk", ScalarAttributeType::N))
        .attribute_definitions(attr(CLOSING_STORE, ScalarAttributeType::S))
        .attribute_definitions(attr(CLOSING_TIME, ScalarAttributeType::N))
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(CLOSING_INDEX)
                .key_schema(key(CLOSING_STORE, KeyType::Hash))
                .key_schema(key(CLOSING_TIME, KeyType::Range))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(|e| err(e.to_string()))?,
        )
        .send()
        .await;
    match created {
        Ok(_) => {}
        Err(e) if e.code() == Some("ResourceInUseException") => return Ok(()),
        Err(e) => return Err(err(describe_sdk_error(&e))),
    }
    let ttl = TimeToLiveSpecification::builder()
        .enabled(true)
        .attribute_name(TTL_ATTRIBUTE)
        .build()
        .map_err(|e| err(e.to_string()))?;
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(ttl)
        .send()
        .await
        .map_err(|e| err(describe_sdk_error(&e)))?;
    Ok(())
}

fn attr(name: &str, kind: ScalarAttributeType) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .expect("name and type are set")
}

fn key(name: &str, kind: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .expect("name and type are set")
}

/// A client for a local emulator at `endpoint` (e.g. dynoxide), with static dummy
/// credentials and a fixed region: it never consults the default credential chain
/// (which would query the instance metadata service). The client has the default
/// [`RetrySettings`] and a retry budget of its own.
pub fn emulator_client(endpoint: &str) -> Client {
    emulator_client_with(endpoint, RetrySettings::default())
}

/// [`emulator_client`] with other retry settings; every call gets a retry budget of its
/// own, so clients (tests, stores) never spend one another's.
pub fn emulator_client_with(endpoint: &str, retry: RetrySettings) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_credential_types::Credentials::new(
            "lambda-streams-local",
            "lambda-streams-local",
            None,
            None,
            "lambda-streams-emulator",
        ))
        .retry_config(retry.retry_config())
        .retry_partition(retry.retry_partition(endpoint))
        .http_client(https_client(crate::lambda::TlsRoots::System))
        .build();
    Client::from_conf(config)
}

/// The HTTPS client of the AWS SDK clients (DynamoDB, and the credentials chain of MSK IAM):
/// the SDK's default client (hyper 1, rustls, proxy settings from the environment) with
/// rustls on *ring* rather than aws-lc (the SDK's default; aws-lc is ~1 MB more of zip, and
/// the binary links a second TLS stack, OpenSSL, for librdkafka anyway), trusting `roots`:
/// [`TlsRoots::Aws`], Amazon Trust Services' roots compiled into the binary (the default);
/// [`TlsRoots::Compiled`], all of the root store compiled into the binary (Mozilla's, from
/// `webpki-root-certs`; Amazon's roots included), nothing read at start-up either; or
/// [`TlsRoots::System`], the system's (read and parsed when the first connector is built:
/// a bundle and a directory of ~150 files each where `SSL_CERT_DIR` is set; BENCHMARKS.md
/// section 4). The SDK crates are built without their `default-https-client` feature, so a
/// client without this one has no HTTP client: every SDK client of the framework is given
/// it ([`crate::lambda::run`], [`emulator_client`]).
///
/// [`TlsRoots::Aws`]: crate::lambda::TlsRoots::Aws
/// [`TlsRoots::Compiled`]: crate::lambda::TlsRoots::Compiled
/// [`TlsRoots::System`]: crate::lambda::TlsRoots::System
pub fn https_client(roots: crate::lambda::TlsRoots) -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    use aws_smithy_http_client::{Builder, ConnectorBuilder, proxy::ProxyConfig};
    let trust_store = match roots {
        crate::lambda::TlsRoots::Aws => {
            TrustStore::empty().with_pem_certificate(compiled_roots_pem(true))
        }
        crate::lambda::TlsRoots::Compiled => {
            TrustStore::empty().with_pem_certificate(compiled_roots_pem(false))
        }
        crate::lambda::TlsRoots::System => TrustStore::empty().with_native_roots(true),
    };
    let context = TlsContext::builder()
        .with_trust_store(trust_store)
        .build()
        .unwrap_or_default();
    Builder::new().build_with_connector_fn(move |settings, components| {
        // As the SDK's default client (aws-smithy-runtime's `default_https_client`), with
        // the crypto provider and trust store above.
        let mut builder = ConnectorBuilder::default()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .tls_context(context.clone());
        builder.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            builder.set_sleep_impl(components.sleep_impl());
        }
        builder.set_proxy_config(Some(ProxyConfig::from_env()));
        builder.build()
    })
}

/// The common names of Amazon Trust Services' roots ([`crate::lambda::TlsRoots::Aws`]):
/// AWS endpoints' certificates chain to Amazon Root CA 1 to 4, which Starfield Services
/// Root CA G2 cross-signs (<https://www.amazontrust.com/repository/>).
const AMAZON_TRUST_SERVICES_ROOTS: [&[u8]; 5] = [
    b"Amazon Root CA 1",
    b"Amazon Root CA 2",
    b"Amazon Root CA 3",
    b"Amazon Root CA 4",
    b"Starfield Services Root Certificate Authority - G2",
];

/// Whether a root certificate (DER) is one of Amazon Trust Services': its subject's common
/// name (a DER UTF8String/PrintableString, so the name preceded by its length) is one of
/// [`AMAZON_TRUST_SERVICES_ROOTS`]. Roots are self-signed: the issuer holds the same name.
fn is_amazon_trust_services_root(der: &[u8]) -> bool {
    AMAZON_TRUST_SERVICES_ROOTS.iter().any(|name| {
        let mut tagged = Vec::with_capacity(name.len() + 1);
        tagged.push(name.len() as u8);
        tagged.extend_from_slice(name);
        memchr::memmem::find(der, &tagged).is_some()
    })
}

/// The compiled-in root certificates, PEM-encoded (the form the SDK's trust store takes):
/// Amazon Trust Services' only with `amazon_only`, else all of them.
fn compiled_roots_pem(amazon_only: bool) -> Vec<u8> {
    use base64::engine::general_purpose::STANDARD;
    let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .filter(|cert| !amazon_only || is_amazon_trust_services_root(cert.as_ref()));
    let mut pem = Vec::with_capacity(webpki_root_certs::TLS_SERVER_ROOT_CERTS.len() * 2048);
    for cert in roots {
        pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
        let encoded = STANDARD.encode(cert.as_ref());
        for line in encoded.as_bytes().chunks(64) {
            pem.extend_from_slice(line);
            pem.push(b'\n');
        }
        pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
    }
    pem
}

/// How the DynamoDB client retries throttled and transient requests, and when it stops.
///
/// Every request is tried up to [`max_attempts`](Self::max_attempts) times, with
/// exponential backoff and jitter from [`initial_backoff`](Self::initial_backoff) (the
/// SDK's standard mode). The retries of one client also draw on a **retry budget**, the
/// SDK's token bucket: a retry after throttling or a service error costs 5 tokens, after a
/// timeout 10; a request that succeeds at once gives 1 back, a retry that succeeds gives its
/// tokens back, and the budget also refills over a minute of wall-clock time. When the
/// budget is spent (sustained throttling), requests are no longer retried: they fail at
/// the first refusal instead of piling retries onto a table that is already over its
/// throughput.
///
/// What a function does then is deliberate: the request's error names the table and says
/// `throttled`, the batch fails as a whole, nothing of it is emitted, and the Kafka event
/// source delivers it again (with the same or other boundaries); the watermarks of the
/// items already written make that redelivery exact (docs/state.md, "Throttling").
///
/// Each client gets a budget of its own ([`retry_partition`](Self::retry_partition)): the
/// SDK would otherwise share one bucket between every DynamoDB client of the process (its
/// default retry partition is per service), so one table's throttling would spend the
/// retries of another.
///
/// In Lambda ([`crate::lambda::run`]) the settings come from
/// `LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS` and `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`
/// ([`RetrySettings::from_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Attempts per request, the first included (`LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS`,
    /// default 6, at least 1: 1 never retries).
    pub max_attempts: u32,
    /// The retry budget in tokens (`LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`, default 500, the
    /// SDK's: 100 throttled retries; 0 never retries).
    pub retry_budget: usize,
    /// The backoff before the first retry; it doubles per attempt, with jitter (25 ms).
    pub initial_backoff: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            max_attempts: 6,
            retry_budget: 500,
            initial_backoff: Duration::from_millis(25),
        }
    }
}

impl RetrySettings {
    /// Parses the values of `LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS` and
    /// `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET` (`None` or blank: the default); an invalid
    /// value is an error naming the variable.
    pub fn parse(
        max_attempts: Option<&str>,
        retry_budget: Option<&str>,
    ) -> Result<Self, crate::StreamError> {
        let mut settings = RetrySettings::default();
        if let Some(value) = max_attempts.map(str::trim).filter(|v| !v.is_empty()) {
            settings.max_attempts = value.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                crate::StreamError::Config(format!(
                    "LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS: {value:?} is not a number of attempts (1 or more)"
                ))
            })?;
        }
        if let Some(value) = retry_budget.map(str::trim).filter(|v| !v.is_empty()) {
            settings.retry_budget = value.parse().map_err(|_| {
                crate::StreamError::Config(format!(
                    "LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET: {value:?} is not a number of tokens (0 or more)"
                ))
            })?;
        }
        Ok(settings)
    }

    /// Reads `LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS` and `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`
    /// from the environment ([`RetrySettings::parse`]).
    pub fn from_env() -> Result<Self, crate::StreamError> {
        let var = |name: &str| std::env::var(name).ok();
        Self::parse(
            var("LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS").as_deref(),
            var("LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET").as_deref(),
        )
    }

    /// The SDK retry configuration: standard mode, these attempts and backoff.
    pub fn retry_config(&self) -> aws_sdk_dynamodb::config::retry::RetryConfig {
        aws_sdk_dynamodb::config::retry::RetryConfig::standard()
            .with_max_attempts(self.max_attempts)
            .with_initial_backoff(self.initial_backoff)
    }

    /// A retry partition named `name` with a token bucket of its own, holding
    /// [`retry_budget`](Self::retry_budget) tokens and refilling it in a minute. Every
    /// call makes a new bucket: clients built from one partition share it, clients built
    /// from two calls do not.
    pub fn retry_partition(&self, name: &str) -> aws_sdk_dynamodb::config::retry::RetryPartition {
        use aws_sdk_dynamodb::config::retry::{RetryPartition, TokenBucket};
        let bucket = TokenBucket::builder()
            .capacity(self.retry_budget)
            .refill_rate(self.retry_budget as f32 / 60.0)
            .build();
        RetryPartition::custom(format!("lambda-streams-dynamodb-{name}"))
            .token_bucket(bucket)
            .build()
    }

    /// A DynamoDB client for `table` from a loaded SDK configuration, with these retry
    /// settings and a retry budget of its own.
    pub fn client(&self, sdk: &aws_config::SdkConfig, table: &str) -> Client {
        let config = aws_sdk_dynamodb::config::Builder::from(sdk)
            .retry_config(self.retry_config())
            .retry_partition(self.retry_partition(table))
            .build();
        Client::from_conf(config)
    }
}

/// The default retry configuration ([`RetrySettings::default`]): up to 6 attempts,
/// exponential backoff with jitter from 25 ms.
pub fn retry_config() -> aws_sdk_dynamodb::config::retry::RetryConfig {
    RetrySettings::default().retry_config()
}

/// The error codes with which DynamoDB refuses a request for throughput (the SDK
/// classifies them as throttling and retries them).
const THROTTLING_CODES: [&str; 3] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
];

/// The description of a failed request to `table`, from the service's error `code`:
/// throttling, once the client stopped retrying it, is said so, with the table and what
/// happens next.
fn describe_request(table: &str, code: Option<&str>, described: String) -> String {
    if code.is_some_and(|code| THROTTLING_CODES.contains(&code)) {
        format!(
            "table \"{table}\" throttled: {described} (the client's retries are spent: \
             LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS attempts, or its retry budget \
             LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET; the batch fails and is delivered again)"
        )
    } else {
        described
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_settings_parse_defaults_values_and_name_the_bad_variable() {
        assert_eq!(
            RetrySettings::parse(None, Some(" ")).expect("defaults"),
            RetrySettings::default()
        );
        let set = RetrySettings::parse(Some("3"), Some("0")).expect("valid");
        assert_eq!((set.max_attempts, set.retry_budget), (3, 0));
        for (attempts, budget, variable) in [
            (Some("0"), None, "LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS"),
            (Some("six"), None, "LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS"),
            (None, Some("-1"), "LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET"),
        ] {
            let error = RetrySettings::parse(attempts, budget).expect_err("invalid");
            assert!(error.to_string().contains(variable), "{error}");
        }
    }

    #[test]
    fn a_throttled_request_names_the_table_and_says_throttled() {
        let text = describe_request(
            "state",
            Some("ProvisionedThroughputExceededException"),
            "ProvisionedThroughputExceededException: rate".into(),
        );
        assert!(text.starts_with("table \"state\" throttled: "), "{text}");
        let other = describe_request("state", Some("ValidationException"), "bad".into());
        assert_eq!(other, "bad");
    }

    #[test]
    fn compiled_roots_are_pem_of_every_root_amazons_included() {
        use base64::engine::general_purpose::STANDARD;
        let pem = String::from_utf8(compiled_roots_pem(false)).expect("PEM is ASCII");
        let blocks: Vec<Vec<u8>> = pem
            .split("-----BEGIN CERTIFICATE-----\n")
            .skip(1)
            .map(|block| {
                let body = block
                    .split("-----END CERTIFICATE-----")
                    .next()
                    .expect("an end marker");
                STANDARD
                    .decode(body.replace('\n', ""))
                    .expect("base64 body")
            })
            .collect();
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS;
        assert_eq!(blocks.len(), roots.len());
        assert!(
            blocks
                .iter()
                .zip(roots)
                .all(|(b, r)| b.as_slice() == r.as_ref())
        );
        // DynamoDB's endpoints chain to Amazon Root CA 1 (and Starfield for older ones).
        let names = |name: &[u8]| {
            roots
                .iter()
                .any(|r| r.windows(name.len()).any(|w| w == name))
        };
        assert!(names(b"Amazon Root CA 1"));
        assert!(names(b"Starfield Services Root Certificate Authority - G2"));
    }

    #[test]
    fn the_aws_roots_are_amazon_trust_services_five() {
        let pem = String::from_utf8(compiled_roots_pem(true)).expect("PEM is ASCII");
        assert_eq!(pem.matches("-----BEGIN CERTIFICATE-----").count(), 5);
        let amazon: Vec<_> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .filter(|r| is_amazon_trust_services_root(r.as_ref()))
            .collect();
        assert_eq!(amazon.len(), 5);
        // Each name matches exactly one root (not, e.g., "Starfield Root ... G2").
        for name in AMAZON_TRUST_SERVICES_ROOTS {
            let n = amazon
                .iter()
                .filter(|r| r.windows(name.len()).any(|w| w == name))
                .count();
            assert_eq!(n, 1, "{}", String::from_utf8_lossy(name));
        }
    }

    #[test]
    fn item_keys_do_not_collide_across_stores() {
        // ("a", "b#c") and ("a#b", "c") must differ: the store name may not hold '#',
        // and the key is base64url, whose alphabet has no '#'.
        assert_ne!(item_key("a", b"b#c"), item_key("a-b", b"c"));
        assert_eq!(item_key("counts", b"fox"), "counts#Zm94");
        assert_eq!(item_key("counts", b""), "counts#");
    }

    #[test]
    fn parses_watermarks_and_rejects_future_formats() {
        let item = HashMap::from([
            ("v".to_owned(), AttributeValue::N("5".into())),
            ("ver".to_owned(), AttributeValue::N("2".into())),
            ("w:text-lines-0".to_owned(), AttributeValue::N("41".into())),
        ]);
        assert_eq!(parse_state(&item), Ok(ItemState::number(5, 2)));
        assert_eq!(
            parse_watermarks(&item),
            Ok(HashMap::from([("text-lines-0".to_owned(), 41)]))
        );
        let mut future = item.clone();
        future.insert("fv".into(), AttributeValue::N("2".into()));
        assert!(
            parse_state(&future)
                .unwrap_err()
                .contains("format version 2")
        );
    }
}
