//! The in-test event source (per-partition logs of every topic, batches, fault
//! schedules) and the comparison of what the topology produced with the reference.

use std::collections::{BTreeMap, BTreeSet};

use lambda_streams::event::{
    EventSource, Header, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Nullable, Serde, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord, UnreachableSink, VERSION_HEADER};
use lambda_streams::state::Store;
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{BatchOptions, PoisonPolicy, Topology};

use super::plan::{Inputs, K, Look, LookUpdates, PARTITIONS, Plan, Rng, V, partition_of};
use super::reference::Expected;

/// Which faults a schedule may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every batch delivered once and succeeds.
    None,
    /// Duplicates, crashes after k writes with same or shifted retries, zombies,
    /// redeliveries of old ranges.
    Any,
}

/// What a schedule produced to the output topics `o<i>`, in production order.
pub struct Run {
    pub outputs: Vec<OutputRecord>,
    /// The faults injected, for the failure report.
    pub log: Vec<String>,
}

/// The event source: every topic's partitions as logs, a committed offset per partition.
struct Source {
    logs: BTreeMap<TopicPartition, Vec<Record>>,
    committed: BTreeMap<TopicPartition, usize>,
    /// The topics the topology reads (inputs and repartition topics).
    reads: BTreeSet<String>,
    outputs: Vec<OutputRecord>,
    round_robin: i32,
    options: BatchOptions,
}

type Range = (TopicPartition, usize, usize);

impl Source {
    fn event(&self, ranges: &[Range]) -> KafkaEvent {
        KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: "generative:9092".to_owned(),
            partitions: ranges
                .iter()
                .map(|(tp, from, to)| PartitionRecords {
                    tp: tp.clone(),
                    records: self.logs[tp][*from..*to].to_vec(),
                })
                .collect(),
        }
    }

    /// Takes what a batch produced: records of topics the topology reads are appended to
    /// their partition's log (by key, as the producer partitions), with their headers;
    /// the others are outputs.
    fn absorb(&mut self, produced: Vec<OutputRecord>) {
        for r in produced {
            if !self.reads.contains(&r.topic) {
                self.outputs.push(r);
                continue;
            }
            let p = partition_of(r.key.as_deref()).unwrap_or_else(|| {
                self.round_robin = (self.round_robin + 1) % PARTITIONS;
                self.round_robin
            });
            let tp = TopicPartition::new(r.topic.as_str(), p);
            let log = self.logs.entry(tp.clone()).or_default();
            self.committed.entry(tp).or_insert(0);
            let offset = log.len() as i64;
            log.push(Record {
                offset,
                timestamp: r.timestamp.unwrap_or_default(),
                timestamp_type: TimestampType::CreateTime,
                key: r.key.map(Into::into),
                value: r.value.map(Into::into),
                headers: r
                    .headers
                    .into_iter()
                    .map(|(n, v)| Header::new(n.as_str(), v))
                    .collect(),
                key_schema_metadata: None,
                value_schema_metadata: None,
            });
        }
    }

    /// The partitions with records not committed yet (table topics first: until they are
    /// caught up, only they).
    fn lagging(&self) -> Vec<TopicPartition> {
        let lag: Vec<TopicPartition> = self
            .logs
            .iter()
            .filter(|(tp, log)| self.committed.get(*tp).copied().unwrap_or(0) < log.len())
            .map(|(tp, _)| tp.clone())
            .collect();
        let tables: Vec<TopicPartition> = lag
            .iter()
            .filter(|tp| tp.topic == "t0" || tp.topic == "t1")
            .cloned()
            .collect();
        if tables.is_empty() { lag } else { tables }
    }
}

fn process(
    topology: &Topology,
    event: &KafkaEvent,
    store: &dyn Store,
    source: &mut Source,
) -> Result<(), String> {
    let sink = MemorySink::new();
    let result =
        futures::executor::block_on(topology.process_with(event, store, &sink, &source.options));
    source.absorb(sink.records());
    result.map(|_| ()).map_err(|e| e.to_string())
}

