//! Event time from a timestamp extractor on DynamoDB (the dynoxide emulator): a windowed
//! count over readings whose time taken is in their value, through `Topology::process`
//! with a `DynamoStore`, in batches over two partitions. The last update per window equals
//! a reference computed here from the extracted times (stream time per partition, persisted
//! between batches, late readings dropped and counted); a redelivered batch changes
//! nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::dsl::{Grouped, TimeWindows};
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::sink::{MemorySink, VERSION_HEADER};
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;

const SIZE: i64 = 1_000;
const GRACE: i64 = 500;

fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream_with_timestamps("readings", Unit, Utf8, |_, v: &String, _| {
            v.split(',')
                .nth(1)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0)
        })
        .group_by(
            |_, v: &String| v.split(',').next().unwrap_or_default().to_owned(),
            Grouped::direct(Utf8),
        )
        .windowed_by(
            TimeWindows::of_size(Duration::from_millis(SIZE as u64))
                .grace(Duration::from_millis(GRACE as u64)),
        )
        .count("per-second")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

/// The reading at `offset` of `partition`: a sensor and a time taken, out of order.
fn reading(partition: usize, offset: usize) -> (String, i64) {
    let h = (partition as u64 * 1_000_003 + offset as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let sensor = format!("s{}", h % 3);
    let taken = 10_000 + offset as i64 * 150 - ((h >> 20) % 1_800) as i64;
    (sensor, taken)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_on_dynamodb_follow_the_extracted_time() {
    require_services();
    let (_, store) = exactly_once_store("event-time").await;
    let sink = MemorySink::new();
    let topology = topology();
    // (partition, first offset, end offset) per batch; record timestamps are the offsets
    // plus a constant (`log_event`), unrelated to the time taken.
    let batches: Vec<Vec<(usize, usize, usize)>> = vec![
        vec![(0, 0, 7), (1, 0, 4)],
        vec![(1, 4, 12)],
        vec![(0, 7, 15), (1, 12, 20)],
        vec![(0, 15, 30)],
        vec![(1, 20, 30)],
    ];
    let (mut counts, mut late, mut stream_time) = (BTreeMap::new(), 0u64, [i64::MIN; 2]);
    let mut reported_late = 0;
    for batch in &batches {
        let event = log_event("readings", 1_000_000, batch, |p, o| {
            let (sensor, taken) = reading(p, o);
            format!("{sensor},{taken}").into_bytes()
        });
        for &(p, lo, hi) in batch {
            for o in lo..hi {
                let (sensor, taken) = reading(p, o);
                stream_time[p] = stream_time[p].max(taken);
                let start = taken - taken.rem_euclid(SIZE);
                if start + SIZE + GRACE <= stream_time[p] {
                    late += 1;
                } else {
                    *counts.entry(format!("{sensor}@{start}")).or_insert(0i64) += 1;
                }
            }
        }
        reported_late += topology
            .process(&event, &store, &sink)
            .await
            .expect("batch")
            .late_records;
        // Delivered again: nothing changes in the state.
        topology
            .process(&event, &store, &sink)
            .await
            .expect("redelivery");
    }
    assert!(late > 0, "the input has late readings");
    assert_eq!(
        reported_late, late,
        "late readings, counted on the extracted time"
    );
    let mut last: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for record in sink.records() {
        let key = String::from_utf8(record.key.clone().expect("key")).expect("utf-8");
        let version: u64 = std::str::from_utf8(record.header(VERSION_HEADER).expect("version"))
            .expect("utf-8")
            .parse()
            .expect("a version");
        let count: i64 = std::str::from_utf8(&record.value.clone().expect("value"))
            .expect("utf-8")
            .parse()
            .expect("a count");
        let entry = last.entry(key).or_insert((0, 0));
        if version >= entry.0 {
            *entry = (version, count);
        }
    }
    let last: BTreeMap<String, i64> = last.into_iter().map(|(k, (_, c))| (k, c)).collect();
    assert_eq!(last, counts, "the last update per window");
}
