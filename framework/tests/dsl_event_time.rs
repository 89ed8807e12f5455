//! Event time from a timestamp extractor (`StreamsBuilder::stream_with_timestamps`):
//! windowed counts, late records and stream time follow the extracted timestamps, not the
//! records' own, checked against a brute-force reference over random inputs.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::{Grouped, TimeWindows};
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

const SIZE: i64 = 10;
const GRACE: i64 = 5;

/// Values `"<sensor>,<time taken>"`; counts per sensor in 10 ms windows, 5 ms of grace.
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
        .count("counts")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

/// Readings: sensor and time taken, on one partition, with record timestamps that say
/// nothing about the time taken.
fn readings() -> impl Strategy<Value = Vec<(u8, i64)>> {
    prop::collection::vec((0u8..3, 0i64..80), 1..60)
}

proptest! {
    #[test]
    fn windows_follow_the_extracted_time(input in readings(), batch in 1usize..10) {
        let driver = TestDriver::new(topology()).with_batching(Batching::Size(batch));
        let mut topic = driver.input_topic("readings", Unit, Utf8);
        // The reference: stream time is the highest time taken so far; a reading is late
        // when its window ended grace or more before it.
        let (mut counts, mut stream_time) = (BTreeMap::new(), i64::MIN);
        for (i, (sensor, taken)) in input.iter().enumerate() {
            // Record timestamps decreasing: if they were used, almost nothing would be late.
            topic
                .pipe_input_with_timestamp((), format!("s{sensor},{taken}"), 1_000_000 - i as i64)
                .unwrap();
            stream_time = stream_time.max(*taken);
            let start = taken - taken.rem_euclid(SIZE);
            if start + SIZE + GRACE > stream_time {
                *counts.entry(format!("s{sensor}@{start}")).or_insert(0i64) += 1;
            }
        }
        driver.flush().unwrap();
        let out = driver.output_topic("out", Utf8, DecimalI64).read_key_values_to_map().unwrap();
        prop_assert_eq!(out, counts);
    }

    #[test]
    fn late_records_are_counted_on_the_extracted_time(input in readings()) {
        let driver = TestDriver::new(topology()).with_batching(Batching::Manual);
        let mut topic = driver.input_topic("readings", Unit, Utf8);
        let (mut late, mut stream_time) = (0u64, i64::MIN);
        for (i, (sensor, taken)) in input.iter().enumerate() {
            topic
                .pipe_input_with_timestamp((), format!("s{sensor},{taken}"), i as i64)
                .unwrap();
            stream_time = stream_time.max(*taken);
            let start = taken - taken.rem_euclid(SIZE);
            if start + SIZE + GRACE <= stream_time {
                late += 1;
            }
        }
        let report = driver.flush().unwrap();
        prop_assert_eq!(report.late_records, late);
    }
}

#[test]
fn produced_records_carry_the_extracted_timestamp() {
    let driver = TestDriver::new(topology());
    driver
        .input_topic("readings", Unit, Utf8)
        .pipe_input_with_timestamp((), "s1,42".to_owned(), 7)
        .unwrap();
    let out = driver.read_output("out");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].timestamp, Some(42));
}
