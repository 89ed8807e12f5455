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
    /// Takes in the record `r` read at stream time `seen` as Kafka Streams' sliding-window
    /// processor does (`KStreamSlidingWindowAggregate`: `processInOrder`, `processEarly`,
    /// `createWindows`), which keeps windows, not records: it reads the key's windows
    /// starting from `t - 2 * difference` to `t + 1`, adds `r` to those it falls in that
    /// are still open, and creates its left window (holding what the window ending just
    /// before it holds, when its newest record is within the difference), the right window
    /// of the record before it (holding `r`) and its own right window (holding what the
    /// latest window containing `r` held before it, when that has a later record), each
    /// only while open. The windows' members are kept as arrival numbers, so each window's
    /// value is the fold of its members in arrival order, as Kafka Streams' aggregate.
    pub(super) fn arrive_final(&mut self, mut r: Buffered, windows: SlidingWindows) {
        if self.members.is_none() {
            // An item written before the members were kept: its windows as its rule gave.
            let records = &self.records;
            let members = self
                .final_windows(windows)
                .into_iter()
                .map(|(start, idx)| (start, idx.iter().map(|&i| records[i].seq).collect()))
                .collect();
            self.members = Some(members);
        }
        let d = windows.difference;
        let t = r.ts;
        let close = r.seen.unwrap_or(t).saturating_sub(windows.grace);
        let seq = self.seq;
        self.seq = self.seq.saturating_add(1);
        r.seq = seq;
        let times: std::collections::HashMap<u64, i64> =
            self.records.iter().map(|x| (x.seq, x.ts)).collect();
        let newest = |m: &[u64]| {
            m.iter()
                .filter_map(|s| times.get(s))
                .copied()
                .max()
                .unwrap_or(i64::MIN)
        };
        let members = self.members.get_or_insert_with(Vec::new);
        let (lo, hi) = (
            t.saturating_sub(d.saturating_mul(2)).max(0),
            t.saturating_add(1),
        );
        let mut found: Vec<(i64, Vec<u64>)> = members
            .iter()
            .filter(|(s, _)| (lo..=hi).contains(s))
            .cloned()
            .collect();
        found.sort_by_key(|(s, _)| *s);
        // The windows `r` is added to (from the members given), and those created without it.
        let mut updates: Vec<(i64, Vec<u64>)> = Vec::new();
        let mut copies: Vec<(i64, Vec<u64>)> = Vec::new();
        let mut starts = std::collections::HashSet::new();
        let mut previous: Option<i64> = None;
        let mut right: Option<Vec<u64>> = None;
        let mut right_created = false;
        if t < d {
            // `processEarly`: the window [0, difference] holds the records before it.
            let mut combined: Option<Vec<u64>> = None;
            for (start, m) in found {
                starts.insert(start);
                if start == 0 {
                    if newest(&m) < t {
                        previous = Some(newest(&m));
                    }
                    combined = Some(m);
                } else if start <= t {
                    right = Some(m.clone());
                    updates.push((start, m));
                } else if start == t.saturating_add(1) {
                    right_created = true;
                }
            }
            if right.is_none() && combined.as_deref().is_some_and(|c| newest(c) > t) {
                right.clone_from(&combined);
            }
            if let Some(m) = right.filter(|m| !right_created && newest(m) > t) {
                copies.push((t.saturating_add(1), m));
            }
            if let Some(p) = previous.filter(|p| !starts.contains(&p.saturating_add(1))) {
                updates.push((p.saturating_add(1), Vec::new()));
            }
            updates.push((0, combined.unwrap_or_default()));
        } else {
            // `processInOrder`, then `createWindows`.
            let mut left: Option<Vec<u64>> = None;
            let mut left_created = false;
            for (start, m) in found {
                starts.insert(start);
                let end = start.saturating_add(d);
                if end < t {
                    previous = Some(newest(&m));
                    left = Some(m);
                } else if end == t {
                    left_created = true;
                    if newest(&m) < t {
                        previous = Some(newest(&m));
                    }
                    updates.push((start, m));
                } else if start <= t {
                    right = Some(m.clone());
                    updates.push((start, m));
                } else if start == t.saturating_add(1) {
                    right_created = true;
                }
            }
            if let Some(p) = previous {
                let start = p.saturating_add(1);
                if !starts.contains(&start) && start.saturating_add(d) >= t {
                    updates.push((start, Vec::new()));
                }
            }
            if !left_created {
                let base = match (previous, left) {
                    (Some(p), Some(left)) if t.saturating_sub(d) <= p => left,
                    _ => Vec::new(),
                };
                updates.push((t.saturating_sub(d), base));
            }
            if let Some(m) = right.filter(|m| !right_created && newest(m) > t) {
                copies.push((t.saturating_add(1), m));
            }
        }
        let mut known = false;
        let set = |members: &mut Vec<(i64, Vec<u64>)>,
                   created: &mut Vec<(i64, u64)>,
                   start: i64,
                   m: Vec<u64>| {
            match members.iter_mut().find(|(s, _)| *s == start) {
                Some(window) => window.1 = m,
                None => {
                    members.push((start, m));
                    if !created.iter().any(|(s, _)| *s == start) {
                        created.push((start, seq));
                    }
                }
            }
        };
        for (start, mut m) in updates {
            // `updateWindowAndForward`: only a window that has not closed.
            if start.saturating_add(d) >= close {
                m.push(seq);
                known = true;
                set(members, &mut self.created, start, m);
            }
        }
        for (start, m) in copies {
            set(members, &mut self.created, start, m);
        }
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
        if let Some(members) = &self.members {
            return created
                .into_iter()
                .filter_map(|(start, _)| {
                    let (_, m) = members.iter().find(|(s, _)| *s == start)?;
                    let idx: Vec<usize> = (0..self.records.len())
                        .filter(|&i| m.contains(&self.records[i].seq))
                        .collect();
                    (!idx.is_empty()).then_some((start, idx))
                })
                .collect();
        }
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
