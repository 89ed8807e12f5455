//! The exactly-once output's protocol steps ([`ExactlyOnceOutput`], the real
//! implementation) against the fault model of `shared/models/exactly_once_output.py`
//! (design notes, section 5a), on an in-memory transactional log written here from Kafka's
//! documented semantics, not from the code under test:
//!
//! - transactional ids with epochs: `init_transactions` bumps the epoch (fencing older
//!   instances), aborts an ongoing transaction and waits while one is being completed
//!   (`CONCURRENT_TRANSACTIONS`); a coordinator timeout aborts and bumps the epoch;
//! - `EndTxn` returns once the transaction is *prepared*; its markers are written later,
//!   and the transactional offsets are materialised in the group after that (both at random
//!   times, in any order across transactions); an `OffsetFetch` with `require_stable` waits
//!   while the partition has offsets pending;
//! - Lambda's event source: batches over random subsets of free partitions with random end
//!   offsets (so retries of a failed batch end elsewhere: shifted retries), retries after a
//!   failure, timeouts that free the partitions while the invocation keeps running
//!   (zombies), crashes at any await point (the container and its producers are lost), and
//!   warm containers whose producers a later invocation reuses.
//!
//! A `read_committed` reader of the log then sees every stateless output (two per record,
//! a fan-out), every repartition record and every dead letter of a source record exactly
//! once (poison in the user's function, or rejected by a store at write time), every
//! aggregate update `(key, version)` once with complete versions (and every session update
//! on update, its merges' tombstones among them, once per session and version), and never the framework's internal transaction header; the state (a count per key
//! in the memory store) is exact. Every schedule is seeded and deterministic (one thread).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use lambda_streams::dsl::Grouped;
use lambda_streams::dsl::Topology;
use lambda_streams::event::TopicPartition;
use lambda_streams::event::{EventSource, KafkaEvent, PartitionRecords, Record, TimestampType};
use lambda_streams::kafka::{
    CommittedOffset, ExactlyOnceOutput, TransactionalLog, TransactionalProducer, TxnError,
};
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::sink::{OutputRecord, SEQUENCE_HEADER, SOURCE_HEADER, VERSION_HEADER};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::state::outbox::{Emission, Entry, Outbox};
use lambda_streams::state::{
    ClaimedWindow, Clock, ClosedWindow, ClosingClaim, ClosingItem, ItemState, ItemWrite,
    StateError, Store, WriteStats,
};
use lambda_streams::wire::TRANSACTION_HEADER;
use lambda_streams::{BatchOptions, PoisonPolicy, StreamsBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "eos/log.rs"]
mod log;
use log::Broker;

// ------------------------------------------------------------------ the topology

/// Per record: two stateless outputs (a fan-out), a repartition record, a count per key;
/// a record whose value is `poison` fails in the user's function and is dead-lettered.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let checked = builder
        .stream("in", Utf8, Utf8)
        .try_map_values(|v: String| if v == "poison" { Err("poison") } else { Ok(v) });
    checked
        .flat_map_values(|v: String| [format!("{v}/1"), format!("{v}/2")])
        .to("out", Utf8, Utf8);
    checked
        .select_key(|_, v: &String| v.clone())
        .repartition("by-value", Utf8, Utf8);
    let counts = checked.group_by_key(Utf8).count("counts").to_stream();
    counts.to("count-updates", Utf8, DecimalI64);
    // A general aggregate, re-keyed directly (each item written from every partition).
    let lengths = checked
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .aggregate(
            "lengths",
            || 0i64,
            |_, v: String, sum| {
                // Fails at write time, in the store's fold: a poison record of the write.
                assert!(v != "boom", "the adder refuses {v}");
                sum + v.len() as i64 + 1
            },
            DecimalI64,
        )
        .to_stream();
    lengths.to("length-updates", Utf8, DecimalI64);
    // The two stores' updates merged into one sink (keys told apart by a prefix): each
    // store's outbox covers its own updates.
    counts
        .map(|k, n| (format!("c:{k}"), n))
        .merge(&lengths.map(|k, n| (format!("l:{k}"), n)))
        .to("merged-updates", Utf8, DecimalI64);
    // A time window emitted on update: per key and window of 3 ms (offsets 3w..3w+2, the
    // records' timestamps being 1,000 + offset), a generous grace so that nothing is late.
    checked
        .group_by_key(Utf8)
        .windowed_by(
            lambda_streams::dsl::TimeWindows::of_size(std::time::Duration::from_millis(3))
                .grace(std::time::Duration::from_secs(3600)),
        )
        .count("per-window")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("window-updates", Utf8, DecimalI64);
    // A time window emitted on close (windows of 3 ms, no grace): each window's final
    // count once, claimed before it is emitted; merged with the count's updates (keys
    // `c:<key>`), which its outbox covers.
    checked
        .group_by_key(Utf8)
        .windowed_by(lambda_streams::dsl::TimeWindows::of_size(
            std::time::Duration::from_millis(3),
        ))
        .emit_strategy(lambda_streams::dsl::EmitStrategy::OnWindowClose)
        .count("closing")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .merge(&counts.map(|k, n| (format!("c:{k}"), n)))
        .to("window-closes", Utf8, DecimalI64);
    // Sessions emitted on close (gap 2 ms, no grace), merged with the count's updates:
    // closed in the closing pass, whose rewrite of the key's item claims them.
    checked
        .group_by_key(Utf8)
        .windowed_by_session(lambda_streams::dsl::SessionWindows::with_inactivity_gap(
            std::time::Duration::from_millis(SESSION_GAP as u64),
        ))
        .emit_strategy(lambda_streams::dsl::EmitStrategy::OnWindowClose)
        .count("sessions")
        .to_stream()
        .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
        .merge(&counts.map(|k, n| (format!("c:{k}"), n)))
        .to("session-closes", Utf8, DecimalI64);
    // Sliding windows emitted on close (difference 2 ms, no grace): the same closing pass.
    checked
        .group_by_key(Utf8)
        .windowed_by_sliding(
            lambda_streams::dsl::SlidingWindows::of_time_difference_and_grace(
                std::time::Duration::from_millis(SLIDING_DIFFERENCE as u64),
                std::time::Duration::ZERO,
            ),
        )
        .emit_strategy(lambda_streams::dsl::EmitStrategy::OnWindowClose)
        .count("sliding")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("sliding-closes", Utf8, DecimalI64);
    // Sessions emitted on update (gap 3 ms, no grace), with the tombstones of the sessions
    // a record merges away: one write changes several sessions, each update in the
    // transaction of the write's record, derived from the state its outbox entry holds.
    // Merged with the count's updates (keys `c:<key>`), each store's outbox covering its own.
    checked
        .group_by_key(Utf8)
        .windowed_by_session(lambda_streams::dsl::SessionWindows::with_inactivity_gap(
            std::time::Duration::from_millis(SESSION_UPDATE_GAP as u64),
        ))
        .count("session-counts")
        .to_change_stream()
        .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
        .merge(&counts.map(|k, n| (format!("c:{k}"), Some(n))))
        .to(
            "session-updates",
            Utf8,
            lambda_streams::serdes::Nullable(DecimalI64),
        );
    builder.build()
}

/// The inactivity gap (ms) of the sessions emitted on update: with records at `1,000 + o`
/// for offsets `o` below 6, a key's records span at most 5 ms, so the item keeps every
/// session a record can merge with (`2 * gap + grace` behind the newest record) and no
/// record is late, whatever the partitions' order: the key's sessions are its record times
/// merged while the next is within the gap, in any order (the brute force of
/// [`check_session_updates`]).
const SESSION_UPDATE_GAP: i64 = 3;

/// The session windows' inactivity gap (ms).
const SESSION_GAP: i64 = 2;
/// The sliding windows' time difference (ms).
const SLIDING_DIFFERENCE: i64 = 2;

fn options() -> BatchOptions {
    BatchOptions {
        poison: PoisonPolicy::DeadLetter {
            topic: "dlq".into(),
        },
        ..BatchOptions::default()
    }
}

/// [`options`], with the source topic's partitions declared: every partition holds the
/// windows open until it has delivered records past them.
fn options_for(source: &Source) -> BatchOptions {
    BatchOptions {
        source_partitions: BTreeMap::from([("in".to_owned(), source.len() as i32)]),
        ..options()
    }
}

// ------------------------------------------------------------------ the event source

struct Invocation {
    batch: BTreeMap<TopicPartition, (i64, i64)>,
    env: usize,
    timed_out: bool,
    handle: tokio::task::JoinHandle<Result<(), String>>,
}

#[derive(Debug, Default)]
struct Stats {
    invocations: u64,
    successes: u64,
    failures: u64,
    crashes: u64,
    zombies: u64,
    multi_partition: u64,
    shifted_retries: u64,
    reused_envs: u64,
    txn_timeouts: u64,
    fenced: u64,
    /// Windows emitted only by the partitions' batches after the run (claims that fenced
    /// zombies made after their partition's last batch).
    closes_by_a_later_batch: u64,
    /// Window closes a `read_committed` reader sees.
    closes: u64,
    /// Sessions and sliding windows a `read_committed` reader sees (closing passes).
    closing_closes: u64,
    /// Of those, emitted only by the partitions' batches after the run.
    closing_by_a_later_batch: u64,
    /// Sessions' updates on update a `read_committed` reader sees, and of them tombstones.
    session_updates: u64,
    session_tombstones: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.invocations += o.invocations;
        self.successes += o.successes;
        self.failures += o.failures;
        self.crashes += o.crashes;
        self.zombies += o.zombies;
        self.multi_partition += o.multi_partition;
        self.shifted_retries += o.shifted_retries;
        self.reused_envs += o.reused_envs;
        self.txn_timeouts += o.txn_timeouts;
        self.fenced += o.fenced;
        self.closes_by_a_later_batch += o.closes_by_a_later_batch;
        self.closes += o.closes;
        self.closing_closes += o.closing_closes;
        self.closing_by_a_later_batch += o.closing_by_a_later_batch;
        self.session_updates += o.session_updates;
        self.session_tombstones += o.session_tombstones;
    }
}

type Source = BTreeMap<TopicPartition, Vec<(String, String)>>;

fn source(rng: &mut StdRng) -> Source {
    let partitions = rng.random_range(2..=3);
    (0..partitions)
        .map(|p| {
            let n = rng.random_range(2..=6);
            let records = (0..n)
                .map(|_| {
                    let key = ["a", "b", "c"][rng.random_range(0..3)].to_owned();
                    let value = if rng.random_bool(0.15) {
                        "poison".to_owned()
                    } else if rng.random_bool(0.08) {
                        long_value()
                    } else if rng.random_bool(0.08) {
                        "boom".to_owned()
                    } else {
                        ["x", "y"][rng.random_range(0..2)].to_owned()
                    };
                    (key, value)
                })
                .collect();
            (TopicPartition::new("in", p), records)
        })
        .collect()
}

/// A value the directly re-keyed aggregate cannot hold: as its key it takes the item's
/// partition key past DynamoDB's 2,048 bytes, so the store rejects the record at write time
/// (a poison record of the write, dead-lettered), while its other outputs and the count go
/// on.
fn long_value() -> String {
    "w".repeat(1600)
}

fn event(source: &Source, batch: &Batch) -> KafkaEvent {
    event_of(batch, |tp, o| {
        let (k, v) = &source[tp][o as usize];
        (k.clone(), v.clone(), 1_000 + o)
    })
}

