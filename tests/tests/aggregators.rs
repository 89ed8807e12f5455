//! The built-in aggregators (top-K, top-K frequent, distinct count) under the random
//! fault model of `state_faults.rs` (redeliveries, retries with other boundaries, crashes
//! after k item writes, zombies whose writes interleave with newer invocations, commits
//! lost or moved back), on the real DynamoDB store on dynoxide. The final outputs (the
//! highest version per key) and the stored states equal references computed here by
//! brute force from the input log.

// Partition numbers index several parallel vectors (log, committed offsets).
#![allow(clippy::needless_range_loop)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::{Grouped, TimeWindows};
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{DecimalI64, Json, Unit, Utf8};
use lambda_streams::sink::{MemorySink, VERSION_HEADER};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::emulator_client;
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchOptions, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOPIC: &str = "plays";
const BASE_TIME: i64 = 1_764_460_800_000;

/// One input record: a group, a member and a score.
#[derive(Debug, Clone)]
struct Play {
    group: String,
    member: String,
    score: i64,
}

impl Play {
    fn encode(&self) -> String {
        format!("{}|{}|{}", self.group, self.member, self.score)
    }
}

fn parse(value: &str) -> (String, String, i64) {
    let mut parts = value.split('|');
    let group = parts.next().unwrap_or_default().to_owned();
    let member = parts.next().unwrap_or_default().to_owned();
    let score = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (group, member, score)
}

/// The input: per partition, the record at each offset (timestamp `BASE_TIME + offset`).
struct Log(Vec<Vec<Play>>);

impl Log {
    fn random(
        rng: &mut StdRng,
        partitions: usize,
        len: usize,
        groups: usize,
        members: usize,
    ) -> Log {
        Log((0..partitions)
            .map(|_| {
                (0..len)
                    .map(|_| Play {
                        group: format!("g{}", rng.random_range(0..groups)),
                        member: format!("m{}", rng.random_range(0..members)),
                        score: rng.random_range(-50..50),
                    })
                    .collect()
            })
            .collect())
    }

    fn event(&self, batch: &[(usize, usize, usize)]) -> KafkaEvent {
        log_event(TOPIC, BASE_TIME, batch, |p, o| {
            self.0[p][o].encode().into_bytes()
        })
    }

    /// Every record with its timestamp.
    fn records(&self) -> impl Iterator<Item = (i64, &Play)> {
        self.0.iter().flat_map(|part| {
            part.iter()
                .enumerate()
                .map(|(o, r)| (BASE_TIME + o as i64, r))
        })
    }
}

const K: usize = 3;
/// Hopping windows of 8 ms every 4 ms; grace beyond the test's time span (nothing late).
fn windows() -> TimeWindows {
    TimeWindows::of_size(Duration::from_millis(8))
        .advance_by(Duration::from_millis(4))
        .grace(Duration::from_secs(3600))
}

/// Per group: the top 3 members by score, the top 3 by frequency (capacity 30 >= the
/// members: exact), the distinct members; and per group and window, the top 3 by score.
fn topology(capacity: usize) -> Topology {
    let builder = StreamsBuilder::new();
    let grouped = builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, v: &String| parse(v).0, Grouped::direct(Utf8));
    grouped
        .top_k(
            "best",
            K,
            |_, v: &String| parse(v).1,
            |_, v: &String| parse(v).2,
            Utf8,
        )
        .to_stream()
        .to("best-out", Utf8, Json::<Vec<(String, i64)>>::new());
    grouped
        .top_k_frequent_with_capacity("frequent", K, capacity, |_, v: &String| parse(v).1, Utf8)
        .to_stream()
        .to("frequent-out", Utf8, Json::<Vec<(String, u64)>>::new());
    grouped
        .distinct_count("distinct", |_, v: &String| parse(v).1, Utf8)
        .to_stream()
        .map_values(|n| n as i64)
        .to("distinct-out", Utf8, DecimalI64);
    grouped
        .windowed_by(windows())
        .top_k(
            "best-windowed",
            K,
            |_, v: &String| parse(v).1,
            |_, v: &String| parse(v).2,
            Utf8,
        )
        .to_stream()
        .map(|w, top| (format!("{}@{}", w.key, w.start), top))
        .to("best-windowed-out", Utf8, Json::<Vec<(String, i64)>>::new());
    builder.build()
}

