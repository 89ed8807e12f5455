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

use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// The name of the state store holding the counts.
pub const STORE: &str = "word-counts";

/// The words of a line: split on Unicode whitespace, lowercased.
pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_lowercase).collect()
}

/// The WordCount topology from `input` to `output`.
pub fn topology(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Unit, Utf8)
        .flat_map_values(|line: String| words(&line))
        .group_by(|_, word| word.clone(), Utf8)
        .count(STORE)
        .to_stream()
        .to(output, Utf8, DecimalI64);
    builder.build()
}

/// The WordCount topology in repartition mode: the words go through `repartition` (a topic
/// the function also consumes), so that each word's count is written by the one partition
/// that owns the word, and its updates reach `output` in order per word.
pub fn topology_repartitioned(input: &str, repartition: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Unit, Utf8)
        .flat_map(|_, line: String| {
            words(&line)
                .into_iter()
                .map(|w| (w, ()))
                .collect::<Vec<_>>()
        })
        .repartition(repartition, Utf8, Unit)
        .group_by_key(Utf8)
        .count(STORE)
        .to_stream()
        .to(output, Utf8, DecimalI64);
    builder.build()
}

/// The topology with its topics from `WORDCOUNT_INPUT_TOPIC` and `WORDCOUNT_OUTPUT_TOPIC`;
/// in repartition mode through `WORDCOUNT_REPARTITION_TOPIC` when it is set.
pub fn topology_from_env() -> Topology {
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
    match std::env::var("WORDCOUNT_REPARTITION_TOPIC") {
        Ok(topic) if !topic.is_empty() => topology_repartitioned(&input, &topic, &output),
        _ => topology(&input, &output),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_lowercased_and_split_on_any_whitespace() {
        assert_eq!(
            words("The  quick\tBROWN\nfox "),
            ["the", "quick", "brown", "fox"]
        );
        assert!(words("   ").is_empty());
    }
}
