//! Window items on DynamoDB (the dynoxide emulator) are not born expired: a replay of data
//! a month old (a consumer starting from the oldest offset, or lagging) writes window items
//! whose TTL is the later of event-time close + retention and wall-clock write time +
//! retention (design notes, section 4), so the store's reads see them, exact, and
//! DynamoDB's TTL would not delete them while they are in use. The TTL attribute is read
//! straight from the table, not through the store under test.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_streams::dsl::{Grouped, TimeWindows};
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{TTL_ATTRIBUTE, emulator_client, item_key};
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;

const SECOND: i64 = 1_000;
const MINUTE: i64 = 60 * SECOND;
const DAY: i64 = 86_400 * SECOND;
const STORE: &str = "views-per-minute";
/// The windows' retention: one hour.
const RETENTION: i64 = 3_600 * SECOND;

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .expect("a clock after 1970")
}

/// Per page, per-minute counts, no grace, kept an hour after they close.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("views", Unit, Utf8)
        .group_by(|_, page: &String| page.clone(), Grouped::direct(Utf8))
        .windowed_by(
            TimeWindows::of_size(Duration::from_secs(60))
                .retention(Duration::from_millis(RETENTION as u64)),
        )
        .count(STORE)
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("counts", Utf8, DecimalI64);
    builder.build()
}

/// One event of `views`, partition 0: (offset, timestamp, page).
fn event(records: &[(i64, i64, &str)]) -> KafkaEvent {
    let records = records
        .iter()
        .map(|(offset, timestamp, page)| Record {
            offset: *offset,
            timestamp: *timestamp,
            timestamp_type: TimestampType::CreateTime,
            key: None,
            value: Some(page.to_string().into()),
            headers: Vec::new(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        })
        .collect();
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new("views", 0),
            records,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_items_of_month_old_data_are_readable_exact_and_not_born_expired() {
    require_services();
    let client = emulator_client(&dynamo_endpoint());
    let (table, store) = exactly_once_store("window-ttl").await;
    let topology = topology();
    let base = (wall_clock_ms() - 30 * DAY).div_euclid(MINUTE) * MINUTE;
    // Three batches, in timestamp order (none is late), a month behind the wall clock.
    let batches = [
        event(&[(0, base + 1, "/a"), (1, base + 2 * SECOND, "/b")]),
        event(&[(2, base + 59 * SECOND, "/a"), (3, base + MINUTE, "/a")]),
        event(&[
            (4, base + MINUTE + 30 * SECOND, "/b"),
            (5, base + 2 * MINUTE - 1, "/a"),
        ]),
    ];
    // The reference: per page and minute, the records in it.
    let mut expected: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for batch in &batches {
        for record in &batch.partitions[0].records {
            let page =
                String::from_utf8(record.value.clone().expect("a value").to_vec()).expect("UTF-8");
            let start = record.timestamp.div_euclid(MINUTE) * MINUTE;
            *expected.entry((page, start)).or_insert(0) += 1;
        }
    }
    let written_from = wall_clock_ms();
    let sink = MemorySink::new();
    let mut late = 0;
    for batch in &batches {
        late += topology
            .process(batch, &store, &sink)
            .await
            .expect("batch")
            .late_records;
    }
    // A redelivery of the last batch changes nothing.
    topology
        .process(&batches[2], &store, &sink)
        .await
        .expect("redelivered batch");
    let written_to = wall_clock_ms();
    assert_eq!(late, 0);

    // Read through the store: every window is there, exact.
    let mut read = BTreeMap::new();
    for page in ["/a", "/b"] {
        for (start, state) in store
            .windows(STORE, page.as_bytes(), i64::MIN, i64::MAX)
            .await
            .expect("query")
        {
            read.insert((page.to_owned(), start), state.value);
        }
    }
    assert_eq!(read, expected, "every window is readable and exact");
    let scanned: BTreeMap<(String, i64), i64> = store
        .scan(STORE)
        .await
        .expect("scan")
        .into_iter()
        .map(|item| {
            (
                (
                    String::from_utf8(item.key).expect("UTF-8"),
                    item.window.expect("a window"),
                ),
                item.state.value,
            )
        })
        .collect();
    assert_eq!(scanned, expected);

    // The raw TTL attribute: at least the retention past the write, at most a second more
    // than the retention past the end of the writes (it is in whole seconds, rounded up).
    for (page, start) in expected.keys() {
        let item = client
            .get_item()
            .table_name(&table)
            .key("pk", AttributeValue::S(item_key(STORE, page.as_bytes())))
            .key("sk", AttributeValue::N(start.to_string()))
            .consistent_read(true)
            .send()
            .await
            .expect("get item");
        let ttl: i64 = match item.item().and_then(|i| i.get(TTL_ATTRIBUTE)) {
            Some(AttributeValue::N(n)) => n.parse().expect("a number"),
            other => panic!("{page}@{start}: no TTL attribute: {other:?}"),
        };
        assert!(
            ttl * SECOND >= written_from + RETENTION,
            "{page}@{start}: TTL {ttl} is before the write + retention"
        );
        assert!(
            ttl * SECOND <= written_to + RETENTION + 2 * SECOND,
            "{page}@{start}: TTL {ttl} is later than the write + retention"
        );
    }
}
