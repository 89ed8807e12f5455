//! Kafka Streams' sliding-window aggregation of one key, as its processor computes it
//! (`KStreamSlidingWindowAggregate` of Kafka 4: `processInOrder`, `processEarly`,
//! `createWindows`, `updateWindowAndForward`), record by record in arrival order, over a
//! store of windows (start → aggregate and newest record time), not of records. A test
//! reference: it keeps windows where the framework keeps records, so the two are
//! independent. Kafka's store keeps windows for its retention; the windows read here (starts
//! from `t - 2 * difference`) are all kept.

use std::collections::{BTreeMap, BTreeSet};

/// The windows of one key: start → (aggregate, newest record time).
pub type Windows<A> = BTreeMap<i64, (A, i64)>;

/// Folds `records` (timestamp, value, the partition's stream time when the record was read,
/// its own timestamp included) into Kafka's windows of `difference` and `grace`, with
/// `init` and `add`. Returns the windows and the number of records dropped as late
/// (`timestamp + difference < stream time - grace`).
pub fn kafka_sliding<V, A: Clone>(
    records: &[(i64, V, i64)],
    difference: i64,
    grace: i64,
    init: impl Fn() -> A,
    add: impl Fn(A, &V) -> A,
) -> (Windows<A>, u64) {
    let d = difference;
    let mut windows: Windows<A> = BTreeMap::new();
    let mut late = 0;
    for (t, v, stream_time) in records {
        let (t, close) = (*t, stream_time - grace);
        if t + d < close {
            late += 1;
            continue;
        }
        // `updateWindowAndForward`: adds the record to the window from `base` when the
        // window has not closed (its end at or after the close time).
        let update = |windows: &mut Windows<A>, start: i64, base: (A, i64)| {
            if start + d >= close {
                let (agg, newest) = base;
                windows.insert(start, (add(agg, v), newest.max(t)));
            }
        };
        let mut starts = BTreeSet::new();
        let mut previous: Option<i64> = None;
        let mut right_agg: Option<(A, i64)> = None;
        let mut right_created = false;
        let found: Vec<(i64, (A, i64))> = windows
            .range((t - 2 * d).max(0)..=t + 1)
            .map(|(s, w)| (*s, w.clone()))
            .collect();
        if t < d {
            // `processEarly`: the window [0, d] holds every record before d.
            let mut combined: Option<(A, i64)> = None;
            let range: Vec<_> = found.into_iter().filter(|(s, _)| *s <= t + 1).collect();
            for (start, w) in range {
                starts.insert(start);
                if start == 0 {
                    if w.1 < t {
                        previous = Some(w.1);
                    }
                    combined = Some(w);
                } else if start <= t {
                    right_agg = Some(w.clone());
                    update(&mut windows, start, w);
                } else if start == t + 1 {
                    right_created = true;
                }
            }
            if right_agg.is_none() && combined.as_ref().is_some_and(|c| c.1 > t) {
                right_agg = combined.clone();
            }
            if let Some(r) = right_agg.filter(|r| !right_created && r.1 > t) {
                windows.insert(t + 1, r);
            }
            if let Some(p) = previous.filter(|p| !starts.contains(&(p + 1))) {
                update(&mut windows, p + 1, (init(), t));
            }
            update(&mut windows, 0, combined.unwrap_or_else(|| (init(), t)));
            continue;
        }
        // `processInOrder`.
        let mut left_agg: Option<(A, i64)> = None;
        let mut left_created = false;
        for (start, w) in found {
            starts.insert(start);
            let end = start + d;
            if end < t {
                previous = Some(w.1);
                left_agg = Some(w);
            } else if end == t {
                left_created = true;
                if w.1 < t {
                    previous = Some(w.1);
                }
                update(&mut windows, start, w);
            } else if start <= t {
                right_agg = Some(w.clone());
                update(&mut windows, start, w);
            } else if start == t + 1 {
                right_created = true;
            }
        }
        // `createWindows`.
        if let Some(p) = previous.filter(|p| !starts.contains(&(p + 1)) && p + 1 + d >= t) {
            update(&mut windows, p + 1, (init(), t));
        }
        if !left_created {
            let base = match (&previous, &left_agg) {
                (Some(p), Some(left)) if t - d <= *p => (left.0.clone(), t),
                _ => (init(), t),
            };
            update(&mut windows, t - d, base);
        }
        if let Some(r) = right_agg.filter(|r| !right_created && r.1 > t) {
            windows.insert(t + 1, r);
        }
    }
    (windows, late)
}
