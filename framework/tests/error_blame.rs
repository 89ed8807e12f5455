//! Errors of windowed operators name the record that caused them (its topic-partition
//! and offset), whichever operator raised them: the one "which record to blame"
//! (`Ctx::blame`) behind every such error.

use std::time::Duration;

use lambda_streams::StreamError;
use lambda_streams::StreamsBuilder;
use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::{SlidingWindows, TimeWindows};
use lambda_streams::serdes::{DecimalI64, Utf8};

/// Pipes a good record (offset 0), then one timestamped -1 (offset 1) to partition 2 of
/// `in`, and returns the error of the second.
fn error_of_a_negative_timestamp(driver: &TestDriver) -> StreamError {
    let mut input = driver.input_topic("in", Utf8, Utf8).with_partition(2);
    input
        .pipe_input_with_timestamp("k", "ok".to_owned(), 1_000)
        .expect("encodes");
    driver.flush().expect("a good record");
    input
        .pipe_input_with_timestamp("k", "bad".to_owned(), -1)
        .expect("encodes");
    driver.flush().expect_err("a negative timestamp")
}

#[test]
fn a_time_window_error_names_the_record() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(10)))
        .count("counts")
        .to_stream()
        .map(|w, n| (w.key, n))
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build()).with_batching(Batching::Manual);
    let err = error_of_a_negative_timestamp(&driver);
    assert!(
        matches!(&err, StreamError::User { tp, offset: 1, .. } if tp.to_string() == "in-2"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "record in-2 offset 1: time windows need a timestamp of 0 or more, not -1"
    );
}

#[test]
fn a_sliding_window_error_names_the_record() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            Duration::from_secs(10),
            Duration::from_secs(5),
        ))
        .count("counts")
        .to_stream()
        .map(|w, n| (w.key, n))
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build()).with_batching(Batching::Manual);
    let err = error_of_a_negative_timestamp(&driver);
    assert!(
        matches!(&err, StreamError::User { tp, offset: 1, .. } if tp.to_string() == "in-2"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "record in-2 offset 1: sliding windows need a timestamp of 0 or more, not -1"
    );
}
