//! The reference interpreter: the definition of the right answer, written from Kafka
//! Streams' semantics and independent of the framework's code. Record at a time, no
//! batching, no watermarks, no store: the table topics are read first (the event source
//! of the test delivers them before the streams, so that every stream record joins the
//! final tables), then the streams, each partition in offset order.

use std::collections::{BTreeMap, BTreeSet};

use super::plan::{
    Agg, Dyn, DynW, Group, In, Inputs, JoinKind, K, Out, PARTITIONS, Plan, S, T, V, W, flat,
    stream_joiner, stream_stream_joiner, table_joiner, try_add_one,
};

/// A record on its way through the reference.
#[derive(Debug, Clone)]
struct Rec {
    key: K,
    value: V,
    ts: i64,
    /// The stream time of the record's source partition when it is processed (its own
    /// timestamp included): the highest timestamp of the partition up to it.
    stream_time: i64,
    /// The stream time of that partition before the record.
    prior: i64,
    /// The source record it comes from: (stream topic index, partition, offset); `None`
    /// for records made by a join of streams or a table's update stream.
    source: Option<(usize, i32, usize)>,
}

/// What each output topic must hold.
#[derive(Debug, Clone)]
pub enum Expected {
    /// A stream's records: `(key, value, timestamp)`, as a multiset (sorted).
    Records(Vec<(K, V, i64)>),
    /// A table's final state (keys absent: no value or deleted).
    Table(BTreeMap<String, i64>),
    /// A table's final state, and the timestamp its final update carries for the keys
    /// where Kafka Streams' rules fix it whatever the batches ([`table_times`]).
    TableAt(BTreeMap<String, i64>, BTreeMap<String, i64>),
    /// Emit-on-close windows: the final value of every closed window, each emitted once,
    /// and its timestamp (Kafka Streams': the window's newest record time).
    Finals {
        values: BTreeMap<String, i64>,
        times: BTreeMap<String, i64>,
    },
    /// A time-windowed table: per window its latest value and the latest update's
    /// timestamp (Kafka Streams': the window's newest record time, whatever the order).
    Windows {
        values: BTreeMap<String, i64>,
        times: BTreeMap<String, i64>,
    },
    /// A table's updates joined with a table ([`Look`](super::plan::Look)): per key, the
    /// table's final value (`finals`), which the update of the highest version holds
    /// joined with one of the values the looked-up table held for the key (`held`, besides
    /// none; `held` is `None` when the table looks up its own key, which holds the final
    /// value then). An inner join's highest version may predate the final value (the
    /// update of the final value found no partner).
    Looked {
        finals: BTreeMap<String, i64>,
        held: Option<BTreeMap<String, BTreeSet<Option<i64>>>>,
        look: super::plan::Look,
    },
    /// Sessions, keyed `<key>@<start>-<end>`: per key, the current sessions. `horizon`:
    /// per key, sessions that end before it are not compared (the framework drops them
    /// from the key's item once no record that is not late can reach them).
    Sessions {
        sessions: BTreeMap<String, i64>,
        horizon: BTreeMap<String, i64>,
    },
}

/// The expected content of every output topic `o<i>`, in order.
pub fn evaluate(plan: &Plan, inputs: &Inputs) -> Vec<Expected> {
    let inputs = &without_poison(plan, inputs);
    plan.outputs
        .iter()
        .map(|out| match out {
            Out::Stream(s) => {
                let mut records: Vec<(K, V, i64)> = stream(s, inputs)
                    .into_iter()
                    .map(|r| (r.key, r.value, r.ts))
                    .collect();
                records.sort();
                Expected::Records(records)
            }
            Out::Table(t) => Expected::TableAt(table(t, inputs), table_times(t, inputs)),
            Out::Looked(t, look) => {
                // Per key, every value the lookup table held (`None`: none yet, or deleted).
                let held = look.table.map(|j| {
                    let mut held: BTreeMap<String, BTreeSet<Option<i64>>> = BTreeMap::new();
                    for r in log(inputs, &format!("t{j}")) {
                        let Some(k) = &r.key else { continue };
                        held.entry(k.clone()).or_default().insert(r.value);
                    }
                    held
                });
                Expected::Looked {
                    finals: table(t, inputs),
                    held,
                    look: *look,
                }
            }
            Out::Merged(a, b) => {
                let prefixed = |m: BTreeMap<String, i64>, prefix: &str| {
                    m.into_iter()
                        .map(|(k, v)| (format!("{prefix}{k}"), v))
                        .collect::<Vec<_>>()
                };
                let values = (prefixed(table(a, inputs), "a:").into_iter())
                    .chain(prefixed(table(b, inputs), "b:"))
                    .collect();
                let times = (prefixed(table_times(a, inputs), "a:").into_iter())
                    .chain(prefixed(table_times(b, inputs), "b:"))
                    .collect();
                Expected::TableAt(values, times)
            }
            Out::Windowed(w) if w.emit_on_close => {
                let values = finals(w, plan, inputs);
                let times = windowed_times(w, inputs)
                    .into_iter()
                    .filter(|(k, _)| values.contains_key(k))
                    .collect();
                Expected::Finals { values, times }
            }
            Out::Windowed(w) => Expected::Windows {
                values: windowed(w, inputs),
                times: windowed_times(w, inputs),
            },
            Out::Dyn(w) if w.emit_on_close => {
                let (values, times) = dyn_finals(w, inputs);
                Expected::Finals { values, times }
            }
            Out::Dyn(
                w @ DynW {
                    windows: Dyn::Session(_),
                    ..
                },
            ) => {
                let (sessions, horizon) = sessions(w, inputs);
                Expected::Sessions { sessions, horizon }
            }
            Out::Dyn(w) => Expected::Table(sliding(w, inputs)),
        })
        .collect()
}