/// The event of `batch`, each record's `(key, value, timestamp)` from `record`.
fn event_of(
    batch: &Batch,
    record: impl Fn(&TopicPartition, i64) -> (String, String, i64),
) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "memory".into(),
        partitions: batch
            .iter()
            .map(|(tp, &(a, b))| PartitionRecords {
                tp: tp.clone(),
                records: (a..=b)
                    .map(|o| {
                        let (k, v, timestamp) = record(tp, o);
                        Record {
                            offset: o,
                            timestamp,
                            timestamp_type: TimestampType::CreateTime,
                            key: Some(Bytes::from(k)),
                            value: Some(Bytes::from(v)),
                            headers: Vec::new(),
                            key_schema_metadata: None,
                            value_schema_metadata: None,
                        }
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// A batch's range of offsets (inclusive) per partition.
type Batch = BTreeMap<TopicPartition, (i64, i64)>;

/// Lambda's event source under the fault model (see the file's documentation): batches of
/// `topology` over `start..ends` of each partition, built by `event`, until every partition
/// is consumed (or the step cap).
struct FaultySource<'a> {
    topology: &'a Arc<Topology>,
    store: &'a Arc<dyn Store>,
    broker: &'a Broker,
    /// Per partition, the first offset to deliver (the event source's committed position).
    start: BTreeMap<TopicPartition, i64>,
    /// Per partition, the offset after its last record.
    ends: BTreeMap<TopicPartition, i64>,
    event: &'a dyn Fn(&Batch) -> KafkaEvent,
    options: BatchOptions,
}

impl FaultySource<'_> {
    /// Runs the schedule, then stops whatever still runs and lets the coordinator complete
    /// every transaction. Returns whether every partition was consumed.
    async fn run(&self, rng: &mut StdRng, stats: &mut Stats) -> bool {
        let p_crash = [0.0, 0.01, 0.03][rng.random_range(0..3)];
        let p_timeout = [0.02, 0.08][rng.random_range(0..2)];
        let mut committed = self.start.clone();
        let mut busy: BTreeMap<TopicPartition, usize> = BTreeMap::new();
        // Warm containers: their output (and its cached producers), and whether one is busy.
        let mut envs: Vec<(Arc<ExactlyOnceOutput>, bool, bool)> = Vec::new(); // (output, busy, alive)
        let mut running: Vec<(usize, Invocation)> = Vec::new();
        let mut next_id = 0usize;
        let mut last_end: HashMap<(TopicPartition, i64), i64> = HashMap::new();
        let mut complete = false;
        for _ in 0..6_000 {
            // Finished invocations.
            let mut i = 0;
            while i < running.len() {
                if !running[i].1.handle.is_finished() {
                    i += 1;
                    continue;
                }
                let (id, inv) = running.remove(i);
                let result = inv.handle.await.unwrap();
                if let Err(e) = &result
                    && std::env::var("EOS_TRACE_ERRORS").is_ok()
                {
                    eprintln!("invocation failed: {e}");
                }
                let ok = result.is_ok();
                envs[inv.env].1 = false;
                if ok {
                    stats.successes += 1;
                } else {
                    stats.failures += 1;
                }
                if !inv.timed_out {
                    for (tp, (_, b)) in &inv.batch {
                        if ok {
                            let c = committed.get_mut(tp).unwrap();
                            *c = (*c).max(b + 1);
                        }
                        if busy.get(tp) == Some(&id) {
                            busy.remove(tp);
                        }
                    }
                }
            }
            let free: Vec<TopicPartition> = self
                .ends
                .iter()
                .filter(|(tp, end)| !busy.contains_key(*tp) && committed[*tp] < **end)
                .map(|(tp, _)| tp.clone())
                .collect();
            let done = free.is_empty()
                && busy.is_empty()
                && self.ends.iter().all(|(tp, end)| committed[tp] == *end);
            {
                let log = self.broker.log();
                if done
                    && running.is_empty()
                    && log.markers.is_empty()
                    && log.to_materialise.is_empty()
                {
                    complete = true;
                    break;
                }
            }
            // One action, weighted as in the model.
            let ongoing = self.broker.log().ongoing();
            let (markers, to_mat) = {
                let log = self.broker.log();
                (log.markers.len(), log.to_materialise.len())
            };
            let mut actions: Vec<(f64, u8, usize)> = Vec::new();
            if !free.is_empty() {
                actions.push((1.0, 0, 0));
            }
            for (k, (_, inv)) in running.iter().enumerate() {
                actions.push((3.0, 1, k));
                if !inv.timed_out {
                    actions.push((p_timeout, 2, k));
                }
                actions.push((p_crash, 3, k));
            }
            if markers > 0 {
                actions.push((1.0, 4, 0));
            }
            if to_mat > 0 {
                actions.push((1.0, 5, 0));
            }
            if !ongoing.is_empty() {
                actions.push((0.03, 6, 0));
            }
            if actions.is_empty() {
                break;
            }
            let total: f64 = actions.iter().map(|a| a.0).sum();
            let mut x = rng.random::<f64>() * total;
            let mut chosen = actions[actions.len() - 1];
            for a in &actions {
                x -= a.0;
                if x <= 0.0 {
                    chosen = *a;
                    break;
                }
            }
            match chosen.1 {
                0 => {
                    let k = rng.random_range(1..=free.len());
                    let mut picked = free.clone();
                    while picked.len() > k {
                        picked.remove(rng.random_range(0..picked.len()));
                    }
                    let mut batch = BTreeMap::new();
                    for tp in picked {
                        let a = committed[&tp];
                        let end = self.ends[&tp] - 1;
                        let b = end.min(a + rng.random_range(0..=3));
                        if let Some(prev) = last_end.insert((tp.clone(), a), b)
                            && prev != b
                        {
                            stats.shifted_retries += 1;
                        }
                        batch.insert(tp, (a, b));
                    }
                    if batch.len() > 1 {
                        stats.multi_partition += 1;
                    }
                    let idle: Vec<usize> = (0..envs.len())
                        .filter(|&e| envs[e].2 && !envs[e].1)
                        .collect();
                    let env = if !idle.is_empty() && rng.random_bool(0.7) {
                        stats.reused_envs += 1;
                        idle[rng.random_range(0..idle.len())]
                    } else {
                        envs.push((
                            Arc::new(ExactlyOnceOutput::new("app", Arc::new(self.broker.clone()))),
                            false,
                            true,
                        ));
                        envs.len() - 1
                    };
                    envs[env].1 = true;
                    let id = next_id;
                    next_id += 1;
                    for tp in batch.keys() {
                        busy.insert(tp.clone(), id);
                    }
                    let event = (self.event)(&batch);
                    let (output, topology, store, options) = (
                        Arc::clone(&envs[env].0),
                        Arc::clone(self.topology),
                        Arc::clone(self.store),
                        self.options.clone(),
                    );
                    let handle = tokio::spawn(async move {
                        output
                            .process(&topology, &event, store.as_ref(), &options)
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    });
                    stats.invocations += 1;
                    running.push((
                        id,
                        Invocation {
                            batch,
                            env,
                            timed_out: false,
                            handle,
                        },
                    ));
                }
                1 => tokio::task::yield_now().await,
                2 => {
                    // The event source gives up waiting: the partitions go to a retry while
                    // the invocation keeps running.
                    let (id, inv) = &mut running[chosen.2];
                    inv.timed_out = true;
                    stats.zombies += 1;
                    for tp in inv.batch.keys() {
                        if busy.get(tp) == Some(id) {
                            busy.remove(tp);
                        }
                    }
                }
                3 => {
                    let (id, inv) = running.remove(chosen.2);
                    inv.handle.abort();
                    let _ = inv.handle.await;
                    stats.crashes += 1;
                    envs[inv.env].2 = false; // the container is gone, with its producers
                    if !inv.timed_out {
                        for tp in inv.batch.keys() {
                            if busy.get(tp) == Some(&id) {
                                busy.remove(tp);
                            }
                        }
                    }
                }
                4 => {
                    let mut log = self.broker.log();
                    let i = rng.random_range(0..log.markers.len());
                    log.deliver_marker(i);
                }
                5 => {
                    let mut log = self.broker.log();
                    let i = rng.random_range(0..log.to_materialise.len());
                    log.materialise(i);
                }
                _ => {
                    let tid = ongoing[rng.random_range(0..ongoing.len())].clone();
                    self.broker.log().timeout_abort(&tid);
                    stats.txn_timeouts += 1;
                }
            }
        }
        // Drain: stop whatever still runs; the coordinator times out open transactions and
        // writes every marker.
        for (_, inv) in running.drain(..) {
            inv.handle.abort();
            let _ = inv.handle.await;
        }
        {
            let mut log = self.broker.log();
            for tid in log.ongoing() {
                log.timeout_abort(&tid);
            }
            while !log.markers.is_empty() {
                log.deliver_marker(0);
            }
            while !log.to_materialise.is_empty() {
                log.materialise(0);
            }
            stats.fenced = log.fenced;
        }
        complete
    }
}

/// One schedule: the event source runs the topology over `source` with faults until
/// every partition is consumed (or the step cap), then the broker completes every
/// transaction. Returns the violations found, whether it completed, and its statistics.
async fn schedule(seed: u64, control: Control) -> (Vec<String>, bool, Stats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let source = source(&mut rng);
    let topology = Arc::new(topology());
    let store: Arc<dyn Store> = match control {
        Control::None => Arc::new(MemoryStore::new()),
        control => Arc::new(Weakened(MemoryStore::new(), control)),
    };
    let broker = Broker::default();
    let mut stats = Stats::default();
    let faults = FaultySource {
        topology: &topology,
        store: &store,
        broker: &broker,
        start: source.keys().map(|tp| (tp.clone(), 0)).collect(),
        ends: source
            .iter()
            .map(|(tp, r)| (tp.clone(), r.len() as i64))
            .collect(),
        event: &|batch| event(&source, batch),
        options: options_for(&source),
    };
    let complete = faults.run(&mut rng, &mut stats).await;
    // What each partition's next batch does: one more batch per partition, with no records
    // and no faults, emits the windows whose claims a fenced zombie made after the
    // partition's last batch (and finishes the committed ones).
    let before = broker.log().committed_view("window-closes").len();
    let closing_before = closing_emitted(&broker);
    if complete {
        for tp in source.keys() {
            let flush = KafkaEvent {
                source: EventSource::SelfManaged,
                bootstrap_servers: "memory".into(),
                partitions: vec![PartitionRecords {
                    tp: tp.clone(),
                    records: Vec::new(),
                }],
            };
            let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
            let (topology, store, options) = (
                Arc::clone(&topology),
                Arc::clone(&store),
                options_for(&source),
            );
            let handle = tokio::spawn(async move {
                output
                    .process(&topology, &flush, store.as_ref(), &options)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
            while !handle.is_finished() {
                tokio::task::yield_now().await;
                let mut log = broker.log();
                while !log.markers.is_empty() {
                    log.deliver_marker(0);
                }
                while !log.to_materialise.is_empty() {
                    log.materialise(0);
                }
            }
            if let Err(e) = handle.await.unwrap() {
                return (
                    vec![format!("the flush batch of {tp} failed: {e}")],
                    complete,
                    stats,
                );
            }
            let mut log = broker.log();
            while !log.markers.is_empty() {
                log.deliver_marker(0);
            }
            while !log.to_materialise.is_empty() {
                log.materialise(0);
            }
        }
    }
    let after = broker.log().committed_view("window-closes").len();
    stats.closes_by_a_later_batch = (after - before) as u64;
    stats.closes = after as u64;
    let closing_after = closing_emitted(&broker);
    stats.closing_by_a_later_batch = (closing_after - closing_before) as u64;
    stats.closing_closes = closing_after as u64;
    {
        let log = broker.log();
        let updates = log.committed_view("session-updates");
        stats.session_updates = updates.len() as u64;
        stats.session_tombstones = updates.iter().filter(|r| r.value.is_none()).count() as u64;
    }
    let mut violations = check(&broker, &source, store.as_ref(), complete).await;
    violations.extend(check_closes(&broker, &source, complete));
    violations.extend(check_closing_passes(&broker, &source, complete));
    violations.extend(check_session_updates(&broker, &source, store.as_ref(), complete).await);
    (violations, complete, stats)
}

/// The window closes a `read_committed` reader sees, against the source (the reference:
/// counts by brute force from the records, each at offset `o` at time `1,000 + o`, in its
/// window of 3 ms): each window at most once and with its final count; when the run
/// completed (and each partition ran one more batch), every window that closed, and no
/// window that cannot have closed. A window closes once every partition's stream time
/// (its highest record time, poison records left out) reaches the window's end; whether a
/// record the store rejects at write time counts towards it is the framework's choice, so
/// the windows ending between the two bounds may go either way.
fn check_closes(broker: &Broker, source: &Source, complete: bool) -> Vec<String> {
    let mut reference: BTreeMap<String, i64> = BTreeMap::new();
    let (mut surely, mut maybe) = (i64::MAX, i64::MAX);
    for records in source.values() {
        let (mut sure, mut may) = (i64::MIN, i64::MIN);
        for (o, (key, value)) in records.iter().enumerate() {
            let t = 1_000 + o as i64;
            if value == "poison" {
                continue;
            }
            *reference.entry(format!("{key}@{}", t - t % 3)).or_default() += 1;
            may = may.max(t);
            if *value != long_value() && value != "boom" {
                sure = sure.max(t);
            }
        }
        surely = surely.min(sure);
        maybe = maybe.min(may);
    }
    let mut violations = Vec::new();
    let mut seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for record in broker.log().committed_view("window-closes") {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        // The count's updates merged in (checked in `check_updates`).
        if key.starts_with("c:") {
            continue;
        }
        let value: i64 = std::str::from_utf8(record.value.as_deref().unwrap_or_default())
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(i64::MIN);
        if record.header(TRANSACTION_HEADER).is_some() {
            violations.push("window-closes: the internal transaction header reached Kafka".into());
        }
        seen.entry(key).or_default().push(value);
    }
    let end = |key: &str| -> i64 {
        key.rsplit_once('@')
            .and_then(|(_, s)| s.parse::<i64>().ok())
            .map_or(i64::MAX, |s| s + 3)
    };
    for (key, values) in &seen {
        if values.len() > 1 {
            violations.push(format!(
                "window-closes: window {key} emitted {} times: {values:?}",
                values.len()
            ));
        }
        let want = reference.get(key).copied().unwrap_or(0);
        if values.iter().any(|v| *v != want) {
            violations.push(format!(
                "window-closes: window {key} emitted with {values:?}, its count is {want}"
            ));
        }
        if end(key) > maybe {
            violations.push(format!(
                "window-closes: window {key} emitted, but it ends at {} after the lowest \
                 stream time {maybe}: an open window",
                end(key)
            ));
        }
    }
    if complete {
        for (key, want) in &reference {
            if end(key) <= surely && !seen.contains_key(key) {
                violations.push(format!(
                    "window-closes: window {key} (count {want}) closed (it ends by the lowest \
                     stream time {surely}) and was never emitted"
                ));
            }
        }
    }
    violations
}

/// How many sessions and sliding windows a `read_committed` reader sees.
fn closing_emitted(broker: &Broker) -> usize {
    let log = broker.log();
    log.committed_view("session-closes").len() + log.committed_view("sliding-closes").len()
}

/// Per key, the times of its records that reach the windowed stores (every record but a
/// poison one, each at offset `o` at time `1,000 + o`), sorted; and the bounds of the low
/// watermark at the end (see [`check_closes`]): below `surely` every partition has passed,
/// at or above `maybe` none has.
fn record_times(source: &Source) -> (BTreeMap<String, Vec<i64>>, i64, i64) {
    let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let (mut surely, mut maybe) = (i64::MAX, i64::MAX);
    for records in source.values() {
        let (mut sure, mut may) = (i64::MIN, i64::MIN);
        for (o, (key, value)) in records.iter().enumerate() {
            let t = 1_000 + o as i64;
            if value == "poison" {
                continue;
            }
            times.entry(key.clone()).or_default().push(t);
            may = may.max(t);
            if *value != long_value() && value != "boom" {
                sure = sure.max(t);
            }
        }
        surely = surely.min(sure);
        maybe = maybe.min(may);
    }
    for t in times.values_mut() {
        t.sort_unstable();
    }
    (times, surely, maybe)
}

/// The sessions and sliding windows a `read_committed` reader sees (each closed in a
/// closing pass, whose rewrite claims it), against the source by brute force, as Kafka
/// Streams defines them: a key's sessions are its records' times merged while the next is
/// within the gap of the session's end (`t - end <= gap`), closed once the low watermark
/// is past `end + gap`; a sliding window `[start, start + d]` holds the records in it, is
/// the left window `[t - d, t]` or the right window `[t + 1, t + 1 + d]` of a record, and
/// closes once the low watermark is past `start + d` (every left window does close then;
/// right windows exist only with a later record in them, which is the framework's to
/// decide, so only their counts are checked). Each at most once, with its final count;
/// when the run completed, every session and left window that closed; none still open.
fn check_closing_passes(broker: &Broker, source: &Source, complete: bool) -> Vec<String> {
    let (times, surely, maybe) = record_times(source);
    let mut sessions: BTreeMap<String, (i64, i64)> = BTreeMap::new(); // name -> (count, end)
    for (key, ts) in &times {
        let mut current: Option<(i64, i64, i64)> = None; // (start, end, count)
        for &t in ts {
            current = match current {
                Some((start, end, n)) if t - end <= SESSION_GAP => Some((start, t, n + 1)),
                other => {
                    if let Some((start, end, n)) = other {
                        sessions.insert(format!("{key}@{start}-{end}"), (n, end));
                    }
                    Some((t, t, 1))
                }
            };
        }
        if let Some((start, end, n)) = current {
            sessions.insert(format!("{key}@{start}-{end}"), (n, end));
        }
    }
    let d = SLIDING_DIFFERENCE;
    let count_in = |key: &str, start: i64| {
        times.get(key).map_or(0, |ts| {
            ts.iter().filter(|&&t| start <= t && t <= start + d).count() as i64
        })
    };
    let mut violations = Vec::new();
    let read = |topic: &str| -> BTreeMap<String, Vec<i64>> {
        let mut seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for record in broker.log().committed_view(topic) {
            let key =
                String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
            // The count's updates merged in (checked in `check_updates`).
            if key.starts_with("c:") {
                continue;
            }
            let value: i64 = std::str::from_utf8(record.value.as_deref().unwrap_or_default())
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(i64::MIN);
            seen.entry(key).or_default().push(value);
        }
        seen
    };
    let twice = |topic: &str, key: &str, values: &[i64], violations: &mut Vec<String>| {
        if values.len() > 1 {
            violations.push(format!(
                "{topic}: {key} emitted {} times: {values:?}",
                values.len()
            ));
        }
    };
    let seen = read("session-closes");
    for (name, values) in &seen {
        twice("session-closes", name, values, &mut violations);
        match sessions.get(name) {
            None => violations.push(format!(
                "session-closes: {name} emitted with {values:?}, not a session of the records"
            )),
            Some((n, end)) => {
                if values.iter().any(|v| v != n) {
                    violations.push(format!(
                        "session-closes: {name} emitted with {values:?}, its count is {n}"
                    ));
                }
                if end + SESSION_GAP >= maybe {
                    violations.push(format!(
                        "session-closes: {name} emitted, but the lowest stream time {maybe} \
                         is not past its end + gap: an open session"
                    ));
                }
            }
        }
    }
    if complete {
        for (name, (n, end)) in &sessions {
            if end + SESSION_GAP < surely && !seen.contains_key(name) {
                violations.push(format!(
                    "session-closes: {name} (count {n}) closed by the lowest stream time \
                     {surely} and was never emitted"
                ));
            }
        }
    }
    let seen = read("sliding-closes");
    for (name, values) in &seen {
        twice("sliding-closes", name, values, &mut violations);
        let (key, start) = name
            .rsplit_once('@')
            .map(|(k, s)| (k, s.parse::<i64>().unwrap_or(i64::MIN)))
            .unwrap_or((name.as_str(), i64::MIN));
        let ts = times.get(key).cloned().unwrap_or_default();
        if !ts.iter().any(|&t| t - d == start || t + 1 == start) {
            violations.push(format!(
                "sliding-closes: {name} is neither a left nor a right window of a record"
            ));
        }
        let n = count_in(key, start);
        if values.iter().any(|v| *v != n) {
            violations.push(format!(
                "sliding-closes: {name} emitted with {values:?}, it holds {n} records"
            ));
        }
        if start + d >= maybe {
            violations.push(format!(
                "sliding-closes: {name} emitted, but the lowest stream time {maybe} is not \
                 past its end: an open window"
            ));
        }
    }
    if complete {
        for (key, ts) in &times {
            for &t in ts {
                let name = format!("{key}@{}", t - d);
                if t < surely && !seen.contains_key(&name) {
                    violations.push(format!(
                        "sliding-closes: the left window {name} of the record at {t} closed by \
                         the lowest stream time {surely} and was never emitted"
                    ));
                }
            }
        }
    }
    violations
}

/// The sessions' updates on update a `read_committed` reader sees (`session-updates`:
/// `key@start-end` to a count, or a tombstone for a session merged away), against the
/// source by brute force (Kafka Streams' sessions: a key's record times merged while the
/// next is within the gap of the session's end; see [`SESSION_UPDATE_GAP`]): each
/// `(session, version)` at most once as a value and at most once as a tombstone (a record
/// within a session merges it into a new one of the same bounds: its tombstone, then the
/// new value, in one write); and when the run completed, per key every version of its item
/// from 1 to the last exactly once among its sessions' updates (every write applies a
/// record, so it changes a session), and per session the latest version (its value after
/// its tombstone, within one write) a live session exactly when the brute force has it,
/// with its count.
async fn check_session_updates(
    broker: &Broker,
    source: &Source,
    store: &dyn Store,
    complete: bool,
) -> Vec<String> {
    const TOPIC: &str = "session-updates";
    let (times, _, _) = record_times(source);
    let mut reference: BTreeMap<String, i64> = BTreeMap::new();
    for (key, ts) in &times {
        let mut current: Option<(i64, i64, i64)> = None;
        for &t in ts {
            current = match current {
                Some((start, end, n)) if t - end <= SESSION_UPDATE_GAP => Some((start, t, n + 1)),
                other => {
                    if let Some((start, end, n)) = other {
                        reference.insert(format!("{key}@{start}-{end}"), n);
                    }
                    Some((t, t, 1))
                }
            };
        }
        if let Some((start, end, n)) = current {
            reference.insert(format!("{key}@{start}-{end}"), n);
        }
    }
    let mut violations = Vec::new();
    // Per session: version -> (tombstones, values).
    let mut seen: BTreeMap<String, BTreeMap<u64, (usize, Vec<i64>)>> = BTreeMap::new();
    for record in broker.log().committed_view(TOPIC) {
        if record.header(TRANSACTION_HEADER).is_some() {
            violations.push(format!(
                "{TOPIC}: the internal transaction header reached Kafka"
            ));
        }
        let name = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        // The count's updates merged in (checked in `check_updates`).
        if name.starts_with("c:") {
            continue;
        }
        let version: u64 = std::str::from_utf8(record.header(VERSION_HEADER).unwrap_or_default())
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let entry = seen.entry(name).or_default().entry(version).or_default();
        match record.value.as_deref() {
            None => entry.0 += 1,
            Some(v) => entry.1.push(
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(i64::MIN),
            ),
        }
    }
    for (name, versions) in &seen {
        for (version, (tombstones, values)) in versions {
            if *tombstones > 1 || values.len() > 1 {
                violations.push(format!(
                    "{TOPIC}: ({name}, version {version}) seen {tombstones} times as a \
                     tombstone and {} times as a value {values:?}",
                    values.len()
                ));
            }
        }
    }
    if !complete {
        return violations;
    }
    let mut per_key: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for (name, versions) in &seen {
        let key = name.split_once('@').map_or(name.as_str(), |(k, _)| k);
        per_key.entry(key).or_default().extend(versions.keys());
    }
    for key in times.keys() {
        let last = store
            .get("session-counts", key.as_bytes())
            .await
            .unwrap()
            .map_or(0, |s| s.version);
        let got: Vec<u64> = per_key
            .get(key.as_str())
            .map(|v| v.iter().copied().collect())
            .unwrap_or_default();
        if got != (1..=last).collect::<Vec<u64>>() {
            violations.push(format!(
                "{TOPIC}: key {key} has versions {got:?} among its sessions' updates, \
                 expected 1..={last}"
            ));
        }
    }
    let live: BTreeMap<String, i64> = seen
        .iter()
        .filter_map(|(name, versions)| {
            let (_, (_, values)) = versions.iter().next_back()?;
            values.first().map(|v| (name.clone(), *v))
        })
        .collect();
    if live != reference {
        violations.push(format!(
            "{TOPIC}: the live sessions (latest versions) are {live:?}, the reference {reference:?}"
        ));
    }
    violations
}

/// What a `read_committed` reader sees, against the source (the reference): every output
/// of a source record at most once, and exactly once when the run completed.
async fn check(broker: &Broker, source: &Source, store: &dyn Store, complete: bool) -> Vec<String> {
    let views: Vec<(&str, Vec<OutputRecord>)> = {
        let log = broker.log();
        ["out", "by-value", "dlq"]
            .into_iter()
            .map(|topic| {
                (
                    topic,
                    log.committed_view(topic).into_iter().cloned().collect(),
                )
            })
            .collect()
    };
    let mut violations = Vec::new();
    violations.extend(check_updates(broker, source, store, complete).await);
    let mut counts: HashMap<(String, Vec<u8>), usize> = HashMap::new();
    for (topic, records) in &views {
        let topic = *topic;
        for record in records {
            if record.header(TRANSACTION_HEADER).is_some() {
                violations.push(format!(
                    "{topic}: the internal transaction header reached Kafka"
                ));
            }
            let mut id = record.header(SOURCE_HEADER).unwrap_or_default().to_vec();
            if topic == "out" {
                id.extend_from_slice(b"/");
                id.extend_from_slice(record.value.as_deref().unwrap_or_default());
            }
            if let Some(seq) = record.header(SEQUENCE_HEADER) {
                id.extend_from_slice(b"#");
                id.extend_from_slice(seq);
            }
            *counts.entry((topic.to_owned(), id)).or_default() += 1;
        }
    }
    let mut expected_counts: BTreeMap<&str, i64> = BTreeMap::new();
    for (tp, records) in source {
        for (o, (key, value)) in records.iter().enumerate() {
            let src = format!("{}:{}:{o}", tp.topic, tp.partition).into_bytes();
            let poison = value == "poison";
            let mut expect: Vec<((&str, Vec<u8>), usize)> = Vec::new();
            for suffix in ["/1", "/2"] {
                let mut id = src.clone();
                id.extend_from_slice(format!("/{value}{suffix}").as_bytes());
                expect.push((("out", id), usize::from(!poison)));
            }
            let mut rep = src.clone();
            rep.extend_from_slice(b"#0");
            expect.push((("by-value", rep), usize::from(!poison)));
            // Dead-lettered: poison in the user's function, or rejected at the state write.
            let dead = poison || *value == long_value() || value == "boom";
            expect.push((("dlq", src.clone()), usize::from(dead)));
            for ((topic, id), want) in expect {
                let got = counts.remove(&(topic.to_owned(), id.clone())).unwrap_or(0);
                if got > want || (complete && got != want) {
                    violations.push(format!(
                        "{topic}: output {:?} of {tp}@{o} seen {got} times by read_committed, \
                         expected {want}",
                        String::from_utf8_lossy(&id)
                    ));
                }
            }
            if !poison {
                *expected_counts.entry(key.as_str()).or_default() += 1;
            }
        }
    }
    for ((topic, id), n) in counts {
        violations.push(format!(
            "{topic}: unexpected output {:?} ({n} times)",
            String::from_utf8_lossy(&id)
        ));
    }
    if complete {
        for (key, want) in expected_counts {
            let got = store
                .get("counts", key.as_bytes())
                .await
                .unwrap()
                .map_or(0, |s| s.value);
            if got != want {
                violations.push(format!("state: count of {key} is {got}, expected {want}"));
            }
        }
    }
    violations
}

/// The aggregate updates a `read_committed` reader sees, against the source: per key of
/// each store, every version at most once, and when the run completed every version from 1
/// to the item's last exactly once, the values growing with the version (every write adds
/// a record: a count by one per record, a length sum by the value's length plus one) and
/// the last one the reference's (computed here from the source, record by record).
async fn check_updates(
    broker: &Broker,
    source: &Source,
    store: &dyn Store,
    complete: bool,
) -> Vec<String> {
    let mut reference: [BTreeMap<String, i64>; 7] = Default::default();
    for records in source.values() {
        for (o, (key, value)) in records.iter().enumerate() {
            if value == "poison" {
                continue;
            }
            *reference[0].entry(key.clone()).or_default() += 1;
            let start = (1_000 + o as i64) / 3 * 3;
            *reference[2].entry(format!("{key}@{start}")).or_default() += 1;
            if *value != long_value() && value != "boom" {
                *reference[1].entry(value.clone()).or_default() += value.len() as i64 + 1;
            }
        }
    }
    let merged = (reference[0].iter().map(|(k, v)| (format!("c:{k}"), *v)))
        .chain(reference[1].iter().map(|(k, v)| (format!("l:{k}"), *v)))
        .collect();
    reference[3] = merged;
    reference[4] = reference[0]
        .iter()
        .map(|(k, v)| (format!("c:{k}"), *v))
        .collect();
    reference[5] = reference[4].clone();
    reference[6] = reference[4].clone();
    let mut violations = Vec::new();
    for (n, (topic, store_name)) in [
        ("count-updates", "counts"),
        ("length-updates", "lengths"),
        ("window-updates", "per-window"),
        ("merged-updates", "merged"),
        // The count's updates among the sessions' (checked in `check_session_updates`),
        // the windows' closes (`check_closes`) and the sessions' (`check_closing_passes`).
        ("session-updates", "merged"),
        ("window-closes", "merged"),
        ("session-closes", "merged"),
    ]
    .into_iter()
    .enumerate()
    {
        let seen: Vec<OutputRecord> = broker
            .log()
            .committed_view(topic)
            .into_iter()
            .cloned()
            .collect();
        let mut per_key: BTreeMap<String, BTreeMap<u64, Vec<i64>>> = BTreeMap::new();
        for record in &seen {
            let key =
                String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
            // A topic of several stores' updates: the keys of the stores checked here.
            if store_name == "merged" && !(key.starts_with("c:") || key.starts_with("l:")) {
                continue;
            }
            let version: u64 =
                std::str::from_utf8(record.header(VERSION_HEADER).unwrap_or_default())
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            let value: i64 = std::str::from_utf8(record.value.as_deref().unwrap_or_default())
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(i64::MIN);
            per_key
                .entry(key)
                .or_default()
                .entry(version)
                .or_default()
                .push(value);
        }
        for (key, versions) in &per_key {
            for (version, values) in versions {
                if values.len() > 1 {
                    violations.push(format!(
                        "{topic}: ({key}, version {version}) seen {} times: {values:?}",
                        values.len()
                    ));
                }
            }
        }
        if !complete {
            continue;
        }
        for (key, want) in &reference[n] {
            let last = match key.split_once('@') {
                // A window's item: by key and window start.
                Some((k, start)) if store_name == "per-window" => {
                    let start: i64 = start.parse().unwrap();
                    store
                        .windows(store_name, k.as_bytes(), start, start)
                        .await
                        .unwrap()
                        .first()
                        .map_or(0, |(_, s)| s.version)
                }
                // The merged sink: the store by the key's prefix.
                _ if store_name == "merged" => {
                    let (store_name, k) = match key.split_at(2) {
                        ("c:", k) => ("counts", k),
                        (_, k) => ("lengths", k),
                    };
                    store
                        .get(store_name, k.as_bytes())
                        .await
                        .unwrap()
                        .map_or(0, |s| s.version)
                }
                _ => store
                    .get(store_name, key.as_bytes())
                    .await
                    .unwrap()
                    .map_or(0, |s| s.version),
            };
            let versions = per_key.get(key).cloned().unwrap_or_default();
            let got: Vec<u64> = versions.keys().copied().collect();
            if got != (1..=last).collect::<Vec<u64>>() {
                violations.push(format!(
                    "{topic}: key {key} has versions {got:?}, expected 1..={last}"
                ));
                continue;
            }
            let values: Vec<i64> = versions.values().map(|v| v[0]).collect();
            if values.windows(2).any(|w| w[1] <= w[0]) || values.last() != Some(want) {
                violations.push(format!(
                    "{topic}: key {key} has values {values:?} by version, expected growing \
                     to {want}"
                ));
            }
        }
    }
    violations
}

fn run_schedules(seeds: std::ops::Range<u64>) -> (Option<(u64, Vec<String>)>, u64, Stats) {
    run_schedules_with(seeds, Control::None)
}

fn run_schedules_with(
    seeds: std::ops::Range<u64>,
    control: Control,
) -> (Option<(u64, Vec<String>)>, u64, Stats) {
    run_seeds(seeds, |seed| schedule(seed, control))
}

/// Runs `run` for each seed (one thread): the first seed with violations and them, the
/// schedules that hit the step cap, the summed statistics.
fn run_seeds<F: std::future::Future<Output = (Vec<String>, bool, Stats)>>(
    seeds: std::ops::Range<u64>,
    run: impl Fn(u64) -> F,
) -> (Option<(u64, Vec<String>)>, u64, Stats) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut total = Stats::default();
    let mut incomplete = 0;
    for seed in seeds {
        let (violations, complete, stats) = rt.block_on(run(seed));
        total.add(&stats);
        incomplete += u64::from(!complete);
        if !violations.is_empty() {
            return (Some((seed, violations)), incomplete, total);
        }
    }
    (None, incomplete, total)
}

#[test]
fn every_output_is_seen_exactly_once_by_read_committed_under_the_fault_model() {
    let schedules: u64 = std::env::var("EOS_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let (failed, incomplete, stats) = run_schedules(0..schedules);
    eprintln!("{schedules} schedules, {incomplete} incomplete (step cap): {stats:?}");
    if let Some((seed, violations)) = failed {
        panic!("seed {seed}: {violations:#?}");
    }
    // The faults were exercised.
    assert!(
        stats.crashes > 0 && stats.zombies > 0 && stats.fenced > 0,
        "{stats:?}"
    );
    assert!(
        stats.multi_partition > 0 && stats.shifted_retries > 0,
        "{stats:?}"
    );
    assert!(stats.reused_envs > 0 && stats.txn_timeouts > 0, "{stats:?}");
    assert!(stats.closes > schedules, "{stats:?}");
    assert!(stats.closing_closes > schedules, "{stats:?}");
    // Sessions merged: their tombstones were seen.
    assert!(
        stats.session_updates > schedules && stats.session_tombstones > 0,
        "{stats:?}"
    );
    assert!(
        incomplete * 10 < schedules,
        "{incomplete} of {schedules} schedules did not complete"
    );
}

// ------------------------------------------------------------------ a left/outer join's closing pass

/// The outer join's window (ms): records of `left` and `right` with the same key join when
/// their timestamps differ by at most this; no grace.
const OUTER_WINDOW: i64 = 1;

/// An outer stream–stream join of `left` and `right` (window [`OUTER_WINDOW`], no grace)
/// to `joined`: each pair once (emitted by the later record's arrival, in its transaction),
/// each record that joined nothing once, alone (emitted by the closing pass, claimed by its
/// rewrite of the key's item, or by a later arrival of its key), with the records' values
/// (`<topic><partition>.<offset>`) as `<left>+<right>`, `none` for a missing side.
fn outer_join_topology() -> Topology {
    use lambda_streams::dsl::JoinWindows;
    let builder = StreamsBuilder::new();
    builder.output_guarantee(lambda_streams::OutputGuarantee::ExactlyOnce);
    let left = builder.stream("left", Utf8, Utf8);
    let right = builder.stream("right", Utf8, Utf8);
    // Merged with a count of `left`'s keys (keys `c:<key>`), which its outbox covers.
    let counts = left
        .group_by_key(Utf8)
        .count("left-counts")
        .to_stream()
        .map(|k, n| (format!("c:{k}"), n.to_string()));
    left.outer_join_stream(
        &right,
        JoinWindows::of(std::time::Duration::from_millis(OUTER_WINDOW as u64)),
        "outer-pairs",
        (Utf8, Utf8, Utf8),
        |_, l: Option<&String>, r: Option<&String>| {
            format!(
                "{}+{}",
                l.map_or("none", |l| l.as_str()),
                r.map_or("none", |r| r.as_str())
            )
        },
    )
    .merge(&counts)
    .to("joined", Utf8, Utf8);
    builder.try_build().unwrap()
}

/// Per partition of `left` and `right` (1 or 2 each), 4 to 8 records of key `a`, `b` or
/// `c`, each at offset `o` at time `1,000 + o`, valued by its coordinates.
fn outer_source(rng: &mut StdRng) -> Source {
    let mut source = Source::new();
    for topic in ["left", "right"] {
        for p in 0..rng.random_range(1..=2) {
            let n = rng.random_range(4..=8);
            let records = (0..n)
                .map(|o| {
                    let key = ["a", "b", "c"][rng.random_range(0..3)].to_owned();
                    (key, format!("{topic}{p}.{o}"))
                })
                .collect();
            source.insert(TopicPartition::new(topic, p), records);
        }
    }
    source
}

/// The outer join's results by brute force, as Kafka Streams defines them (no record is
/// later than the grace here: each partition's timestamps increase, and the join closes on
/// the lowest stream time): every pair of a left and a right record of one key whose
/// timestamps differ by at most the window, and every record with no such partner, alone,
/// with its timestamp (it is emitted once the closing time passes its timestamp + window).
fn outer_reference(source: &Source) -> (BTreeSet<String>, BTreeMap<String, i64>) {
    let records = |topic: &str| -> Vec<(String, String, i64)> {
        source
            .iter()
            .filter(|(tp, _)| tp.topic == topic)
            .flat_map(|(_, rs)| {
                rs.iter()
                    .enumerate()
                    .map(|(o, (k, v))| (k.clone(), v.clone(), 1_000 + o as i64))
            })
            .collect()
    };
    let (left, right) = (records("left"), records("right"));
    let joins = |a: &(String, String, i64), b: &(String, String, i64)| {
        a.0 == b.0 && (a.2 - b.2).abs() <= OUTER_WINDOW
    };
    let mut pairs = BTreeSet::new();
    let mut alone = BTreeMap::new();
    for l in &left {
        for r in right.iter().filter(|r| joins(l, r)) {
            pairs.insert(format!("{}+{}", l.1, r.1));
        }
        if !right.iter().any(|r| joins(l, r)) {
            alone.insert(format!("{}+none", l.1), l.2);
        }
    }
    for r in &right {
        if !left.iter().any(|l| joins(l, r)) {
            alone.insert(format!("none+{}", r.1), r.2);
        }
    }
    (pairs, alone)
}

/// What a `read_committed` reader of `joined` sees, against [`outer_reference`]: each
/// output at most once and no output that is not a result; when the run completed (and
/// each partition ran one more batch), every pair and every record alone whose window the
/// lowest stream time has passed, and no record alone whose window it has not.
fn check_outer_join(broker: &Broker, source: &Source, complete: bool) -> (Vec<String>, u64) {
    let (pairs, alone) = outer_reference(source);
    let low = source
        .values()
        .map(|rs| 1_000 + rs.len() as i64 - 1)
        .min()
        .unwrap_or(i64::MIN);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    // The count's updates merged in: per key, version -> counts.
    let mut counts: BTreeMap<String, BTreeMap<u64, Vec<i64>>> = BTreeMap::new();
    for record in broker.log().committed_view("joined") {
        if record.header(TRANSACTION_HEADER).is_some() {
            violations.push("joined: the internal transaction header reached Kafka".into());
        }
        let value = String::from_utf8_lossy(record.value.as_deref().unwrap_or_default());
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default());
        if let Some(key) = key.strip_prefix("c:") {
            let version: u64 =
                std::str::from_utf8(record.header(VERSION_HEADER).unwrap_or_default())
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            let versions = counts.entry(key.to_owned()).or_default();
            versions
                .entry(version)
                .or_default()
                .push(value.parse().unwrap_or(i64::MIN));
            continue;
        }
        *seen.entry(value.into_owned()).or_default() += 1;
    }
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for (tp, records) in source {
        if tp.topic == "left" {
            for (key, _) in records {
                *want.entry(key.clone()).or_default() += 1;
            }
        }
    }
    for (key, versions) in &counts {
        let values: Vec<i64> = versions.values().flatten().copied().collect();
        let growing = values.windows(2).all(|w| w[0] < w[1]);
        if versions.values().any(|v| v.len() > 1) || !growing {
            violations.push(format!("joined: c:{key} by version {versions:?}"));
        }
        if complete && values.last() != want.get(key) {
            violations.push(format!(
                "joined: c:{key} ends at {:?}, expected {:?}",
                values.last(),
                want.get(key)
            ));
        }
    }
    if complete && counts.len() != want.len() {
        violations.push(format!(
            "joined: counts of {:?}, expected of {:?}",
            counts.keys(),
            want.keys()
        ));
    }
    for (value, n) in &seen {
        if *n > 1 {
            violations.push(format!("joined: {value} seen {n} times"));
        }
        match alone.get(value) {
            Some(ts) if ts + OUTER_WINDOW >= low => violations.push(format!(
                "joined: {value} emitted alone, but the lowest stream time {low} has not \
                 passed its window"
            )),
            Some(_) => {}
            None if !pairs.contains(value) => {
                violations.push(format!("joined: {value} is not a result of the join"))
            }
            None => {}
        }
    }
    if complete {
        for pair in &pairs {
            if !seen.contains_key(pair) {
                violations.push(format!("joined: the pair {pair} was never emitted"));
            }
        }
        for (value, ts) in &alone {
            if ts + OUTER_WINDOW < low && !seen.contains_key(value) {
                violations.push(format!(
                    "joined: {value} (closed by the lowest stream time {low}) was never \
                     emitted"
                ));
            }
        }
    }
    let closed = alone.values().filter(|ts| *ts + OUTER_WINDOW < low).count();
    (violations, closed as u64)
}

/// Completes every transaction the broker has pending (markers, then offsets).
fn settle(broker: &Broker) {
    let mut log = broker.log();
    while !log.markers.is_empty() {
        log.deliver_marker(0);
    }
    while !log.to_materialise.is_empty() {
        log.materialise(0);
    }
}

/// One schedule of [`outer_join_topology`] under the fault model, then one more batch per
/// partition (for claims a fenced zombie made after its partition's last batch).
async fn outer_join_schedule(seed: u64, control: Control) -> (Vec<String>, bool, Stats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let source = outer_source(&mut rng);
    let topology = Arc::new(outer_join_topology());
    let store: Arc<dyn Store> = match control {
        Control::None => Arc::new(MemoryStore::new()),
        control => Arc::new(Weakened(MemoryStore::new(), control)),
    };
    let broker = Broker::default();
    let mut stats = Stats::default();
    let mut declared = BTreeMap::new();
    for tp in source.keys() {
        *declared.entry(tp.topic.clone()).or_insert(0) += 1;
    }
    let options = BatchOptions {
        source_partitions: declared,
        ..options()
    };
    let faults = FaultySource {
        topology: &topology,
        store: &store,
        broker: &broker,
        start: source.keys().map(|tp| (tp.clone(), 0)).collect(),
        ends: source
            .iter()
            .map(|(tp, r)| (tp.clone(), r.len() as i64))
            .collect(),
        event: &|batch| {
            event_of(batch, |tp, o| {
                let (k, v) = &source[tp][o as usize];
                (k.clone(), v.clone(), 1_000 + o)
            })
        },
        options: options.clone(),
    };
    let complete = faults.run(&mut rng, &mut stats).await;
    let before = broker.log().committed_view("joined").len();
    if complete {
        for tp in source.keys() {
            let flush = KafkaEvent {
                source: EventSource::SelfManaged,
                bootstrap_servers: "memory".into(),
                partitions: vec![PartitionRecords {
                    tp: tp.clone(),
                    records: Vec::new(),
                }],
            };
            let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
            let (topology, store, options) =
                (Arc::clone(&topology), Arc::clone(&store), options.clone());
            let handle = tokio::spawn(async move {
                output
                    .process(&topology, &flush, store.as_ref(), &options)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
            while !handle.is_finished() {
                tokio::task::yield_now().await;
                settle(&broker);
            }
            if let Err(e) = handle.await.unwrap() {
                return (
                    vec![format!("the flush batch of {tp} failed: {e}")],
                    complete,
                    stats,
                );
            }
            settle(&broker);
        }
    }
    let after = broker.log().committed_view("joined").len();
    stats.closing_by_a_later_batch = (after - before) as u64;
    let (violations, closed) = check_outer_join(&broker, &source, complete);
    stats.closing_closes = closed;
    (violations, complete, stats)
}

/// A left or outer stream–stream join's closing pass under exactly-once output: the records
/// of `left` and `right` that joined nothing leave the key's item alone, in the closing
/// pass (whose rewrite of the item claims them for the batch's first event partition) or
/// with a later arrival of their key (kept in the item with that record, in its
/// transaction), and the pairs with the later record's arrival. Under the fault model
/// (zombies, crashes at any await point, shifted retries, warm producers, coordinator
/// timeouts, several partitions of both topics), a `read_committed` reader sees each pair
/// and each record alone exactly once, against the brute-force outer join.
#[test]
fn an_outer_join_s_closing_pass_is_seen_exactly_once_under_the_fault_model() {
    let schedules: u64 = std::env::var("EOS_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let (failed, incomplete, stats) = run_seeds(0..schedules, |seed| {
        outer_join_schedule(seed, Control::None)
    });
    eprintln!("{schedules} schedules, {incomplete} incomplete (step cap): {stats:?}");
    if let Some((seed, violations)) = failed {
        panic!("seed {seed}: {violations:#?}");
    }
    assert!(
        stats.crashes > 0 && stats.zombies > 0 && stats.fenced > 0,
        "{stats:?}"
    );
    assert!(
        stats.multi_partition > 0 && stats.shifted_retries > 0,
        "{stats:?}"
    );
    // Records alone were closed (by the pass or by a later arrival) in most schedules.
    assert!(stats.closing_closes > schedules, "{stats:?}");
    assert!(
        incomplete * 10 < schedules,
        "{incomplete} of {schedules} schedules did not complete"
    );
}

/// The control of the join's closing pass: with its rewrite not claiming (the records
/// removed from the item by a plain rewrite, as at least once), a batch whose transaction
/// aborts after the rewrite (a crash, a fenced zombie) has removed them for good: a
/// `read_committed` reader misses a record that joined nothing, so
/// [`an_outer_join_s_closing_pass_is_seen_exactly_once_under_the_fault_model`] can fail.
#[test]
fn an_outer_join_s_closing_pass_without_claims_loses_records() {
    let (failed, _, _) = run_seeds(0..400, |seed| {
        outer_join_schedule(seed, Control::NoClosingClaims)
    });
    let (seed, violations) = failed.expect("no schedule lost a record alone");
    eprintln!("seed {seed}: {violations:#?}");
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("joined: ") && v.contains("never emitted")),
        "{violations:#?}"
    );
}

// ------------------------------------------------------------------ switching from at-least-once

/// The window size and grace of the switch's count, ms.
const SWITCH_SIZE: i64 = 10;
const SWITCH_GRACE: i64 = 5;

/// A tumbling count per key (windows of 10 ms, grace 5 ms), emitted on update, and the same
/// count emitted on close (to `switch-closes`).
fn switch_topology() -> Topology {
    let builder = StreamsBuilder::new();
    let windows = || {
        lambda_streams::dsl::TimeWindows::of_size(std::time::Duration::from_millis(
            SWITCH_SIZE as u64,
        ))
        .grace(std::time::Duration::from_millis(SWITCH_GRACE as u64))
    };
    let grouped = builder.stream("in", Utf8, Utf8).group_by_key(Utf8);
    grouped
        .windowed_by(windows())
        .count("switch")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("switch-updates", Utf8, DecimalI64);
    grouped
        .windowed_by(windows())
        .emit_strategy(lambda_streams::dsl::EmitStrategy::OnWindowClose)
        .count("switch-close")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("switch-closes", Utf8, DecimalI64);
    builder.build()
}

/// The options of the switch schedules: the partitions of `in` declared, so that windows
/// close on their low watermark.
fn switch_options(source: &SwitchSource) -> BatchOptions {
    BatchOptions {
        source_partitions: BTreeMap::from([("in".to_owned(), source.len() as i32)]),
        ..BatchOptions::default()
    }
}

/// The closed windows a `read_committed` reader of `switch-closes` sees: each at most once
/// (one closed at least once before the switch is not emitted again), with the
/// reference's count.
fn check_switch_closes(broker: &Broker, reference: &BTreeMap<String, i64>) -> Vec<String> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in broker.log().committed_view("switch-closes") {
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
        seen.entry(key).or_default().push(value);
    }
    let mut violations = Vec::new();
    for (window, values) in seen {
        let want = reference.get(&window).map(i64::to_string);
        if values.len() > 1 || want.as_ref() != values.first() {
            violations.push(format!(
                "switch-closes: {window} closed as {values:?}, expected once as {want:?}"
            ));
        }
    }
    violations
}

/// Per partition, `(key, timestamp)` records: time goes forward 0 to 4 ms a record, and one
/// record in four goes back 5 to 30 ms (late when its window has closed); and the offset at
/// which the function switches from at-least-once to exactly-once output (records before it
/// ran at least once).
type SwitchSource = BTreeMap<TopicPartition, (Vec<(String, i64)>, i64)>;

fn switch_source(rng: &mut StdRng) -> SwitchSource {
    (0..rng.random_range(2..=3))
        .map(|p| {
            let n = rng.random_range(4..=14);
            let mut t = 1_000;
            let records = (0..n)
                .map(|_| {
                    let key = ["a", "b"][rng.random_range(0..2)].to_owned();
                    t += rng.random_range(0..=4);
                    let time = if rng.random_bool(0.25) {
                        t - rng.random_range(5..=30)
                    } else {
                        t
                    };
                    (key, time)
                })
                .collect();
            let switch = rng.random_range(1..n);
            (TopicPartition::new("in", p), (records, switch))
        })
        .collect()
}

fn switch_event(source: &SwitchSource, batch: &Batch) -> KafkaEvent {
    event_of(batch, |tp, o| {
        let (k, t) = &source[tp].0[o as usize];
        (k.clone(), k.clone(), *t)
    })
}

/// The reference, as Kafka Streams decides lateness: per partition in offset order, a
/// record is late when its window's end + grace is at or before the highest timestamp read
/// so far in the partition (its own included). The count per window (`<key>@<start>`).
fn switch_reference(source: &SwitchSource) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for (records, _) in source.values() {
        let mut stream_time = i64::MIN;
        for (key, t) in records {
            stream_time = stream_time.max(*t);
            let start = t - t.rem_euclid(SWITCH_SIZE);
            if start + SWITCH_SIZE + SWITCH_GRACE > stream_time {
                *counts.entry(format!("{key}@{start}")).or_default() += 1;
            }
        }
    }
    counts
}

