//! An in-memory store with the same exactly-once semantics as the DynamoDB store.
//! For unit tests of a topology and for the test driver; not durable.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::event::TopicPartition;

use super::outbox::{self, Emission, Entry, Outbox};
use super::{
    ClaimState, ClaimedWindow, Clock, ClosedWindow, ClosingClaim, ClosingItem, ItemState,
    ItemWrite, PartitionTime, StateError, Store, WriteStats, above_watermarks, limits,
};

#[derive(Debug, Clone, Default)]
struct Item {
    value: i64,
    aggregate: Option<Vec<u8>>,
    version: u64,
    watermarks: HashMap<String, i64>,
    /// An emit-on-close window not marked closed yet: when it closes.
    close_at: Option<i64>,
    /// A windowed item's TTL (epoch seconds), as the DynamoDB store's `ttl` attribute.
    expires_at: Option<i64>,
    /// The newest record time, as the DynamoDB store's `mt` attribute.
    timestamp: Option<i64>,
    /// Under exactly-once output: the outbox of updates, by event partition.
    outbox: HashMap<String, Vec<Entry>>,
    /// Under exactly-once output, a closed window's claim: the event partition and the
    /// attempts that claimed it (out of the closing index meanwhile).
    claim: Option<(String, Vec<String>)>,
    /// Under exactly-once output, an item closed by a closing pass: its claims, by slot
    /// (the version each claiming rewrite replaced): the event partition, the attempts and
    /// the records emitted.
    closing_claims: BTreeMap<u64, (String, Vec<String>, Vec<u8>)>,
    /// The slots of those claims whose records did not fit in the item beside what it
    /// keeps: the DynamoDB store writes them to pages of their own and keeps only a
    /// reference in the item, so they count that much towards its 400 KB.
    paged_claims: BTreeSet<u64>,
}

impl Item {
    /// Whether the item is past its TTL at `now_seconds` (wall clock): as DynamoDB, which
    /// deletes such items lazily, the reads leave them out.
    fn expired(&self, now_seconds: i64) -> bool {
        self.expires_at.is_some_and(|ttl| ttl < now_seconds)
    }

    /// The bytes its closing pass's claims keep in it (a paged claim: its reference).
    fn closing_claims_bytes(&self) -> usize {
        self.closing_claims
            .iter()
            .map(
                |(slot, (tp, attempts, outputs))| match self.paged_claims.contains(slot) {
                    true => {
                        limits::closing_claim_bytes(*slot, tp, attempts, &[])
                            + limits::CLAIM_PAGES_REFERENCE_BYTES
                    }
                    false => limits::closing_claim_bytes(*slot, tp, attempts, outputs),
                },
            )
            .sum()
    }

    /// About the bytes DynamoDB counts for the item (its keys and small attributes as a
    /// fixed allowance): what decides whether a closing pass's claim fits in it.
    fn approximate_bytes(&self) -> usize {
        let watermarks: usize = self.watermarks.keys().map(|tp| 2 + tp.len() + 8).sum();
        let outbox: usize = self
            .outbox
            .iter()
            .map(|(tp, e)| 3 + tp.len() + outbox::encoded_len(e))
            .sum();
        let aggregate = self.aggregate.as_ref().map_or(0, Vec::len);
        aggregate + watermarks + outbox + self.closing_claims_bytes() + 1024
    }

    fn state(&self) -> ItemState {
        ItemState {
            value: self.value,
            aggregate: self.aggregate.clone(),
            version: self.version,
            timestamp: self.timestamp,
        }
    }
}

/// The wall clock, epoch seconds, which TTLs are compared with.
fn unix_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// An item's identity: store, key, window start.
type ItemId = (String, Vec<u8>, Option<i64>);

/// The windows (key, start, false) and closing passes' claims (key, slot, true) an event
/// partition's attempts claimed or meant to claim.
type ClaimRegister = BTreeSet<(Vec<u8>, i64, bool)>;