/// The inputs without the records the user function fails on: under the `skip` policy a
/// poison record is left out whole, with every record it would have caused, and it does
/// not advance stream time (as a record that does not deserialize). This is the
/// framework's unit of poison, the source record (its effect is applied once or not at
/// all); Kafka Streams' processing exception handler (KIP-1033) drops the record only at
/// the processor that failed, so its siblings downstream of a `merge` or `split` still
/// see it.
fn without_poison(plan: &Plan, inputs: &Inputs) -> Inputs {
    fn walk(s: &S, inputs: &Inputs, bad: &mut BTreeSet<(usize, i32, usize)>) {
        match s {
            S::Source(_) | S::ToStream(_) => {}
            S::Filter(s, _)
            | S::MapValues(s, _)
            | S::SelectKey(s, _)
            | S::Map(s, _, _)
            | S::FlatMapValues(s, _)
            | S::Split(s, _, _)
            | S::Repartition(s)
            | S::Branch { of: s, .. }
            | S::Join(s, _, _)
            | S::VersionedJoin { stream: s, .. } => walk(s, inputs, bad),
            S::TryMapValues(inner, b) => {
                walk(inner, inputs, bad);
                for r in stream(inner, inputs) {
                    if try_add_one(*b, r.value).is_err() {
                        bad.extend(r.source);
                    }
                }
            }
            S::Merge(a, b) => {
                walk(a, inputs, bad);
                walk(b, inputs, bad);
            }
            S::StreamJoin { left, right, .. } => {
                walk(left, inputs, bad);
                walk(right, inputs, bad);
            }
        }
    }
    let mut bad = BTreeSet::new();
    for out in &plan.outputs {
        match out {
            Out::Stream(s) => walk(s, inputs, &mut bad),
            Out::Table(T::Agg(s, _, _) | T::ToTable(s)) => walk(s, inputs, &mut bad),
            Out::Table(_) => {}
            Out::Looked(T::Agg(s, _, _) | T::ToTable(s), _) => walk(s, inputs, &mut bad),
            Out::Looked(..) => {}
            Out::Merged(a, b) => {
                for t in [a, b] {
                    if let T::Agg(s, _, _) | T::ToTable(s) = t {
                        walk(s, inputs, &mut bad);
                    }
                }
            }
            Out::Windowed(w) => walk(&w.stream, inputs, &mut bad),
            Out::Dyn(w) => walk(&w.stream, inputs, &mut bad),
        }
    }
    let mut out = inputs.clone();
    for (i, p, offset) in bad {
        if let Some(r) = out
            .logs
            .get_mut(&(format!("s{i}"), p))
            .and_then(|log| log.get_mut(offset))
        {
            r.bad = true;
        }
    }
    out
}

fn log<'a>(inputs: &'a Inputs, topic: &str) -> impl Iterator<Item = &'a In> + 'a {
    let topic = topic.to_owned();
    (0..PARTITIONS).flat_map(move |p| inputs.logs.get(&(topic.clone(), p)).into_iter().flatten())
}

