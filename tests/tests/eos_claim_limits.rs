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

use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::{EmitStrategy, SessionWindows};
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::Utf8;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
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
