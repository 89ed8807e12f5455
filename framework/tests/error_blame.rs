//! Errors of windowed operators name the record that caused them (its topic-partition
//! and offset), whichever operator raised them: the one "which record to blame"
//! (`Ctx::blame`) behind every such error.

use std::time::Duration;

use lambda_streams::StreamError;
use lambda_streams::StreamsBuilder;
use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::{KGroupedStream, KTable, SlidingWindows, TimeWindows, Windowed};
use lambda_streams::serdes::{DecimalI64, Utf8};

/// Counts `in` per key in the windows `windowed` makes, pipes a good record (offset 0),
/// then one timestamped -1 (offset 1) to partition 2, and checks the error of the second:
/// a user error naming `in-2` offset 1, with `message`.
fn a_negative_timestamp_is_blamed_on_its_record(
    windowed: impl FnOnce(KGroupedStream<String, String>) -> KTable<Windowed<String>, i64>,
    message: &str,
) {
    let builder = StreamsBuilder::new();
    windowed(builder.stream("in", Utf8, Utf8).group_by_key(Utf8))
        .to_stream()
        .map(|w, n| (w.key, n))
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build()).with_batching(Batching::Manual);
    let mut input = driver.input_topic("in", Utf8, Utf8).with_partition(2);
    input
        .pipe_input_with_timestamp("k", "ok".to_owned(), 1_000)
        .expect("encodes");
    driver.flush().expect("a good record");
    input
        .pipe_input_with_timestamp("k", "bad".to_owned(), -1)
        .expect("encodes");
    let err = driver.flush().expect_err("a negative timestamp");
    assert!(
        matches!(&err, StreamError::User { tp, offset: 1, .. } if tp.to_string() == "in-2"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), format!("record in-2 offset 1: {message}"));
}

#[test]
fn a_time_window_error_names_the_record() {
    a_negative_timestamp_is_blamed_on_its_record(
        |grouped| {
            grouped
                .windowed_by(TimeWindows::of_size(Duration::from_secs(10)))
                .count("counts")
        },
        "time windows need a timestamp of 0 or more, not -1",
    );
}

#[test]
fn a_sliding_window_error_names_the_record() {
    a_negative_timestamp_is_blamed_on_its_record(
        |grouped| {
            grouped
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    Duration::from_secs(10),
                    Duration::from_secs(5),
                ))
                .count("counts")
        },
        "sliding windows need a timestamp of 0 or more, not -1",
    );
}