/// [`process`] with a producer that fails: nothing is produced.
fn process_unreachable(
    topology: &Topology,
    event: &KafkaEvent,
    store: &dyn Store,
    source: &Source,
) -> Result<(), String> {
    futures::executor::block_on(topology.process_with(
        event,
        store,
        &UnreachableSink,
        &source.options,
    ))
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// An input partition's records as the event carries them (a bad record's value does not
/// decode).
pub fn input_log(records: &[super::plan::In]) -> Vec<Record> {
    records
        .iter()
        .enumerate()
        .map(|(offset, r)| Record {
            offset: offset as i64,
            timestamp: r.ts,
            timestamp_type: TimestampType::CreateTime,
            key: Nullable(Utf8).serialize(&r.key).map(Into::into),
            value: if r.bad {
                Some(b"#not-a-number".to_vec().into())
            } else {
                Nullable(DecimalI64).serialize(&r.value).map(Into::into)
            },
            headers: Vec::new(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        })
        .collect()
}

/// Runs the inputs through `topology` batch by batch, with the faults of `faults`.
pub fn run_schedule(
    topology: &Topology,
    store: &dyn Store,
    plan: &Plan,
    inputs: &Inputs,
    faults: Fault,
    rng: &mut Rng,
) -> Result<Run, String> {
    let reads: BTreeSet<String> = topology.source_topics().into_iter().collect();
    let mut options = BatchOptions::default();
    if plan.poison {
        options.poison = PoisonPolicy::Skip;
    }
    // Every input topic the topology reads, declared (emit-on-close windows wait for
    // each of their partitions).
    for topic in ["s0", "s1", "t0", "t1"] {
        if reads.contains(topic) {
            options
                .source_partitions
                .insert(topic.to_owned(), PARTITIONS);
        }
    }
    let mut source = Source {
        logs: BTreeMap::new(),
        committed: BTreeMap::new(),
        reads,
        outputs: Vec::new(),
        round_robin: 0,
        options,
    };
    for ((topic, p), records) in &inputs.logs {
        if !source.reads.contains(topic) {
            continue;
        }
        let tp = TopicPartition::new(topic.as_str(), *p);
        let log: Vec<Record> = input_log(records);
        source.committed.insert(tp.clone(), 0);
        source.logs.insert(tp, log);
    }
    let max_batch = rng.range(1, 8) as usize;
    let mut log = Vec::new();
    let mut zombies: Vec<KafkaEvent> = Vec::new();
    let mut steps = 0;
    loop {
        steps += 1;
        if steps > 10_000 {
            return Err("the schedule does not end (records keep coming back)".to_owned());
        }
        let lagging = source.lagging();
        if lagging.is_empty() {
            break;
        }
        // One to three lagging partitions in one event.
        let mut ranges: Vec<Range> = Vec::new();
        for _ in 0..rng.range(1, 3) {
            let tp = rng.pick(&lagging);
            if ranges.iter().any(|(t, _, _)| *t == tp) {
                continue;
            }
            let from = source.committed[&tp];
            let to = (from + rng.range(1, max_batch as i64) as usize).min(source.logs[&tp].len());
            ranges.push((tp, from, to));
        }
        let event = source.event(&ranges);
        let fault = if faults == Fault::Any && rng.chance(40) {
            rng.below(6)
        } else {
            9
        };
        let mut committed_ranges = ranges.clone();
        match fault {
            0 => {
                log.push(format!("duplicate {ranges:?}"));
                process(topology, &event, store, &mut source)
                    .map_err(|e| format!("batch {ranges:?}: {e}"))?;
            }
            1 | 2 => {
                // A crash after k state writes, then a retry: same boundaries, or the
                // same start and a later end.
                let k = rng.below(4);
                let faulty = FaultyStore::new(store).crash_after(k);
                let crashed = process(topology, &event, &faulty, &mut source);
                if fault == 2 {
                    for (tp, _, to) in &mut committed_ranges {
                        *to = (*to + rng.below(3) as usize).min(source.logs[tp].len());
                    }
                }
                log.push(format!(
                    "crash after {k} writes ({crashed:?}) then retry {committed_ranges:?}"
                ));
            }
            3 => {
                // A zombie: this attempt finishes after its retry (and later batches).
                log.push(format!("zombie {ranges:?}"));
                zombies.push(event.clone());
                for (tp, _, to) in &mut committed_ranges {
                    *to = (*to + rng.below(2) as usize).min(source.logs[tp].len());
                }
            }
            5 => {
                // A crash after k state writes, retried later: the event source goes on
                // with the other partitions, and the failed ones are delivered again from
                // the same offsets when the schedule picks them (as an event source
                // retries a failed batch while other partitions' batches run). The crash
                // comes after k state writes, or after all of them (its producer fails).
                let crashed = if rng.chance(50) {
                    let k = rng.below(4);
                    let faulty = FaultyStore::new(store).crash_after(k);
                    let crashed = process(topology, &event, &faulty, &mut source);
                    log.push(format!(
                        "crash after {k} writes ({crashed:?}) of {ranges:?}, retried later"
                    ));
                    crashed
                } else {
                    let crashed = process_unreachable(topology, &event, store, &source);
                    log.push(format!(
                        "crash at producing ({crashed:?}) of {ranges:?}, retried later"
                    ));
                    crashed
                };
                if crashed.is_err() {
                    continue;
                }
            }
            4 => {
                // Redelivery of an old range of a partition.
                let done: Vec<(TopicPartition, usize)> = source
                    .committed
                    .iter()
                    .filter(|(_, c)| **c > 0)
                    .map(|(tp, c)| (tp.clone(), *c))
                    .collect();
                if !done.is_empty() {
                    let (tp, c) = rng.pick(&done);
                    let from = rng.below(c as u64) as usize;
                    let to = (from + rng.range(1, 4) as usize).min(c);
                    let old = source.event(&[(tp.clone(), from, to)]);
                    log.push(format!("redeliver {tp}[{from}..{to})"));
                    process(topology, &old, store, &mut source)
                        .map_err(|e| format!("redelivery {tp}[{from}..{to}): {e}"))?;
                }
            }
            _ => {}
        }
        let event = source.event(&committed_ranges);
        process(topology, &event, store, &mut source)
            .map_err(|e| format!("batch {committed_ranges:?}: {e}"))?;
        for (tp, _, to) in &committed_ranges {
            source.committed.insert(tp.clone(), *to);
        }
        if !zombies.is_empty() && rng.chance(50) {
            let zombie = zombies.remove(0);
            process(topology, &zombie, store, &mut source).map_err(|e| format!("zombie: {e}"))?;
        }
    }
    for zombie in zombies {
        process(topology, &zombie, store, &mut source).map_err(|e| format!("zombie: {e}"))?;
    }
    Ok(Run {
        outputs: source.outputs,
        log,
    })
}

fn decode(r: &OutputRecord) -> Result<(K, V, i64), String> {
    let key = Nullable(Utf8)
        .deserialize(r.key.as_deref())
        .map_err(|e| e.0)?;
    let value = Nullable(DecimalI64)
        .deserialize(r.value.as_deref())
        .map_err(|e| e.0)?;
    Ok((key, value, r.timestamp.unwrap_or_default()))
}

/// Compares the outputs of a run with the reference.
pub fn compare(plan: &Plan, expected: &[Expected], run: &Run, faults: Fault) -> Result<(), String> {
    for (i, want) in expected.iter().enumerate() {
        let topic = format!("o{i}");
        let records: Vec<&OutputRecord> = run.outputs.iter().filter(|r| r.topic == topic).collect();
        match want {
            Expected::Records(want) => {
                let mut got = records
                    .iter()
                    .map(|r| decode(r))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut want = want.clone();
                if plan.ignore_timestamps {
                    got.iter_mut().for_each(|r| r.2 = 0);
                    want.iter_mut().for_each(|r| r.2 = 0);
                    want.sort();
                }
                let want = &want;
                got.sort();
                let ok = if faults == Fault::None {
                    got == *want
                } else {
                    // At least once: every expected record, nothing else, copies allowed.
                    let got: BTreeSet<_> = got.iter().collect();
                    let want_set: BTreeSet<_> = want.iter().collect();
                    got == want_set
                };
                if !ok {
                    return Err(format!(
                        "topic {topic}: produced (sorted) {got:?}\nreference {want:?}\nfaults: {:?}",
                        run.log
                    ));
                }
            }
            Expected::Finals {
                values: want,
                times,
            } => {
                let got = records
                    .iter()
                    .map(|r| decode(r))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut finals: BTreeMap<String, i64> = BTreeMap::new();
                let mut problems = Vec::new();
                for (key, value, timestamp) in &got {
                    let (Some(key), Some(value)) = (key, value) else {
                        problems.push(format!("a final without key or value: {key:?}={value:?}"));
                        continue;
                    };
                    // Kafka Streams' timestamp: the window's newest record time.
                    if !plan.ignore_timestamps
                        && let Some(want) = times.get(key)
                        && want != timestamp
                    {
                        problems.push(format!(
                            "{key} emitted at {timestamp}, newest record {want}"
                        ));
                    }
                    match finals.insert(key.clone(), *value) {
                        Some(old) if old != *value => {
                            problems.push(format!("{key} emitted as {old} and as {value}"))
                        }
                        // Once per window; a copy only under faults (a crash between the
                        // emission and the marking), with the same value.
                        Some(_) if faults == Fault::None => {
                            problems.push(format!("{key} emitted twice"))
                        }
                        _ => {}
                    }
                }
                if !problems.is_empty() || finals != *want {
                    return Err(format!(
                        "topic {topic}: finals {finals:?}\nreference {want:?}\nproblems: {problems:?}\nfaults: {:?}",
                        run.log
                    ));
                }
            }
            Expected::Sessions { sessions, horizon } => {
                // Per session, the update with the highest version (its key's item version)
                // is the current one; a tombstone (a session merged away) deletes it. Within
                // one version (one batch), the tombstones come before the sessions.
                let mut latest: BTreeMap<String, (u64, Option<i64>)> = BTreeMap::new();
                for r in &records {
                    let (key, value, _) = decode(r)?;
                    let Some(key) = key else {
                        return Err(format!("topic {topic}: a session without key"));
                    };
                    let version = version_of(r)?;
                    let entry = latest.entry(key.clone()).or_insert((0, None));
                    if version > entry.0 {
                        *entry = (version, value);
                    } else if version == entry.0 {
                        if let (Some(old), Some(new)) = (entry.1, value)
                            && old != new
                        {
                            return Err(format!(
                                "topic {topic}: session {key} version {version} emitted as {old} and as {new}"
                            ));
                        }
                        if value.is_some() {
                            entry.1 = value;
                        }
                    }
                }
                let current: BTreeMap<String, (u64, BTreeMap<String, i64>)> = latest
                    .into_iter()
                    .filter_map(|(k, (_, v))| v.map(|v| (k.clone(), (0, BTreeMap::from([(k, v)])))))
                    .collect();
                let end_of = |key: &str| -> (String, i64) {
                    let (group, window) = key.rsplit_once('@').unwrap_or((key, "0-0"));
                    let end = window
                        .rsplit_once('-')
                        .and_then(|(_, e)| e.parse().ok())
                        .unwrap_or(i64::MAX);
                    (group.to_owned(), end)
                };
                let recent = |key: &String| {
                    let (group, end) = end_of(key);
                    horizon.get(&group).is_none_or(|h| end >= *h)
                };
                let got: BTreeMap<String, i64> = current
                    .into_values()
                    .flat_map(|(_, s)| s)
                    .filter(|(k, _)| recent(k))
                    .collect();
                let want: BTreeMap<String, i64> = sessions
                    .iter()
                    .filter(|(k, _)| recent(k))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                if got != want {
                    return Err(format!(
                        "topic {topic}: current sessions {got:?}\nreference {want:?}\nfaults: {:?}",
                        run.log
                    ));
                }
            }
            Expected::Windows {
                values: want,
                times,
            } => {
                // Per window, the update with the highest version is the latest; it carries
                // the window's newest record time (Kafka Streams'), also under faults.
                let mut latest: BTreeMap<String, (u64, Option<i64>, i64)> = BTreeMap::new();
                for r in &records {
                    let (key, value, timestamp) = decode(r)?;
                    let key = key
                        .ok_or_else(|| format!("topic {topic}: a window update with a null key"))?;
                    let version = version_of(r)?;
                    match latest.get(&key) {
                        Some((v, old, at))
                            if *v == version && (*old != value || *at != timestamp) =>
                        {
                            return Err(format!(
                                "topic {topic}: window {key} version {version} emitted as {old:?}@{at} and as {value:?}@{timestamp}"
                            ));
                        }
                        Some((v, _, _)) if *v >= version => {}
                        _ => {
                            latest.insert(key, (version, value, timestamp));
                        }
                    }
                }
                let mut problems = Vec::new();
                if !plan.ignore_timestamps {
                    for (key, (_, _, timestamp)) in &latest {
                        if let Some(want) = times.get(key)
                            && want != timestamp
                        {
                            problems.push(format!(
                                "{key} last emitted at {timestamp}, newest record {want}"
                            ));
                        }
                    }
                }
                let got: BTreeMap<String, i64> = latest
                    .into_iter()
                    .filter_map(|(k, (_, v, _))| v.map(|v| (k, v)))
                    .collect();
                if got != *want || !problems.is_empty() {
                    return Err(format!(
                        "topic {topic}: windows {got:?}\nreference {want:?}\nproblems: {problems:?}\nfaults: {:?}",
                        run.log
                    ));
                }
            }
            Expected::Table(want) => table_updates(&topic, &records, want, None, run)?,
            Expected::Looked { finals, held, look } => looked_up(
                &topic,
                &run.outputs,
                finals,
                held.as_ref(),
                *look,
                faults,
                run,
            )?,
            Expected::TableAt(want, times) => {
                table_updates(&topic, &records, want, Some(times), run)?
            }
        }
    }
    Ok(())
}

/// Checks a table's updates on `topic`: per key, the update with the highest version holds
/// the reference's final value (`want`) and, for the keys in `times`, its timestamp.
///
/// Every table update carries a version that grows with each change of its key: its item's
/// version, or for a table–table join the sum of its two sides' versions (each read after
/// the batch's writes; under exactly-once output, the version of the join's decision item),
/// so the highest is the latest, also under faults.
fn table_updates(
    topic: &str,
    records: &[&OutputRecord],
    want: &BTreeMap<String, i64>,
    times: Option<&BTreeMap<String, i64>>,
    run: &Run,
) -> Result<(), String> {
    let mut latest: BTreeMap<String, (u64, Option<i64>, i64)> = BTreeMap::new();
    for r in records {
        let (key, value, ts) = decode(r)?;
        let key = key.ok_or_else(|| format!("topic {topic}: a table update with a null key"))?;
        let version = version_of(r)?;
        // Only the value is compared between updates of one version: copies of an
        // aggregation's update carry the highest timestamp of their batch's records, and
        // a join's version (a sum) can be reached from two states of equal value. The
        // highest version is reached only from both sides' final states, so its timestamp
        // is fixed.
        match latest.get(&key) {
            Some((v, old, _)) if *v == version && *old != value => {
                return Err(format!(
                    "topic {topic}: key {key} version {version} emitted as {old:?} and as {value:?}"
                ));
            }
            Some((v, _, _)) if *v >= version => {}
            _ => {
                latest.insert(key, (version, value, ts));
            }
        }
    }
    let got: BTreeMap<String, i64> = latest
        .iter()
        .filter_map(|(k, (_, v, _))| v.map(|v| (k.clone(), v)))
        .collect();
    if got != *want {
        return Err(format!(
            "topic {topic}: final table {got:?}\nreference   {want:?}\nfaults: {:?}",
            run.log
        ));
    }
    if let Some(times) = times {
        let got: BTreeMap<String, i64> = latest
            .iter()
            .filter(|(k, _)| times.contains_key(*k))
            .map(|(k, (_, _, ts))| (k.clone(), *ts))
            .collect();
        if got != *times {
            return Err(format!(
                "topic {topic}: final updates' timestamps {got:?}\nreference {times:?}\nfaults: {:?}",
                run.log
            ));
        }
    }
    Ok(())
}

/// Per key (prefix removed), per version, the values of the updates on `topic` whose key
/// starts with `prefix` (`""`: all of them).
type ByVersion = BTreeMap<String, BTreeMap<u64, Vec<V>>>;

fn by_version(topic: &str, outputs: &[OutputRecord], prefix: &str) -> Result<ByVersion, String> {
    let mut out = ByVersion::new();
    for r in outputs.iter().filter(|r| r.topic == topic) {
        let (key, value, _) = decode(r)?;
        let key = key.ok_or_else(|| format!("topic {topic}: an update with a null key"))?;
        let Some(key) = key.strip_prefix(prefix) else {
            continue;
        };
        out.entry(key.to_owned())
            .or_default()
            .entry(version_of(r)?)
            .or_default()
            .push(value);
    }
    Ok(out)
}

/// Checks a table's updates joined with a table ([`Look`]) on `topic`.
///
/// - Every key of the table has joined updates (an inner join with a topic's table: only
///   keys of the table), and those of its highest version are the table's final value
///   joined with a value the other table held for the key, or with none (left join), or
///   with the final value itself (the table's own key). An inner join with a topic's table
///   may drop the final value's update, so its highest version is not compared.
/// - When the table's plain updates are sent too, they end at its final values, and,
///   with every batch delivered once (also under exactly-once output, where the caller
///   gives [`Fault::None`]): each joined update's version is one of the plain updates',
///   and its value is that update's value joined with a value the other table held (its
///   own table: the value of that version or a later one); and a left join, or a join
///   with the table's own key, joins every version. At least once, the copies of one
///   version may carry different lookups (a retry reads the other table again): each
///   must be such a join. (Under exactly-once output, the caller checks one update per
///   version.)
fn looked_up(
    topic: &str,
    outputs: &[OutputRecord],
    finals: &BTreeMap<String, i64>,
    held: Option<&BTreeMap<String, BTreeSet<Option<i64>>>>,
    look: Look,
    faults: Fault,
    run: &Run,
) -> Result<(), String> {
    let fail = |what: String| Err(format!("topic {topic}: {what}\nfaults: {:?}", run.log));
    let (joined, updates) = match look.updates {
        LookUpdates::None => (by_version(topic, outputs, "")?, None),
        LookUpdates::Separate => (
            by_version(topic, outputs, "")?,
            Some(by_version(&format!("{topic}u"), outputs, "")?),
        ),
        LookUpdates::Merged => (
            by_version(topic, outputs, "j:")?,
            Some(by_version(topic, outputs, "u:")?),
        ),
    };
    if look.updates == LookUpdates::Merged
        && let Some(r) = outputs.iter().filter(|r| r.topic == topic).find(|r| {
            let key = decode(r).ok().and_then(|(k, _, _)| k).unwrap_or_default();
            !key.starts_with("j:") && !key.starts_with("u:")
        })
    {
        return fail(format!(
            "a merged update keyed neither j: nor u: ({:?})",
            decode(r)
        ));
    }
    let none = BTreeSet::new();
    // The values the other table may have held for `key` at the update of `version`.
    let partners = |key: &str, version: u64| -> Option<BTreeSet<Option<i64>>> {
        Some(match held {
            Some(held) => {
                let held = held.get(key).unwrap_or(&none);
                let mut all: BTreeSet<Option<i64>> = held.iter().copied().collect();
                if look.inner {
                    all.remove(&None);
                } else {
                    all.insert(None);
                }
                all
            }
            None => updates
                .as_ref()?
                .get(key)?
                .range(version..)
                .flat_map(|(_, values)| values.iter().copied())
                .collect(),
        })
    };
    let got: BTreeSet<&String> = joined.keys().collect();
    let want: BTreeSet<&String> = finals.keys().collect();
    let partial = look.inner && held.is_some();
    if got != want && !(partial && got.is_subset(&want)) {
        return fail(format!(
            "joined updates of the keys {got:?}, the table's keys {want:?}"
        ));
    }
    for (key, last) in finals {
        let Some((version, values)) = joined.get(key).and_then(|v| v.last_key_value()) else {
            continue;
        };
        if partial {
            continue;
        }
        let mut valid: BTreeSet<V> = BTreeSet::new();
        match held {
            Some(held) => {
                let held = held.get(key).unwrap_or(&none);
                for x in std::iter::once(None).chain(held.iter().copied()) {
                    valid.insert(super::plan::stream_joiner(Some(*last), x));
                }
            }
            None => {
                valid.insert(super::plan::stream_joiner(Some(*last), Some(*last)));
            }
        }
        if let Some(value) = values.iter().find(|v| !valid.contains(v)) {
            return fail(format!(
                "key {key} version {version} is {value:?}, not the final value {last} joined \
                 with one the table held ({:?}) or none",
                held.map(|h| h.get(key))
            ));
        }
    }
    let Some(updates) = &updates else {
        return Ok(());
    };
    for (key, last) in finals {
        let latest = updates.get(key).and_then(|v| v.last_key_value());
        if latest.is_none_or(|(_, values)| values.iter().any(|v| *v != Some(*last))) {
            return fail(format!(
                "key {key}: the table's last plain updates {latest:?}, its final value {last}"
            ));
        }
    }
    if faults != Fault::None {
        return Ok(());
    }
    for (key, versions) in &joined {
        let plain = updates.get(key).cloned().unwrap_or_default();
        for (version, values) in versions {
            let Some(value) = plain.get(version).and_then(|v| v.first()) else {
                return fail(format!(
                    "key {key}: a joined update of version {version}, which no plain update has \
                     (versions {:?})",
                    plain.keys().collect::<Vec<_>>()
                ));
            };
            let partners = partners(key, *version).unwrap_or_default();
            let valid: BTreeSet<V> = partners
                .iter()
                .map(|x| super::plan::stream_joiner(*value, *x))
                .collect();
            if let Some(bad) = values.iter().find(|v| !valid.contains(v)) {
                return fail(format!(
                    "key {key} version {version}: joined {bad:?}, not the update's {value:?} \
                     joined with one of {partners:?}"
                ));
            }
        }
        if !partial {
            let missing: Vec<&u64> = plain.keys().filter(|v| !versions.contains_key(v)).collect();
            if !missing.is_empty() {
                return fail(format!(
                    "key {key}: the versions {missing:?} of the table's updates were never \
                     joined (joined: {:?})",
                    versions.keys().collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(())
}

/// The version header of an emitted update.
fn version_of(r: &OutputRecord) -> Result<u64, String> {
    let header = r
        .header(VERSION_HEADER)
        .ok_or_else(|| format!("topic {}: an update without {VERSION_HEADER}", r.topic))?;
    std::str::from_utf8(header)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "bad version header".to_owned())
}

/// The store a plan with one time-windowed output aggregates into (`Builder::windowed`
/// names it first).
const WINDOW_STORE: &str = "win1";

/// For a plan whose one output is a time-windowed aggregation: the store's readers
/// (`Store::windows`, which leave out items past their TTL, as DynamoDB's reads do) see
/// every window the reference holds at the end, and no other; an additive window's
/// number is the reference's. This is what catches windows born expired (a TTL from
/// event time alone), which the outputs do not show.
pub fn check_window_state(plan: &Plan, inputs: &Inputs, store: &dyn Store) -> Result<(), String> {
    let Some(want) = super::reference::window_items(plan, inputs) else {
        return Ok(());
    };
    let mut by_key: BTreeMap<String, BTreeMap<i64, i64>> = BTreeMap::new();
    for (window, value) in &want {
        let (key, start) = window
            .rsplit_once('@')
            .ok_or_else(|| format!("reference window {window:?}"))?;
        let start: i64 = start
            .parse()
            .map_err(|_| format!("reference window {window:?}"))?;
        by_key
            .entry(key.to_owned())
            .or_default()
            .insert(start, *value);
    }
    for (key, want) in &by_key {
        let bytes = Nullable(Utf8)
            .serialize(&Some(key.clone()))
            .ok_or("a key serialized to null")?;
        let got =
            futures::executor::block_on(store.windows(WINDOW_STORE, &bytes, i64::MIN, i64::MAX))
                .map_err(|e| format!("reading the windows of {key:?}: {e}"))?;
        let starts: BTreeSet<i64> = got.iter().map(|(start, _)| *start).collect();
        let wanted: BTreeSet<i64> = want.keys().copied().collect();
        if starts != wanted {
            return Err(format!(
                "store {WINDOW_STORE}, key {key:?}: readable windows {starts:?}, reference {wanted:?}"
            ));
        }
        for (start, state) in &got {
            if state.aggregate.is_none() && want.get(start) != Some(&state.value) {
                return Err(format!(
                    "store {WINDOW_STORE}, key {key:?}, window {start}: {} read, reference {:?}",
                    state.value,
                    want.get(start)
                ));
            }
        }
    }
    Ok(())
}