/// A [`Store`] in a `HashMap`, exact under redelivery like the DynamoDB store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    items: Mutex<HashMap<ItemId, Item>>,
    clock: Mutex<Clock>,
    /// Under exactly-once output: per (store, event partition), its claim register.
    claims: Mutex<HashMap<(String, String), ClaimRegister>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every item of an additive `store` (count, sum), sorted by key: `(key, value, version)`.
    pub fn items(&self, store: &str) -> Vec<(Vec<u8>, i64, u64)> {
        let mut out: Vec<_> = self
            .states(store)
            .into_iter()
            .map(|(k, state)| (k, state.value, state.version))
            .collect();
        out.sort();
        out
    }

    /// Every item of `store` with its whole state, sorted by key.
    pub fn states(&self, store: &str) -> Vec<(Vec<u8>, ItemState)> {
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = items
            .iter()
            .filter(|((s, _, window), _)| s == store && window.is_none())
            .map(|((_, k, _), item)| (k.clone(), item.state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every windowed item of `store`, sorted by key and window start; items past their
    /// TTL are left out, as the DynamoDB store's reads leave them out.
    pub fn windowed_states(&self, store: &str) -> Vec<(Vec<u8>, i64, ItemState)> {
        let now = unix_seconds();
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = items
            .iter()
            .filter(|((s, _, _), item)| s == store && !item.expired(now))
            .filter_map(|((_, k, window), item)| window.map(|w| (k.clone(), w, item.state())))
            .collect();
        out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        out
    }
}

impl MemoryStore {
    /// One update's worth of a write (see [`Store::apply`]): what DynamoDB's update would
    /// do, limits checked first.
    fn apply_one(
        &self,
        write: ItemWrite<'_>,
        ob: Option<&Outbox<'_>>,
    ) -> Result<(ItemState, Vec<Emission>, WriteStats), StateError> {
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (write.store.to_owned(), write.key.to_vec(), write.window);
        let empty = Item::default();
        let stored = items.get(&id).unwrap_or(&empty);
        let (delta, marks) = above_watermarks(&write, &stored.watermarks);
        let mut stats = WriteStats {
            requests: 1,
            ..WriteStats::default()
        };
        let mut emissions =
            ob.map_or_else(Vec::new, |ob| outbox::stored_emissions(ob, &stored.outbox));
        if marks.is_empty() {
            stats.conditional_failures = 1;
            return Ok((stored.state(), emissions, stats));
        }
        // Under exactly-once output: the entries the write keeps (the committed ones
        // pruned) and where its own goes.
        let held = super::held_up_to(&write, &stored.watermarks);
        let mut kept: HashMap<String, Vec<Entry>> = stored.outbox.clone();
        let mut origin = None;
        if let Some(ob) = ob {
            for (i, tp) in ob.partitions.iter().enumerate() {
                let name = tp.to_string();
                if let Some(entries) = kept.get_mut(&name) {
                    *entries = outbox::kept(ob, i as u32, entries);
                    if entries.is_empty() {
                        kept.remove(&name);
                    }
                }
            }
            origin = ob.entry_origin(
                write
                    .contributions
                    .iter()
                    .filter(|c| super::is_new(&held, c.tp, c.offset)),
            );
        }
        let outbox_bytes = |aggregate: Option<usize>| -> usize {
            if ob.is_none() {
                return 0;
            }
            let stored: usize = kept
                .iter()
                .map(|(tp, e)| 3 + tp.len() + outbox::encoded_len(e))
                .sum();
            // The write's own entry repeats the aggregate, when it keeps one (a store whose
            // updates reach a sink; the outbox of a store that keeps only dead letters
            // does not).
            match origin {
                Some(_) => stored + 3 + 64 + 45 + aggregate.map_or(0, |a| a + 4),
                None => stored,
            }
        };
        let aggregate = match write.fold {
            Some(fold) => {
                let held = super::held_up_to(&write, &stored.watermarks);
                let include = |tp: u32, offset: i64| super::is_new(&held, tp, offset);
                let new_marks: Vec<(String, i64)> = marks
                    .iter()
                    .map(|(tp, offset)| (write.partitions[*tp as usize].to_string(), *offset))
                    .collect();
                let mut watermarks = stored.watermarks.clone();
                watermarks.extend(new_marks.iter().cloned());
                // A closing pass's claims not finished yet stay in the item.
                let claims = stored.closing_claims_bytes();
                let fits = |bytes: usize| {
                    limits::check_aggregate(
                        &write,
                        bytes + outbox_bytes(Some(bytes)) + claims,
                        stored.version + 1,
                        watermarks.iter().map(|(tp, o)| (tp.as_str(), *o)),
                        new_marks.iter().map(|(tp, o)| (tp.as_str(), *o)),
                    )
                };
                Some(limits::fold_within_limits(
                    &write,
                    fold,
                    stored.aggregate.as_deref(),
                    &include,
                    &fits,
                )?)
            }
            None => None,
        };
        let closing = match (&aggregate, write.fold) {
            (Some(aggregate), Some(fold)) => fold.close_at(aggregate),
            _ => None,
        };
        let item = items.entry(id).or_default();
        match aggregate {
            Some(aggregate) => item.aggregate = Some(aggregate),
            None => item.value += delta,
        }
        item.version += 1;
        if write.close_at.is_some() {
            item.close_at = write.close_at;
        }
        if let Some(close_at) = closing {
            item.close_at = close_at;
        }
        if write.expires_at.is_some() {
            item.expires_at = write.expires_at;
        }
        if let Some(at) = write.timestamp {
            item.timestamp = Some(item.timestamp.map_or(at, |t| t.max(at)));
        }
        for (tp, offset) in marks {
            item.watermarks
                .insert(write.partitions[tp as usize].to_string(), offset);
        }
        if let Some(ob) = ob {
            item.outbox = kept;
            for (tp, entry) in ob.dead_letters(write.contributions) {
                item.outbox
                    .entry(ob.partitions[tp as usize].to_string())
                    .or_default()
                    .push(entry.clone());
                emissions.push(Emission { tp, entry });
            }
            if let Some((tp, offset)) = origin {
                let entry = Entry {
                    offset,
                    state: item.state(),
                    time: item.timestamp.unwrap_or(ob.time),
                    dead_letter: None,
                };
                item.outbox
                    .entry(ob.partitions[tp as usize].to_string())
                    .or_default()
                    .push(entry.clone());
                emissions.push(Emission { tp, entry });
            }
        }
        Ok((item.state(), emissions, stats))
    }

    /// [`Store::apply`] and [`Store::apply_outboxed`]: split as the DynamoDB store splits.
    fn apply_parts(
        &self,
        write: ItemWrite<'_>,
        ob: Option<&Outbox<'_>>,
    ) -> Result<(ItemState, Vec<Emission>, WriteStats), StateError> {
        limits::check_keys(&write)?;
        let parts = limits::split(&write);
        if parts.is_empty() {
            return self.apply_one(write, ob);
        }
        let mut stats = WriteStats::default();
        let mut last = None;
        let mut emissions = Vec::new();
        for part in &parts {
            let restricted = part.fold(&write);
            let (state, part_emissions, part_stats) =
                self.apply_one(part.write(&write, restricted.as_ref()), ob)?;
            stats.add(&part_stats);
            last = Some(state);
            // A part emits the stored entries again: keep each version once.
            for e in part_emissions {
                if !emissions.contains(&e) {
                    emissions.push(e);
                }
            }
        }
        emissions.sort_by_key(|e: &Emission| e.entry.state.version);
        Ok((last.unwrap_or(ItemState::number(0, 0)), emissions, stats))
    }
}

#[async_trait]
impl Store for MemoryStore {
    /// Checks DynamoDB's limits first ([`limits`]), as the DynamoDB store
    /// does, so that the test driver refuses what Lambda would: a rejected write changes
    /// nothing.
    ///
    /// A write fed by more partitions than one DynamoDB update names is applied in the
    /// same parts as the DynamoDB store sends it ([`limits::split`]), so that both give the
    /// same versions and fold the values in the same order.
    async fn apply(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError> {
        self.apply_parts(write, None)
            .map(|(state, _, stats)| (state, stats))
    }

    /// As [`apply`](Self::apply), keeping the item's outbox as the DynamoDB store does.
    async fn apply_outboxed(
        &self,
        write: ItemWrite<'_>,
        outbox: &Outbox<'_>,
    ) -> Result<(ItemState, Vec<Emission>, WriteStats), StateError> {
        self.apply_parts(write, Some(outbox))
    }

    async fn get_many(
        &self,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Result<HashMap<Vec<u8>, ItemState>, StateError> {
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(keys
            .iter()
            .filter_map(|key| {
                items
                    .get(&(store.to_owned(), key.clone(), None))
                    .map(|item| (key.clone(), item.state()))
            })
            .collect())
    }

    async fn get(&self, store: &str, key: &[u8]) -> Result<Option<ItemState>, StateError> {
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(items
            .get(&(store.to_owned(), key.to_vec(), None))
            .map(Item::state))
    }

    async fn windows(
        &self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, ItemState)>, StateError> {
        let now = unix_seconds();
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = items
            .iter()
            .filter(|((s, k, _), item)| s == store && k == key && !item.expired(now))
            .filter_map(|((_, _, window), item)| {
                window
                    .filter(|w| (from..=to).contains(w))
                    .map(|w| (w, item.state()))
            })
            .collect();
        out.sort_by_key(|(w, _)| *w);
        Ok(out)
    }

    async fn clock(&self) -> Result<Clock, StateError> {
        Ok(self
            .clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }

    async fn advance_stream_times(
        &self,
        advances: &[crate::state::ClockAdvance],
        now_ms: i64,
    ) -> Result<(), StateError> {
        let mut clock = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        for advance in advances {
            if let Some(processed) = advance.processed {
                let mark = clock
                    .at_least_once
                    .entry(advance.tp.clone())
                    .or_insert(processed);
                *mark = (*mark).max(processed);
            }
            let Some(time) = advance.stream_time else {
                continue;
            };
            clock.started_at.get_or_insert(now_ms);
            let entry = clock
                .partitions
                .entry(advance.tp.clone())
                .or_insert(PartitionTime {
                    stream_time: time,
                    advanced_at: now_ms,
                });
            if time >= entry.stream_time {
                *entry = PartitionTime {
                    stream_time: time,
                    advanced_at: now_ms,
                };
            }
        }
        Ok(())
    }

    async fn closed_windows(
        &self,
        store: &str,
        up_to: i64,
    ) -> Result<Vec<ClosedWindow>, StateError> {
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = items
            .iter()
            .filter(|((s, _, _), item)| {
                s == store && item.claim.is_none() && item.close_at.is_some_and(|c| c <= up_to)
            })
            .filter_map(|((_, key, window), item)| {
                window.map(|start| ClosedWindow {
                    key: key.clone(),
                    start,
                    state: item.state(),
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.key, a.start).cmp(&(&b.key, b.start)));
        Ok(out)
    }

    async fn mark_closed(
        &self,
        store: &str,
        windows: &[ClosedWindow],
        up_to: i64,
    ) -> Result<WriteStats, StateError> {
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stats = WriteStats::default();
        for window in windows {
            stats.requests += 1;
            let id = (store.to_owned(), window.key.clone(), Some(window.start));
            match items.get_mut(&id) {
                Some(item) if item.version == window.state.version => item.close_at = None,
                _ => stats.conditional_failures += 1,
            }
        }
        let mut clock = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        let closed = clock.closed.entry(store.to_owned()).or_insert(up_to);
        *closed = (*closed).max(up_to);
        Ok(stats)
    }

    async fn claimed_windows(
        &self,
        store: &str,
        tp: &TopicPartition,
    ) -> Result<(Vec<ClaimedWindow>, WriteStats), StateError> {
        let named: Vec<(Vec<u8>, i64, bool)> = self
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(store.to_owned(), tp.to_string()))
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default();
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let out = named
            .into_iter()
            .map(|(key, start, closing)| {
                if closing {
                    return closing_claim(&items, store, key, start);
                }
                let item = items.get(&(store.to_owned(), key.clone(), Some(start)));
                let claim = match item {
                    Some(Item {
                        claim: Some((tp, attempts)),
                        ..
                    }) => ClaimState::Claimed {
                        tp: tp.clone(),
                        attempts: attempts.clone(),
                    },
                    Some(item) if item.close_at.is_some() => ClaimState::Open,
                    _ => ClaimState::Closed,
                };
                ClaimedWindow {
                    window: ClosedWindow {
                        key,
                        start,
                        state: item.map_or(ItemState::number(0, 0), Item::state),
                    },
                    claim,
                    outputs: None,
                }
            })
            .collect();
        Ok((
            out,
            WriteStats {
                requests: 2,
                ..WriteStats::default()
            },
        ))
    }

    async fn claim_window(
        &self,
        store: &str,
        window: &ClosedWindow,
        tp: &TopicPartition,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((store.to_owned(), tp.to_string()))
            .or_default()
            .insert((window.key.clone(), window.start, false));
        let mut stats = WriteStats {
            requests: 2,
            ..WriteStats::default()
        };
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (store.to_owned(), window.key.clone(), Some(window.start));
        match items.get_mut(&id) {
            Some(item)
                if item.claim.is_none()
                    && item.close_at.is_some()
                    && item.version == window.state.version =>
            {
                item.close_at = None;
                item.claim = Some((tp.to_string(), vec![attempt.to_owned()]));
                Ok((true, stats))
            }
            _ => {
                stats.conditional_failures += 1;
                Ok((false, stats))
            }
        }
    }

    async fn reclaim_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        let mut stats = WriteStats {
            requests: 1,
            ..WriteStats::default()
        };
        let ClaimState::Claimed { tp, attempts } = &window.claim else {
            stats.conditional_failures += 1;
            return Ok((false, stats));
        };
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        if window.outputs.is_some() {
            let id = (store.to_owned(), window.window.key.clone(), None);
            let slot = window.window.start as u64;
            return match items
                .get_mut(&id)
                .and_then(|item| item.closing_claims.get_mut(&slot))
            {
                Some((t, a, _)) if t == tp && a == attempts => {
                    a.push(attempt.to_owned());
                    Ok((true, stats))
                }
                _ => {
                    stats.conditional_failures += 1;
                    Ok((false, stats))
                }
            };
        }
        let id = (
            store.to_owned(),
            window.window.key.clone(),
            Some(window.window.start),
        );
        match items.get_mut(&id) {
            Some(Item {
                claim: Some((t, a)),
                ..
            }) if t == tp && a == attempts => {
                a.push(attempt.to_owned());
                Ok((true, stats))
            }
            _ => {
                stats.conditional_failures += 1;
                Ok((false, stats))
            }
        }
    }

    async fn finish_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
    ) -> Result<(bool, WriteStats), StateError> {
        let mut stats = WriteStats {
            requests: 2,
            ..WriteStats::default()
        };
        let ClaimState::Claimed { tp, attempts } = &window.claim else {
            stats.conditional_failures += 1;
            return Ok((false, stats));
        };
        let finished = {
            let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
            if window.outputs.is_some() {
                let id = (store.to_owned(), window.window.key.clone(), None);
                let slot = window.window.start as u64;
                let item = items.get_mut(&id);
                match item {
                    Some(item)
                        if item
                            .closing_claims
                            .get(&slot)
                            .is_some_and(|(t, a, _)| t == tp && a == attempts) =>
                    {
                        if let Some((_, _, outputs)) = item.closing_claims.remove(&slot)
                            && item.paged_claims.remove(&slot)
                        {
                            // The pages' deletes.
                            stats.requests +=
                                outputs.len().div_ceil(limits::CLAIM_PAGE_BYTES).max(1) as u64;
                        }
                        true
                    }
                    _ => false,
                }
            } else {
                let id = (
                    store.to_owned(),
                    window.window.key.clone(),
                    Some(window.window.start),
                );
                match items.get_mut(&id) {
                    Some(item)
                        if item
                            .claim
                            .as_ref()
                            .is_some_and(|(t, a)| t == tp && a == attempts) =>
                    {
                        item.claim = None;
                        true
                    }
                    _ => false,
                }
            }
        };
        if !finished {
            stats.conditional_failures += 1;
            return Ok((false, stats));
        }
        if let Some(register) = self
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&(store.to_owned(), tp.clone()))
        {
            register.remove(&(
                window.window.key.clone(),
                window.window.start,
                window.outputs.is_some(),
            ));
        }
        Ok((true, stats))
    }

    async fn forget_claims(
        &self,
        store: &str,
        tp: &TopicPartition,
        windows: &[ClaimedWindow],
    ) -> Result<WriteStats, StateError> {
        if let Some(register) = self
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&(store.to_owned(), tp.to_string()))
        {
            for w in windows {
                register.remove(&(w.window.key.clone(), w.window.start, w.outputs.is_some()));
            }
        }
        Ok(WriteStats {
            requests: u64::from(!windows.is_empty()),
            ..WriteStats::default()
        })
    }

    async fn closing_items(&self, store: &str, up_to: i64) -> Result<Vec<ClosingItem>, StateError> {
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = items
            .iter()
            .filter(|((s, _, window), item)| {
                s == store && window.is_none() && item.close_at.is_some_and(|c| c <= up_to)
            })
            .map(|((_, key, _), item)| ClosingItem {
                key: key.clone(),
                state: item.state(),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn close_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        Ok(self.rewrite(store, item, aggregate, close_at, None))
    }

    /// The register first (one write), then the rewrite with the claim (one write).
    async fn claim_closing_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
        claim: ClosingClaim<'_>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((store.to_owned(), claim.tp.to_string()))
            .or_default()
            .insert((item.key.clone(), item.state.version as i64, true));
        let (state, mut stats) = self.rewrite(store, item, aggregate, close_at, Some(claim));
        stats.requests += 1;
        Ok((state, stats))
    }
}

impl MemoryStore {
    /// A closing pass's rewrite of `item` on the condition that its version is the one
    /// read, with `claim` kept in the slot of that version.
    fn rewrite(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
        claim: Option<ClosingClaim<'_>>,
    ) -> (Option<ItemState>, WriteStats) {
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stats = WriteStats {
            requests: 1,
            ..WriteStats::default()
        };
        match items.get_mut(&(store.to_owned(), item.key.clone(), None)) {
            Some(stored) if stored.version == item.state.version => {
                stored.aggregate = Some(aggregate.to_vec());
                stored.version += 1;
                stored.close_at = close_at;
                if let Some(claim) = claim {
                    let slot = item.state.version;
                    stored.closing_claims.insert(
                        slot,
                        (
                            claim.tp.to_string(),
                            vec![claim.attempt.to_owned()],
                            claim.outputs.to_vec(),
                        ),
                    );
                    // As the DynamoDB store: records that do not fit beside what the item
                    // keeps go to pages (one write a page, after a refused try in the
                    // item when they alone would fit).
                    let len = claim.outputs.len();
                    if len > limits::CLAIM_PAGE_BYTES
                        || stored.approximate_bytes() > limits::MAX_ITEM_BYTES
                    {
                        stored.paged_claims.insert(slot);
                        stats.requests += len.div_ceil(limits::CLAIM_PAGE_BYTES).max(1) as u64
                            + u64::from(len <= limits::CLAIM_PAGE_BYTES);
                    }
                }
                (Some(stored.state()), stats)
            }
            _ => {
                stats.conditional_failures = 1;
                (None, stats)
            }
        }
    }
}

/// A closing pass's claim (slot `slot` of `key`'s item) as it stands.
fn closing_claim(
    items: &HashMap<ItemId, Item>,
    store: &str,
    key: Vec<u8>,
    slot: i64,
) -> ClaimedWindow {
    let item = items.get(&(store.to_owned(), key.clone(), None));
    let found = item.and_then(|i| i.closing_claims.get(&(slot as u64)));
    let (claim, outputs) = match (item, found) {
        (_, Some((tp, attempts, outputs))) => (
            ClaimState::Claimed {
                tp: tp.clone(),
                attempts: attempts.clone(),
            },
            outputs.clone(),
        ),
        // A claim of the slot may still land while the item's version is the slot.
        (Some(i), None) if i.version as i64 <= slot => (ClaimState::Open, Vec::new()),
        _ => (ClaimState::Closed, Vec::new()),
    };
    ClaimedWindow {
        window: ClosedWindow {
            key,
            start: slot,
            state: item.map_or(ItemState::number(0, 0), Item::state),
        },
        claim,
        outputs: Some(outputs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Contribution, Fold, StateErrorKind};

    /// The record at (t-0, `.1`) grows the aggregate by `.0` bytes.
    struct Grow(usize, i64);

    impl Fold for Grow {
        fn fold(
            &self,
            current: Option<&[u8]>,
            include: &dyn Fn(u32, i64) -> bool,
        ) -> Result<Vec<u8>, String> {
            let mut out = current.unwrap_or_default().to_vec();
            if include(0, self.1) {
                out.extend(std::iter::repeat_n(b'x', self.0));
            }
            Ok(out)
        }
    }

    /// Applies the record at `grow.1` of partition t-0 to item "k", growing it by `grow.0`.
    async fn grow(store: &MemoryStore, grow: &Grow) -> Result<ItemState, StateError> {
        let offset = grow.1;
        let partitions = [TopicPartition::new("t", 0)];
        let contributions = [Contribution {
            tp: 0,
            offset,
            delta: 1,
        }];
        let write = ItemWrite {
            store: "s",
            key: b"k",
            window: None,
            expires_at: None,
            timestamp: None,
            contributions: &contributions,
            partitions: &partitions,
            fold: Some(grow),
            close_at: None,
        };
        store.apply(write).await.map(|(state, _)| state)
    }

    /// A fold whose items close at the aggregate's first byte (as a number).
    struct Closes;

    impl Fold for Closes {
        fn fold(&self, _: Option<&[u8]>, _: &dyn Fn(u32, i64) -> bool) -> Result<Vec<u8>, String> {
            Ok(vec![10])
        }

        fn closes(&self) -> bool {
            true
        }

        fn close_at(&self, aggregate: &[u8]) -> Option<Option<i64>> {
            Some(aggregate.first().map(|b| i64::from(*b)))
        }
    }

    #[tokio::test]
    async fn an_item_that_closes_on_its_content_is_closed_once_by_version() {
        let store = MemoryStore::new();
        let partitions = [TopicPartition::new("t", 0)];
        let contributions = [Contribution {
            tp: 0,
            offset: 0,
            delta: 1,
        }];
        let write = ItemWrite {
            store: "s",
            key: b"k",
            window: None,
            expires_at: None,
            contributions: &contributions,
            partitions: &partitions,
            fold: Some(&Closes),
            close_at: None,
            timestamp: None,
        };
        store.apply(write).await.expect("written");
        // The fold's aggregate says 10: in the closing index at 10, not before.
        assert!(store.closing_items("s", 9).await.expect("read").is_empty());
        let found = store.closing_items("s", 10).await.expect("read");
        assert_eq!(found.len(), 1);
        let item = &found[0];
        // A closer that read an older version writes nothing.
        let stale = ClosingItem {
            key: item.key.clone(),
            state: ItemState {
                version: item.state.version - 1,
                ..item.state.clone()
            },
        };
        let (written, stats) = store.close_item("s", &stale, b"x", None).await.expect("ok");
        assert_eq!((written, stats.conditional_failures), (None, 1));
        // The one that read the current version rewrites it, out of the index.
        let (written, _) = store.close_item("s", item, b"y", None).await.expect("ok");
        assert_eq!(
            written.map(|s| (s.aggregate, s.version)),
            Some((Some(b"y".to_vec()), 2))
        );
        assert!(
            store
                .closing_items("s", i64::MAX)
                .await
                .expect("read")
                .is_empty()
        );
        // A second closer of the same read loses.
        let (written, _) = store.close_item("s", item, b"z", None).await.expect("ok");
        assert_eq!(written, None);
    }

    #[tokio::test]
    async fn an_item_over_400_kb_is_refused_and_left_unchanged() {
        let store = MemoryStore::new();
        grow(&store, &Grow(300 * 1024, 0))
            .await
            .expect("300 KB fit");
        let error = grow(&store, &Grow(300 * 1024, 1))
            .await
            .expect_err("600 KB do not");
        // The record at offset 1 is to blame: nothing was written.
        assert!(
            matches!(&error.kind, StateErrorKind::Rejected(r) if r.0.len() == 1 && r.0[0].1 == 1),
            "{error}"
        );
        let state = store.get("s", b"k").await.expect("get").expect("item");
        assert_eq!(
            (state.aggregate.map(|a| a.len()), state.version),
            (Some(300 * 1024), 1)
        );
        grow(&store, &Grow(99 * 1024, 2)).await.expect("399 KB fit");
    }
}