fn brute_top_k(plays: &[&Play]) -> Vec<(String, i64)> {
    let mut best: BTreeMap<String, i64> = BTreeMap::new();
    for p in plays {
        let e = best.entry(p.member.clone()).or_insert(p.score);
        *e = (*e).max(p.score);
    }
    let mut all: Vec<(String, i64)> = best.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all.truncate(K);
    all
}

fn brute_frequent(plays: &[&Play]) -> Vec<(String, u64)> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for p in plays {
        *counts.entry(p.member.clone()).or_insert(0) += 1;
    }
    let mut all: Vec<(String, u64)> = counts.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all.truncate(K);
    all
}

#[derive(Debug, PartialEq, Default)]
struct Results {
    best: BTreeMap<String, Vec<(String, i64)>>,
    frequent: BTreeMap<String, Vec<(String, u64)>>,
    distinct: BTreeMap<String, i64>,
    best_windowed: BTreeMap<String, Vec<(String, i64)>>,
}

fn reference(log: &Log) -> Results {
    let mut by_group: BTreeMap<String, Vec<&Play>> = BTreeMap::new();
    let mut by_window: BTreeMap<String, Vec<&Play>> = BTreeMap::new();
    for (ts, play) in log.records() {
        by_group.entry(play.group.clone()).or_default().push(play);
        for start in windows().window_starts(ts) {
            by_window
                .entry(format!("{}@{start}", play.group))
                .or_default()
                .push(play);
        }
    }
    Results {
        best: by_group
            .iter()
            .map(|(g, ps)| (g.clone(), brute_top_k(ps)))
            .collect(),
        frequent: by_group
            .iter()
            .map(|(g, ps)| (g.clone(), brute_frequent(ps)))
            .collect(),
        distinct: by_group
            .iter()
            .map(|(g, ps)| {
                let members: BTreeSet<&str> = ps.iter().map(|p| p.member.as_str()).collect();
                (g.clone(), members.len() as i64)
            })
            .collect(),
        best_windowed: by_window
            .iter()
            .map(|(w, ps)| (w.clone(), brute_top_k(ps)))
            .collect(),
    }
}

/// Per topic and key, the value of the emitted update with the highest version.
fn latest(sink: &MemorySink, topic: &str) -> BTreeMap<String, String> {
    let mut latest: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for record in sink.records().into_iter().filter(|r| r.topic == topic) {
        let key = String::from_utf8(record.key.clone().expect("key")).expect("utf-8");
        let version: u64 = std::str::from_utf8(record.header(VERSION_HEADER).expect("version"))
            .expect("utf-8")
            .parse()
            .expect("n");
        let value = String::from_utf8(record.value.clone().expect("value")).expect("utf-8");
        let entry = latest.entry(key).or_insert((0, String::new()));
        if version > entry.0 {
            *entry = (version, value);
        }
    }
    latest.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

fn latest_json<T: serde::de::DeserializeOwned>(
    sink: &MemorySink,
    topic: &str,
) -> BTreeMap<String, T> {
    latest(sink, topic)
        .into_iter()
        .map(|(k, v)| (k, serde_json::from_str(&v).expect("json")))
        .collect()
}

fn emitted(sink: &MemorySink) -> Results {
    Results {
        best: latest_json(sink, "best-out"),
        frequent: latest_json(sink, "frequent-out"),
        distinct: latest(sink, "distinct-out")
            .into_iter()
            .map(|(k, v)| (k, v.parse().expect("count")))
            .collect(),
        best_windowed: latest_json(sink, "best-windowed-out"),
    }
}

/// The distinct counts straight from the table: the `distinct` store's items (attribute
/// `a`) read in the documented state format (version 1, kind `D`, mode 0 = exact set:
/// `u32` n then n hashes), without the code under test.
async fn table_distinct(table: &str) -> BTreeMap<String, i64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = emulator_client(&dynamo_endpoint());
    let mut out = BTreeMap::new();
    let mut pages = client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        for item in page.expect("scan").items() {
            let Some(AttributeValue::S(pk)) = item.get("pk") else {
                continue;
            };
            if !pk.starts_with("distinct#") {
                continue;
            }
            let (Some(AttributeValue::B(key)), Some(AttributeValue::B(a))) =
                (item.get("k"), item.get("a"))
            else {
                panic!("a distinct-count item without k or a: {item:?}");
            };
            let a = a.as_ref();
            assert_eq!(&a[..3], &[1, b'D', 0], "version 1, distinct, exact");
            let n = u32::from_be_bytes(a[3..7].try_into().expect("4 bytes")) as usize;
            assert_eq!(a.len(), 7 + 8 * n);
            let key = String::from_utf8(key.as_ref().to_vec()).expect("utf-8");
            out.insert(key, n as i64);
        }
    }
    out
}

