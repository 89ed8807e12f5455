//! Emit on close for sliding windows ([`EmitStrategy::OnWindowClose`](crate::dsl::EmitStrategy)):
//! which windows Kafka Streams would hold a record in (its processor keeps windows, not
//! records), when each closes, and the closing pass that emits each once.

use std::sync::Arc;

use super::{Buffered, Records, RecordsSerde, SlidingWindows};
use crate::dsl::Downstream;
use crate::dsl::suppress::emit_final;
use crate::dsl::windowed::Windowed;
use crate::error::StreamError;
use crate::serdes::Serde;
use crate::state::ItemState;
use crate::topology::CloseFn;
use crate::topology::context::Ctx;

impl SlidingWindows {
    /// When the window starting at `start` closes, as Kafka Streams' emit-on-close: once
    /// the stream time is past its end + grace (`end < stream time - grace`).
    pub(super) fn close_time(&self, start: i64) -> i64 {
        start
            .saturating_add(self.difference)
            .saturating_add(self.grace)
            .saturating_add(1)
    }
}

impl Records {
    /// Emit-on-close: takes in the record `r` read at stream time `seen` as Kafka Streams'
    /// sliding-window processor does, which keeps windows, not records: `r` counts in the
    /// windows it falls in that exist and are still open; its left window, the right
    /// window of the record before it and its own right window (when a later record is in
    /// it) are created if they do not exist yet and are still open, holding the records in
    /// them that Kafka Streams knows of (records that counted in a window when they were
    /// read) and `r` if it falls in them. A record that counts in no window is one Kafka
    /// Streams does not know of: it is in no window made later either.
    pub(super) fn arrive_final(&mut self, mut r: Buffered, windows: SlidingWindows) {
        let seen = r.seen.unwrap_or(r.ts);
        let seq = self.seq;
        self.seq = self.seq.saturating_add(1);
        let open = |start: i64| windows.close_time(start) > seen;
        let holds =
            |start: i64, ts: i64| start <= ts && ts <= start.saturating_add(windows.difference);
        let mut known = self
            .created
            .iter()
            .any(|(start, _)| holds(*start, r.ts) && open(*start));
        let reach = windows.difference.saturating_add(1);
        let mut new = vec![r.ts.saturating_sub(windows.difference).max(0)];
        let later = self
            .records
            .iter()
            .any(|x| x.known && x.ts > r.ts && x.ts <= r.ts.saturating_add(reach));
        if later {
            new.push(r.ts.saturating_add(1));
        }
        let before = self
            .records
            .iter()
            .filter(|x| x.known && x.ts < r.ts)
            .map(|x| x.ts)
            .max();
        if let Some(p) = before.filter(|p| r.ts <= p.saturating_add(reach)) {
            new.push(p.saturating_add(1));
        }
        for start in new {
            if open(start) && !self.created.iter().any(|(s, _)| *s == start) {
                self.created.push((start, seq));
                known |= holds(start, r.ts);
            }
        }
        r.seq = seq;
        r.known = known;
        self.records.push(r);
    }

    /// Emit-on-close: the windows not emitted yet, by start, each with the records that
    /// count in it (indices, in arrival order): the records Kafka Streams knew of when it
    /// was created, then those read while it was open.
    pub(super) fn final_windows(&self, windows: SlidingWindows) -> Vec<(i64, Vec<usize>)> {
        let closed = self.closed.unwrap_or(i64::MIN);
        let mut created: Vec<(i64, u64)> = self
            .created
            .iter()
            .copied()
            .filter(|(start, _)| windows.close_time(*start) > closed)
            .collect();
        created.sort_unstable();
        created
            .into_iter()
            .filter_map(|(start, at)| {
                let close = windows.close_time(start);
                let end = start.saturating_add(windows.difference);
                let members: Vec<usize> = (0..self.records.len())
                    .filter(|&i| {
                        let r = &self.records[i];
                        (start..=end).contains(&r.ts)
                            && if r.seq < at {
                                r.known
                            } else {
                                r.seen.is_none_or(|seen| close > seen)
                            }
                    })
                    .collect();
                (!members.is_empty()).then_some((start, members))
            })
            .collect()
    }