/// Runs each partition from `position` to its switch offset at least once: fault-free
/// batches of 1 to 3 records, the partitions interleaved at random, outputs to `sink`.
async fn at_least_once_until_the_switch(
    topology: &Topology,
    store: &Arc<dyn Store>,
    source: &SwitchSource,
    position: &mut BTreeMap<TopicPartition, i64>,
    sink: &lambda_streams::sink::MemorySink,
    rng: &mut StdRng,
) {
    loop {
        let pending: Vec<&TopicPartition> = source
            .iter()
            .filter(|(tp, (_, switch))| position[*tp] < *switch)
            .map(|(tp, _)| tp)
            .collect();
        let Some(&tp) = pending.get(rng.random_range(0..pending.len().max(1))) else {
            break;
        };
        let a = position[tp];
        let b = (a + rng.random_range(0..=2)).min(source[tp].1 - 1);
        let event = switch_event(source, &BTreeMap::from([(tp.clone(), (a, b))]));
        topology
            .process_with(&event, store.as_ref(), sink, &switch_options(source))
            .await
            .unwrap();
        position.insert(tp.clone(), b + 1);
    }
}

/// One switch: the records before each partition's switch offset run at least once
/// (fault-free batches of 1 to 3 records, the partitions interleaved at random), the rest
/// exactly once under the fault model, from the same store, with nothing in the shadow
/// group. Then every window's state and the updates a `read_committed` reader sees must
/// match the reference: versions after the at-least-once ones, each once and complete,
/// the last one the reference's count.
async fn switch_schedule(seed: u64) -> (Vec<String>, bool, Stats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let source = switch_source(&mut rng);
    let topology = Arc::new(switch_topology());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let before = lambda_streams::sink::MemorySink::new();
    let mut position: BTreeMap<TopicPartition, i64> =
        source.keys().map(|tp| (tp.clone(), 0)).collect();
    at_least_once_until_the_switch(&topology, &store, &source, &mut position, &before, &mut rng)
        .await;
    let broker = Broker::default();
    let mut stats = Stats::default();
    let complete = FaultySource {
        topology: &topology,
        store: &store,
        broker: &broker,
        start: position,
        ends: source
            .iter()
            .map(|(tp, (r, _))| (tp.clone(), r.len() as i64))
            .collect(),
        event: &|batch| switch_event(&source, batch),
        options: switch_options(&source),
    }
    .run(&mut rng, &mut stats)
    .await;
    if !complete {
        return (Vec::new(), false, stats);
    }
    let version_of = |r: &OutputRecord| -> u64 {
        std::str::from_utf8(r.header(VERSION_HEADER).unwrap_or_default())
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let text = |b: &Option<Vec<u8>>| {
        String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned()
    };
    let mut at_switch: BTreeMap<String, u64> = BTreeMap::new();
    if std::env::var("SWITCH_TRACE").is_ok() {
        eprintln!("source {source:?}");
    }
    for r in before.records() {
        if std::env::var("SWITCH_TRACE").is_ok() {
            eprintln!(
                "alo {:?} {:?} {:?}",
                text(&r.key),
                text(&r.value),
                r.headers
            );
        }
        let v = at_switch.entry(text(&r.key)).or_default();
        *v = (*v).max(version_of(&r));
    }
    let mut after: BTreeMap<String, BTreeMap<u64, Vec<String>>> = BTreeMap::new();
    for r in broker.log().committed_view("switch-updates") {
        if std::env::var("SWITCH_TRACE").is_ok() {
            eprintln!(
                "committed {:?} {:?} {:?}",
                text(&r.key),
                text(&r.value),
                r.headers
            );
        }
        after
            .entry(text(&r.key))
            .or_default()
            .entry(version_of(r))
            .or_default()
            .push(text(&r.value));
    }
    let mut state = BTreeMap::new();
    for key in ["a", "b"] {
        for (start, item) in store
            .windows("switch", key.as_bytes(), 0, 10_000)
            .await
            .unwrap()
        {
            state.insert(format!("{key}@{start}"), item);
        }
    }
    let reference = switch_reference(&source);
    let mut violations = Vec::new();
    let windows: BTreeSet<&String> = state.keys().chain(reference.keys()).collect();
    for window in windows {
        let want = reference.get(window).copied().unwrap_or(0);
        let (value, version) = state.get(window).map_or((0, 0), |i| (i.value, i.version));
        if value != want {
            violations.push(format!("state of {window}: {value}, expected {want}"));
        }
        let first = at_switch.get(window).copied().unwrap_or(0) + 1;
        let seen = after.remove(window).unwrap_or_default();
        let versions: Vec<u64> = seen.keys().copied().collect();
        if versions != (first..=version).collect::<Vec<u64>>() {
            violations.push(format!(
                "{window}: versions {versions:?} read_committed after the switch, expected \
                 {first}..={version}"
            ));
        }
        if let Some((v, values)) = seen.iter().find(|(_, values)| values.len() > 1) {
            violations.push(format!("{window}: version {v} seen {values:?}"));
        }
        let last = seen.values().last().map(|v| v[0].clone());
        if version >= first && last != Some(want.to_string()) {
            violations.push(format!("{window}: last update {last:?}, expected {want}"));
        }
    }
    violations.extend(
        after
            .keys()
            .map(|w| format!("{w}: updates of a window with no state")),
    );
    violations.extend(check_switch_closes(&broker, &reference));
    (violations, true, stats)
}

/// A deployed windowed count switched from at-least-once to exactly-once output, with
/// nothing in the shadow group: a partition's first batches under exactly-once output must
/// decide lateness on the stream time the at-least-once batches reached (a record for a
/// window closed before the switch stays out), and do so in every attempt, aborted first
/// attempts and zombies included (an attempt's advance of the store's persisted time must
/// not make a retry drop records whose updates it must produce again).
/// A switch back: each partition's records before a first offset run exactly once under
/// the fault model, then at least once up to its switch offset (fault-free batches of 1 to
/// 3 records, as [`switch_schedule`]), then exactly once again from the same store and
/// shadow group, whose progress and stream time stop where the first exactly-once run left
/// them. The windows the at-least-once batches closed must stay closed: every window's
/// state the reference's, and no `(window, version)` twice for a `read_committed` reader.
async fn switch_back_schedule(seed: u64) -> (Vec<String>, bool, Stats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let source = switch_source(&mut rng);
    let back: BTreeMap<TopicPartition, i64> = source
        .iter()
        .map(|(tp, (_, switch))| (tp.clone(), rng.random_range(0..=*switch)))
        .collect();
    let topology = Arc::new(switch_topology());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let broker = Broker::default();
    let mut stats = Stats::default();
    let event = |batch: &Batch| switch_event(&source, batch);
    let exactly_once = |start: BTreeMap<TopicPartition, i64>, ends| FaultySource {
        topology: &topology,
        store: &store,
        broker: &broker,
        start,
        ends,
        event: &event,
        options: switch_options(&source),
    };
    let zeros = source.keys().map(|tp| (tp.clone(), 0)).collect();
    if !exactly_once(zeros, back.clone())
        .run(&mut rng, &mut stats)
        .await
    {
        return (Vec::new(), false, stats);
    }
    let sink = lambda_streams::sink::MemorySink::new();
    let mut position = back;
    at_least_once_until_the_switch(&topology, &store, &source, &mut position, &sink, &mut rng)
        .await;
    let ends = source
        .iter()
        .map(|(tp, (r, _))| (tp.clone(), r.len() as i64))
        .collect();
    if !exactly_once(position, ends).run(&mut rng, &mut stats).await {
        return (Vec::new(), false, stats);
    }
    let mut violations = Vec::new();
    let reference = switch_reference(&source);
    let mut state = BTreeMap::new();
    for key in ["a", "b"] {
        for (start, item) in store
            .windows("switch", key.as_bytes(), 0, 10_000)
            .await
            .unwrap()
        {
            state.insert(format!("{key}@{start}"), item.value);
        }
    }
    let windows: BTreeSet<&String> = state.keys().chain(reference.keys()).collect();
    for window in windows {
        let (got, want) = (state.get(window), reference.get(window));
        if got.copied().unwrap_or(0) != want.copied().unwrap_or(0) {
            violations.push(format!("state of {window}: {got:?}, expected {want:?}"));
        }
    }
    let mut seen = BTreeSet::new();
    for r in broker.log().committed_view("switch-updates") {
        let version = r.header(VERSION_HEADER).unwrap_or_default().to_vec();
        if !seen.insert((r.key.clone(), version.clone())) {
            violations.push(format!(
                "{:?} version {:?} read twice",
                r.key.as_deref().map(String::from_utf8_lossy),
                String::from_utf8_lossy(&version)
            ));
        }
    }
    violations.extend(check_switch_closes(&broker, &reference));
    (violations, true, stats)
}

/// A windowed topology under exactly-once output reading a partition whose batches start
/// past its committed progress without at-least-once batches in between (a transactional
/// source: each transaction's marker takes an offset, so the next batch starts one past the
/// committed `last + 1`) is seeded once, by its first batch: the seed of a switch back
/// needs at-least-once batches to have read the partition past its progress
/// (`Clock::at_least_once`), which exactly-once batches never record. (The first fix of the
/// switch back, re-seeding whenever a batch started past the committed progress, committed
/// a seed transaction before every batch here.) Then the same partition read at least once
/// for two batches and exactly once again: seeded once more, and no more after.
#[test]
fn a_partition_is_seeded_once_per_switch_not_after_every_transaction_marker() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::completing();
    let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
    let store = MemoryStore::new();
    let topology = switch_topology();
    let tp = TopicPartition::new("in", 0);
    let options = BatchOptions {
        source_partitions: BTreeMap::from([("in".to_owned(), 1)]),
        ..BatchOptions::default()
    };
    // Offsets 3a..3a+1 hold records, 3a+2 a marker.
    let batch = |a: i64| {
        event_of(
            &BTreeMap::from([(tp.clone(), (3 * a, 3 * a + 1))]),
            |_, o| ("k".to_owned(), "k".to_owned(), 1_000 + o),
        )
    };
    let mut seeds = Vec::new();
    for a in 0..4 {
        let (_, report) = rt
            .block_on(output.process(&topology, &batch(a), &store, &options))
            .expect("a batch");
        seeds.push(report.seeded);
        settle(&broker);
    }
    assert_eq!(seeds, [1, 0, 0, 0], "seeded per batch, exactly once");
    // At least once for two batches, then exactly once again.
    let sink = lambda_streams::sink::MemorySink::new();
    for a in 4..6 {
        rt.block_on(topology.process_with(&batch(a), &store, &sink, &options))
            .expect("an at-least-once batch");
    }
    for a in 6..9 {
        let (_, report) = rt
            .block_on(output.process(&topology, &batch(a), &store, &options))
            .expect("a batch");
        seeds.push(report.seeded);
        settle(&broker);
    }
    assert_eq!(
        seeds,
        [1, 0, 0, 0, 1, 0, 0],
        "seeded again once after the at-least-once batches"
    );
}

