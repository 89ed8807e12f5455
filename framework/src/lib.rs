//! # lambda-streams
//!
//! Kafka Streams-style stream processing that runs **per batch** inside an AWS Lambda
//! function invoked by a Kafka event source (Amazon MSK or a self-managed cluster),
//! with state in DynamoDB written with an **exactly-once effect**.
//!
//! The model:
//! - a [`Topology`] is written once with the [`dsl`] ([`KStream`](dsl::KStream),
//!   [`KTable`](dsl::KTable), grouped aggregations);
//! - each Lambda invocation brings a batch of records ([`event::KafkaEvent`]); stateless
//!   operators run inline; aggregations fold the batch in memory and write each touched
//!   state item **once**, with a condition on per-partition offset watermarks
//!   ([`state`]), so a redelivered or retried batch never counts twice;
//! - output records go to Kafka through an idempotent producer ([`sink`]);
//! - [`lambda::run`] turns a topology into a Lambda function in a few lines;
//! - [`driver::TestDriver`] runs a topology in memory, deterministically, for unit tests
//!   (the analogue of Kafka Streams' `TopologyTestDriver`).
//!
//! ```
//! use lambda_streams::dsl::{Grouped, StreamsBuilder};
//! use lambda_streams::event::KafkaEvent;
//! use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
//! use lambda_streams::sink::MemorySink;
//! use lambda_streams::state::memory::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! // Kafka Streams' WordCount.
//! let builder = StreamsBuilder::new();
//! builder
//!     .stream("text-lines", Unit, Utf8)
//!     .flat_map_values(|line: String| {
//!         line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>()
//!     })
//!     // Direct re-keying: each batch counts its own words. (`Grouped::with(Utf8, Utf8)`,
//!     // the default for counts that go to a topic, would first send the words through a
//!     // repartition topic that the function also consumes.)
//!     .group_by(|_, word| word.clone(), Grouped::direct(Utf8))
//!     .count("counts")
//!     .to_stream()
//!     .to("word-counts", Utf8, DecimalI64);
//! let topology = builder.build();
//!
//! // One batch, as the Kafka event source delivers it ("the fox" and "The end").
//! let event = KafkaEvent::decode(br#"{
//!   "eventSource": "SelfManagedKafka", "bootstrapServers": "127.0.0.1:9092",
//!   "records": {"text-lines-0": [
//!     {"topic": "text-lines", "partition": 0, "offset": 0, "timestamp": 1, "timestampType": "CREATE_TIME",
//!      "key": null, "value": "dGhlIGZveA==", "headers": []},
//!     {"topic": "text-lines", "partition": 0, "offset": 1, "timestamp": 2, "timestampType": "CREATE_TIME",
//!      "key": null, "value": "VGhlIGVuZA==", "headers": []}]}}"#).unwrap();
//!
//! let (store, sink) = (MemoryStore::new(), MemorySink::new());
//! topology.process(&event, &store, &sink).await.unwrap();
//! // The same batch again (a redelivery) changes nothing.
//! topology.process(&event, &store, &sink).await.unwrap();
//! assert_eq!(
//!     store.items("counts"),
//!     vec![(b"end".to_vec(), 1, 1), (b"fox".to_vec(), 1, 1), (b"the".to_vec(), 2, 1)]
//! );
//! # });
//! ```
//!
//! # Examples
//!
//! Programs to copy from, one per main pattern, each running its topology through the
//! [`driver::TestDriver`] and tested against values worked out by hand or by brute force
//! (`cargo run -p lambda-streams --example NAME`, `cargo test -p lambda-streams --example NAME`):
//!
//! - [`filter_map`](https://docs.rs/crate/lambda-streams/latest/source/examples/filter_map.rs):
//!   stateless filter and map, no state;
//! - [`windowed_count`](https://docs.rs/crate/lambda-streams/latest/source/examples/windowed_count.rs):
//!   a count per key and minute, emitted once per window when it closes
//!   ([`EmitStrategy::OnWindowClose`](dsl::EmitStrategy::OnWindowClose)), late records dropped
//!   and counted;
//! - [`enrichment_join`](https://docs.rs/crate/lambda-streams/latest/source/examples/enrichment_join.rs):
//!   a stream left-joined with a table ([`KStream::left_join`](dsl::KStream::left_join));
//! - [`top_k`](https://docs.rs/crate/lambda-streams/latest/source/examples/top_k.rs): the `k`
//!   best members per key ([`KGroupedStream::top_k`](dsl::KGroupedStream::top_k)).
//!
//! # Guarantees
//!
//! State is exact under everything the Kafka event source does (redeliveries, retries with
//! other boundaries, zombies, crashes part-way through a batch); outputs are at least once,
//! each aggregate update with its item's version. What holds for each state and output kind,
//! under which faults, at what cost in DynamoDB requests per batch, and the test that proves
//! each claim:
//! [docs/guarantees.md](https://github.com/lambda-streams/lambda-streams/blob/main/docs/guarantees.md).

#![cfg_attr(test, allow(clippy::unwrap_used))]

/// The crate's README (its examples run as doctests).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub mod aws;
mod config;
pub mod config_env;
pub mod driver;
pub mod dsl;
pub mod error;
pub mod event;
mod handler;
mod http1;
pub mod kafka;
pub mod lambda;
pub mod metrics;
pub(crate) mod runtime;
pub mod serdes;
pub mod sink;
pub mod state;
pub(crate) mod topology;
pub mod wire;

pub use dsl::{StreamsBuilder, Topology};
pub use error::{StreamError, TopologyError};
pub use runtime::{
    BatchOptions, BatchOutcome, BatchReport, ERROR_HEADER, OUTPUT_CHUNK, OutputGuarantee,
    PoisonPolicy,
};
pub use state::Guarantee;
