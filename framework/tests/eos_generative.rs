//! The generative differential test under exactly-once output (issue 15): every random
//! topology of the generative suite's families that `build()` accepts with
//! `OutputGuarantee::ExactlyOnce` runs through the real [`ExactlyOnceOutput`] against the
//! in-memory transactional log (`eos/log.rs`, Kafka's semantics), under the exactly-once
//! fault model of `eos_protocol.rs` (batches over random partitions with random ends,
//! event-source timeouts that leave zombies running, crashes at any await point, warm
//! containers reusing their producers, transaction markers and offsets materialised late,
//! coordinator timeouts). Repartition topics are read back from that log as Lambda's event
//! source would read them, `read_uncommitted` (records of open and aborted transactions
//! included), and the function re-reads them `read_committed`.
//!
//! What a `read_committed` reader of the outputs sees must equal the reference
//! interpreter's records as a fault-free run would produce them, each once (the generative
//! suite's comparison with no fault allowance), and no table, window or session update may
//! be seen twice with one version. A topology `build()` refuses counts as refused: the
//! project's rule allows refusing, never a silent loss or copy.
//!
//! `tests/tests/eos_generative_dynamo.rs` runs the same cases on DynamoDB (dynoxide).
//!
//! Environment: `EOS_GENERATIVE_CASES=N` cases per family (default 40 here),
//! `EOS_GENERATIVE_FAMILIES=a,b` (default: the generative suite's default families),
//! `EOS_GENERATIVE_SEED=<family>:<seed>` replays one case.

#![allow(clippy::unwrap_used)]

/// The generative suite (its plans, reference and comparison).
#[path = "generative.rs"]
mod generative;
#[path = "eos/log.rs"]
mod log;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use generative::harness::{self, Fault, Run};
use generative::plan::{Inputs, PARTITIONS, Plan, Rng, partition_of};
use generative::{DEFAULT_FAMILIES, reference};
use lambda_streams::event::{
    EventSource, Header, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::kafka::ExactlyOnceOutput;
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams::state::Store;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::wire::TRANSACTION_HEADER;
use lambda_streams::{BatchOptions, OutputGuarantee, PoisonPolicy, Topology};
use log::Broker;

/// The topics the plans read as inputs (the rest of what a topology reads is repartition
/// topics, written by the topology in transactions).
const INPUTS: [&str; 4] = ["s0", "s1", "t0", "t1"];

/// What one invocation is: its ranges (inclusive), its container, whether the event source
/// gave up waiting for it (a zombie), and the task.
struct Invocation {
    batch: BTreeMap<TopicPartition, (i64, i64)>,
    env: usize,
    timed_out: bool,
    handle: tokio::task::JoinHandle<Result<Vec<(TopicPartition, i64)>, String>>,
}

/// What the event source did, for the failure report.
#[derive(Debug, Default)]
struct Stats {
    invocations: u64,
    failures: u64,
    crashes: u64,
    zombies: u64,
    txn_timeouts: u64,
}

/// The partitions' records as the event source reads them (`read_uncommitted`): the
/// inputs, and the repartition topics' records in the log, whatever their transaction.
struct Source {
    inputs: BTreeMap<TopicPartition, Vec<Record>>,
    repartition: BTreeSet<String>,
    broker: Broker,
}

impl Source {
    fn records(&self, tp: &TopicPartition) -> Vec<Record> {
        if let Some(records) = self.inputs.get(tp) {
            return records.clone();
        }
        self.broker
            .log()
            .partition(tp)
            .into_iter()
            .enumerate()
            .map(|(offset, (r, _))| Record {
                offset: offset as i64,
                timestamp: r.timestamp.unwrap_or_default(),
                timestamp_type: TimestampType::CreateTime,
                key: r.key.clone().map(Into::into),
                value: r.value.clone().map(Into::into),
                headers: r
                    .headers
                    .iter()
                    .map(|(n, v)| Header::new(n.as_str(), v.clone()))
                    .collect(),
                key_schema_metadata: None,
                value_schema_metadata: None,
            })
            .collect()
    }

    /// Every partition the event source polls.
    fn partitions(&self) -> Vec<TopicPartition> {
        let mut all: Vec<TopicPartition> = self.inputs.keys().cloned().collect();
        for topic in &self.repartition {
            all.extend((0..PARTITIONS).map(|p| TopicPartition::new(topic.as_str(), p)));
        }
        all
    }

    fn event(&self, batch: &BTreeMap<TopicPartition, (i64, i64)>) -> KafkaEvent {
        KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: "memory".into(),
            partitions: batch
                .iter()
                .map(|(tp, &(a, b))| PartitionRecords {
                    tp: tp.clone(),
                    records: self.records(tp)[a as usize..=b as usize].to_vec(),
                })
                .collect(),
        }
    }
}

