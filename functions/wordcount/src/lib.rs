//! Kafka Streams' WordCount, on AWS Lambda.
//!
//! Reads UTF-8 lines from the input topic (`text-lines`), splits them into lowercase
//! words on whitespace, counts each word exactly once in DynamoDB, and after each batch
//! produces `(word, count)` to the output topic (`word-counts`): the key is the word,
//! the value the word's count after the batch as decimal UTF-8 text, with the state
//! item's version in the `lambda-streams-version` header (the record with the highest
//! version per word carries its current count).
//!
//! Environment: `WORDCOUNT_INPUT_TOPIC` (default `text-lines`), `WORDCOUNT_OUTPUT_TOPIC`
//! (default `word-counts`), plus the framework's (`LAMBDA_STREAMS_TABLE`, …; see
//! `lambda_streams::lambda`).

use lambda_streams::dsl::Grouped;
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
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
        .stream(input, Unit, Utf8)
        .flat_map_values(|line: String| words(&line))
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
    let var = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_owned())
    };
    let (input, output) = (
        var("WORDCOUNT_INPUT_TOPIC", "text-lines"),
        var("WORDCOUNT_OUTPUT_TOPIC", "word-counts"),
    );
    match var("WORDCOUNT_REKEYING", "repartition").as_str() {
        "repartition" => Ok(topology_repartitioned(
            &input,
            &var("WORDCOUNT_REPARTITION_TOPIC", REPARTITION_TOPIC),
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
}