/// Exactly once, at least once, exactly once again, under the fault model: the windows
/// closed before the second switch stay closed (each partition is seeded again from the
/// persisted time when at-least-once batches read it past its committed progress). Before
/// the seed of a switch back, seed 2 applied a late record.
#[test]
fn a_switch_back_to_exactly_once_keeps_closed_windows_closed() {
    let schedules: u64 = std::env::var("EOS_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let (failed, incomplete, total) = run_seeds(0..schedules, switch_back_schedule);
    if let Some((seed, violations)) = failed {
        panic!("seed {seed}: {violations:#?}");
    }
    eprintln!("{schedules} switches back, {incomplete} incomplete (step cap): {total:?}");
    assert!(total.crashes > 0 && total.fenced > 0, "{total:?}");
    assert!(
        incomplete * 10 < schedules,
        "{incomplete} of {schedules} incomplete"
    );
}

#[test]
fn a_switch_from_at_least_once_keeps_closed_windows_closed() {
    let schedules: u64 = std::env::var("EOS_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let (failed, incomplete, total) = run_seeds(0..schedules, switch_schedule);
    if let Some((seed, violations)) = failed {
        panic!("seed {seed}: {violations:#?}");
    }
    eprintln!("{schedules} switches, {incomplete} incomplete (step cap): {total:?}");
    assert!(
        total.crashes > 0 && total.zombies > 0 && total.fenced > 0 && total.shifted_retries > 0,
        "{total:?}"
    );
    assert!(
        incomplete * 10 < schedules,
        "{incomplete} of {schedules} incomplete"
    );
}

/// An inner stream–stream join's pairs are accepted under exactly-once output: which
/// records a record joins is decided in the join item's conditional write, and the pairs are
/// kept in the item with the record that emits them, so a retry emits the same pairs in that
/// record's transaction (`eos_generative.rs` runs the joins' families under faults; before
/// the join kept both sides in one item, it found pairs produced in two transactions).
#[test]
fn a_stream_stream_join_s_pairs_are_accepted_under_exactly_once_output() {
    use lambda_streams::dsl::JoinWindows;
    let builder = StreamsBuilder::new();
    builder.output_guarantee(lambda_streams::OutputGuarantee::ExactlyOnce);
    let left = builder.stream("left", Utf8, Utf8);
    let right = builder.stream("right", Utf8, Utf8);
    left.join_stream(
        &right,
        JoinWindows::of(std::time::Duration::from_secs(10)),
        "pairs",
        (Utf8, Utf8, Utf8),
        |_, l: &String, r: &String| format!("{l}+{r}"),
    )
    .to("joined", Utf8, Utf8);
    if let Err(refused) = builder.try_build() {
        panic!("refused: {refused}");
    }
}

/// With partial batch responses, a partition stopped by a poison record at offset `f`
/// commits its progress at `f` (not past the batch): its outputs before `f` are committed
/// once, a redelivery of the whole batch produces none of them again, and the shadow group
/// holds `f`, from where the event source delivers the partition again.
#[test]
fn a_partial_batch_response_commits_the_progress_up_to_the_failed_record() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::completing();
    let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
    let store = MemoryStore::new();
    let topology = topology();
    let tp = TopicPartition::new("in", 0);
    let mut source = Source::new();
    source.insert(
        tp.clone(),
        ["x", "y", "poison", "x"]
            .iter()
            .map(|v| ("k".to_owned(), (*v).to_owned()))
            .collect(),
    );
    let options = BatchOptions {
        poison: PoisonPolicy::Fail,
        partial_batch_response: true,
        ..BatchOptions::default()
    };
    let whole = event(&source, &BTreeMap::from([(tp.clone(), (0, 3))]));
    for _ in 0..2 {
        let (outcome, _) = rt
            .block_on(output.process(&topology, &whole, &store, &options))
            .expect("the batch answers a partial response");
        assert_eq!(outcome.failures, [(tp.clone(), 2)]);
        let mut log = broker.log();
        while !log.markers.is_empty() {
            log.deliver_marker(0);
        }
        while !log.to_materialise.is_empty() {
            log.materialise(0);
        }
    }
    let log = broker.log();
    let mut out: Vec<String> = log
        .committed_view("out")
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    out.sort();
    assert_eq!(out, ["x/1", "x/2", "y/1", "y/2"], "offsets 0 and 1, once");
    assert_eq!(
        log.offsets
            .get(&("app-eos".to_owned(), tp))
            .map(|c| c.offset),
        Some(2)
    );
}

/// A log whose first initialisation of one transactional id fails.
struct FailingInit {
    broker: Broker,
    id: String,
    failed: Mutex<bool>,
}

#[async_trait]
impl TransactionalLog for FailingInit {
    async fn producer(
        &self,
        transactional_id: &str,
    ) -> Result<Arc<dyn TransactionalProducer>, TxnError> {
        if transactional_id == self.id
            && !std::mem::replace(&mut *self.failed.lock().unwrap(), true)
        {
            return Err(TxnError::abortable("the coordinator is not available"));
        }
        self.broker.producer(transactional_id).await
    }

    async fn read_committed(
        &self,
        tp: &TopicPartition,
        first: i64,
        last: i64,
    ) -> Result<Vec<i64>, TxnError> {
        self.broker.read_committed(tp, first, last).await
    }

    async fn committed(
        &self,
        group: &str,
        tps: &[TopicPartition],
    ) -> Result<Vec<Option<CommittedOffset>>, TxnError> {
        self.broker.committed(group, tps).await
    }
}

/// An initialisation that fails fails the invocation naming the partition and its
/// transactional id; the producers initialised meanwhile are kept for the next invocation
/// (under their own partitions), which initialises only the one that failed.
#[test]
fn a_failed_initialisation_names_the_partition_and_keeps_the_others() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::completing();
    let log = FailingInit {
        broker: broker.clone(),
        id: "app-in-0".into(),
        failed: Mutex::new(false),
    };
    let output = ExactlyOnceOutput::new("app", Arc::new(log));
    let store = MemoryStore::new();
    let topology = topology();
    let mut source = Source::new();
    for p in 0..2 {
        source.insert(TopicPartition::new("in", p), vec![("k".into(), "x".into())]);
    }
    let batch: BTreeMap<_, _> = (0..2)
        .map(|p| (TopicPartition::new("in", p), (0, 0)))
        .collect();
    let e = rt
        .block_on(output.process(&topology, &event(&source, &batch), &store, &options()))
        .expect_err("the init fails");
    let message = e.to_string();
    assert!(
        message.contains("in-0") && message.contains("\"app-in-0\"") && message.contains("init"),
        "{message}"
    );
    let (_, report) = rt
        .block_on(output.process(&topology, &event(&source, &batch), &store, &options()))
        .expect("the retry succeeds");
    assert_eq!((report.reused, report.initialised), (1, 1), "{report:?}");
}

