//! Session windows' lateness rule, by hand: a record more than gap + grace behind its
//! partition's stream time is late (dropped and counted), judged on its own timestamp,
//! even when it falls inside a session that is still open. That is the rule
//! `dsl/session.rs` documents; Kafka Streams would merge such a record into the open
//! session (it judges the merged session's end).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lambda_streams::StreamsBuilder;
use lambda_streams::driver::TestDriver;
use lambda_streams::dsl::SessionWindows;
use lambda_streams::serdes::{DecimalI64, Utf8};

#[test]
fn a_record_inside_an_open_session_but_behind_gap_and_grace_is_late() {
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
    let driver = TestDriver::new(builder.build());
    let mut input = driver.input_topic("in", Utf8, Utf8);
    // One session [100, 130]: records 5 ms apart (gap 10 ms, no grace).
    for ts in [100, 105, 110, 115, 120, 125, 130] {
        input
            .pipe_input_with_timestamp("a", "x".to_owned(), ts)
            .unwrap();
    }
    assert_eq!(driver.last_report().unwrap().late_records, 0);
    // 112 is inside the open session, but before stream time 130 - gap 10 - grace 0.
    input
        .pipe_input_with_timestamp("a", "x".to_owned(), 112)
        .unwrap();
    assert_eq!(driver.last_report().unwrap().late_records, 1);
    // 121 is not before 120: it joins the session.
    input
        .pipe_input_with_timestamp("a", "x".to_owned(), 121)
        .unwrap();
    assert_eq!(driver.last_report().unwrap().late_records, 0);
    let out = driver
        .output_topic("out", Utf8, DecimalI64)
        .read_key_values_to_map()
        .unwrap();
    assert_eq!(out["a@100-130"], 8);
}