fn stream(s: &S, inputs: &Inputs) -> Vec<Rec> {
    match s {
        S::Source(i) => {
            let mut out = Vec::new();
            for p in 0..PARTITIONS {
                let mut time = i64::MIN;
                for (offset, r) in inputs
                    .logs
                    .get(&(format!("s{i}"), p))
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    // A value that does not deserialize never enters the topology (Kafka
                    // Streams' `LogAndContinueExceptionHandler`): skipped, and it does not
                    // advance the partition's stream time either.
                    if r.bad {
                        continue;
                    }
                    let prior = time;
                    time = time.max(r.ts);
                    out.push(Rec {
                        key: r.key.clone(),
                        value: r.value,
                        ts: r.ts,
                        stream_time: time,
                        prior,
                        source: Some((*i, p, offset)),
                    });
                }
            }
            out
        }
        S::Filter(s, p) => stream(s, inputs)
            .into_iter()
            .filter(|r| p.test(&r.key, &r.value))
            .collect(),
        S::MapValues(s, f) => stream(s, inputs)
            .into_iter()
            .map(|r| Rec {
                value: f.apply(r.value),
                ..r
            })
            .collect(),
        S::SelectKey(s, f) => stream(s, inputs)
            .into_iter()
            .map(|r| Rec {
                key: f.apply(&r.key, &r.value),
                ..r
            })
            .collect(),
        S::Map(s, kf, vf) => stream(s, inputs)
            .into_iter()
            .map(|r| Rec {
                key: kf.apply(&r.key, &r.value),
                value: vf.apply(r.value),
                ..r
            })
            .collect(),
        S::FlatMapValues(s, n) => stream(s, inputs)
            .into_iter()
            .flat_map(|r| {
                flat(*n, r.value)
                    .into_iter()
                    .map(move |value| Rec { value, ..r.clone() })
            })
            .collect(),
        S::Merge(a, b) => {
            let mut out = stream(a, inputs);
            out.extend(stream(b, inputs));
            out
        }
        S::Split(s, p, take) => stream(s, inputs)
            .into_iter()
            .filter(|r| p.test(&r.key, &r.value) == *take)
            .collect(),
        // Kafka Streams' `BranchedKStream`: a record goes to the first branch whose
        // predicate it matches, else to the default branch (index `preds.len()`).
        S::Branch { of, preds, take } => stream(of, inputs)
            .into_iter()
            .filter(|r| {
                let index = preds
                    .iter()
                    .position(|p| p.test(&r.key, &r.value))
                    .unwrap_or(preds.len());
                index == *take
            })
            .collect(),
        // A repartition moves records, it does not change them.
        S::Repartition(s) => stream(s, inputs),
        // Kafka Streams' `KStreamKTableJoinProcessor` drops a record with a null value
        // (inner and left joins, with or without a grace period).
        S::Join(s, t, left) => {
            let t = table(t, inputs);
            stream(s, inputs)
                .into_iter()
                .filter(|r| r.value.is_some())
                .filter_map(|r| {
                    let found = r.key.as_ref().and_then(|k| t.get(k)).copied();
                    match (found, left) {
                        (None, false) => None,
                        (found, _) => Some(Rec {
                            value: stream_joiner(r.value, found),
                            ..r
                        }),
                    }
                })
                .collect()
        }
        // A table without deletions: its update stream, read into a table again, is
        // the table; only its final values matter to the plans that use it.
        S::ToStream(t) => table(t, inputs)
            .into_iter()
            .map(|(k, v)| Rec {
                key: Some(k),
                value: Some(v),
                ts: 0,
                stream_time: 0,
                prior: 0,
                source: None,
            })
            .collect(),
        // Under `skip`, a record the user function fails on is left out.
        S::TryMapValues(s, bad) => stream(s, inputs)
            .into_iter()
            .filter_map(|r| {
                try_add_one(*bad, r.value)
                    .ok()
                    .map(|value| Rec { value, ..r })
            })
            .collect(),
        S::VersionedJoin {
            stream: s,
            table,
            op,
            left,
            grace,
        } => {
            let versions = versioned(*table, inputs);
            let mut read = BTreeSet::new();
            sources(s, &mut read);
            let low = low_watermark(&read, inputs);
            stream(s, inputs)
                .into_iter()
                .filter(|r| r.value.is_some())
                .filter_map(|r| {
                    let Some(k) = &r.key else {
                        // No table value; a left join emits it at once, an inner drops it.
                        return left.then(|| Rec {
                            value: stream_joiner(r.value, None),
                            ..r.clone()
                        });
                    };
                    // With a grace period: released once the join's closing time (the
                    // lowest stream time of the stream's partitions) reaches ts + grace.
                    if let Some(g) = grace
                        && low.is_none_or(|low| r.ts.saturating_add(*g) > low)
                    {
                        return None;
                    }
                    let found = as_of(versions.get(k), r.ts).and_then(|v| op.apply(v));
                    match (found, left) {
                        (None, false) => None,
                        (found, _) => Some(Rec {
                            value: stream_joiner(r.value, found),
                            ..r
                        }),
                    }
                })
                .collect()
        }
        S::StreamJoin {
            left,
            right,
            kind,
            difference,
            before,
            grace,
        } => {
            let mut read = BTreeSet::new();
            sources(left, &mut read);
            sources(right, &mut read);
            stream_join(
                &stream(left, inputs),
                &stream(right, inputs),
                *kind,
                (*before, *difference),
                *grace,
                low_watermark(&read, inputs),
            )
        }
    }
}