fn declared(partitions: usize) -> BatchOptions {
    BatchOptions {
        source_partitions: BTreeMap::from([(TOPIC.to_owned(), partitions as i32)]),
        ..BatchOptions::default()
    }
}

fn seeds(default: u64) -> u64 {
    std::env::var("LAMBDA_STREAMS_FAULT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The random fault model of `state_faults.rs` (a copy of its `faulty_run`): rounds of 1
/// to 3 concurrent invocations from the committed offsets (the older ones zombies), some
/// crashing after k writes, writes delayed at random so that they interleave, commits
/// sometimes lost or moved back; then a fault-free drain.
async fn faulty_run(
    seed: u64,
    store: Arc<dyn Store>,
    topology: &Topology,
    log: &Log,
    max_batch: usize,
) -> MemorySink {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let parts = log.0.len();
    let len = log.0[0].len();
    let sink = MemorySink::new();
    let mut committed = vec![0usize; parts];
    for round in 0..rng.random_range(3..25) {
        let mut invocations = Vec::new();
        for i in 0..rng.random_range(1..=3) {
            let mut batch = Vec::new();
            for p in 0..parts {
                if committed[p] < len && rng.random_bool(0.6) {
                    let hi = (committed[p] + rng.random_range(1..max_batch)).min(len);
                    batch.push((p, committed[p], hi));
                }
            }
            if batch.is_empty() {
                continue;
            }
            let mut layer = FaultyStore::new(Arc::clone(&store))
                .with_delays(Duration::from_millis(3), seed * 1000 + round * 10 + i);
            if rng.random_bool(0.3) {
                layer = layer.crash_after(rng.random_range(0..4));
            }
            invocations.push((batch, layer));
        }
        let results = futures::future::join_all(invocations.iter().map(|(batch, layer)| {
            let (sink, event) = (&sink, log.event(batch));
            async move {
                topology
                    .process_with(&event, layer, sink, &declared(parts))
                    .await
            }
        }))
        .await;
        for ((batch, _), result) in invocations.iter().zip(results) {
            if result.is_err() {
                continue;
            }
            for &(p, lo, hi) in batch {
                if rng.random_bool(0.9) {
                    committed[p] = committed[p].max(hi);
                }
                if rng.random_bool(0.05) {
                    committed[p] = rng.random_range(0..=lo);
                }
            }
        }
    }
    for p in 0..parts {
        while committed[p] < len {
            let hi = (committed[p] + rng.random_range(1..max_batch)).min(len);
            topology
                .process_with(
                    &log.event(&[(p, committed[p], hi)]),
                    &store,
                    &sink,
                    &declared(parts),
                )
                .await
                .expect("fault-free batch");
            committed[p] = hi;
        }
    }
    sink
}

fn scenario_log(seed: u64) -> Log {
    let mut rng = StdRng::seed_from_u64(seed);
    let len = rng.random_range(5..40);
    let groups = rng.random_range(1..4);
    Log::random(&mut rng, 3, len, groups, 12)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_the_aggregators_on_the_emulator_are_exact() {
    require_services();
    let topology = topology(30);
    for seed in 0..seeds(20) {
        let (table, store) = exactly_once_store("aggregators").await;
        let store: Arc<dyn Store> = Arc::new(store);
        let log = scenario_log(seed);
        let sink = faulty_run(seed, store, &topology, &log, 12).await;
        let truth = reference(&log);
        assert_eq!(
            emitted(&sink),
            truth,
            "seed {seed}: highest-version output per key"
        );
        assert_eq!(
            table_distinct(&table).await,
            truth.distinct,
            "seed {seed}: stored sets"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_the_aggregators_in_memory_are_exact() {
    let topology = topology(30);
    for seed in 0..seeds(200) {
        let log = scenario_log(seed);
        let sink = faulty_run(seed, Arc::new(MemoryStore::new()), &topology, &log, 12).await;
        assert_eq!(emitted(&sink), reference(&log), "seed {seed}");
    }
}

/// Beyond the exact regimes, under faults, on the emulator: one group with 3,000 distinct
/// members (past the exact limit of 2,048: the HyperLogLog sketch) and Space-Saving with
/// a capacity of 5 over 40 members. The sketch's estimate is the same as a fault-free run's
/// (its state does not depend on order or boundaries, and no record counts twice) and
/// within 3 standard errors (2.44%) of the truth; every reported frequent count is within
/// Space-Saving's bound (true <= count <= true + N / capacity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_exact_regimes_the_bounds_hold_under_faults() {
    require_services();
    let capacity = 5;
    let topology = topology(capacity);
    let mut rng = StdRng::seed_from_u64(77);
    let (parts, len) = (3, 1000);
    let log = Log((0..parts)
        .map(|p| {
            (0..len)
                .map(|o| Play {
                    group: "all".to_owned(),
                    // Distinct per record: 3,000 members for distinct_count ...
                    member: format!("u{p}-{o}"),
                    score: rng.random_range(0..1_000_000),
                })
                .collect()
        })
        .collect());
    // ... and a skewed second topology input for Space-Saving: the same log with members
    // folded onto 40, `s0` about 32% of them.
    let skewed = Log(log
        .0
        .iter()
        .map(|part| {
            part.iter()
                .map(|play| {
                    let id = if rng.random_bool(0.3) {
                        0
                    } else {
                        rng.random_range(0..40)
                    };
                    Play {
                        member: format!("s{id}"),
                        ..play.clone()
                    }
                })
                .collect()
        })
        .collect());
    let run = async |log: &Log, seed: Option<u64>| {
        let (_, store) = exactly_once_store("aggregators-big").await;
        let store: Arc<dyn Store> = Arc::new(store);
        match seed {
            Some(seed) => faulty_run(seed, store, &topology, log, 200).await,
            None => {
                let sink = MemorySink::new();
                for p in 0..parts {
                    for lo in (0..len).step_by(250) {
                        topology
                            .process_with(
                                &log.event(&[(p, lo, lo + 250)]),
                                &store,
                                &sink,
                                &declared(parts),
                            )
                            .await
                            .expect("batch");
                    }
                }
                sink
            }
        }
    };
    let clean = emitted(&run(&log, None).await);
    let faulty = emitted(&run(&log, Some(3)).await);
    let truth = (parts * len) as f64;
    let estimate = faulty.distinct["all"] as f64;
    let se = 1.04 / f64::from(1u32 << 14).sqrt();
    eprintln!(
        "distinct count of {truth} members: {estimate} (relative error {:+.3}%)",
        (estimate - truth) / truth * 100.0
    );
    assert_eq!(
        faulty.distinct, clean.distinct,
        "the sketch ends the same under faults"
    );
    assert!(((estimate - truth) / truth).abs() < 3.0 * se);
    // Top-K by score stays exact with 3,000 members.
    assert_eq!(faulty.best, reference(&log).best);

    let frequent = emitted(&run(&skewed, Some(4)).await).frequent;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for (_, play) in skewed.records() {
        *counts.entry(play.member.clone()).or_insert(0) += 1;
    }
    let bound = (parts * len / capacity) as u64;
    let reported = &frequent["all"];
    assert_eq!(reported.len(), K);
    for (member, count) in reported {
        let f = counts[member];
        eprintln!("space-saving: {member} reported {count}, true {f} (bound N/c = {bound})");
        assert!(
            *count >= f && *count - f <= bound,
            "{member}: {count} vs true {f}"
        );
    }
    // The truly most frequent member is far above N / c, hence monitored and reported.
    let top = brute_frequent(&skewed.records().map(|(_, p)| p).collect::<Vec<_>>());
    assert!(
        reported.iter().any(|(m, _)| m == &top[0].0),
        "{reported:?} vs {top:?}"
    );
}