/// One schedule of `topology` over `inputs`: the event source runs it with faults until
/// every partition (the repartition topics' too) is consumed, then the coordinator
/// completes every transaction. Returns what a `read_committed` reader of the output
/// topics sees.
async fn schedule(
    topology: Arc<Topology>,
    plan: &Plan,
    inputs: &Inputs,
    store: Arc<dyn Store>,
    rng: &mut Rng,
    io: bool,
) -> Result<Run, String> {
    let reads: BTreeSet<String> = topology.source_topics().into_iter().collect();
    let repartition: BTreeSet<String> = reads
        .iter()
        .filter(|t| !INPUTS.contains(&t.as_str()))
        .cloned()
        .collect();
    let mut options = BatchOptions::default();
    if plan.poison {
        options.poison = PoisonPolicy::Skip;
    }
    for topic in INPUTS {
        if reads.contains(topic) {
            options
                .source_partitions
                .insert(topic.to_owned(), PARTITIONS);
        }
    }
    let options = Arc::new(options);
    let broker = Broker::default();
    {
        let read_back = repartition.clone();
        broker.log().partitioner = Some(Arc::new(move |r, index| {
            read_back
                .contains(&r.topic)
                .then(|| partition_of(r.key.as_deref()).unwrap_or(index as i32 % PARTITIONS))
        }));
    }
    let source = Source {
        inputs: inputs
            .logs
            .iter()
            .filter(|((topic, _), _)| reads.contains(topic))
            .map(|((topic, p), records)| {
                (
                    TopicPartition::new(topic.as_str(), *p),
                    harness::input_log(records),
                )
            })
            .collect(),
        repartition: repartition.clone(),
        broker: broker.clone(),
    };
    let p_crash = [0, 1, 3][rng.below(3) as usize];
    let p_timeout = [2, 8][rng.below(2) as usize];
    let max_batch = rng.range(1, 6);
    let mut stats = Stats::default();
    let mut committed: HashMap<TopicPartition, i64> = HashMap::new();
    let mut busy: HashMap<TopicPartition, usize> = HashMap::new();
    // Warm containers: their output (with its cached producers), busy, alive.
    let mut envs: Vec<(Arc<ExactlyOnceOutput>, bool, bool)> = Vec::new();
    let mut running: Vec<(usize, Invocation)> = Vec::new();
    let mut next_id = 0usize;
    let mut complete = false;
    let trace = std::env::var("EOS_GENERATIVE_TRACE").is_ok_and(|v| v == "1");
    // On a store behind the network, invocations wait on requests: the schedule runs by
    // the clock, its waits short sleeps (the requests go on meanwhile).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let steps = if io { u64::MAX } else { 40_000 };
    for _ in 0..steps {
        if io && std::time::Instant::now() > deadline {
            break;
        }
        // Finished invocations: the event source commits what succeeded.
        let mut i = 0;
        while i < running.len() {
            if !running[i].1.handle.is_finished() {
                i += 1;
                continue;
            }
            let (id, inv) = running.remove(i);
            let result = inv.handle.await.unwrap();
            if trace {
                println!(
                    "invocation {id} env {} {:?}{}: {result:?}",
                    inv.env,
                    inv.batch,
                    if inv.timed_out { " (zombie)" } else { "" }
                );
            }
            envs[inv.env].1 = false;
            if result.is_err() {
                stats.failures += 1;
            }
            if !inv.timed_out {
                for (tp, (_, b)) in &inv.batch {
                    if let Ok(failures) = &result {
                        let next = failures
                            .iter()
                            .find(|(t, _)| t == tp)
                            .map_or(b + 1, |(_, offset)| *offset);
                        let c = committed.entry(tp.clone()).or_insert(0);
                        *c = (*c).max(next);
                    }
                    if busy.get(tp) == Some(&id) {
                        busy.remove(tp);
                    }
                }
            }
        }
        // The lagging partitions (table topics first: until they are caught up, only they).
        let lagging: Vec<(TopicPartition, i64, i64)> = source
            .partitions()
            .into_iter()
            .map(|tp| {
                let len = source.records(&tp).len() as i64;
                let at = committed.get(&tp).copied().unwrap_or(0);
                (tp, at, len)
            })
            .filter(|(_, at, len)| at < len)
            .collect();
        let tables_lag = lagging
            .iter()
            .any(|(tp, _, _)| tp.topic == "t0" || tp.topic == "t1");
        let free: Vec<(TopicPartition, i64, i64)> = lagging
            .iter()
            .filter(|(tp, _, _)| !tables_lag || tp.topic == "t0" || tp.topic == "t1")
            .filter(|(tp, _, _)| !busy.contains_key(tp))
            .cloned()
            .collect();
        {
            let log = broker.log();
            if lagging.is_empty()
                && busy.is_empty()
                && running.is_empty()
                && log.markers.is_empty()
                && log.to_materialise.is_empty()
                && log.ongoing().is_empty()
            {
                complete = true;
                break;
            }
        }
        let ongoing = broker.log().ongoing();
        let (markers, to_materialise) = {
            let log = broker.log();
            (log.markers.len(), log.to_materialise.len())
        };
        // One action, weighted (per mille).
        let mut actions: Vec<(u64, u8, usize)> = Vec::new();
        if !free.is_empty() {
            actions.push((1000, 0, 0));
        }
        for (k, (_, inv)) in running.iter().enumerate() {
            actions.push((3000, 1, k));
            if !inv.timed_out {
                actions.push((p_timeout * 10, 2, k));
            }
            actions.push((p_crash * 10, 3, k));
        }
        if markers > 0 {
            actions.push((1000, 4, 0));
        }
        if to_materialise > 0 {
            actions.push((1000, 5, 0));
        }
        if !ongoing.is_empty() {
            actions.push((30, 6, 0));
        }
        let total: u64 = actions.iter().map(|a| a.0).sum();
        if total == 0 {
            break;
        }
        let mut x = rng.below(total);
        let mut chosen = actions[actions.len() - 1];
        for a in &actions {
            if x < a.0 {
                chosen = *a;
                break;
            }
            x -= a.0;
        }
        match chosen.1 {
            0 => {
                let mut picked = free.clone();
                let k = rng.range(1, 3.min(free.len() as i64)) as usize;
                while picked.len() > k {
                    picked.remove(rng.below(picked.len() as u64) as usize);
                }
                let batch: BTreeMap<TopicPartition, (i64, i64)> = picked
                    .into_iter()
                    .map(|(tp, at, len)| {
                        let end = (at + rng.range(0, max_batch - 1)).min(len - 1);
                        (tp, (at, end))
                    })
                    .collect();
                let idle: Vec<usize> = (0..envs.len())
                    .filter(|&e| envs[e].2 && !envs[e].1)
                    .collect();
                let env = if !idle.is_empty() && rng.chance(70) {
                    idle[rng.below(idle.len() as u64) as usize]
                } else {
                    let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()))
                        .reread_committed(repartition.iter().cloned());
                    envs.push((Arc::new(output), false, true));
                    envs.len() - 1
                };
                envs[env].1 = true;
                let id = next_id;
                next_id += 1;
                for tp in batch.keys() {
                    busy.insert(tp.clone(), id);
                }
                let event = source.event(&batch);
                let (output, topology, store, options) = (
                    Arc::clone(&envs[env].0),
                    Arc::clone(&topology),
                    Arc::clone(&store),
                    Arc::clone(&options),
                );
                let handle = tokio::spawn(async move {
                    output
                        .process(&topology, &event, store.as_ref(), &options)
                        .await
                        .map(|(outcome, _)| outcome.failures)
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
            1 if io => tokio::time::sleep(std::time::Duration::from_micros(300)).await,
            1 => tokio::task::yield_now().await,
            2 => {
                // The event source gives up waiting: the partitions go to a retry while
                // the invocation keeps running.
                let (id, inv) = &mut running[chosen.2];
                if trace {
                    println!("invocation {id} {:?} times out", inv.batch);
                }
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
                if trace {
                    println!("invocation {id} {:?} crashes", inv.batch);
                }
                inv.handle.abort();
                let _ = inv.handle.await;
                stats.crashes += 1;
                envs[inv.env].2 = false; // the container is gone, with its producers
                for tp in inv.batch.keys() {
                    if busy.get(tp) == Some(&id) {
                        busy.remove(tp);
                    }
                }
            }
            4 => {
                let mut log = broker.log();
                let i = rng.below(log.markers.len() as u64) as usize;
                log.deliver_marker(i);
            }
            5 => {
                let mut log = broker.log();
                let i = rng.below(log.to_materialise.len() as u64) as usize;
                log.materialise(i);
            }
            _ => {
                let tid = ongoing[rng.below(ongoing.len() as u64) as usize].clone();
                if trace {
                    println!("the coordinator times out {tid}'s transaction");
                }
                broker.log().timeout_abort(&tid);
                stats.txn_timeouts += 1;
            }
        }
    }
    for (_, inv) in running.drain(..) {
        inv.handle.abort();
        let _ = inv.handle.await;
    }
    if !complete {
        return Err(format!("the schedule did not complete: {stats:?}"));
    }
    // One more batch per partition (its last record again, as the event source redelivers
    // an old range): a window that a fenced zombie claimed after its partition's last batch
    // is emitted by that partition's next batch (docs/state.md, the claims' liveness limit).
    for tp in source.partitions() {
        let len = source.records(&tp).len() as i64;
        if len == 0 {
            continue;
        }
        let event = source.event(&BTreeMap::from([(tp.clone(), (len - 1, len - 1))]));
        let output = ExactlyOnceOutput::new("app", Arc::new(broker.clone()))
            .reread_committed(repartition.iter().cloned());
        let done = tokio::spawn({
            let (topology, store, options) = (
                Arc::clone(&topology),
                Arc::clone(&store),
                Arc::clone(&options),
            );
            async move {
                output
                    .process(&topology, &event, store.as_ref(), &options)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        });
        loop {
            if done.is_finished() {
                break;
            }
            // The coordinator completes what the batch waits on.
            {
                let mut log = broker.log();
                while !log.markers.is_empty() {
                    log.deliver_marker(0);
                }
                while !log.to_materialise.is_empty() {
                    log.materialise(0);
                }
            }
            if io {
                tokio::time::sleep(std::time::Duration::from_micros(300)).await;
            } else {
                tokio::task::yield_now().await;
            }
        }
        done.await
            .unwrap()
            .map_err(|e| format!("the last batch of {tp}: {e}"))?;
        let mut log = broker.log();
        while !log.markers.is_empty() {
            log.deliver_marker(0);
        }
        while !log.to_materialise.is_empty() {
            log.materialise(0);
        }
    }
    let log = broker.log();
    if trace {
        for (tp, records) in &source.inputs {
            for r in records {
                println!(
                    "input {tp} @{} {:?}={:?} t={}",
                    r.offset,
                    r.key.as_deref().map(String::from_utf8_lossy),
                    r.value.as_deref().map(String::from_utf8_lossy),
                    r.timestamp
                );
            }
        }
        for (topic, records) in &log.topics {
            for (r, txn) in records {
                println!(
                    "log {topic} {:?}={:?} t={:?} v={:?} txn={txn:?} {:?}",
                    r.key.as_deref().map(String::from_utf8_lossy),
                    r.value.as_deref().map(String::from_utf8_lossy),
                    r.timestamp,
                    r.header(VERSION_HEADER).map(String::from_utf8_lossy),
                    log.txns.get(txn)
                );
            }
        }
    }
    let mut outputs = Vec::new();
    for topic in log.topics.keys() {
        if reads.contains(topic) {
            continue;
        }
        outputs.extend(log.committed_view(topic).into_iter().cloned());
    }
    Ok(Run {
        outputs,
        log: vec![format!("{stats:?}")],
    })
}

/// The exactly-once checks the generative comparison does not make for updates: no update
/// of a key seen twice with one version (a value and a tombstone of one version are two
/// updates: a record within a session merges it into a new session of the same bounds,
/// Kafka Streams' tombstone of the old one then the new value, in one write), and no
/// internal header in the output. A topic whose reference is a stream's records
/// (`Expected::Records`) is compared as an exact multiset already, which finds any copy;
/// there one write may also emit several records of a key with the item's one version (a
/// left or outer join's closing pass releasing two records of the key, a grace join's
/// releasing two held records), so its versions are not checked here.
fn check_once(run: &Run, expected: &[reference::Expected]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    let records_only: BTreeSet<String> = expected
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, reference::Expected::Records(_)))
        .map(|(i, _)| format!("o{i}"))
        .collect();
    for r in &run.outputs {
        if r.header(TRANSACTION_HEADER).is_some() {
            return Err(format!(
                "{}: the internal transaction header leaked",
                r.topic
            ));
        }
        if records_only.contains(&r.topic) {
            continue;
        }
        if let Some(version) = r.header(VERSION_HEADER)
            && !seen.insert((
                r.topic.clone(),
                r.key.clone(),
                version.to_vec(),
                r.value.is_none(),
            ))
        {
            return Err(format!(
                "{}: key {:?} seen twice with version {:?} ({:?})",
                r.topic,
                r.key.as_deref().map(String::from_utf8_lossy),
                String::from_utf8_lossy(version),
                run.log
            ));
        }
    }
    Ok(())
}

