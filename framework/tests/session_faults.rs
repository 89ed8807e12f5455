//! Session windows at least once, re-keyed directly so that two partitions write one key,
//! when a batch of one partition fails after its state write and another partition's batch
//! writes the key before the retry (an event source retries a failed batch while the other
//! partitions' batches run). The failed batch's record merged a session away; its retry
//! must still send that session's tombstone. Expected values follow Kafka Streams' session
//! semantics worked out by hand: records at 1,919 and 2,749 ms with a 1,500 ms gap form one
//! session `[1919, 2749]` (the session `[1919, 1919]` merged away: deleted), and a record at
//! 9,000 ms a session of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_streams::dsl::{Grouped, SessionWindows};
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{DecimalI64, Nullable, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord, UnreachableSink};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{StreamsBuilder, Topology};

/// The header with the version of an update.
const VERSION_HEADER: &str = "lambda-streams-version";

/// Counts per session (gap 1.5 s) of every click, all re-keyed directly to `all`.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("clicks", Utf8, Utf8)
        .group_by(|_, _| "all".to_owned(), Grouped::direct(Utf8))
        .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_millis(
            1_500,
        )))
        .count("sessions")
        .to_change_stream()
        .map(|w, v| (format!("{}@{}-{}", w.key, w.start, w.end), v))
        .to("counts", Utf8, Nullable(DecimalI64));
    builder.build()
}

/// An event of one record of `clicks`' partition `p` at `offset`, timestamp `ts`.
fn event(p: i32, offset: i64, ts: i64) -> KafkaEvent {
    let json = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{"clicks-{p}":[{{"topic":"clicks","partition":{p},"offset":{offset},"timestamp":{ts},"timestampType":"CREATE_TIME","key":"{key}","value":"{value}","headers":[]}}]}}}}"#,
        key = STANDARD.encode(format!("user{p}")),
        value = STANDARD.encode("click"),
    );
    KafkaEvent::decode(json.as_bytes()).expect("a valid event")
}

/// Per session, the update with the highest version (a tombstone before a value of the
/// same version, as one write sends them): its count, `None` for a deletion.
fn current(records: &[OutputRecord]) -> BTreeMap<String, Option<i64>> {
    let mut latest: BTreeMap<String, (u64, Option<i64>)> = BTreeMap::new();
    for r in records {
        let version: u64 = r
            .header(VERSION_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .expect("a versioned update");
        let key = String::from_utf8(r.key.clone().expect("a key")).expect("UTF-8");
        let count = r
            .value
            .as_deref()
            .map(|v| String::from_utf8_lossy(v).parse().expect("a decimal count"));
        if latest.get(&key).is_none_or(|(v, _)| *v <= version) {
            latest.insert(key, (version, count));
        }
    }
    latest.into_iter().map(|(k, (_, c))| (k, c)).collect()
}

#[tokio::test]
async fn a_retry_after_another_partition_s_batch_still_deletes_the_session_it_merged() {
    let topology = topology();
    let store = MemoryStore::new();
    let sink = MemorySink::new();
    let ok = |r: Result<_, lambda_streams::StreamError>| r.expect("the batch");
    // Partition 1: a session [1919, 1919].
    ok(topology.process(&event(1, 0, 1_919), &store, &sink).await);
    // Partition 2: a record that merges it into [1919, 2749]; written, not produced.
    let failed = topology
        .process(&event(2, 0, 2_749), &store, &UnreachableSink)
        .await;
    assert!(failed.is_err(), "the producer fails");
    // Partition 1 again, before partition 2's retry: a session of its own.
    ok(topology.process(&event(1, 1, 9_000), &store, &sink).await);
    // Partition 2's retry.
    ok(topology.process(&event(2, 0, 2_749), &store, &sink).await);
    let want = BTreeMap::from([
        ("all@1919-1919".to_owned(), None),
        ("all@1919-2749".to_owned(), Some(2)),
        ("all@9000-9000".to_owned(), Some(1)),
    ]);
    let records = sink.records();
    assert_eq!(current(&records), want, "{records:#?}");
}
