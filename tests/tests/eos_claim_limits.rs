//! A closing pass's pending claim counts towards its item's 400 KB, on DynamoDB (the
//! emulator) with real transactions on the broker (issue 15).
//!
//! Under exactly-once output a session closed by a closing pass keeps the records it
//! emitted in its item (the claim) until its partition's next batch finishes the claim. An
//! arrival of another partition meanwhile whose session fits alone but not beside the claim
//! is a poison record of that record: dead-lettered, naming it (topic-partition and
//! offset), the batch going on. Without the claim's bytes in the limit check, DynamoDB
//! refused the write (the item over 400 KB) and the batch failed on every retry, naming only
//! the store and key, until the claiming partition's next batch. The same record after the
//! claim is finished fits. Kafka's Java consumer (`read_committed`) reads the outputs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::{EmitStrategy, SessionWindows, SlidingWindows};
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::Utf8;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{BatchOptions, Guarantee, OutputGuarantee, PoisonPolicy, StreamsBuilder};
use lambda_streams_e2e::*;
use local_runner::admin;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_that_fits_only_without_a_pending_claim_is_dead_lettered_on_dynamodb() {
    require_services();
    let (input, closed, dlq) = (
        unique("claimlimit-in"),
        unique("claimlimit-closed"),
        unique("claimlimit-dlq"),
    );
    let servers = bootstrap();
    for topic in [&input, &closed, &dlq] {
        admin::create_topic(&servers, topic, 2)
            .await
            .expect("topic");
    }
    let table = unique("claimlimit");
    create_table(&dynamo_client(), &table).await.expect("table");
    let builder = StreamsBuilder::new();
    builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    builder
        .stream(&input, Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_millis(
            100,
        )))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .reduce("big", |a: String, b: String| a + &b, Utf8)
        .to_stream()
        .map(|w, v: String| (format!("{}@{}", w.key, w.start), v))
        .to(&closed, Utf8, Utf8);
    let handler = Handler::with_kafka_output(
        builder.build(),
        Arc::new(DynamoStore::new(
            dynamo_client(),
            table,
            Guarantee::ExactlyOnce,
        )),
        None,
    )
    .with_options(BatchOptions {
        source_partitions: [(input.clone(), 2)].into_iter().collect(),
        poison: PoisonPolicy::DeadLetter { topic: dlq.clone() },
        output: OutputGuarantee::ExactlyOnce,
        ..BatchOptions::default()
    })
    .with_application_id(unique("claimlimit-app"))
    .with_event_read_committed(true);
    // Record times near now (the window items' TTL counts from them).
    let base = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis(),
    )
    .expect("milliseconds fit in i64");
    let mut offsets = [0i64; 2];
    let mut run = async |p: usize, key: &str, value: String, at: i64| {
        let offset = offsets[p];
        offsets[p] += 1;
        let event = KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: bootstrap(),
            partitions: vec![PartitionRecords {
                tp: TopicPartition::new(input.as_str(), p as i32),
                records: vec![Record {
                    offset,
                    timestamp: base + at,
                    timestamp_type: TimestampType::CreateTime,
                    key: Some(key.to_owned().into_bytes().into()),
                    value: Some(value.into_bytes().into()),
                    headers: Vec::new(),
                    key_schema_metadata: None,
                    value_schema_metadata: None,
                }],
            }],
        };
        let report = handler
            .handle_event(&event)
            .await
            .unwrap_or_else(|e| panic!("partition {p} offset {offset}: {e}"));
        (offset, report)
    };
    let big = |c: char| std::iter::repeat_n(c, 150_000).collect::<String>();
    run(1, "x", "a".into(), 0).await;
    run(0, "k", big('b'), 0).await;
    run(1, "x", "a".into(), 4_000).await;
    // Both partitions at +4,000: the session k@+0 closes, claimed by partition 0's batch
    // (its 150,000 bytes kept in k's item until partition 0's next batch).
    run(0, "y", "a".into(), 4_000).await;
    // 150,000 bytes fit alone (a session item holds about twice its value), not beside the
    // claim: dead-lettered, the batch succeeds.
    let (offset, _) = run(1, "k", big('c'), 4_001).await;
    let letters = kafka_read_all(&dlq, "read_committed");
    assert_eq!(
        letters.len(),
        1,
        "{:?}",
        letters.iter().map(|r| &r.source).collect::<Vec<_>>()
    );
    assert_eq!(letters[0].source, format!("{input}:1:{offset}"));
    // Partition 0's next batch finishes the claim; the same record then fits.
    run(0, "z", "a".into(), 5_000).await;
    run(1, "k", big('c'), 5_001).await;
    assert_eq!(kafka_read_all(&dlq, "read_committed").len(), 1);
    let sessions: Vec<(String, usize)> = kafka_read_all(&closed, "read_committed")
        .into_iter()
        .map(|r| (r.key, r.value.len()))
        .collect();
    let k = format!("k@{base}");
    assert!(
        sessions
            .iter()
            .any(|(key, len)| *key == k && *len == 150_000),
        "the closed session k@+0, once: {sessions:?}"
    );
    assert_eq!(sessions.iter().filter(|(key, _)| *key == k).count(), 1);
}

