//! Two repartition hops and a store fed through two channels, end to end: lines on 3
//! partitions, their words through a 3-partition repartition topic, the words' first
//! letters through a 2-partition one, and each line's word count as a key both directly and
//! through a copy topic; through the local runner on the real broker with duplicate
//! deliveries and longer retries injected on every hop (so every repartition topic gets
//! duplicate copies), the state in DynamoDB on the emulator. The counts equal references
//! computed here from the lines (each line once). And null-key records through a hop, whose
//! copies the producer would spread over the hop's partitions without a stand-in key.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{Unit, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::admin;

/// `per-letter`: words (hop 1) → first letters (hop 2) → count. `by-length`: each line
/// keyed by its number of words, directly and through `copy`, merged → count (each line
/// counts twice).
fn topology(input: &str, words: &str, letters: &str, copy: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let lines = builder.stream(input, Unit, Utf8);
    lines
        .flat_map(|_, line: String| {
            line.split_whitespace()
                .map(|w| (w.to_lowercase(), ()))
                .collect::<Vec<_>>()
        })
        .repartition(words, Utf8, Unit)
        .map(|word: String, ()| (word.chars().take(1).collect::<String>(), word))
        .repartition(letters, Utf8, Utf8)
        .group_by_key(Utf8)
        .count("per-letter");
    let by_length =
        lines.map(|_, line: String| (line.split_whitespace().count().to_string(), line));
    by_length
        .merge(&by_length.repartition(copy, Utf8, Utf8))
        .group_by_key(Utf8)
        .count("by-length");
    builder.build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hops_and_merged_channels_are_exact_under_faults_on_every_hop() {
    require_services();
    let (input, words, letters, copy) = (
        unique("hops-lines"),
        unique("hops-words"),
        unique("hops-letters"),
        unique("hops-copy"),
    );
    let servers = bootstrap();
    for (topic, partitions) in [(&input, 3), (&words, 3), (&letters, 2), (&copy, 2)] {
        admin::create_topic(&servers, topic, partitions)
            .await
            .expect("topic");
    }
    let lines = sample_text(150, 47);
    produce_across_partitions(&input, &lines, 3).await;
    let (table, store) = exactly_once_store("hops").await;
    let store = Arc::new(store);
    let handler =
        Handler::with_kafka_output(topology(&input, &words, &letters, &copy), store, None);
    run_with_redeliveries(
        handler,
        vec![input.clone(), words.clone(), letters.clone(), copy.clone()],
        "hops-group",
        20,
        Duration::from_secs(240),
    )
    .await;

    // The references, from the lines.
    let mut per_letter: BTreeMap<String, i64> = BTreeMap::new();
    for (word, n) in reference_counts(&lines) {
        *per_letter
            .entry(word.chars().take(1).collect())
            .or_default() += n;
    }
    let mut by_length: BTreeMap<String, i64> = BTreeMap::new();
    for line in &lines {
        *by_length
            .entry(line.split_whitespace().count().to_string())
            .or_default() += 2;
    }
    let total_words: i64 = per_letter.values().sum();
    assert!(
        read_topic(&words).len() as i64 > total_words,
        "the faults put duplicate copies in the first repartition topic"
    );
    assert!(
        read_topic(&letters).len() as i64 > total_words,
        "and in the second"
    );
    assert_eq!(
        table_counts(&table, "per-letter").await,
        per_letter,
        "two hops"
    );
    assert_eq!(
        table_counts(&table, "by-length").await,
        by_length,
        "merged channels"
    );
}

/// Lines (null keys) through a 3-partition repartition topic, keys kept, then counted per
/// number of words in one item fed directly from every partition of the hop.
fn null_keys_topology(input: &str, hop: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Unit, Utf8)
        .repartition(hop, Unit, Utf8)
        .group_by(
            |_, line: &String| line.split_whitespace().count().to_string(),
            lambda_streams::dsl::Grouped::direct(Utf8),
        )
        .count("by-length");
    builder.build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_key_records_cross_a_hop_exactly_once_under_faults() {
    // The producer puts a null key on a partition of its choice per send, so without a
    // stand-in key a duplicate's copy lands on another partition of the hop, another
    // watermark channel, and is counted again.
    require_services();
    let (input, hop) = (unique("nullkey-lines"), unique("nullkey-hop"));
    let servers = bootstrap();
    for (topic, partitions) in [(&input, 3), (&hop, 3)] {
        admin::create_topic(&servers, topic, partitions)
            .await
            .expect("topic");
    }
    let lines = sample_text(120, 53);
    produce_across_partitions(&input, &lines, 3).await;
    let (table, store) = exactly_once_store("nullkey").await;
    let store = Arc::new(store);
    let handler = Handler::with_kafka_output(null_keys_topology(&input, &hop), store, None);
    run_with_redeliveries(
        handler,
        vec![input.clone(), hop.clone()],
        "nullkey-group",
        20,
        Duration::from_secs(240),
    )
    .await;

    // The reference, from the lines: each line once.
    let mut by_length: BTreeMap<String, i64> = BTreeMap::new();
    for line in &lines {
        *by_length
            .entry(line.split_whitespace().count().to_string())
            .or_default() += 1;
    }
    assert!(
        read_topic(&hop).len() > lines.len(),
        "the faults put duplicate copies in the repartition topic"
    );
    assert_eq!(table_counts(&table, "by-length").await, by_length);
}