// ------------------------------------------------------------------ the outbox control

/// The memory store without an outbox: under exactly-once output it re-derives each
/// touched item's update from its current state (what the batch did before the outbox),
/// in the transaction of its first contribution's record. The control of
/// [`aggregate_updates_without_the_outbox_are_duplicated_or_lost`].
/// A weakening of the memory store, the control of a test that must be able to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    /// None: the memory store as it is.
    None,
    /// No outbox: see [`Weakened`].
    NoOutbox,
    /// No claim register: a partition's batch finds none of its claims, so it neither
    /// finishes the committed ones nor re-claims those whose transaction aborted.
    NoRegister,
    /// No claims in the closing passes: a rewrite that closes sessions or sliding windows
    /// is a plain rewrite (as at least once), and the records go in the transaction.
    NoClosingClaims,
}

/// The memory store with a [`Control`]'s weakening.
struct Weakened(MemoryStore, Control);

#[async_trait]
impl Store for Weakened {
    async fn apply(&self, write: ItemWrite<'_>) -> Result<(ItemState, WriteStats), StateError> {
        self.0.apply(write).await
    }
    async fn apply_outboxed(
        &self,
        write: ItemWrite<'_>,
        outbox: &Outbox<'_>,
    ) -> Result<(ItemState, Vec<Emission>, WriteStats), StateError> {
        if self.1 != Control::NoOutbox {
            return self.0.apply_outboxed(write, outbox).await;
        }
        let origin = outbox.entry_origin(write.contributions);
        let (state, stats) = self.0.apply(write).await?;
        let emissions = origin
            .map(|(tp, offset)| Emission {
                tp,
                entry: Entry {
                    offset,
                    state: state.clone(),
                    time: outbox.time,
                    dead_letter: None,
                },
            })
            .into_iter()
            .collect();
        Ok((state, emissions, stats))
    }
    async fn get(&self, store: &str, key: &[u8]) -> Result<Option<ItemState>, StateError> {
        self.0.get(store, key).await
    }
    async fn claimed_windows(
        &self,
        store: &str,
        tp: &TopicPartition,
    ) -> Result<(Vec<ClaimedWindow>, WriteStats), StateError> {
        if self.1 == Control::NoRegister {
            return Ok((Vec::new(), WriteStats::default()));
        }
        self.0.claimed_windows(store, tp).await
    }
    async fn claim_window(
        &self,
        store: &str,
        window: &ClosedWindow,
        tp: &TopicPartition,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        self.0.claim_window(store, window, tp, attempt).await
    }
    async fn reclaim_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
        attempt: &str,
    ) -> Result<(bool, WriteStats), StateError> {
        self.0.reclaim_window(store, window, attempt).await
    }
    async fn finish_window(
        &self,
        store: &str,
        window: &ClaimedWindow,
    ) -> Result<(bool, WriteStats), StateError> {
        self.0.finish_window(store, window).await
    }
    async fn forget_claims(
        &self,
        store: &str,
        tp: &TopicPartition,
        windows: &[ClaimedWindow],
    ) -> Result<WriteStats, StateError> {
        self.0.forget_claims(store, tp, windows).await
    }
    async fn claim_closing_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
        claim: ClosingClaim<'_>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        if self.1 == Control::NoClosingClaims {
            return self.0.close_item(store, item, aggregate, close_at).await;
        }
        self.0
            .claim_closing_item(store, item, aggregate, close_at, claim)
            .await
    }
    async fn get_many(
        &self,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Result<HashMap<Vec<u8>, ItemState>, StateError> {
        self.0.get_many(store, keys).await
    }
    async fn windows(
        &self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, ItemState)>, StateError> {
        self.0.windows(store, key, from, to).await
    }
    async fn clock(&self) -> Result<Clock, StateError> {
        self.0.clock().await
    }
    async fn advance_stream_times(
        &self,
        advances: &[lambda_streams::state::ClockAdvance],
        now_ms: i64,
    ) -> Result<(), StateError> {
        self.0.advance_stream_times(advances, now_ms).await
    }
    async fn closed_windows(
        &self,
        store: &str,
        up_to: i64,
    ) -> Result<Vec<ClosedWindow>, StateError> {
        self.0.closed_windows(store, up_to).await
    }
    async fn mark_closed(
        &self,
        store: &str,
        windows: &[ClosedWindow],
        up_to: i64,
    ) -> Result<WriteStats, StateError> {
        self.0.mark_closed(store, windows, up_to).await
    }
    async fn closing_items(&self, store: &str, up_to: i64) -> Result<Vec<ClosingItem>, StateError> {
        self.0.closing_items(store, up_to).await
    }
    async fn close_item(
        &self,
        store: &str,
        item: &ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
    ) -> Result<(Option<ItemState>, WriteStats), StateError> {
        self.0.close_item(store, item, aggregate, close_at).await
    }
}