/// The versions of each key of table topic `t<i>` (Kafka Streams' versioned store, KIP-889,
/// with a retention longer than the inputs): per key, `(valid from, value or None for a
/// tombstone)` by timestamp; of two records at one timestamp the later (in offset order,
/// the key's partition) replaces the earlier. Records with a null key are dropped.
fn versioned(i: usize, inputs: &Inputs) -> BTreeMap<String, BTreeMap<i64, Option<i64>>> {
    let mut out: BTreeMap<String, BTreeMap<i64, Option<i64>>> = BTreeMap::new();
    for r in log(inputs, &format!("t{i}")) {
        if let Some(k) = &r.key {
            out.entry(k.clone()).or_default().insert(r.ts, r.value);
        }
    }
    out
}

/// The value valid at `ts`: that of the newest version at or before it.
fn as_of(versions: Option<&BTreeMap<i64, Option<i64>>>, ts: i64) -> Option<i64> {
    versions?.range(..=ts).next_back().and_then(|(_, v)| *v)
}

/// Kafka Streams' stream–stream join (`KStreamKStreamJoin`, 3.1+ semantics), of the
/// records with a key and a value (Kafka Streams skips the others):
/// - a pair for every left record at `t` and right record of one key in `[t - before, t +
///   after]` (`window = (before, after)`, `JoinWindows.ofTimeDifferenceAndGrace(after,
///   grace).before(before)`), timestamped with the later of the two;
/// - left and outer joins: a record that joined nothing is emitted alone (the other side
///   null), with its own timestamp, once its window has closed: when the join's closing
///   time is past `t + after + grace` for a left record, `t + before + grace` for a right
///   one (strictly, as `emitNonJoinedOuterRecords` with `getOuterJoinLookBackTimeMs`).
///   Records whose window has not closed at the end are not emitted. Kafka Streams closes
///   on the task's stream time, the highest timestamp that reached the join, reading its
///   partitions in timestamp order and knowing nothing more will come; an event source
///   delivers each partition on its own, so the framework closes on the lowest stream time
///   of the partitions feeding the join (`low`, see [`low_watermark`]), the time no
///   partner within the grace can come before: the reference closes there too.
///
/// The plans keep every record within `grace` of its partition's stream time, so no
/// record is late (dropped for an expired window) and the order of the records does not
/// matter.
fn stream_join(
    left: &[Rec],
    right: &[Rec],
    kind: JoinKind,
    (before, after): (i64, i64),
    grace: i64,
    low: Option<i64>,
) -> Vec<Rec> {
    let present = |r: &&Rec| r.key.is_some() && r.value.is_some();
    let left: Vec<&Rec> = left.iter().filter(present).collect();
    let right: Vec<&Rec> = right.iter().filter(present).collect();
    let closed = |r: &Rec, is_left: bool| {
        let reach = if is_left { after } else { before };
        low.is_some_and(|low| r.ts.saturating_add(reach).saturating_add(grace) < low)
    };
    // A left record `l` and a right record `r`.
    let joins = |l: &Rec, r: &Rec| l.key == r.key && r.ts >= l.ts - before && r.ts <= l.ts + after;
    let mut out = Vec::new();
    for l in &left {
        for r in &right {
            if joins(l, r) {
                let ts = l.ts.max(r.ts);
                out.push(Rec {
                    key: l.key.clone(),
                    value: stream_stream_joiner(l.value, r.value),
                    ts,
                    stream_time: ts,
                    prior: ts,
                    source: None,
                });
            }
        }
    }
    let alone = |side: &[&Rec], other: &[&Rec], is_left: bool, out: &mut Vec<Rec>| {
        for a in side {
            let joined = other
                .iter()
                .any(|b| if is_left { joins(a, b) } else { joins(b, a) });
            if joined || !closed(a, is_left) {
                continue;
            }
            let value = if is_left {
                stream_stream_joiner(a.value, None)
            } else {
                stream_stream_joiner(None, a.value)
            };
            out.push(Rec {
                key: a.key.clone(),
                value,
                ts: a.ts,
                stream_time: a.ts,
                prior: a.ts,
                source: None,
            });
        }
    };
    if kind != JoinKind::Inner {
        alone(&left, &right, true, &mut out);
    }
    if kind == JoinKind::Outer {
        alone(&right, &left, false, &mut out);
    }
    out
}

