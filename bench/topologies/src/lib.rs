//! The lambda-streams side of the end-to-end benchmark against Kafka Streams (issue 7,
//! item 2; `bench/e2e`). The local runner runs these in-process as `--function
//! bench-stateless` and `--function bench-count`; the Kafka Streams side is
//! `bench/kstreams` (the same pipelines in Java).
//!
//! Input (written by `bench/kstreams`' `Produce`): record `i` has the UTF-8 key
//! `key-<i mod keys>` and the UTF-8 value `"<i>,<amount>"` with `amount` in `0..100`.
//!
//! Environment: `BENCH_INPUT_TOPIC` (default `bench-input`), `BENCH_OUTPUT_TOPIC`
//! (default `bench-output`).

use lambda_streams::config_env::env_or;
use lambda_streams::serdes::{BigEndianI64, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// The name of the count's state store.
pub const STORE: &str = "bench-counts";

/// The amount of a value `"<i>,<amount>"`, or `None` when it has none.
pub fn amount(value: &str) -> Option<u32> {
    value.split_once(',')?.1.parse().ok()
}

/// (a) stateless: keeps the records whose amount is at least 50 (about half) and maps
/// each to `(key, "<key>:<amount * 2>")`; UTF-8 in and out.
pub fn stateless(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Utf8, Utf8)
        .filter(|_, value: &String| amount(value).is_some_and(|a| a >= 50))
        .map(|key: String, value: String| {
            let doubled = amount(&value).unwrap_or(0) * 2;
            let mapped = format!("{key}:{doubled}");
            (key, mapped)
        })
        .to(output, Utf8, Utf8);
    builder.build()
}

/// (b) count by key: `group_by_key → count → to_stream → to`, the count as an 8-byte
/// big-endian integer (Kafka Streams' `Serdes.Long()`), the item's version in the
/// `lambda-streams-version` header.
pub fn count(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Utf8, Utf8)
        .group_by_key(Utf8)
        .count(STORE)
        .to_stream()
        .to(output, Utf8, BigEndianI64);
    builder.build()
}

fn topics_from_env() -> (String, String) {
    (
        env_or("BENCH_INPUT_TOPIC", "bench-input"),
        env_or("BENCH_OUTPUT_TOPIC", "bench-output"),
    )
}

/// [`stateless`] with its topics from `BENCH_INPUT_TOPIC` and `BENCH_OUTPUT_TOPIC`.
pub fn stateless_from_env() -> Topology {
    let (input, output) = topics_from_env();
    stateless(&input, &output)
}

/// [`count`] with its topics from `BENCH_INPUT_TOPIC` and `BENCH_OUTPUT_TOPIC`.
pub fn count_from_env() -> Topology {
    let (input, output) = topics_from_env();
    count(&input, &output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_streams::driver::TestDriver;

    #[test]
    fn stateless_filters_and_maps() -> Result<(), Box<dyn std::error::Error>> {
        let driver = TestDriver::new(stateless("in", "out"));
        driver.input_topic("in", Utf8, Utf8).pipe_key_values([
            ("key-1", "0,49"),
            ("key-2", "1,50"),
            ("key-3", "2,99"),
        ])?;
        assert_eq!(
            driver.output_topic("out", Utf8, Utf8).read_key_values()?,
            [
                ("key-2".to_string(), "key-2:100".to_string()),
                ("key-3".to_string(), "key-3:198".to_string())
            ]
        );
        Ok(())
    }

    #[test]
    fn count_counts_by_key() -> Result<(), Box<dyn std::error::Error>> {
        let driver = TestDriver::new(count("in", "out"));
        driver.input_topic("in", Utf8, Utf8).pipe_key_values([
            ("a", "0,1"),
            ("b", "1,2"),
            ("a", "2,3"),
        ])?;
        let out = driver
            .output_topic("out", Utf8, BigEndianI64)
            .read_key_values()?;
        assert_eq!(out.last(), Some(&("a".to_string(), 2)));
        Ok(())
    }
}