/// The control: the same schedules with the outbox replaced by the update re-derived from
/// the item's current state find a duplicate `(key, version)` or a missing version (a
/// crash after the write and before the commit: the retry finds the item written and
/// re-emits, or a shifted retry emits a later version and the earlier one is never
/// committed), so [`every_output_is_seen_exactly_once_by_read_committed_under_the_fault_model`]
/// can fail.
#[test]
fn aggregate_updates_without_the_outbox_are_duplicated_or_lost() {
    let (failed, _, _) = run_schedules_with(0..400, Control::NoOutbox);
    let (seed, violations) = failed.expect("no schedule found a duplicate or a gap");
    eprintln!("seed {seed}: {violations:#?}");
    assert!(
        violations
            .iter()
            .any(|v| v.contains("-updates: ") && (v.contains("times") || v.contains("versions"))),
        "{violations:#?}"
    );
}

/// The control of the window closes: without the claim register a batch finds none of
/// its partition's claims, so a claim whose transaction aborted (a crash after the claim,
/// a fenced zombie) is never emitted again: a `read_committed` reader misses a closed
/// window, so the window checks of
/// [`every_output_is_seen_exactly_once_by_read_committed_under_the_fault_model`] can fail.
#[test]
fn window_closes_without_the_claim_register_are_lost() {
    let (failed, _, _) = run_schedules_with(0..400, Control::NoRegister);
    let (seed, violations) = failed.expect("no schedule lost a window");
    eprintln!("seed {seed}: {violations:#?}");
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("window-closes: ") && v.contains("never emitted")),
        "{violations:#?}"
    );
}

/// The control of the closing passes: with their rewrites not claiming (the sessions and
/// sliding windows marked emitted by a plain rewrite, as at least once), a batch whose
/// transaction aborts after the rewrite (a crash, a fenced zombie) has marked them emitted
/// for good: a `read_committed` reader misses a closed session or window, so the checks of
/// [`check_closing_passes`] can fail.
#[test]
fn closing_passes_without_claims_lose_sessions_and_windows() {
    let (failed, _, _) = run_schedules_with(0..400, Control::NoClosingClaims);
    let (seed, violations) = failed.expect("no schedule lost a session or a sliding window");
    eprintln!("seed {seed}: {violations:#?}");
    assert!(
        violations.iter().any(|v| (v.starts_with("session-closes: ")
            || v.starts_with("sliding-closes: "))
            && v.contains("never emitted")),
        "{violations:#?}"
    );
}

/// The control of the sessions' updates on update: with the outbox replaced by the updates
/// re-derived from the item's current state (what a write's emission is without its
/// entry), the same schedules produce a session's update twice with one version, or lose a
/// version, so [`check_session_updates`] can fail.
#[test]
fn session_updates_without_the_outbox_are_duplicated_or_lost() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let found = (0..400).find_map(|seed| {
        let (violations, _, _) = rt.block_on(schedule(seed, Control::NoOutbox));
        let sessions: Vec<String> = violations
            .into_iter()
            .filter(|v| v.starts_with("session-updates: "))
            .collect();
        (!sessions.is_empty()).then_some((seed, sessions))
    });
    let (seed, violations) = found.expect("no schedule duplicated or lost a session's update");
    eprintln!("seed {seed}: {violations:#?}");
    assert!(
        violations
            .iter()
            .any(|v| v.contains("times as a") || v.contains("versions")),
        "{violations:#?}"
    );
}