/// Sliding windows of 100 ms, grace 0, emitted on close: a reduce concatenating values.
const DIFFERENCE: i64 = 100;

/// One key's `n` records of `size` bytes each, 1 ms apart.
fn big_windows_records(n: u8, size: usize) -> Vec<(String, i64)> {
    (0..n)
        .map(|i| {
            let c = char::from(b'a' + i % 26);
            (std::iter::repeat_n(c, size).collect(), i64::from(i))
        })
        .collect()
}

/// Kafka Streams' sliding windows of `records` (value, time; distinct times): each
/// record's left window `[t - d, t]`, and the right window `[t + 1, t + 1 + d]` of each
/// record with another in `(t, t + d]`; a window's value its records' values in time
/// order. By window start.
fn reference_sliding_windows(records: &[(String, i64)]) -> BTreeMap<i64, String> {
    let content = |start: i64, end: i64| -> String {
        let mut inside: Vec<&(String, i64)> = records
            .iter()
            .filter(|(_, t)| (start..=end).contains(t))
            .collect();
        inside.sort_by_key(|(_, t)| *t);
        inside.into_iter().map(|(v, _)| v.as_str()).collect()
    };
    let mut windows = BTreeMap::new();
    for (_, t) in records {
        windows.insert(t - DIFFERENCE, content(t - DIFFERENCE, *t));
        if records.iter().any(|(_, u)| *u > *t && *u <= t + DIFFERENCE) {
            windows.insert(t + 1, content(t + 1, t + 1 + DIFFERENCE));
        }
    }
    windows
}

/// The table's pages of closing passes' claims (`__claimpages#…` items).
async fn claim_pages_left(table: &str) -> usize {
    let scanned = dynamo_client()
        .scan()
        .table_name(table)
        .filter_expression("begins_with(pk, :p)")
        .expression_attribute_values(
            ":p",
            aws_sdk_dynamodb::types::AttributeValue::S("__claimpages#".into()),
        )
        .consistent_read(true)
        .send()
        .await
        .expect("scan");
    scanned.items().len()
}

/// A sliding window's closing pass under exactly-once output emits every window its
/// item's records make, which can be far more than the item: 30 records of 4,000 bytes
/// (120 KB) make 59 windows, 3.6 MB. Kept in the item, that claim was refused by DynamoDB
/// (over 400 KB) on every retry, and the partition stopped for good. Its records now go to
/// pages of their own, the item keeping only their reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_pass_whose_records_exceed_an_item_is_claimed_in_pages_on_dynamodb() {
    let records = big_windows_records(30, 4_000);
    claimed_in_pages(&records, 59).await;
}

/// Records that would fit in an item alone but not beside what the item keeps (9 records
/// of 4,400 bytes: 17 windows, 358 KB, beside the records' 40 KB): DynamoDB refuses the
/// claim in the item, and it goes to pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_pass_whose_records_fit_only_without_its_item_is_claimed_in_pages_on_dynamodb() {
    let records = big_windows_records(9, 4_400);
    claimed_in_pages(&records, 17).await;
}

