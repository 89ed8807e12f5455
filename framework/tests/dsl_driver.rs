//! The test driver on WordCount: batching modes, partitions, redelivery, store contents.
//! Expected counts are worked out by hand in the comments.

#![allow(clippy::unwrap_used)]

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::Grouped;
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams::{StreamsBuilder, Topology};

fn wordcount() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("text-lines", Unit, Utf8)
        .flat_map_values(|line: String| {
            line.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        })
        .group_by(|_, word| word.clone(), Grouped::direct(Utf8))
        .count("counts")
        .to_stream()
        .to("word-counts", Utf8, DecimalI64);
    builder.build()
}

fn kv(word: &str, count: i64) -> (String, i64) {
    (word.to_owned(), count)
}

#[test]
fn per_record_batches_emit_every_update() {
    let driver = TestDriver::new(wordcount());
    let mut lines = driver.input_topic("text-lines", Unit, Utf8);
    lines.pipe_value("a b a").unwrap();
    lines.pipe_value("B").unwrap();
    let counts = driver.output_topic("word-counts", Utf8, DecimalI64);
    // Batch 1 ("a b a"): a=2, b=1, emitted sorted by key. Batch 2 ("B"): b=2.
    assert_eq!(
        counts.read_key_values().unwrap(),
        [kv("a", 2), kv("b", 1), kv("b", 2)]
    );
    assert_eq!(
        driver.store("counts"),
        [(b"a".to_vec(), 2, 1), (b"b".to_vec(), 2, 2)]
    );
}

#[test]
fn manual_batches_span_partitions_and_redelivery_changes_no_state() {
    let driver = TestDriver::new(wordcount()).with_batching(Batching::Manual);
    let mut lines = driver.input_topic("text-lines", Unit, Utf8);
    lines.pipe_to_partition(0, (), "a b").unwrap();
    lines.pipe_to_partition(1, (), "b c").unwrap();
    lines.pipe_to_partition(0, (), "a").unwrap();
    assert_eq!(driver.pending(), 3);
    let report = driver.flush().unwrap();
    // 3 lines in; a=2, b=2, c=1: 3 items touched, 3 updates out.
    assert_eq!(
        (report.records_in, report.items_touched, report.records_out),
        (3, 3, 3)
    );
    let counts = driver.output_topic("word-counts", Utf8, DecimalI64);
    assert_eq!(
        counts.read_key_values().unwrap(),
        [kv("a", 2), kv("b", 2), kv("c", 1)]
    );

    // The event source delivers the same batch again: the watermarks hold every
    // record already, so the state is unchanged (same values, same versions); the
    // updates are emitted again with the same versions.
    driver.redeliver_last_batch().unwrap();
    let expected_store = [
        (b"a".to_vec(), 2, 1),
        (b"b".to_vec(), 2, 1),
        (b"c".to_vec(), 1, 1),
    ];
    assert_eq!(driver.store("counts"), expected_store);
    let again = counts.read_records().unwrap();
    let versions: Vec<(&str, i64, &[u8])> = again
        .iter()
        .map(|r| {
            let version = r
                .headers
                .iter()
                .find(|(n, _)| n == VERSION_HEADER)
                .map(|(_, v)| v.as_slice())
                .unwrap();
            (r.key.as_str(), r.value, version)
        })
        .collect();
    assert_eq!(
        versions,
        [
            ("a", 2, &b"1"[..]),
            ("b", 2, &b"1"[..]),
            ("c", 1, &b"1"[..])
        ]
    );

    // A new record on partition 1 (offset 1): c=2, version 2.
    lines.pipe_to_partition(1, (), "C").unwrap();
    driver.flush().unwrap();
    assert_eq!(counts.read_key_values().unwrap(), [kv("c", 2)]);
    assert_eq!(driver.store("counts")[2], (b"c".to_vec(), 2, 2));
}

#[test]
fn size_batching_and_final_table() {
    let driver = TestDriver::new(wordcount()).with_batching(Batching::Size(2));
    let mut lines = driver.input_topic("text-lines", Unit, Utf8);
    // Batches: ["x y", "y"] then ["x"] (flushed by hand).
    lines.pipe_values(["x y", "y", "x"]).unwrap();
    assert_eq!(driver.pending(), 1);
    driver.flush().unwrap();
    let counts = driver.output_topic("word-counts", Utf8, DecimalI64);
    assert_eq!(counts.queue_size(), 3);
    let table = counts.read_key_values_to_map().unwrap();
    assert_eq!(
        table.into_iter().collect::<Vec<_>>(),
        [kv("x", 2), kv("y", 2)]
    );
    assert!(counts.is_empty());
}

#[test]
fn empty_lines_touch_no_state() {
    let driver = TestDriver::new(wordcount());
    driver
        .input_topic("text-lines", Unit, Utf8)
        .pipe_values(["", "   "])
        .unwrap();
    let report = driver.last_report().unwrap();
    assert_eq!((report.records_in, report.items_touched), (1, 0));
    assert!(driver.store("counts").is_empty());
    assert!(driver.produced().is_empty());
}

#[tokio::test]
async fn the_driver_works_inside_an_async_runtime() {
    let driver = TestDriver::new(wordcount());
    driver
        .input_topic("text-lines", Unit, Utf8)
        .pipe_value("hi")
        .unwrap();
    assert_eq!(
        driver
            .output_topic("word-counts", Utf8, DecimalI64)
            .read_key_values()
            .unwrap(),
        [kv("hi", 1)]
    );
}

/// A panic in user code on a table's updates fails the batch with an error naming it,
/// instead of unwinding through the runtime; the state stays as the store wrote it.
#[test]
fn a_panic_on_a_table_update_fails_the_batch_cleanly() {
    let builder = StreamsBuilder::new();
    builder
        .stream("words", Utf8, Utf8)
        .group_by_key(Utf8)
        .count("counts")
        .to_stream()
        .map(|k: String, n: i64| {
            assert!(k != "boom", "no booms");
            (k, n)
        })
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build());
    let mut words = driver.input_topic("words", Utf8, Utf8);
    words
        .pipe_input("fine", "x".to_owned())
        .expect("a fine word");
    let error = words
        .pipe_input("boom", "x".to_owned())
        .expect_err("the update's map panics");
    assert!(
        error
            .to_string()
            .contains("user code panicked on a table update: no booms"),
        "{error}"
    );
}