/// A record the store rejects at write time (the aggregate's adder fails on `boom`) is
/// dead-lettered in its partition's transaction, and the item is written without it (its
/// watermark past it). When the invocation then fails (a later store's write crashes), the
/// transaction aborts with the dead letter; the retry finds the record held by the item and
/// does not decide again, so the dead letter must come from what the item kept: a
/// `read_committed` reader sees it once.
#[test]
fn a_write_time_dead_letter_survives_an_aborted_transaction() {
    use lambda_streams::state::fault::FaultyStore;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let builder = StreamsBuilder::new();
    let input = builder.stream("in", Utf8, Utf8);
    input
        .group_by_key(Utf8)
        .aggregate(
            "lengths",
            || 0i64,
            |_, v: String, sum| {
                assert!(v != "boom", "the adder refuses {v}");
                sum + v.len() as i64
            },
            DecimalI64,
        )
        .to_stream()
        .to("length-updates", Utf8, DecimalI64);
    input.group_by_key(Utf8).count("counts");
    let topology = builder.build();
    let broker = Broker::completing();
    let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
    // The lengths' item: a first write rejects `boom`, the second writes it without; the
    // third (the count's) fails.
    let store = FaultyStore::fail_once_after(MemoryStore::new(), 2);
    let tp = TopicPartition::new("in", 0);
    let mut source = Source::new();
    source.insert(
        tp.clone(),
        ["x", "boom", "y"]
            .iter()
            .map(|v| ("k".to_owned(), (*v).to_owned()))
            .collect(),
    );
    let e = event(&source, &BTreeMap::from([(tp.clone(), (0, 2))]));
    let settle = |broker: &Broker| {
        let mut log = broker.log();
        while !log.markers.is_empty() {
            log.deliver_marker(0);
        }
        while !log.to_materialise.is_empty() {
            log.materialise(0);
        }
    };
    let crash = rt
        .block_on(output.process(&topology, &e, &store, &options()))
        .expect_err("the count's write crashes");
    assert!(crash.to_string().contains("injected"), "{crash}");
    assert_eq!(
        rt.block_on(store.get("lengths", b"k"))
            .unwrap()
            .map(|s| s.version),
        Some(1),
        "the lengths' item was written, without boom"
    );
    settle(&broker);
    rt.block_on(output.process(&topology, &e, &store, &options()))
        .expect("the retry succeeds");
    settle(&broker);
    let log = broker.log();
    let letters: Vec<String> = log
        .committed_view("dlq")
        .iter()
        .map(|r| String::from_utf8_lossy(r.header(SOURCE_HEADER).unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(letters, ["in:0:1"], "the dead letter of in-0@1, once");
    let updates = log.committed_view("length-updates").len();
    assert_eq!(updates, 1, "one update of the lengths, once");
}

/// The dead letter of a record a left join's closing pass cannot emit (its joiner panics on
/// the record alone) is kept in the pass's claim with the records it emits: when the
/// transaction that holds them aborts (here the coordinator times it out and fences the
/// producer as the pass claims), the retry re-claims the claim and produces the dead letter
/// and the record alone again, from the claim, although the item no longer holds them: a
/// `read_committed` reader sees each once. Its control, the same schedule with the rewrite
/// not claiming (as at least once): both are lost.
#[test]
fn a_join_s_closing_pass_dead_letter_survives_an_aborted_transaction() {
    use lambda_streams::dsl::JoinWindows;
    use lambda_streams::state::fault::FaultyStore;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let topology = || {
        let builder = StreamsBuilder::new();
        builder.output_guarantee(lambda_streams::OutputGuarantee::ExactlyOnce);
        let left = builder.stream("left", Utf8, Utf8);
        let right = builder.stream("right", Utf8, Utf8);
        left.left_join_stream(
            &right,
            JoinWindows::of(std::time::Duration::from_millis(1)),
            "left-pairs",
            (Utf8, Utf8, Utf8),
            |_, l: &String, r: Option<&String>| {
                assert!(
                    !(l == "boom" && r.is_none()),
                    "the joiner refuses boom alone"
                );
                format!("{l}+{}", r.map_or("none", |r| r.as_str()))
            },
        )
        .to("joined", Utf8, Utf8);
        builder.try_build().unwrap()
    };
    // left-0: k "boom" at 1,000, then z at 1,001 to 1,003; right-0: q at 1,000 to 1,003.
    // The closing pass at 1,003 closes boom and x1 alone (nothing of q's key on the left).
    let (l, r) = (
        TopicPartition::new("left", 0),
        TopicPartition::new("right", 0),
    );
    let mut source = Source::new();
    source.insert(
        l.clone(),
        [("k", "boom"), ("z", "x1"), ("z", "x2"), ("z", "x3")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    source.insert(
        r.clone(),
        (0..4).map(|_| ("q".to_owned(), "r".to_owned())).collect(),
    );
    let batch = BTreeMap::from([(l.clone(), (0, 3)), (r.clone(), (0, 3))]);
    let e = event(&source, &batch);
    let options = BatchOptions {
        source_partitions: BTreeMap::from([("left".to_owned(), 1), ("right".to_owned(), 1)]),
        ..options()
    };
    let run = |control: Control| {
        let topology = topology();
        let broker = Broker::completing();
        let inner: Box<dyn Store> = match control {
            Control::None => Box::new(MemoryStore::new()),
            control => Box::new(Weakened(MemoryStore::new(), control)),
        };
        // The three arrivals' writes, then the pass's first claim: as it is made, the
        // coordinator times out the left partition's transaction (the batch's first).
        let timeouts = broker.clone();
        let store = FaultyStore::new(inner).on_write(move |before| {
            if before == 3 {
                timeouts.log().timeout_abort("app-left-0");
            }
        });
        let first = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
        let failed = rt.block_on(first.process(&topology, &e, &store, &options));
        assert!(failed.is_err(), "the first attempt is fenced");
        settle(&broker);
        let retry = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
        rt.block_on(retry.process(&topology, &e, &store, &options))
            .expect("the retry succeeds");
        settle(&broker);
        let log = broker.log();
        let letters: Vec<String> = log
            .committed_view("dlq")
            .iter()
            .map(|r| {
                String::from_utf8_lossy(r.header(SOURCE_HEADER).unwrap_or_default()).into_owned()
            })
            .collect();
        let joined: Vec<String> = log
            .committed_view("joined")
            .iter()
            .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
            .collect();
        (letters, joined)
    };
    let (letters, joined) = run(Control::None);
    assert_eq!(letters, ["left:0:0"], "the dead letter of left-0@0, once");
    assert_eq!(joined, ["x1+none"], "the record alone, once");
    // The control: the rewrite not claiming loses both with the aborted transaction.
    let (letters, joined) = run(Control::NoClosingClaims);
    assert!(
        letters.is_empty() && joined.is_empty(),
        "{letters:?} {joined:?}"
    );
}

// ------------------------------------------------------------------ table–table joins

/// The tables' topics of the table–table join test: each key's records in one partition
/// of each topic (`a`, `c` in partition 0, `b`, `d` in 1), so that each table's final value
/// of a key is its partition's last record of it.
const JOIN_TOPICS: [&str; 2] = ["names", "cities"];

/// Per table topic and partition, the records `(key, value)`; `None` is a tombstone.
type JoinSource = BTreeMap<TopicPartition, Vec<(String, Option<String>)>>;

fn join_source(rng: &mut StdRng) -> JoinSource {
    let mut source = JoinSource::new();
    for topic in JOIN_TOPICS {
        for p in 0..2 {
            let keys = [["a", "c"], ["b", "d"]][p as usize];
            let n = rng.random_range(2..=7);
            let records = (0..n)
                .map(|_| {
                    let key = keys[rng.random_range(0..2)].to_owned();
                    let value = (!rng.random_bool(0.2))
                        .then(|| format!("{topic}{}", rng.random_range(0..3)));
                    (key, value)
                })
                .collect();
            source.insert(TopicPartition::new(topic, p), records);
        }
    }
    source
}

/// Two tables joined both ways under exactly-once output: an outer join (`profiles`: every
/// change of either side emits, a deletion once neither side has the key) and an inner join
/// (`pairs`), each joined value `<name>@<city>` (`?` for a side without a value).
fn join_topology(output: lambda_streams::OutputGuarantee) -> Topology {
    use lambda_streams::serdes::Nullable;
    let builder = StreamsBuilder::new();
    builder.output_guarantee(output);
    let names = builder.table("names", Utf8, Utf8, "names");
    let cities = builder.table("cities", Utf8, Utf8, "cities");
    let side = |v: Option<&String>| v.cloned().unwrap_or_else(|| "?".to_owned());
    names
        .outer_join(&cities, move |_, n: Option<&String>, c: Option<&String>| {
            format!("{}@{}", side(n), side(c))
        })
        .to_change_stream()
        .to("profiles", Utf8, Nullable(Utf8));
    names
        .join(&cities, |_, n: &String, c: &String| format!("{n}@{c}"))
        .to_change_stream()
        .to("pairs", Utf8, Nullable(Utf8));
    builder.build()
}

fn join_event(source: &JoinSource, batch: &Batch) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "memory".into(),
        partitions: batch
            .iter()
            .map(|(tp, &(a, b))| PartitionRecords {
                tp: tp.clone(),
                records: (a..=b)
                    .map(|o| {
                        let (k, v) = &source[tp][o as usize];
                        Record {
                            offset: o,
                            timestamp: 1_000 + o,
                            timestamp_type: TimestampType::CreateTime,
                            key: Some(Bytes::from(k.clone())),
                            value: v.clone().map(Bytes::from),
                            headers: Vec::new(),
                            key_schema_metadata: None,
                            value_schema_metadata: None,
                        }
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// One schedule of [`join_topology`] under the fault model; returns the violations of what
/// a `read_committed` reader of `profiles` and `pairs` sees, against a reference computed
/// from the source alone.
async fn join_schedule(seed: u64, control: Control) -> (Vec<String>, bool, Stats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let source = join_source(&mut rng);
    let topology = join_topology(lambda_streams::OutputGuarantee::ExactlyOnce);
    let store: Arc<dyn Store> = match control {
        Control::None => Arc::new(MemoryStore::new()),
        control => Arc::new(Weakened(MemoryStore::new(), control)),
    };
    let mut stats = Stats::default();
    let (broker, complete) =
        run_on_join_source(&topology, &store, &source, &mut rng, &mut stats).await;
    let violations = check_joins(&broker, &source, complete);
    (violations, complete, stats)
}

/// Runs `topology` over the join tests' `source` under the fault model (every partition
/// from offset 0); returns the log and whether every partition was consumed.
async fn run_on_join_source(
    topology: &Topology,
    store: &Arc<dyn Store>,
    source: &JoinSource,
    rng: &mut StdRng,
    stats: &mut Stats,
) -> (Broker, bool) {
    let broker = Broker::default();
    let complete = FaultySource {
        topology: &Arc::new(topology.clone()),
        store,
        broker: &broker,
        start: source.keys().map(|tp| (tp.clone(), 0)).collect(),
        ends: source
            .iter()
            .map(|(tp, r)| (tp.clone(), r.len() as i64))
            .collect(),
        event: &|batch| join_event(source, batch),
        options: BatchOptions::default(),
    }
    .run(rng, stats)
    .await;
    (broker, complete)
}

/// The reference of the table–table join test, from the source alone: per key, every value
/// each table held (in its partition's order, `None` for none) and its final value.
fn join_reference(source: &JoinSource) -> BTreeMap<String, [Vec<Option<String>>; 2]> {
    let mut held: BTreeMap<String, [Vec<Option<String>>; 2]> = BTreeMap::new();
    for key in ["a", "b", "c", "d"] {
        held.insert(key.to_owned(), [vec![None], vec![None]]);
    }
    for (tp, records) in source {
        let side = usize::from(tp.topic == JOIN_TOPICS[1]);
        for (k, v) in records {
            held.get_mut(k).unwrap()[side].push(v.clone());
        }
    }
    held
}

/// What a `read_committed` reader of the joins' outputs must see: per topic, each
/// `(key, version)` once; every value a join of values the two tables held for the key;
/// for the outer join, versions 1..N complete per key; and, when the run completed, per key
/// the update of the highest version is the join of the two tables' final values (a
/// deletion, or no update at all, where the join has no value).
fn check_joins(broker: &Broker, source: &JoinSource, complete: bool) -> Vec<String> {
    let reference = join_reference(source);
    let log = broker.log();
    if std::env::var("JOIN_TRACE").is_ok() {
        eprintln!("source {source:?}");
        for topic in ["profiles", "pairs"] {
            for (r, txn) in log.topics.get(topic).into_iter().flatten() {
                eprintln!(
                    "{topic} {:?}={:?} {:?} committed={:?}",
                    r.key.as_deref().map(String::from_utf8_lossy),
                    r.value.as_deref().map(String::from_utf8_lossy),
                    r.header(VERSION_HEADER).map(String::from_utf8_lossy),
                    log.txns.get(txn)
                );
            }
        }
    }
    let mut violations = Vec::new();
    let text = |b: &Option<Vec<u8>>| {
        b.as_deref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let side = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".to_owned());
    for (topic, outer) in [("profiles", true), ("pairs", false)] {
        let mut latest: BTreeMap<String, BTreeMap<u64, Option<String>>> = BTreeMap::new();
        for r in log.committed_view(topic) {
            let key = text(&r.key).unwrap_or_default();
            let Some(version) = r
                .header(VERSION_HEADER)
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.parse::<u64>().ok())
            else {
                violations.push(format!("{topic}: an update of {key} without a version"));
                continue;
            };
            if r.header(TRANSACTION_HEADER).is_some() {
                violations.push(format!("{topic}: the transaction header leaked"));
            }
            let value = text(&r.value);
            if let Some(old) = latest
                .entry(key.clone())
                .or_default()
                .insert(version, value.clone())
            {
                violations.push(format!(
                    "{topic}: {key} version {version} seen twice ({old:?}, {value:?})"
                ));
            }
            // A value joins values the two tables held.
            if let Some(value) = &value {
                let [names, cities] = &reference[&key];
                let valid = names.iter().any(|n| {
                    cities.iter().any(|c| {
                        (outer || (n.is_some() && c.is_some()))
                            && *value == format!("{}@{}", side(n), side(c))
                    })
                });
                if !valid {
                    violations.push(format!(
                        "{topic}: {key} = {value:?} joins no values the tables held"
                    ));
                }
            }
        }
        for (key, versions) in &latest {
            if outer {
                let want: Vec<u64> = (1..=versions.len() as u64).collect();
                let got: Vec<u64> = versions.keys().copied().collect();
                if complete && got != want {
                    violations.push(format!("{topic}: {key} versions {got:?}, not 1..N"));
                }
            }
        }
        if !complete {
            continue;
        }
        for (key, [names, cities]) in &reference {
            let (n, c) = (names.last().unwrap(), cities.last().unwrap());
            let want = if outer {
                (n.is_some() || c.is_some()).then(|| format!("{}@{}", side(n), side(c)))
            } else {
                n.as_ref().zip(c.as_ref()).map(|(n, c)| format!("{n}@{c}"))
            };
            let got = latest
                .get(key)
                .and_then(|v| v.last_key_value())
                .and_then(|(_, v)| v.clone());
            if got != want {
                violations.push(format!(
                    "{topic}: {key}'s highest version holds {got:?}, the join of the final \
                     values is {want:?} ({:?})",
                    latest.get(key)
                ));
            }
        }
    }
    violations
}

#[test]
fn a_table_table_join_is_seen_once_by_read_committed_under_the_fault_model() {
    let schedules: u64 = std::env::var("EOS_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let first: u64 = std::env::var("EOS_FIRST_SCHEDULE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let (failed, incomplete, stats) =
        run_seeds(first..schedules, |seed| join_schedule(seed, Control::None));
    eprintln!("{schedules} schedules, {incomplete} incomplete (step cap): {stats:?}");
    if let Some((seed, violations)) = failed {
        panic!("seed {seed}: {violations:#?}");
    }
    assert!(
        stats.crashes > 0 && stats.zombies > 0 && stats.shifted_retries > 0,
        "{stats:?}"
    );
}

/// The control of the table–table joins: with the outbox replaced by the update re-derived
/// from the item's current state (see [`Weakened`]), a retry after an aborted transaction
/// emits a decision's update again under a later version, or not at all: a `read_committed`
/// reader sees a key's versions with a gap or a value twice, so
/// [`a_table_table_join_is_seen_once_by_read_committed_under_the_fault_model`] can fail.
#[test]
fn table_table_join_updates_without_the_outbox_are_duplicated_or_lost() {
    let (failed, _, _) = run_seeds(0..400, |seed| join_schedule(seed, Control::NoOutbox));
    let (seed, violations) = failed.expect("no schedule found a duplicate or a gap");
    eprintln!("seed {seed}: {violations:#?}");
}

/// Both sides of an inner table–table join lose a key that joined, and each side's change
/// finds the other side gone: the names batch deleting `a` crashes after its table write
/// (before its decision), the cities batch deleting `a` then reads names' deletion, and the
/// names batch's retry reads cities' deletion. Neither side sees the other still holding a
/// value, so each decides "nothing"; the pair `n1@c1` emitted before must still be deleted
/// (the join of the final values has none). The same happens when the two batches run at
/// once in two invocations (found by `tests/tests/eos_table_join.rs` under load: a key's
/// pair never deleted).
#[test]
fn a_key_both_tables_lose_in_turn_deletes_the_inner_join_s_pair() {
    use lambda_streams::state::fault::FaultyStore;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (names, cities) = (
        TopicPartition::new(JOIN_TOPICS[0], 0),
        TopicPartition::new(JOIN_TOPICS[1], 0),
    );
    let source: JoinSource = [&names, &cities]
        .into_iter()
        .zip(["n1", "c1"])
        .map(|(tp, value)| {
            let records = vec![
                ("a".to_owned(), Some(value.to_owned())),
                ("a".to_owned(), None),
            ];
            (tp.clone(), records)
        })
        .collect();
    let broker = Broker::completing();
    let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
    let memory = MemoryStore::new();
    let topology = join_topology(lambda_streams::OutputGuarantee::ExactlyOnce);
    let options = BatchOptions::default();
    let settle = || {
        let mut log = broker.log();
        while !log.markers.is_empty() {
            log.deliver_marker(0);
        }
        while !log.to_materialise.is_empty() {
            log.materialise(0);
        }
    };
    let batch = |tp: &TopicPartition, offset: i64| {
        join_event(&source, &BTreeMap::from([(tp.clone(), (offset, offset))]))
    };
    for tp in [&names, &cities] {
        rt.block_on(output.process(&topology, &batch(tp, 0), &memory, &options))
            .expect("a value of each table");
        settle();
    }
    // The names batch deleting `a` writes the names table, then crashes.
    let crashing = FaultyStore::fail_once_after(&memory, 1);
    let crashed = rt.block_on(output.process(&topology, &batch(&names, 1), &crashing, &options));
    assert!(crashed.is_err(), "the crash fails the batch");
    settle();
    for tp in [&cities, &names] {
        rt.block_on(output.process(&topology, &batch(tp, 1), &memory, &options))
            .expect("the deletions");
        settle();
    }
    let violations = check_joins(&broker, &source, true);
    assert!(violations.is_empty(), "{violations:#?}");
    let pairs: Vec<Option<Vec<u8>>> = broker
        .log()
        .committed_view("pairs")
        .iter()
        .map(|r| r.value.clone())
        .collect();
    assert_eq!(pairs.first(), Some(&Some(b"n1@c1".to_vec())), "{pairs:?}");
    assert_eq!(pairs.last(), Some(&None), "the pair deleted: {pairs:?}");
}

// --------------------------------------------- a table's updates through a stream–table join

/// A store's updates joined with a table under exactly-once output, on the sources of the
/// table–table join test: `names` is the table, `cities` a stream counted per key (its
/// tombstones skipped, as Kafka Streams' aggregations skip null values). A count's updates
/// left-joined (`moved`) and inner-joined (`moved-inner`) with the names, each value
/// `<count>:<name>` (`?` for no name); and the updates of sessions on update (gap 3 ms)
/// left-joined the same way (`moved-sessions`, keyed `<key>@<start>-<end>`).
fn lookup_topology() -> Topology {
    use lambda_streams::dsl::SessionWindows;
    let builder = StreamsBuilder::new();
    builder.output_guarantee(lambda_streams::OutputGuarantee::ExactlyOnce);
    let names = builder.table("names", Utf8, Utf8, "names");
    let moves = builder
        .stream("cities", Utf8, lambda_streams::serdes::Nullable(Utf8))
        .filter(|_, v| v.is_some());
    let counts = moves.group_by_key(Utf8).count("moves").to_stream();
    let name = |name: Option<String>| name.unwrap_or_else(|| "?".to_owned());
    counts
        .left_join(&names, move |_, n: i64, found: Option<String>| {
            format!("{n}:{}", name(found))
        })
        .to("moved", Utf8, Utf8);
    counts
        .join(&names, |_, n: i64, found: String| format!("{n}:{found}"))
        .to("moved-inner", Utf8, Utf8);
    moves
        .group_by_key(Utf8)
        .windowed_by_session(SessionWindows::with_inactivity_gap(
            std::time::Duration::from_millis(SESSION_UPDATE_GAP as u64),
        ))
        .count("move-sessions")
        .to_stream()
        .map(|w, n| (w.key, (w.start, w.end, n)))
        .left_join(
            &names,
            move |_, (start, end, n): (i64, i64, i64), found: Option<String>| {
                (start, end, format!("{n}:{}", name(found)))
            },
        )
        .map(|k, (start, end, v)| (format!("{k}@{start}-{end}"), v))
        .to("moved-sessions", Utf8, Utf8);
    builder.build()
}

/// One schedule of [`lookup_topology`] under the fault model; returns the violations of
/// what a `read_committed` reader sees (see [`check_lookups`]).
async fn lookup_schedule(seed: u64) -> (Vec<String>, bool, Stats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let source = join_source(&mut rng);
    let topology = lookup_topology();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut stats = Stats::default();
    let (broker, complete) =
        run_on_join_source(&topology, &store, &source, &mut rng, &mut stats).await;
    let violations = check_lookups(&broker, &source, &*store, complete).await;
    (violations, complete, stats)
}

/// Per key (or session) of a joined output, per version: the counts and names seen.
type LookedUp = BTreeMap<String, BTreeMap<u64, Vec<(i64, String)>>>;

/// What a `read_committed` reader of [`lookup_topology`]'s outputs must see, against the
/// source alone: per topic, each `(key, version)` once (per session and version for the
/// sessions); every name one the table held for the key (or `?` where the left join found
/// none), none in the inner join; a key's counts growing with its versions, one count per
/// version in both joins; and when the run completed, the left joins' versions 1..N
/// complete per key (every write changes the count and a session), the count of the
/// highest version the key's number of records, and each session of the brute force's
/// with its count at its highest version.
async fn check_lookups(
    broker: &Broker,
    source: &JoinSource,
    store: &dyn Store,
    complete: bool,
) -> Vec<String> {
    let held = join_reference(source);
    // Per key: its non-null `cities` record times (1,000 + offset), in order.
    let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (tp, records) in source.iter().filter(|(tp, _)| tp.topic == "cities") {
        let _ = tp;
        for (o, (key, value)) in records.iter().enumerate() {
            if value.is_some() {
                times.entry(key.clone()).or_default().push(1_000 + o as i64);
            }
        }
    }
    let mut violations = Vec::new();
    let text = |b: &Option<Vec<u8>>| {
        b.as_deref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    // Per topic, per key (or session), per version: the values seen.
    let mut seen: BTreeMap<&str, LookedUp> = BTreeMap::new();
    for topic in ["moved", "moved-inner", "moved-sessions"] {
        let per_key = seen.entry(topic).or_default();
        let committed: Vec<OutputRecord> = broker
            .log()
            .committed_view(topic)
            .into_iter()
            .cloned()
            .collect();
        for r in &committed {
            if r.header(TRANSACTION_HEADER).is_some() {
                violations.push(format!("{topic}: the transaction header leaked"));
            }
            let key = text(&r.key);
            let Some(version) = r
                .header(VERSION_HEADER)
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.parse::<u64>().ok())
            else {
                violations.push(format!("{topic}: an update of {key} without a version"));
                continue;
            };
            let value = text(&r.value);
            let Some((count, name)) = value
                .split_once(':')
                .and_then(|(n, name)| Some((n.parse::<i64>().ok()?, name.to_owned())))
            else {
                violations.push(format!("{topic}: {key} = {value:?} is not <count>:<name>"));
                continue;
            };
            let plain = key.split_once('@').map_or(key.as_str(), |(k, _)| k);
            let names = &held.get(plain).map(|h| &h[0]);
            let valid = names.is_some_and(|names| {
                names.iter().any(|n| match n {
                    Some(n) => *n == name,
                    None => name == "?" && topic != "moved-inner",
                })
            });
            if !valid {
                violations.push(format!(
                    "{topic}: {key} = {value:?} joins a name the table never held"
                ));
            }
            per_key
                .entry(key)
                .or_default()
                .entry(version)
                .or_default()
                .push((count, name));
        }
    }
    for (topic, per_key) in &seen {
        for (key, versions) in per_key {
            for (version, values) in versions {
                if values.len() != 1 {
                    violations.push(format!(
                        "{topic}: ({key}, version {version}) seen {} times: {values:?}",
                        values.len()
                    ));
                }
            }
            if *topic != "moved-sessions" {
                let counts: Vec<i64> = versions.values().map(|v| v[0].0).collect();
                if counts.windows(2).any(|w| w[0] >= w[1]) {
                    violations.push(format!(
                        "{topic}: {key}'s counts do not grow with its versions: {versions:?}"
                    ));
                }
            }
        }
    }
    // The inner join's counts are the left join's of the same version (one outbox entry).
    for (key, versions) in &seen["moved-inner"] {
        for (version, values) in versions {
            let left = seen["moved"].get(key).and_then(|v| v.get(version));
            if left.is_some_and(|l| l[0].0 != values[0].0) {
                violations.push(format!(
                    "{key} version {version}: the inner join's count {values:?}, the left \
                     join's {left:?}"
                ));
            }
        }
    }
    if !complete {
        return violations;
    }
    for (key, ts) in &times {
        let versions = seen["moved"].get(key).cloned().unwrap_or_default();
        let got: Vec<u64> = versions.keys().copied().collect();
        if got != (1..=got.len() as u64).collect::<Vec<_>>() {
            violations.push(format!("moved: {key} has versions {got:?}, not 1..N"));
        }
        let last = versions.last_key_value().map(|(_, v)| v[0].0);
        if last != Some(ts.len() as i64) {
            violations.push(format!(
                "moved: {key}'s highest version counts {last:?}, the key has {} records",
                ts.len()
            ));
        }
        // Sessions: the key's versions among its sessions' updates, and each session of
        // the brute force (record times merged while the next is within the gap) with its
        // count at its highest version.
        let last = store
            .get("move-sessions", key.as_bytes())
            .await
            .unwrap()
            .map_or(0, |s| s.version);
        let mut versions: BTreeSet<u64> = BTreeSet::new();
        for (name, v) in &seen["moved-sessions"] {
            if name.split_once('@').is_some_and(|(k, _)| k == key) {
                versions.extend(v.keys());
            }
        }
        if versions.iter().copied().collect::<Vec<_>>() != (1..=last).collect::<Vec<u64>>() {
            violations.push(format!(
                "moved-sessions: {key} has versions {versions:?}, expected 1..={last}"
            ));
        }
        let mut sessions: Vec<(i64, i64, i64)> = Vec::new();
        for &t in ts {
            match sessions.last_mut() {
                Some((_, end, n)) if t - *end <= SESSION_UPDATE_GAP => {
                    *end = t;
                    *n += 1;
                }
                _ => sessions.push((t, t, 1)),
            }
        }
        for (start, end, n) in sessions {
            let name = format!("{key}@{start}-{end}");
            let got = seen["moved-sessions"]
                .get(&name)
                .and_then(|v| v.last_key_value())
                .map(|(_, v)| v[0].0);
            if got != Some(n) {
                violations.push(format!(
                    "moved-sessions: {name} counts {got:?} at its highest version, the brute \
                     force {n}"
                ));
            }
        }
    }
    violations
}

/// A store's updates through a stream–table join under exactly-once output (a count's,
/// left and inner joins, and sessions' on update): each update that waits at the join goes
/// on in the transaction of its outbox entry's record, so a `read_committed` reader sees
/// each `(key, version)` once, complete, joined with a name the table held.
#[test]
fn table_updates_through_a_stream_table_join_are_seen_once_by_read_committed_under_the_fault_model()
{
    let schedules: u64 = std::env::var("EOS_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let (failed, incomplete, stats) = run_seeds(0..schedules, lookup_schedule);
    eprintln!("{schedules} schedules, {incomplete} incomplete (step cap): {stats:?}");
    if let Some((seed, violations)) = failed {
        panic!("seed {seed}: {violations:#?}");
    }
    assert!(
        stats.crashes > 0 && stats.zombies > 0 && stats.shifted_retries > 0,
        "{stats:?}"
    );
    // The checks of a completed run are the strong ones: most runs complete.
    assert!(
        incomplete * 10 < schedules,
        "{incomplete} of {schedules} incomplete"
    );
}

// ------------------------------------------------ an arrival beside a closing pass's claim

/// Under exactly-once output, a session closed by a closing pass keeps what it emitted in
/// its item (the claim) until its partition's next batch finishes the claim, and those bytes
/// count towards the item's 400 KB: an arrival of another partition meanwhile whose session
/// fits alone but not beside the claim is a poison record of that record (dead-lettered,
/// the batch goes on), not a write DynamoDB refuses on every retry (the batch failing,
/// naming only the store and key, until the claiming partition's next batch). The same
/// record after the claim is finished fits. (Before the claims were counted, the in-memory
/// store took the write and DynamoDB refused it.)
#[test]
fn an_arrival_that_fits_only_without_a_pending_claim_is_a_poison_record() {
    use lambda_streams::dsl::{EmitStrategy, SessionWindows};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::completing();
    let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()));
    let store = MemoryStore::new();
    let builder = StreamsBuilder::new();
    builder.output_guarantee(lambda_streams::OutputGuarantee::ExactlyOnce);
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(SessionWindows::with_inactivity_gap(
            std::time::Duration::from_millis(100),
        ))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .reduce("big", |a: String, b: String| a + &b, Utf8)
        .to_stream()
        .map(|w, v: String| (format!("{}@{}", w.key, w.start), v))
        .to("closed", Utf8, Utf8);
    let topology = builder.build();
    let options = BatchOptions {
        source_partitions: BTreeMap::from([("in".to_owned(), 2)]),
        poison: PoisonPolicy::DeadLetter {
            topic: "dlq".into(),
        },
        ..BatchOptions::default()
    };
    let (p0, p1) = (TopicPartition::new("in", 0), TopicPartition::new("in", 1));
    let mut next: HashMap<TopicPartition, i64> = HashMap::new();
    let mut run = |tp: &TopicPartition, key: &str, value: String, timestamp: i64| {
        let offset = *next.entry(tp.clone()).and_modify(|o| *o += 1).or_insert(0);
        let event = event_of(&BTreeMap::from([(tp.clone(), (offset, offset))]), |_, _| {
            (key.to_owned(), value.clone(), timestamp)
        });
        let (outcome, _) = rt
            .block_on(output.process(&topology, &event, &store, &options))
            .unwrap_or_else(|e| panic!("{tp} offset {offset}: {e}"));
        settle(&broker);
        (offset, outcome.report)
    };
    let big = |c: char, n: usize| std::iter::repeat_n(c, n).collect::<String>();
    run(&p1, "x", "a".into(), 1_000);
    run(&p0, "k", big('b', 150_000), 1_000);
    run(&p1, "x", "a".into(), 5_000);
    // Both partitions at 5,000: the session k@1000 closes, claimed by in-0's batch (its
    // 150,000 bytes kept in k's item until in-0's next batch).
    run(&p0, "y", "a".into(), 5_000);
    let closed = |broker: &Broker| -> Vec<String> {
        broker
            .log()
            .committed_view("closed")
            .iter()
            .map(|r| String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned())
            .collect()
    };
    assert_eq!(
        closed(&broker)
            .iter()
            .filter(|k| k.starts_with("k@"))
            .collect::<Vec<_>>(),
        ["k@1000"],
        "the session closed once"
    );
    // 150,000 bytes fit alone (a session item holds about twice its value), not beside
    // the claim.
    let (offset, report) = run(&p1, "k", big('c', 150_000), 5_001);
    assert_eq!(report.poison_records, 1, "{report:?}");
    let letters: Vec<(String, String)> = broker
        .log()
        .committed_view("dlq")
        .iter()
        .map(|r| {
            (
                String::from_utf8_lossy(r.header(SOURCE_HEADER).unwrap_or_default()).into_owned(),
                String::from_utf8_lossy(
                    r.header(lambda_streams::wire::ERROR_HEADER)
                        .unwrap_or_default(),
                )
                .into_owned(),
            )
        })
        .collect();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].0, format!("in:1:{offset}"), "{letters:?}");
    assert!(letters[0].1.contains("400 KB"), "{letters:?}");
    eprintln!("{}", letters[0].1);
    // in-0's next batch finishes the claim; the same record then fits.
    run(&p0, "z", "a".into(), 6_000);
    let (_, report) = run(&p1, "k", big('c', 150_000), 6_001);
    assert_eq!(report.poison_records, 0, "{report:?}");
    assert_eq!(broker.log().committed_view("dlq").len(), 1);
}