fn fold(agg: Agg, acc: Option<i64>, value: V) -> i64 {
    match agg {
        Agg::Count => acc.unwrap_or(0) + 1,
        Agg::Sum => acc.unwrap_or(0) + value.unwrap_or(0),
        Agg::Max => acc.unwrap_or(i64::MIN).max(value.unwrap_or(i64::MIN)),
    }
}

/// The records an aggregation sees: the stream, non-null values only for `Max` (the plan
/// filters them out before its `reduce`) and where `skip_nulls` (Kafka 4 skips a null
/// value in `count`, `aggregate`, `reduce` and sliding windows: `KStreamAggregate`,
/// `KStreamReduce`, `KStreamSlidingWindowAggregate`; its time and session windows
/// aggregate it), re-keyed by the grouping. Records with a null key are not aggregated
/// (Kafka Streams drops them).
fn grouped(s: &S, group: Group, agg: Agg, skip_nulls: bool, inputs: &Inputs) -> Vec<(String, Rec)> {
    stream(s, inputs)
        .into_iter()
        .filter(|r| (agg != Agg::Max && !skip_nulls) || r.value.is_some())
        .filter_map(|r| group.key(&r.key, &r.value).map(|k| (k, r)))
        .collect()
}

/// The timestamp of each key's final update of table `t`, for the keys where it does not
/// depend on batch boundaries or on the order between two topics' records: a table read
/// from a topic, or made by `to_table` of a stream that keeps its keys and partitions,
/// carries the timestamp of the record that set its value (Kafka Streams' table source);
/// `filter` and `map_values` keep it; a table–table join's value carries the later of both
/// sides' (Kafka Streams' table–table joins), for keys both sides hold (a left join's key
/// the other side lacks carries that of the last change, of either side); an aggregation's
/// table carries the newest timestamp of the key's records. A `to_table` of a re-keyed or
/// merged stream is left out.
fn table_times(t: &T, inputs: &Inputs) -> BTreeMap<String, i64> {
    /// Whether a stream's records of a key come in one partition's offset order.
    fn in_order(s: &S) -> bool {
        match s {
            S::Source(_) => true,
            S::Filter(s, _) | S::MapValues(s, _) | S::FlatMapValues(s, _) => in_order(s),
            S::TryMapValues(s, _) | S::Split(s, _, _) | S::Branch { of: s, .. } => in_order(s),
            _ => false,
        }
    }
    let values = table(t, inputs);
    let times = match t {
        T::Source(i) => {
            let mut out = BTreeMap::new();
            for r in log(inputs, &format!("t{i}")) {
                let Some(k) = &r.key else { continue };
                out.insert(k.clone(), r.ts);
            }
            out
        }
        // An aggregation's update carries the newest timestamp of the key's records
        // (`KStreamAggregate`, `KStreamReduce`: `max(record, aggregate)`), whatever the order.
        T::Agg(s, group, agg) => {
            let mut out: BTreeMap<String, i64> = BTreeMap::new();
            for (k, r) in grouped(s, *group, *agg, true, inputs) {
                let newest = out.entry(k).or_insert(r.ts);
                *newest = (*newest).max(r.ts);
            }
            out
        }
        T::ToTable(s) if in_order(s) => {
            let mut out = BTreeMap::new();
            for r in stream(s, inputs) {
                if let (Some(k), Some(_)) = (r.key, r.value) {
                    out.insert(k, r.ts);
                }
            }
            out
        }
        T::ToTable(_) => BTreeMap::new(),
        T::Join(a, b_table, _) => {
            let (a, b) = (table_times(a, inputs), table_times(b_table, inputs));
            let b_values = table(b_table, inputs);
            a.into_iter()
                .filter(|(k, _)| b_values.contains_key(k))
                .filter_map(|(k, x)| b.get(&k).map(|y| (k, x.max(*y))))
                .collect()
        }
        T::MapValues(t, _) | T::Filter(t, _) => table_times(t, inputs),
    };
    times
        .into_iter()
        .filter(|(k, _)| values.contains_key(k))
        .collect()
}

