//! The reference interpreter: the definition of the right answer, written from Kafka
//! Streams' semantics and independent of the framework's code. Record at a time, no
//! batching, no watermarks, no store: the table topics are read first (the event source
//! of the test delivers them before the streams, so that every stream record joins the
//! final tables), then the streams, each partition in offset order.

use std::collections::BTreeMap;

use super::plan::{
    Agg, Group, In, Inputs, K, Out, PARTITIONS, Plan, S, T, V, W, flat, stream_joiner, table_joiner,
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
}

/// What each output topic must hold.
#[derive(Debug, Clone)]
pub enum Expected {
    /// A stream's records: `(key, value, timestamp)`, as a multiset (sorted).
    Records(Vec<(K, V, i64)>),
    /// A table's final state (keys absent: no value or deleted).
    Table(BTreeMap<String, i64>),
}

/// The expected content of every output topic `o<i>`, in order.
pub fn evaluate(plan: &Plan, inputs: &Inputs) -> Vec<Expected> {
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
            Out::Table(t) => Expected::Table(table(t, inputs)),
            Out::Windowed(w) => Expected::Table(windowed(w, inputs)),
        })
        .collect()
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
                for r in inputs.logs.get(&(format!("s{i}"), p)).into_iter().flatten() {
                    time = time.max(r.ts);
                    out.push(Rec {
                        key: r.key.clone(),
                        value: r.value,
                        ts: r.ts,
                        stream_time: time,
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
        // A repartition moves records, it does not change them.
        S::Repartition(s) => stream(s, inputs),
        S::Join(s, t, left) => {
            let t = table(t, inputs);
            stream(s, inputs)
                .into_iter()
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
            })
            .collect(),
    }
}

fn fold(agg: Agg, acc: Option<i64>, value: V) -> i64 {
    match agg {
        Agg::Count => acc.unwrap_or(0) + 1,
        Agg::Sum => acc.unwrap_or(0) + value.unwrap_or(0),
        Agg::Max => acc.unwrap_or(i64::MIN).max(value.unwrap_or(i64::MIN)),
    }
}

/// The records an aggregation sees: the stream, non-null values only for `Max`
/// (`reduce` skips null values, as in Kafka Streams), re-keyed by the grouping.
/// Records with a null key are not aggregated (Kafka Streams drops them).
fn grouped(s: &S, group: Group, agg: Agg, inputs: &Inputs) -> Vec<(String, Rec)> {
    stream(s, inputs)
        .into_iter()
        .filter(|r| agg != Agg::Max || r.value.is_some())
        .filter_map(|r| group.key(&r.key, &r.value).map(|k| (k, r)))
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
            for (k, r) in grouped(s, *group, *agg, inputs) {
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

/// Kafka Streams' time windows: a record at `t` is in every window `[s, s + size)` with
/// `s = k * advance`, `s >= 0`, `s <= t < s + size`; it is late for a window (dropped)
/// when the stream time has reached the window's end plus grace.
fn windowed(w: &W, inputs: &Inputs) -> BTreeMap<String, i64> {
    let (size, advance) = (w.windows.size(), w.windows.advance());
    let mut out = BTreeMap::new();
    for (k, r) in grouped(&w.stream, w.group, w.agg, inputs) {
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
