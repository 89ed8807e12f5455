//! Exactly-once output of what a batch emits with no source record: the closes of
//! emit-on-close time windows, and the closing passes of the items that close on their
//! content (sessions and sliding windows emitted on close). Each is *claimed* before it is
//! emitted, and the claim names the batch attempt whose transaction holds it
//! (`docs/state.md`, "Exactly-once output of window closes"; the protocol is checked by
//! `tests/models/exactly_once_close.py`):
//!
//! - a time window's claim is the window item's own (`Store::claim_window`);
//! - a closing pass's claim is its rewrite of the item (`Store::claim_closing_item`): the
//!   rewrite that marks the sessions or windows emitted also keeps, in a *slot* of the item
//!   named by the version it replaced, the claiming partition, the attempt and the records
//!   emitted, so that an attempt that re-claims it emits exactly those records again (the
//!   item's content moves on meanwhile: arrivals, merges, later closes).
//!
//! Both kinds are named in the event partition's claim register before they are made, and
//! resolved the same way by the partition's next batches ([`Topology::resolve_claims`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{StreamExt, TryStreamExt};

use super::batch::{CLOSE_ATTEMPTS, closing_dead_letter, forward_closed, tag_transaction};
use super::options::PoisonPolicy;
use super::poison::guarded;
use super::report::BatchReport;
use crate::error::StreamError;
use crate::event::TopicPartition;
use crate::sink::{OutputRecord, Sink};
use crate::state::{
    ClaimState, ClosedWindow, ClosingClaim, ClosingItem, ItemState, StateError, StateErrorKind,
    Store, WRITE_CONCURRENCY, WriteStats,
};
use crate::topology::context::{Ctx, Origin};
use crate::topology::{StoreSpec, Topology};

/// Under exactly-once output, what a batch's claims need (see
/// [`Topology::claim_and_close_windows`]): the attempt's id and, per event partition, the
/// attempt whose transaction last committed there (the shadow offset's metadata); it
/// records which partitions' transactions hold claimed windows, which must commit.
pub(crate) struct WindowClaims<'a> {
    attempt: &'a str,
    committed: &'a [Option<String>],
    claimed: Vec<AtomicBool>,
}

