//! `Topology::describe` and `Topology::to_mermaid`, expected texts written by hand.

#![allow(clippy::unwrap_used)]

use lambda_streams::dsl::{Grouped, NodeKind};
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
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

#[test]
fn wordcount_description() {
    let expected = "\
Topologies:
   Sub-topology: 0
    Source: KSTREAM-SOURCE-0000000000 (topics: [text-lines])
      --> KSTREAM-FLATMAPVALUES-0000000001
    Processor: KSTREAM-FLATMAPVALUES-0000000001 (stores: [])
      --> KSTREAM-KEY-SELECT-0000000002
      <-- KSTREAM-SOURCE-0000000000
    Processor: KSTREAM-KEY-SELECT-0000000002 (stores: [])
      --> KSTREAM-AGGREGATE-0000000003
      <-- KSTREAM-FLATMAPVALUES-0000000001
    Processor: KSTREAM-AGGREGATE-0000000003 (stores: [counts])
      --> KTABLE-TOSTREAM-0000000004
      <-- KSTREAM-KEY-SELECT-0000000002
    Processor: KTABLE-TOSTREAM-0000000004 (stores: [])
      --> KSTREAM-SINK-0000000005
      <-- KSTREAM-AGGREGATE-0000000003
    Sink: KSTREAM-SINK-0000000005 (topic: word-counts)
      <-- KTABLE-TOSTREAM-0000000004
";
    assert_eq!(wordcount().describe().to_string(), expected);
}

#[test]
fn wordcount_mermaid() {
    let expected = r#"graph TD
  t0[/"text-lines"/]
  t1[/"word-counts"/]
  subgraph sub0["Sub-topology 0"]
    n0(["KSTREAM-SOURCE-0000000000"])
    n1["KSTREAM-FLATMAPVALUES-0000000001"]
    n2["KSTREAM-KEY-SELECT-0000000002"]
    n3["KSTREAM-AGGREGATE-0000000003"]
    n4["KTABLE-TOSTREAM-0000000004"]
    n5[["KSTREAM-SINK-0000000005"]]
  end
  s0[("counts")]
  t0 --> n0
  n0 --> n1
  n1 --> n2
  n2 --> n3
  n3 -.- s0
  n3 --> n4
  n4 --> n5
  n5 --> t1
"#;
    assert_eq!(wordcount().to_mermaid(), expected);
}

#[test]
fn independent_streams_are_separate_sub_topologies() {
    let builder = StreamsBuilder::new();
    let a = builder.stream("a", Unit, Utf8);
    builder.stream("b", Unit, Utf8).to("b-copy", Unit, Utf8);
    let split = a.split();
    split.branch("x", |_, v| v == "x").to("xs", Unit, Utf8);
    split.default_branch("rest").foreach(|_, _| {});
    let d = builder.build().describe();
    let layout: Vec<Vec<&str>> = d
        .sub_topologies
        .iter()
        .map(|s| s.nodes.iter().map(|n| n.name.as_str()).collect())
        .collect();
    assert_eq!(
        layout,
        [
            vec![
                "KSTREAM-SOURCE-0000000000",
                "KSTREAM-BRANCH-0000000003",
                "KSTREAM-BRANCH-0000000003-x",
                "KSTREAM-SINK-0000000005",
                "KSTREAM-BRANCH-0000000003-rest",
                "KSTREAM-FOREACH-0000000007",
            ],
            vec!["KSTREAM-SOURCE-0000000001", "KSTREAM-SINK-0000000002"],
        ]
    );
    let branch = d.node("KSTREAM-BRANCH-0000000003").unwrap();
    assert_eq!(
        branch.successors,
        [
            "KSTREAM-BRANCH-0000000003-x",
            "KSTREAM-BRANCH-0000000003-rest"
        ]
    );
    assert_eq!(
        d.node("KSTREAM-SINK-0000000002").unwrap().kind,
        NodeKind::Sink {
            topic: "b-copy".into()
        }
    );
    let text = d.to_string();
    assert!(
        text.contains(
            "\n\n   Sub-topology: 1\n    Source: KSTREAM-SOURCE-0000000001 (topics: [b])\n"
        )
    );
    assert!(
        text.contains("    Processor: KSTREAM-FOREACH-0000000007 (stores: [])\n      --> none\n")
    );
}

#[test]
fn mermaid_escapes_quotes_in_names() {
    let builder = StreamsBuilder::new();
    let split = builder.stream("in", Unit, Utf8).split();
    split
        .branch("say \"hi\"", |_, _| true)
        .to("out", Unit, Utf8);
    let mermaid = builder.build().to_mermaid();
    assert!(mermaid.contains(r#"n2["KSTREAM-BRANCH-0000000001-say #quot;hi#quot;"]"#));
}
