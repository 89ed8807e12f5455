//! Kafka Streams' WordCount, on AWS Lambda.
//!
//! Reads UTF-8 lines from the input topic (`text-lines`), splits them into lowercase
//! words on whitespace, counts each word exactly once in DynamoDB, and after each batch
//! produces `(word, count)` to the output topic (`word-counts`): the key is the word,
//! the value the word's count after the batch as decimal UTF-8 text, with the state
//! item's version in the `lambda-streams-version` header (the record with the highest
//! version per word carries its current count). A null line (a tombstone in `text-lines`)
//! has no words: it counts nothing and is not a poison record.
//!
//! Environment: `WORDCOUNT_INPUT_TOPIC` (default `text-lines`), `WORDCOUNT_OUTPUT_TOPIC`
//! (default `word-counts`), plus the framework's (`LAMBDA_STREAMS_TABLE`, …; see
//! `lambda_streams::lambda`).

use lambda_streams::config_env::env_or;
use lambda_streams::dsl::Grouped;
use lambda_streams::serdes::{DecimalI64, Nullable, Unit, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// The name of the state store holding the counts.
pub const STORE: &str = "word-counts";

/// The words of a line: split on Unicode whitespace, lowercased.
pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_lowercase).collect()
}

/// The default name of the repartition topic (`WORDCOUNT_REPARTITION_TOPIC`): the store's
/// name followed by `-repartition`, as [`Grouped`] names it.
pub const REPARTITION_TOPIC: &str = "word-counts-repartition";

/// The WordCount topology from `input` to `output`, the words repartitioned through
/// [`REPARTITION_TOPIC`] (the default of the framework when a re-keyed aggregation's updates
/// go to a topic): the function consumes that topic too, each word's count is written by
/// the one partition that owns the word, and its updates reach `output` in order.
pub fn topology(input: &str, output: &str) -> Topology {
    build(input, output, Grouped::with(Utf8, Utf8))
}

/// The WordCount topology through the repartition topic `repartition`.
pub fn topology_repartitioned(input: &str, repartition: &str, output: &str) -> Topology {
    build(
        input,
        output,
        Grouped::with(Utf8, Utf8).with_topic(repartition),
    )
}

/// The WordCount topology in direct mode: each batch writes the counts of its words
/// straight from its own partition (exact state; the updates of a word carry the count's
/// version in the `lambda-streams-version` header, and a consumer keeps the highest).
pub fn topology_direct(input: &str, output: &str) -> Topology {
    build(input, output, Grouped::direct(Utf8))
}

fn build(input: &str, output: &str, grouped: Grouped<String, String>) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        // `Nullable`: a tombstone (null line) is `None`, which has no words, rather than a
        // value `Utf8` refuses (a poison record that stops the partition under `fail`).
        .stream(input, Unit, Nullable(Utf8))
        .flat_map_values(|line: Option<String>| line.as_deref().map(words).unwrap_or_default())
        .group_by(|_, word| word.clone(), grouped)
        .count(STORE)
        .to_stream()
        .to(output, Utf8, DecimalI64);
    builder.build()
}

/// The topology with its topics from `WORDCOUNT_INPUT_TOPIC`, `WORDCOUNT_OUTPUT_TOPIC` and
/// `WORDCOUNT_REPARTITION_TOPIC` (defaults `text-lines`, `word-counts`,
/// [`REPARTITION_TOPIC`]); `WORDCOUNT_REKEYING=direct` chooses [`topology_direct`].
///
/// # Errors
/// An unknown `WORDCOUNT_REKEYING` (neither `repartition` nor `direct`), named.
pub fn topology_from_env() -> Result<Topology, String> {
    let (input, output) = (
        env_or("WORDCOUNT_INPUT_TOPIC", "text-lines"),
        env_or("WORDCOUNT_OUTPUT_TOPIC", "word-counts"),
    );
    match env_or("WORDCOUNT_REKEYING", "repartition").as_str() {
        "repartition" => Ok(topology_repartitioned(
            &input,
            &env_or("WORDCOUNT_REPARTITION_TOPIC", REPARTITION_TOPIC),
            &output,
        )),
        "direct" => Ok(topology_direct(&input, &output)),
        other => Err(format!(
            "WORDCOUNT_REKEYING={other:?}: expected \"repartition\" (the default) or \"direct\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_mode_repartitions_the_words() {
        let topology = topology("lines", "counts");
        assert_eq!(topology.repartition_topics(), [REPARTITION_TOPIC]);
        assert_eq!(topology.source_topics(), ["lines", REPARTITION_TOPIC]);
        let named = topology_repartitioned("lines", "words", "counts");
        assert_eq!(named.repartition_topics(), ["words"]);
        assert!(
            topology_direct("lines", "counts")
                .repartition_topics()
                .is_empty()
        );
    }

    #[test]
    fn words_are_lowercased_and_split_on_any_whitespace() {
        assert_eq!(
            words("The  quick\tBROWN\nfox "),
            ["the", "quick", "brown", "fox"]
        );
        assert!(words("   ").is_empty());
    }

    /// A tombstone between two lines: Kafka Streams' WordCount counts the words of the
    /// lines only (a null line has none), and the batch holding it succeeds under the
    /// default `fail` poison policy.
    #[test]
    fn a_tombstone_line_counts_nothing_and_is_not_poison() {
        use lambda_streams::driver::{Batching, TestDriver};
        for topology in [
            topology("lines", "counts"),
            topology_direct("lines", "counts"),
        ] {
            let driver = TestDriver::new(topology).with_batching(Batching::Manual);
            driver
                .pipe("lines", 0, None, Some(b"the fox".to_vec()), 1)
                .expect("piped");
            driver.pipe("lines", 0, None, None, 2).expect("piped");
            driver
                .pipe("lines", 0, None, Some(b"The end".to_vec()), 3)
                .expect("piped");
            let report = driver.flush().expect("the batch with a tombstone succeeds");
            assert_eq!(report.poison_records, 0);
            // The repartitioned topology's second hop runs in the batch the driver
            // delivers next.
            driver.flush().expect("second hop");
            assert_eq!(driver.pending(), 0);
            let counts: Vec<(Vec<u8>, i64)> = driver
                .store(STORE)
                .into_iter()
                .map(|(key, count, _)| (key, count))
                .collect();
            assert_eq!(
                counts,
                [
                    (b"end".to_vec(), 1),
                    (b"fox".to_vec(), 1),
                    (b"the".to_vec(), 2)
                ]
            );
        }
    }
}