fn table(t: &T, inputs: &Inputs) -> BTreeMap<String, i64> {
    match t {
        T::Source(i) => {
            let mut out = BTreeMap::new();
            for r in log(inputs, &format!("t{i}")) {
                let Some(k) = &r.key else { continue };
                match r.value {
                    Some(v) => out.insert(k.clone(), v),
                    None => out.remove(k),
                };
            }
            out
        }
        T::Agg(s, group, agg) => {
            let mut out = BTreeMap::new();
            for (k, r) in grouped(s, *group, *agg, true, inputs) {
                let acc = out.get(&k).copied();
                out.insert(k, fold(*agg, acc, r.value));
            }
            out
        }
        T::ToTable(s) => {
            let mut out = BTreeMap::new();
            for r in stream(s, inputs) {
                if let (Some(k), Some(v)) = (r.key, r.value) {
                    out.insert(k, v);
                }
            }
            out
        }
        T::Join(a, b, left) => {
            let b = table(b, inputs);
            table(a, inputs)
                .into_iter()
                .filter_map(|(k, x)| match (b.get(&k), left) {
                    (None, false) => None,
                    (y, _) => Some((k, table_joiner(x, y.copied()))),
                })
                .collect()
        }
        T::MapValues(t, c) => table(t, inputs)
            .into_iter()
            .map(|(k, v)| (k, v + c))
            .collect(),
        T::Filter(t, c) => table(t, inputs)
            .into_iter()
            .filter(|(_, v)| v > c)
            .collect(),
    }
}

/// The windows (`<key>@<start>` → aggregate) a plan whose one output is a time-windowed
/// aggregation holds at the end, every one of them readable (its TTL is ahead of the wall
/// clock: design.md section 4); `None` for other plans.
pub fn window_items(plan: &Plan, inputs: &Inputs) -> Option<BTreeMap<String, i64>> {
    match plan.outputs.as_slice() {
        [Out::Windowed(w)] => Some(windowed(w, &without_poison(plan, inputs))),
        _ => None,
    }
}

/// Kafka Streams' time windows: a record at `t` is in every window `[s, s + size)` with
/// `s = k * advance`, `s >= 0`, `s <= t < s + size`; it is late for a window (dropped)
/// when the stream time has reached the window's end plus grace.
fn windowed(w: &W, inputs: &Inputs) -> BTreeMap<String, i64> {
    let (size, advance) = (w.windows.size(), w.windows.advance());
    let mut out = BTreeMap::new();
    for (k, r) in grouped(&w.stream, w.group, w.agg, false, inputs) {
        let mut start = 0;
        while start <= r.ts {
            if r.ts < start + size && start + size + w.grace > r.stream_time {
                let key = format!("{k}@{start}");
                let acc = out.get(&key).copied();
                out.insert(key, fold(w.agg, acc, r.value));
            }
            start += advance;
        }
    }
    out
}

/// Per window of [`windowed`], the newest timestamp of the records it holds (Kafka Streams'
/// window timestamp: `max(record, stored)`, so a late record does not move it back).
fn windowed_times(w: &W, inputs: &Inputs) -> BTreeMap<String, i64> {
    let (size, advance) = (w.windows.size(), w.windows.advance());
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for (k, r) in grouped(&w.stream, w.group, w.agg, false, inputs) {
        let mut start = 0;
        while start <= r.ts {
            if r.ts < start + size && start + size + w.grace > r.stream_time {
                let newest = out.entry(format!("{k}@{start}")).or_insert(r.ts);
                *newest = (*newest).max(r.ts);
            }
            start += advance;
        }
    }
    out
}

/// The partitions' final stream times of the stream topics a stream reads: `(topic,
/// partition) -> highest timestamp` (absent: the partition has no record).
fn sources(s: &S, into: &mut BTreeSet<usize>) {
    match s {
        S::Source(i) => {
            into.insert(*i);
        }
        S::Filter(s, _)
        | S::MapValues(s, _)
        | S::SelectKey(s, _)
        | S::Map(s, _, _)
        | S::FlatMapValues(s, _)
        | S::Split(s, _, _)
        | S::Repartition(s)
        | S::Branch { of: s, .. }
        | S::TryMapValues(s, _)
        | S::Join(s, _, _)
        | S::VersionedJoin { stream: s, .. } => sources(s, into),
        S::Merge(a, b) => {
            sources(a, into);
            sources(b, into);
        }
        S::StreamJoin { left, right, .. } => {
            sources(left, into);
            sources(right, into);
        }
        S::ToStream(_) => {}
    }
}

