//! Session windows' lateness rule, by hand, as Kafka Streams' `KStreamSessionWindowAggregate`
//! (Kafka 4) judges it: a record is late (dropped and counted) when the session it merges
//! into ends before its partition's stream time − gap − grace; a record behind that but
//! inside (or within the gap of) a session still open merges into it. One record per batch
//! and as one batch: the same sessions, the same count of late records.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lambda_streams::StreamsBuilder;
use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::SessionWindows;
use lambda_streams::serdes::{DecimalI64, Utf8};

fn run(batching: Batching) -> (std::collections::BTreeMap<String, i64>, u64) {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_millis(
            10,
        )))
        .count("sessions")
        .to_stream()
        .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build()).with_batching(batching);
    let mut input = driver.input_topic("in", Utf8, Utf8);
    let mut late = 0;
    // One session [100, 130]: records 5 ms apart (gap 10 ms, no grace); then, at stream
    // time 130 (close time 120): 112 (inside the open session), 92 (within the gap of its
    // start), 121, and 50 and 75 (no session within the gap: their own session [t, t]
    // ends before 120).
    for ts in [100, 105, 110, 115, 120, 125, 130, 112, 92, 121, 50, 75] {
        input
            .pipe_input_with_timestamp("a", "x".to_owned(), ts)
            .unwrap();
        if batching == Batching::PerRecord {
            late += driver.last_report().unwrap().late_records;
        }
    }
    if batching != Batching::PerRecord {
        late = driver.flush().unwrap().late_records;
    }
    let out = driver
        .output_topic("out", Utf8, DecimalI64)
        .read_key_values_to_map()
        .unwrap();
    (out, late)
}

#[test]
fn a_record_merging_into_an_open_session_is_on_time_whatever_its_own_timestamp() {
    for batching in [Batching::PerRecord, Batching::Manual] {
        let (out, late) = run(batching);
        // By hand: 7 + 112 + 121 in [100, 130], then 92 extends it to [92, 130]; 50 and
        // 75 are late.
        assert_eq!(out.get("a@92-130"), Some(&10), "{batching:?}: {out:?}");
        assert_eq!(late, 2, "{batching:?}");
        assert!(
            !out.keys()
                .any(|k| k.starts_with("a@50") || k.starts_with("a@75"))
        );
    }
}