enum Verdict {
    Passed,
    Refused(String),
    Failed(String),
}

/// A fresh store for one case.
pub type NewStore<'a> = &'a dyn Fn() -> Arc<dyn Store>;

fn run_case(
    rt: &tokio::runtime::Runtime,
    family: &str,
    seed: u64,
    new_store: NewStore,
    io: bool,
) -> (Plan, Verdict) {
    let mut rng = Rng::new(seed);
    let plan = Plan::generate(family, &mut rng);
    let inputs = Inputs::generate(&plan, &mut rng);
    // The builder's refusals are expected panics: kept off the output.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let built = catch_unwind(AssertUnwindSafe(|| {
        plan.build_with(OutputGuarantee::ExactlyOnce)
    }));
    std::panic::set_hook(hook);
    let topology = match built {
        Ok(t) => Arc::new(t),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            return (plan, Verdict::Refused(message));
        }
    };
    let expected = reference::evaluate(&plan, &inputs);
    let store = new_store();
    let mut schedule_rng = Rng::new(seed ^ 0x00e0_5eed);
    let result = rt
        .block_on(schedule(
            topology,
            &plan,
            &inputs,
            Arc::clone(&store),
            &mut schedule_rng,
            io,
        ))
        .and_then(|run| {
            check_once(&run, &expected)?;
            harness::compare(&plan, &expected, &run, Fault::None)
        })
        .and_then(|()| harness::check_window_state(&plan, &inputs, store.as_ref()));
    match result {
        Ok(()) => (plan, Verdict::Passed),
        Err(e) => (plan, Verdict::Failed(e)),
    }
}

