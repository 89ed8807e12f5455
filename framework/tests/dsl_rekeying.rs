//! `group_by`'s re-keying modes (design notes, section 4a): which mode the builder
//! chooses, what the description shows, and that repartitioned counts are exact and
//! ordered per key (checked against counts computed here).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::{EmitStrategy, Grouped, Rekeying, TimeWindows};
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

/// WordCount with the given `Grouped`; the counts go to `word-counts` when `to_topic`.
fn wordcount(grouped: Grouped<String, String>, to_topic: bool) -> Topology {
    let builder = StreamsBuilder::new();
    let counts = builder
        .stream("text-lines", Unit, Utf8)
        .flat_map_values(|line: String| {
            line.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        })
        .group_by(|_, word| word.clone(), grouped)
        .count("counts");
    if to_topic {
        counts.to_stream().to("word-counts", Utf8, DecimalI64);
    }
    builder.build()
}

#[test]
fn updates_to_a_topic_repartition_by_default() {
    let topology = wordcount(Grouped::with(Utf8, Utf8), true);
    assert_eq!(topology.repartition_topics(), ["counts-repartition"]);
    assert_eq!(
        topology.source_topics(),
        ["counts-repartition", "text-lines"]
    );
    assert_eq!(
        topology.sink_topics(),
        ["counts-repartition", "word-counts"]
    );
    let expected = "\
Topologies:
   Sub-topology: 0
    Source: KSTREAM-SOURCE-0000000000 (topics: [text-lines])
      --> KSTREAM-FLATMAPVALUES-0000000001
    Processor: KSTREAM-FLATMAPVALUES-0000000001 (stores: [])
      --> KSTREAM-KEY-SELECT-0000000002
      <-- KSTREAM-SOURCE-0000000000
    Processor: KSTREAM-KEY-SELECT-0000000002 (stores: [])
      --> KSTREAM-SINK-0000000006
      <-- KSTREAM-FLATMAPVALUES-0000000001
    Sink: KSTREAM-SINK-0000000006 (topic: counts-repartition)
      <-- KSTREAM-KEY-SELECT-0000000002

   Sub-topology: 1
    Processor: KSTREAM-AGGREGATE-0000000003 (stores: [counts])
      --> KTABLE-TOSTREAM-0000000004
      <-- KSTREAM-SOURCE-0000000007
    Processor: KTABLE-TOSTREAM-0000000004 (stores: [])
      --> KSTREAM-SINK-0000000005
      <-- KSTREAM-AGGREGATE-0000000003
    Sink: KSTREAM-SINK-0000000005 (topic: word-counts)
      <-- KTABLE-TOSTREAM-0000000004
    Source: KSTREAM-SOURCE-0000000007 (topics: [counts-repartition])
      --> KSTREAM-AGGREGATE-0000000003
";
    // (Nodes are listed in the order they were declared: the repartition hop's sink and
    // source are added when the builder chooses the mode, in `build`.)
    assert_eq!(topology.describe().to_string(), expected);
}

#[test]
fn the_repartition_topic_can_be_named() {
    let topology = wordcount(Grouped::with(Utf8, Utf8).with_topic("wc-words"), true);
    assert_eq!(topology.repartition_topics(), ["wc-words"]);
}

#[test]
fn state_read_from_the_table_alone_stays_direct() {
    let topology = wordcount(Grouped::with(Utf8, Utf8), false);
    assert!(topology.repartition_topics().is_empty());
    assert_eq!(topology.source_topics(), ["text-lines"]);
    // Unless asked for.
    let always = wordcount(Grouped::with(Utf8, Utf8).always_repartition(), false);
    assert_eq!(always.repartition_topics(), ["counts-repartition"]);
}

#[test]
fn direct_is_never_repartitioned() {
    let grouped = Grouped::<String, String>::direct(Utf8);
    assert_eq!(grouped.rekeying(), Rekeying::Direct);
    let topology = wordcount(grouped.always_repartition(), true);
    assert!(topology.repartition_topics().is_empty());
    assert_eq!(topology.sink_topics(), ["word-counts"]);
}

#[test]
fn emit_on_window_close_stays_direct_and_on_update_repartitions() {
    for (emit, repartitioned) in [
        (EmitStrategy::OnWindowClose, false),
        (EmitStrategy::OnWindowUpdate, true),
    ] {
        let builder = StreamsBuilder::new();
        builder
            .stream("views", Unit, Utf8)
            .group_by(|_, page: &String| page.clone(), Grouped::with(Utf8, Utf8))
            .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
            .emit_strategy(emit)
            .count("per-minute")
            .to_stream()
            .map(|w, n| (w.key, n))
            .to("out", Utf8, DecimalI64);
        let topics = builder.build().repartition_topics();
        assert_eq!(
            topics.len(),
            usize::from(repartitioned),
            "{emit:?}: {topics:?}"
        );
    }
}

/// Lines of words from a small vocabulary.
fn lines() -> impl Strategy<Value = Vec<(i32, String)>> {
    let word = prop::sample::select(vec!["a", "b", "c", "d", "e"]);
    let line = prop::collection::vec(word, 0..6).prop_map(|w| w.join(" "));
    prop::collection::vec((0..3i32, line), 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Repartitioned through the driver (which reads the repartition topic back), with
    /// batches of random sizes and redeliveries: the last update per word is its count,
    /// and a word's updates never go down (one writer per word).
    #[test]
    fn repartitioned_counts_are_exact_and_ordered(
        input in lines(),
        cuts in prop::collection::vec(any::<bool>(), 40),
        redeliver in prop::collection::vec(any::<bool>(), 40),
    ) {
        let driver = TestDriver::new(wordcount(Grouped::with(Utf8, Utf8), true))
            .with_batching(Batching::Manual);
        let mut reference: BTreeMap<String, i64> = BTreeMap::new();
        for (i, (partition, line)) in input.iter().enumerate() {
            driver
                .pipe("text-lines", *partition, None, Some(line.clone().into_bytes()), i as i64)
                .unwrap();
            for w in line.split_whitespace() {
                *reference.entry(w.to_owned()).or_default() += 1;
            }
            if cuts[i] {
                driver.flush().unwrap();
                if redeliver[i] {
                    driver.redeliver_last_batch().unwrap();
                }
            }
        }
        // Until the repartition topic is drained too.
        while driver.pending() > 0 {
            driver.flush().unwrap();
        }
        let mut last: BTreeMap<String, i64> = BTreeMap::new();
        for (word, count) in driver.output_topic("word-counts", Utf8, DecimalI64).read_key_values().unwrap() {
            let previous = last.insert(word.clone(), count).unwrap_or(0);
            prop_assert!(count >= previous, "{}: {} after {}", word, count, previous);
        }
        prop_assert_eq!(&last, &reference);
        let stored: BTreeMap<String, i64> = driver
            .store("counts")
            .into_iter()
            .map(|(k, v, _)| (String::from_utf8(k).unwrap(), v))
            .collect();
        prop_assert_eq!(stored, reference);
    }
}