    /// Emit-on-close: when the item next closes (the earliest close time of a window not
    /// emitted yet).
    pub(super) fn next_close(&self, windows: SlidingWindows) -> Option<i64> {
        self.final_windows(windows)
            .into_iter()
            .map(|(start, _)| windows.close_time(start))
            .min()
    }
}

/// A window's aggregate of the records given, in that order.
pub(super) type FoldFn<K, A> =
    Arc<dyn Fn(&K, &mut dyn Iterator<Item = &Buffered>) -> Result<A, StreamError> + Send + Sync>;

/// The closing pass of an emit-on-close sliding-window item at the closing time `low`:
/// emits each window not emitted yet whose close time has come (by start; its value from
/// the records that count in it, in arrival order, with its newest such record's time, as
/// Kafka Streams) through the aggregation's downstream operators, except those in the set
/// of windows emitted already by an earlier try of this pass, and returns the item with its
/// emitted time moved to `low` and its next closing time.
pub(super) fn closer<K, A>(
    key_serde: Arc<dyn Serde<K>>,
    windows: SlidingWindows,
    fold: FoldFn<K, A>,
    out: Downstream<Windowed<K>, A>,
) -> CloseFn
where
    K: Clone + Send + Sync + 'static,
    A: Clone + Send + Sync + 'static,
{
    Arc::new(
        move |ctx: &mut Ctx,
              key_bytes: &[u8],
              state: &ItemState,
              _read: Option<&ItemState>,
              low: i64,
              emitted| {
            let corrupt = |what: &str, e: String| {
                StreamError::Config(format!(
                    "a sliding-window item's {what} does not decode: {e}"
                ))
            };
            let mut buffer = RecordsSerde
                .deserialize(state.aggregate.as_deref())
                .map_err(|e| corrupt("records", e.0))?;
            let closed: Vec<(i64, Vec<usize>)> = buffer
                .final_windows(windows)
                .into_iter()
                .filter(|(start, _)| windows.close_time(*start) <= low)
                .collect();
            if !closed.is_empty() {
                let key = key_serde
                    .deserialize(Some(key_bytes))
                    .map_err(|e| corrupt("key", e.0))?;
                for (start, members) in closed {
                    if !emitted.insert(start.to_be_bytes().to_vec()) {
                        continue;
                    }
                    let records = &buffer.records;
                    let aggregate = fold(&key, &mut members.iter().map(|&i| &records[i]))?;
                    let newest = members
                        .iter()
                        .map(|&i| records[i].ts)
                        .max()
                        .unwrap_or(start);
                    let window = Windowed {
                        key: key.clone(),
                        start,
                        end: start.saturating_add(windows.difference).saturating_add(1),
                    };
                    // Blamed on a failure downstream: the window's newest record.
                    let blamed = members
                        .iter()
                        .map(|&i| &records[i])
                        .max_by_key(|r| (r.ts, r.seq));
                    let at = blamed.and_then(|r| r.at.clone());
                    let stored = blamed.and_then(|r| r.value.clone());
                    emit_final(ctx, at.as_ref(), key_bytes, stored, newest, |ctx| {
                        ctx.with_timestamp(newest, |ctx| out.forward(ctx, window, aggregate))
                    })?;
                }
            }
            let closed_at = buffer.closed.map_or(low, |c| c.max(low));
            buffer.closed = Some(closed_at);
            buffer
                .created
                .retain(|(start, _)| windows.close_time(*start) > closed_at);
            let next = buffer.next_close(windows);
            let bytes = RecordsSerde
                .try_serialize(&buffer)
                .map_err(|e| corrupt("records", e.0))?
                .unwrap_or_default();
            Ok(Some((bytes, next)))
        },
    )
}