/// Closes `records` (one key's) under exactly-once output; a batch that fails after any of
/// its writes (the claim made, its transaction aborted) is retried by another container,
/// which re-claims and emits the windows from the pages. A `read_committed` consumer sees
/// each of Kafka Streams' windows once (`windows` of them), with its value, and the
/// claim's next batch deletes the pages.
async fn claimed_in_pages(records: &[(String, i64)], windows: usize) {
    require_services();
    let reference = reference_sliding_windows(records);
    assert_eq!(reference.len(), windows);
    let mut crashed = 0;
    for crash_after in 0.. {
        let (input, closed) = (unique("claimpages-in"), unique("claimpages-closed"));
        for topic in [&input, &closed] {
            admin::create_topic(&bootstrap(), topic, 1)
                .await
                .expect("topic");
        }
        let table = unique("claimpages");
        create_table(&dynamo_client(), &table).await.expect("table");
        let app = unique("claimpages-app");
        let handler = |store: Arc<dyn lambda_streams::state::Store>| {
            let builder = StreamsBuilder::new();
            builder.output_guarantee(OutputGuarantee::ExactlyOnce);
            builder
                .stream(&input, Utf8, Utf8)
                .group_by_key(Utf8)
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    Duration::from_millis(DIFFERENCE as u64),
                    Duration::ZERO,
                ))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .reduce("concat", |a: String, b: String| a + &b, Utf8)
                .to_stream()
                .map(|w, v: String| (format!("{}@{}", w.key, w.start), v))
                .to(&closed, Utf8, Utf8);
            Handler::with_kafka_output(builder.build(), store, None)
                .with_options(BatchOptions {
                    source_partitions: [(input.clone(), 1)].into_iter().collect(),
                    output: OutputGuarantee::ExactlyOnce,
                    ..BatchOptions::default()
                })
                .with_application_id(app.clone())
                .with_event_read_committed(true)
        };
        let dynamo = || DynamoStore::new(dynamo_client(), table.clone(), Guarantee::ExactlyOnce);
        let base = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("the clock is after 1970")
                .as_millis(),
        )
        .expect("milliseconds fit in i64");
        let event = |first: i64, batch: &[(&str, &str, i64)]| KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: bootstrap(),
            partitions: vec![PartitionRecords {
                tp: TopicPartition::new(input.as_str(), 0),
                records: batch
                    .iter()
                    .zip(first..)
                    .map(|((k, v, at), offset)| Record {
                        offset,
                        timestamp: base + at,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(k.as_bytes().to_vec().into()),
                        value: Some(v.as_bytes().to_vec().into()),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    })
                    .collect(),
            }],
        };
        // The 30 records of k, then one of z far later: k's windows all close.
        let mut first: Vec<(&str, &str, i64)> =
            records.iter().map(|(v, t)| ("k", v.as_str(), *t)).collect();
        first.push(("z", "z", 10_000));
        let faulty = Arc::new(FaultyStore::fail_once_after(dynamo(), crash_after));
        let outcome = handler(faulty.clone())
            .handle_event(&event(0, &first))
            .await;
        if !faulty.fired() {
            outcome.expect("the batch without a fault");
        } else {
            assert!(outcome.is_err(), "crash after {crash_after} writes");
            crashed += 1;
            handler(Arc::new(dynamo()))
                .handle_event(&event(0, &first))
                .await
                .unwrap_or_else(|e| panic!("the retry after {crash_after} writes: {e}"));
        }
        // The partition's next batch finishes the claim.
        handler(Arc::new(dynamo()))
            .handle_event(&event(first.len() as i64, &[("z", "z", 10_001)]))
            .await
            .expect("the next batch");
        let mut seen: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for r in kafka_read_all(&closed, "read_committed") {
            let (key, start) = r.key.split_once('@').expect("key@start");
            if key != "k" {
                continue;
            }
            let start: i64 = start.parse().expect("a start");
            seen.entry(start - base).or_default().push(r.value);
        }
        let once: BTreeMap<i64, String> = seen
            .into_iter()
            .map(|(start, mut values)| {
                assert_eq!(values.len(), 1, "window {start} after {crash_after} writes");
                (start, values.remove(0))
            })
            .collect();
        assert!(
            once == reference,
            "after {crash_after} writes: windows {:?}, Kafka Streams' {:?}",
            once.keys().collect::<Vec<_>>(),
            reference.keys().collect::<Vec<_>>()
        );
        assert_eq!(
            claim_pages_left(&table).await,
            0,
            "after {crash_after} writes"
        );
        if !faulty.fired() {
            break;
        }
    }
    assert!(crashed >= 3, "{crashed} crash points");
}