impl<'a> WindowClaims<'a> {
    /// The claims of attempt `attempt`, per event partition the last committed attempt.
    pub(crate) fn new(attempt: &'a str, committed: &'a [Option<String>]) -> Self {
        WindowClaims {
            attempt,
            committed,
            claimed: committed.iter().map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Whether event partition `i`'s transaction holds windows this attempt claimed.
    pub(crate) fn claimed(&self, i: usize) -> bool {
        self.claimed
            .get(i)
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn mark(&self, i: usize) {
        if let Some(c) = self.claimed.get(i) {
            c.store(true, Ordering::Relaxed);
        }
    }
}

impl Topology {
    /// [`close_windows`](Self::close_windows) under exactly-once output, where a window's
    /// result must be in exactly one committed transaction. A window is *claimed* before it
    /// is emitted: a conditional write takes it out of the closing index into a claim of
    /// the batch's first event partition `tp` by this attempt (named first in `tp`'s claim
    /// register, strongly consistent), and the result goes in `tp`'s transaction, which
    /// then commits with the attempt id as the shadow offset's metadata. Before claiming,
    /// each event partition's claims are resolved ([`resolve_claims`](Self::resolve_claims)).
    /// Two closers of one window (two partitions, a zombie and its retry) never both commit
    /// it: the claim's conditional write admits one partition, and per partition one
    /// attempt commits.
    pub(super) async fn claim_and_close_windows(
        &self,
        lows: &[Option<i64>],
        ctx: &mut Ctx,
        store: &dyn Store,
        sink: &dyn Sink,
        claims: &WindowClaims<'_>,
        report: &mut BatchReport,
    ) -> Result<(), StreamError> {
        for (spec, low) in self.inner.stores.iter().zip(lows) {
            let Some(size) = spec.emit_on_close else {
                continue;
            };
            self.resolve_claims(spec, ctx, store, sink, claims, report)
                .await?;
            // The windows closed now: claimed for the first event partition, emitted.
            let Some(low) = *low else {
                continue;
            };
            let Some(tp) = ctx.partitions.first().cloned() else {
                continue;
            };
            let mut emit = Vec::new();
            for window in store.closed_windows(&spec.name, low).await? {
                let (claimed, stats) = store
                    .claim_window(&spec.name, &window, &tp, claims.attempt)
                    .await?;
                report.state.add(&stats);
                if claimed {
                    emit.push(window);
                }
            }
            if !emit.is_empty() {
                claims.mark(0);
                self.emit_closed(spec, size, &emit, &tp, ctx, sink, report)
                    .await?;
            }
            // The store's closed time moves forward (lateness).
            let stats = store.mark_closed(&spec.name, &[], low).await?;
            report.state.add(&stats);
        }
        Ok(())
    }

    /// Resolves, per event partition `tp` of the batch, the claims of store `spec` named in
    /// `tp`'s claim register, against the attempt whose transaction last committed there
    /// (`A`, read after the inits): a claim whose attempts hold `A` was emitted in a
    /// committed transaction, and is finished (closed); any other claim was emitted only in
    /// transactions that aborted or never will commit (their producers are fenced), and is
    /// re-claimed by this attempt (its id appended: a fenced zombie's re-claim of a claim by
    /// a newer attempt keeps that attempt in it) and emitted again in `tp`'s transaction: a
    /// window with its state, a closing pass's claim its stored records, unchanged. Claims
    /// closed or made by another partition leave the register. A claim a fenced zombie
    /// makes after its partition's last batch is emitted by that partition's next batch.
    pub(super) async fn resolve_claims(
        &self,
        spec: &StoreSpec,
        ctx: &mut Ctx,
        store: &dyn Store,
        sink: &dyn Sink,
        claims: &WindowClaims<'_>,
        report: &mut BatchReport,
    ) -> Result<(), StreamError> {
        let partitions = ctx.partitions.clone();
        for (i, tp) in partitions.iter().enumerate() {
            let (named, stats) = store.claimed_windows(&spec.name, tp).await?;
            report.state.add(&stats);
            let mut forget = Vec::new();
            let mut windows = Vec::new();
            let mut records = Vec::new();
            for claimed in named {
                let ClaimState::Claimed {
                    tp: owner,
                    attempts,
                } = &claimed.claim
                else {
                    if claimed.claim == ClaimState::Closed {
                        forget.push(claimed);
                    }
                    // Open: an intent whose claim failed or is under way.
                    continue;
                };
                if *owner != tp.to_string() {
                    forget.push(claimed);
                    continue;
                }
                let committed = claims.committed[i]
                    .as_ref()
                    .is_some_and(|a| attempts.contains(a));
                let (done, stats) = if committed {
                    store.finish_window(&spec.name, &claimed).await?
                } else {
                    store
                        .reclaim_window(&spec.name, &claimed, claims.attempt)
                        .await?
                };
                report.state.add(&stats);
                if !done {
                    // Another attempt of this partition changed the claim meanwhile:
                    // one of them is fenced; this batch fails and is retried.
                    return Err(StreamError::State(StateError::new(
                        &spec.name,
                        &claimed.window.key,
                        StateErrorKind::Request(format!(
                            "the claim at {} changed while event partition {tp} resolved it \
                             (a concurrent attempt of the partition)",
                            claimed.window.start
                        )),
                    )));
                }
                if committed {
                    continue;
                }
                match &claimed.outputs {
                    Some(stored) => records.extend(decode_outputs(stored).map_err(|e| {
                        StreamError::State(StateError::new(
                            &spec.name,
                            &claimed.window.key,
                            StateErrorKind::Corrupt(format!(
                                "the records of the claim at {}: {e}",
                                claimed.window.start
                            )),
                        ))
                    })?),
                    None => windows.push(claimed.window),
                }
            }
            if !forget.is_empty() {
                let stats = store.forget_claims(&spec.name, tp, &forget).await?;
                report.state.add(&stats);
            }
            if !windows.is_empty() {
                claims.mark(i);
                let size = spec.emit_on_close.unwrap_or(0);
                self.emit_closed(spec, size, &windows, tp, ctx, sink, report)
                    .await?;
            }
            if !records.is_empty() {
                claims.mark(i);
                send_claimed(records, tp, sink, report).await?;
            }
        }
        Ok(())
    }

    /// The closing pass of store `index` ([`close_join`](Self::close_join)) under
    /// exactly-once output: per item whose closing time has come, the records the pass
    /// emits (through the store's downstream operators, its dead letters among them) are
    /// computed from the item as read, then the rewrite *claims* them for the batch's
    /// first event partition `tp` ([`Store::claim_closing_item`]: named in `tp`'s register,
    /// then kept in the rewrite, on the condition that the item's version is the one
    /// read), and only the records of the rewrites that won are produced, in `tp`'s
    /// transaction. An item another writer changed first is read again and closed from
    /// what it holds then (nothing of the lost try was emitted). A rewrite that emits
    /// nothing claims nothing.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_and_close_items(
        &self,
        index: usize,
        low: i64,
        poison_policy: &PoisonPolicy,
        ctx: &mut Ctx,
        store: &dyn Store,
        sink: &dyn Sink,
        claims: &WindowClaims<'_>,
        report: &mut BatchReport,
    ) -> Result<(), StreamError> {
        let spec = &self.inner.stores[index];
        let Some(close) = spec.closing.as_ref().and_then(|c| c.close.as_ref()) else {
            return Ok(());
        };
        let Some(tp) = ctx.partitions.first().cloned() else {
            return Ok(());
        };
        let mut pending = store.closing_items(&spec.name, low).await?;
        let name = spec.name.as_str();
        let mut sent = Vec::new();
        for attempt in 0..CLOSE_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let read = self.closing_reads(spec, &pending, store, report).await?;
            // Per item: its rewrite and the records it emits (encoded for the claim).
            let mut rewrites = Vec::with_capacity(pending.len());
            for item in pending {
                ctx.origin = Origin::Update {
                    version: item.state.version + 1,
                    timestamp: 0,
                };
                let mark = ctx.outputs.len();
                let mut closed = None;
                guarded(|| {
                    let table = read.get(&item.key);
                    closed = close(ctx, &item.key, &item.state, table, low, &mut HashSet::new())?;
                    Ok(())
                })?;
                let mut outputs: Vec<OutputRecord> = ctx.outputs.drain(mark..).collect();
                let mut poisoned = 0u64;
                let mut lettered = 0u64;
                for poison in std::mem::take(&mut ctx.closing_poison) {
                    match poison_policy {
                        PoisonPolicy::Fail => return Err(poison.error),
                        PoisonPolicy::Skip => {}
                        PoisonPolicy::DeadLetter { topic } => {
                            outputs.push(closing_dead_letter(topic, poison));
                            lettered += 1;
                        }
                    }
                    poisoned += 1;
                }
                if let Some((aggregate, next)) = closed {
                    let encoded = (!outputs.is_empty()).then(|| encode_outputs(&outputs));
                    rewrites.push((item, aggregate, next, encoded, outputs, poisoned, lettered));
                }
            }
            let attempt_id = claims.attempt;
            let tp_ref = &tp;
            let results: Vec<_> = futures::stream::iter(rewrites)
                .map(
                    |(item, aggregate, next, encoded, outputs, poisoned, lettered)| async move {
                        let (written, stats): (Option<ItemState>, WriteStats) = match &encoded {
                            Some(encoded) => {
                                let claim = ClosingClaim {
                                    tp: tp_ref,
                                    attempt: attempt_id,
                                    outputs: encoded,
                                };
                                store
                                    .claim_closing_item(name, &item, &aggregate, next, claim)
                                    .await?
                            }
                            None => store.close_item(name, &item, &aggregate, next).await?,
                        };
                        Ok::<_, StateError>((item, written, stats, outputs, poisoned, lettered))
                    },
                )
                // In item order: the records go out in the order the pass met them.
                .buffered(WRITE_CONCURRENCY)
                .try_collect()
                .await?;
            let mut conflicts = Vec::new();
            for (item, written, stats, outputs, poisoned, lettered) in results {
                report.state.add(&stats);
                if written.is_none() {
                    conflicts.push(item.key);
                    continue;
                }
                report.poison_records += poisoned;
                report.dead_lettered += lettered;
                sent.extend(outputs);
            }
            // Another writer changed the item since it was read (an arrival of its key, or
            // a concurrent closer): read it again and close what is still there.
            pending = Vec::new();
            if !conflicts.is_empty() && attempt + 1 < CLOSE_ATTEMPTS {
                let found = store.get_many(name, &conflicts).await?;
                for key in conflicts {
                    if let Some(state) = found.get(&key) {
                        pending.push(ClosingItem {
                            key,
                            state: state.clone(),
                        });
                    }
                }
            }
            // Still changing after the last try: the items stay in the closing index.
        }
        if !sent.is_empty() {
            claims.mark(0);
            send_claimed(sent, &tp, sink, report).await?;
        }
        Ok(())
    }

    /// Emits `windows` of emit-on-close store `spec` (window size `size`) through its
    /// downstream operators into `tp`'s transaction, produced and acknowledged.
    #[allow(clippy::too_many_arguments)]
    async fn emit_closed(
        &self,
        spec: &StoreSpec,
        size: i64,
        windows: &[ClosedWindow],
        tp: &TopicPartition,
        ctx: &mut Ctx,
        sink: &dyn Sink,
        report: &mut BatchReport,
    ) -> Result<(), StreamError> {
        forward_closed(spec, size, windows, ctx)?;
        let outputs = std::mem::take(&mut ctx.outputs);
        report.windows_closed += windows.len() as u64;
        send_claimed(outputs, tp, sink, report).await
    }
}

/// Produces claimed `records` in `tp`'s transaction (never below its committed offset:
/// the claim decides), acknowledged.
async fn send_claimed(
    mut records: Vec<OutputRecord>,
    tp: &TopicPartition,
    sink: &dyn Sink,
    report: &mut BatchReport,
) -> Result<(), StreamError> {
    tag_transaction(&mut records, tp, i64::MAX);
    report.records_out += records.len() as u64;
    if !records.is_empty() {
        sink.send(records).await?;
    }
    Ok(())
}

/// The format version of a claim's records.
const OUTPUTS_FORMAT: u8 = 1;

/// A closing pass's records as a claim keeps them: the format version, then per record
/// its topic, key, value, headers and timestamp (lengths 4 bytes big endian; an absent key,
/// value or timestamp as a `0` byte, a present one as `1` and its bytes).
fn encode_outputs(records: &[OutputRecord]) -> Vec<u8> {
    fn bytes(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(b);
    }
    fn optional(out: &mut Vec<u8>, b: Option<&[u8]>) {
        match b {
            Some(b) => {
                out.push(1);
                bytes(out, b);
            }
            None => out.push(0),
        }
    }
    let mut out = vec![OUTPUTS_FORMAT];
    out.extend_from_slice(
        &u32::try_from(records.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    for r in records {
        bytes(&mut out, r.topic.as_bytes());
        optional(&mut out, r.key.as_deref());
        optional(&mut out, r.value.as_deref());
        out.extend_from_slice(
            &u32::try_from(r.headers.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        for (name, value) in &r.headers {
            bytes(&mut out, name.as_bytes());
            bytes(&mut out, value);
        }
        match r.timestamp {
            Some(t) => {
                out.push(1);
                out.extend_from_slice(&t.to_be_bytes());
            }
            None => out.push(0),
        }
    }
    out
}

/// The records [`encode_outputs`] wrote.
fn decode_outputs(data: &[u8]) -> Result<Vec<OutputRecord>, String> {
    struct Reader<'a>(&'a [u8]);
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
            if self.0.len() < n {
                return Err("truncated".into());
            }
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Ok(head)
        }
        fn byte(&mut self) -> Result<u8, String> {
            Ok(self.take(1)?[0])
        }
        fn len(&mut self) -> Result<usize, String> {
            let b = self.take(4)?;
            Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        }
        fn bytes(&mut self) -> Result<Vec<u8>, String> {
            let n = self.len()?;
            Ok(self.take(n)?.to_vec())
        }
        fn optional(&mut self) -> Result<Option<Vec<u8>>, String> {
            match self.byte()? {
                0 => Ok(None),
                _ => self.bytes().map(Some),
            }
        }
        fn string(&mut self) -> Result<String, String> {
            String::from_utf8(self.bytes()?).map_err(|e| e.to_string())
        }
    }
    let mut r = Reader(data);
    let format = r.byte()?;
    if format != OUTPUTS_FORMAT {
        return Err(format!("unknown format version {format}"));
    }
    let n = r.len()?;
    let mut records = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let topic = r.string()?;
        let key = r.optional()?;
        let value = r.optional()?;
        let headers = (0..r.len()?)
            .map(|_| Ok((r.string()?, r.bytes()?)))
            .collect::<Result<Vec<_>, String>>()?;
        let timestamp = match r.byte()? {
            0 => None,
            _ => {
                let b = r.take(8)?;
                Some(i64::from_be_bytes(b.try_into().map_err(|_| "truncated")?))
            }
        };
        records.push(OutputRecord {
            topic,
            key,
            value,
            headers,
            timestamp,
        });
    }
    if !r.0.is_empty() {
        return Err("trailing bytes".into());
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_records_decode_as_they_were_encoded() {
        let records = vec![
            OutputRecord {
                topic: "out".into(),
                key: Some(b"k".to_vec()),
                value: None,
                headers: vec![("h".into(), vec![0, 255]), ("e".into(), Vec::new())],
                timestamp: Some(-5),
            },
            OutputRecord {
                topic: "other".into(),
                key: None,
                value: Some(Vec::new()),
                headers: Vec::new(),
                timestamp: None,
            },
        ];
        let encoded = encode_outputs(&records);
        assert_eq!(decode_outputs(&encoded).unwrap(), records);
        assert!(decode_outputs(&encoded[..encoded.len() - 1]).is_err());
        assert_eq!(decode_outputs(&encode_outputs(&[])).unwrap(), Vec::new());
    }
}