fn families() -> Vec<String> {
    match std::env::var("EOS_GENERATIVE_FAMILIES") {
        Ok(v) if !v.is_empty() => v.split(',').map(|s| s.trim().to_owned()).collect(),
        _ => DEFAULT_FAMILIES.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[test]
fn every_topology_accepted_under_exactly_once_output_is_seen_once_by_read_committed() {
    // This file is also a module of the test on DynamoDB; the in-memory run is this crate's.
    if module_path!() != "eos_generative" {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    run_all(&rt, 40, &|| Arc::new(MemoryStore::new()), false);
}

/// Runs `cases` cases (or `EOS_GENERATIVE_CASES`) of every family on `rt`, each on a store
/// from `new_store` (`io`: behind the network); panics with each failing family's first
/// failing case.
pub fn run_all(rt: &tokio::runtime::Runtime, cases: u64, new_store: NewStore, io: bool) {
    if let Ok(replay) = std::env::var("EOS_GENERATIVE_SEED") {
        let (family, seed) = replay.split_once(':').expect("<family>:<seed>");
        let (plan, verdict) =
            run_case(rt, family, seed.parse().expect("a u64 seed"), new_store, io);
        println!("plan: {plan:#?}");
        match verdict {
            Verdict::Passed => println!("passed"),
            Verdict::Refused(m) => println!("refused: {m}"),
            Verdict::Failed(m) => panic!("{replay} failed: {m}"),
        }
        return;
    }
    let cases: u64 = std::env::var("EOS_GENERATIVE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let mut failures = Vec::new();
    let mut accepted_total = 0;
    for family in families() {
        let (mut passed, mut refused, mut failed) = (0, 0, 0);
        let mut refusal = None;
        let mut first_failure = None;
        for index in 0..cases {
            let seed = generative::plan::mix(
                index
                    ^ family.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
                    }),
            );
            match run_case(rt, &family, seed, new_store, io).1 {
                Verdict::Passed => passed += 1,
                Verdict::Refused(m) => {
                    refused += 1;
                    refusal.get_or_insert(m);
                }
                Verdict::Failed(m) => {
                    failed += 1;
                    first_failure
                        .get_or_insert(format!("EOS_GENERATIVE_SEED={family}:{seed}\n{m}"));
                }
            }
        }
        accepted_total += passed + failed;
        println!(
            "family {family:<34} passed {passed:>4}  refused {refused:>4}  failed {failed:>4}{}",
            refusal
                .map(|m| format!("  (refusal: {})", m.lines().next().unwrap_or_default()))
                .unwrap_or_default()
        );
        failures.extend(first_failure);
    }
    assert!(accepted_total > 0, "every case was refused");
    assert!(
        failures.is_empty(),
        "{} families failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