/// Emit on window close (Kafka Streams' `EmitStrategy.onWindowClose()`): each window is
/// emitted once, with its final value, when it closes: its end + grace at or before the
/// stream time. Here the stream time that closes windows is the low watermark the design
/// defines for direct mode (design.md section 4b): the lowest final stream time over every
/// partition of the stream topics the plan reads, all declared
/// (`BatchOptions::source_partitions`); a partition without records holds every window
/// open (the test ends long before the idle timeout). The plans' grace exceeds the
/// inputs' disorder, so no record is late and a final value is that of all its records.
fn finals(w: &W, plan: &Plan, inputs: &Inputs) -> BTreeMap<String, i64> {
    let _ = plan;
    let mut read = BTreeSet::new();
    sources(&w.stream, &mut read);
    let Some(low) = low_watermark(&read, inputs) else {
        return BTreeMap::new();
    };
    let size = w.windows.size();
    windowed(w, inputs)
        .into_iter()
        .filter(|(key, _)| {
            let start: i64 = key
                .rsplit_once('@')
                .and_then(|(_, s)| s.parse().ok())
                .unwrap_or(i64::MAX);
            start.saturating_add(size).saturating_add(w.grace) <= low
        })
        .collect()
}

/// The lowest final stream time over every partition of the stream topics `read` (all
/// declared, `BatchOptions::source_partitions`): `None` when one of them has no record (it
/// holds the time back; the test ends long before the idle timeout), or there are none.
fn low_watermark(read: &BTreeSet<usize>, inputs: &Inputs) -> Option<i64> {
    let mut low: Option<i64> = None;
    for i in read {
        for p in 0..PARTITIONS {
            let top = inputs
                .logs
                .get(&(format!("s{i}"), p))
                .into_iter()
                .flatten()
                .filter(|r| !r.bad)
                .map(|r| r.ts)
                .max()?;
            low = Some(low.map_or(top, |l: i64| l.min(top)));
        }
    }
    low
}

/// Kafka Streams' session windows (`KStreamSessionWindowAggregate`): per key, in the
/// order the records are processed, a record at `t` merges every session that ends at or
/// after `t - gap` and starts at or before `t + gap` into one (aggregates combined with
/// the merger). Without lateness the sessions are the runs of a key's records whose
/// consecutive timestamps are at most `gap` apart, whatever the order.
///
/// Lateness is Kafka 4's: a session ending at or before `stream time before the record -
/// grace - gap` is no longer returned by the session store (retention gap + grace, its time
/// that of the records put before) and merges with nothing, and the record is dropped as
/// late when the session it merges into ends before the close time `stream time - grace -
/// gap` (its own timestamp included).
/// Returns the sessions `<key>@<start>-<end>` and, per key, the horizon `newest session
/// end - (2 * gap + grace)`.
fn sessions(w: &DynW, inputs: &Inputs) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let Dyn::Session(gap) = w.windows else {
        unreachable!("session plans only")
    };
    // Per key: (start, end, aggregate).
    let mut by_key: BTreeMap<String, Vec<(i64, i64, i64)>> = BTreeMap::new();
    for (k, r) in grouped(&w.stream, w.group, w.agg, false, inputs) {
        let sessions = by_key.entry(k).or_default();
        let (mut start, mut end) = (r.ts, r.ts);
        let mut agg = fold(w.agg, None, r.value);
        let mut rest = Vec::new();
        let mut merged = Vec::new();
        let close = r.stream_time.saturating_sub(w.grace).saturating_sub(gap);
        // The session store's time is the stream time before the record.
        let expired = r.prior.saturating_sub(w.grace).saturating_sub(gap);
        for s in sessions.drain(..) {
            if s.1 >= r.ts - gap && s.0 <= r.ts + gap && s.1 > expired {
                merged.push(s);
            } else {
                rest.push(s);
            }
        }
        for s in &merged {
            start = start.min(s.0);
            end = end.max(s.1);
        }
        if end < close {
            // Late: dropped, the sessions stay as they were.
            rest.extend(merged);
            *sessions = rest;
            continue;
        }
        for s in &merged {
            agg = match w.agg {
                Agg::Count | Agg::Sum => agg + s.2,
                Agg::Max => agg.max(s.2),
            };
        }
        rest.push((start, end, agg));
        *sessions = rest;
    }
    let mut out = BTreeMap::new();
    let mut horizon = BTreeMap::new();
    for (k, sessions) in by_key {
        if let Some(newest) = sessions.iter().map(|s| s.1).max() {
            horizon.insert(
                k.clone(),
                newest.saturating_sub(gap.saturating_mul(2).saturating_add(w.grace)),
            );
        }
        for (start, end, agg) in sessions {
            out.insert(format!("{k}@{start}-{end}"), agg);
        }
    }
    (out, horizon)
}

/// Emit on close for sessions and sliding windows (Kafka Streams' `emitStrategy(
/// onWindowClose())`): each session or window once, with its final value, once the stream
/// time is past its end + grace (`end < stream time - grace`, minus the gap for sessions:
/// `KStreamSessionWindowAggregate`, `KStreamSlidingWindowAggregate`), with Kafka Streams'
/// timestamp (a session's end, a sliding window's newest record). The stream time that
/// closes them is the low watermark of the partitions feeding the aggregation, as for
/// time windows ([`finals`]). The plans' grace exceeds the inputs' disorder: no record is
/// late, none reaches a session or window after it closed, so the final values are those
/// of all the records ([`sessions`], [`sliding`]).
fn dyn_finals(w: &DynW, inputs: &Inputs) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let mut read = BTreeSet::new();
    sources(&w.stream, &mut read);
    let (mut values, mut times) = (BTreeMap::new(), BTreeMap::new());
    let Some(low) = low_watermark(&read, inputs) else {
        return (values, times);
    };
    match w.windows {
        Dyn::Session(gap) => {
            for (key, value) in sessions(w, inputs).0 {
                let end: i64 = key
                    .rsplit_once('-')
                    .and_then(|(_, e)| e.parse().ok())
                    .unwrap_or(i64::MAX);
                if end < low.saturating_sub(w.grace).saturating_sub(gap) {
                    values.insert(key.clone(), value);
                    times.insert(key, end);
                }
            }
        }
        Dyn::Sliding(d) => {
            for (key, (value, newest)) in sliding_windows(w, inputs) {
                let Some(start) = key
                    .rsplit_once('@')
                    .and_then(|(_, s)| s.parse::<i64>().ok())
                else {
                    continue;
                };
                let end = start.saturating_add(d);
                if end < low.saturating_sub(w.grace) {
                    values.insert(key.clone(), value);
                    times.insert(key, newest);
                }
            }
        }
    }
    (values, times)
}

/// Kafka Streams' sliding windows (`SlidingWindows`, `KStreamSlidingWindowAggregate`):
/// windows of `difference`, both ends inclusive, per key, made and filled record by
/// record in arrival order as Kafka 4's processor does (`reference/kafka_sliding.rs`, a
/// port of its window logic): a record counts only in the windows still open (on its
/// partition's stream time) when it is read, a window is made only while open, and a
/// record late for all its windows (`t + difference < stream time - grace`) is dropped.
/// Per window `<key>@<start>`: its value.
fn sliding(w: &DynW, inputs: &Inputs) -> BTreeMap<String, i64> {
    sliding_windows(w, inputs)
        .into_iter()
        .map(|(k, (v, _))| (k, v))
        .collect()
}

/// [`sliding`]'s windows with their newest record's time (Kafka Streams' window timestamp).
fn sliding_windows(w: &DynW, inputs: &Inputs) -> BTreeMap<String, (i64, i64)> {
    let Dyn::Sliding(d) = w.windows else {
        unreachable!("sliding plans only")
    };
    let mut by_key: BTreeMap<String, Vec<(i64, V, i64)>> = BTreeMap::new();
    for (k, r) in grouped(&w.stream, w.group, w.agg, true, inputs) {
        by_key
            .entry(k)
            .or_default()
            .push((r.ts, r.value, r.stream_time));
    }
    let agg = w.agg;
    let mut out = BTreeMap::new();
    for (k, records) in by_key {
        let (windows, _) = super::kafka_sliding::kafka_sliding(
            &records,
            d,
            w.grace,
            || None,
            |acc, value: &V| Some(fold(agg, acc, *value)),
        );
        for (start, (acc, newest)) in windows {
            if let Some(acc) = acc {
                out.insert(format!("{k}@{start}"), (acc, newest));
            }
        }
    }
    out
}
