//! An event from an event source in Queue mode (Kafka share groups: no per-partition order,
//! records delivered to several consumers at once) is refused with a clear error, by the
//! decoder and so by the handler: the framework's offset watermarks need partition order.
//!
//! AWS's documentation (as found) describes Queue mode (`ConsumptionMode: Queue`, Kafka 4.2
//! share groups) but shows no Queue-mode event, so these events mark Queue mode the ways
//! the docs and KIP-932 describe: a share consumer's per-record `deliveryCount`, an
//! event-level `consumptionMode`, and records of a partition out of offset order.

use std::sync::Arc;

use lambda_streams::StreamsBuilder;
use lambda_streams::event::{DecodeErrorKind, KafkaEvent};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::Utf8;
use lambda_streams::sink::MemorySink;
use lambda_streams::state::memory::MemoryStore;

fn record(offset: i64, extra: &str) -> String {
    format!(
        r#"{{"topic":"orders","partition":0,"offset":{offset},"timestamp":1764460800000,"timestampType":"CREATE_TIME","key":null,"value":"YQ==","headers":[]{extra}}}"#
    )
}

fn event(top: &str, records: &[String]) -> String {
    format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092"{top},"records":{{"orders-0":[{}]}}}}"#,
        records.join(",")
    )
}

fn refused(json: &str) -> String {
    let err = KafkaEvent::decode(json.as_bytes()).expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("ConsumptionMode"), "{text}");
    text
}

#[test]
fn a_record_with_a_delivery_count_is_refused_naming_the_record() {
    let json = event("", &[record(0, ""), record(1, r#","deliveryCount":2"#)]);
    let err = KafkaEvent::decode(json.as_bytes()).expect_err("refused");
    assert!(matches!(err.kind(), DecodeErrorKind::QueueMode(_)), "{err}");
    assert_eq!(err.offset(), Some(1));
    assert_eq!(err.field(), Some("deliveryCount"));
    let text = refused(&json);
    assert!(text.contains("Queue mode"), "{text}");
    assert!(text.contains("orders-0"), "{text}");
}

#[test]
fn an_event_in_queue_consumption_mode_is_refused() {
    let json = event(r#","consumptionMode":"Queue""#, &[record(0, "")]);
    let err = KafkaEvent::decode(json.as_bytes()).expect_err("refused");
    assert!(matches!(err.kind(), DecodeErrorKind::QueueMode(_)), "{err}");
    refused(&json);
    // Stream mode, said explicitly, is the ordinary event.
    let stream = event(r#","consumptionMode":"Stream""#, &[record(0, "")]);
    assert_eq!(
        KafkaEvent::decode(stream.as_bytes())
            .expect("stream")
            .record_count(),
        1
    );
}

#[test]
fn records_out_of_order_are_refused_and_the_error_says_why() {
    let json = event("", &[record(5, ""), record(3, "")]);
    let text = refused(&json);
    assert!(text.contains("offset 3 follows offset 5"), "{text}");
}

#[test]
fn the_handler_refuses_a_queue_mode_event_without_processing_it() {
    let builder = StreamsBuilder::new();
    builder.stream("orders", Utf8, Utf8).to("out", Utf8, Utf8);
    let sink = Arc::new(MemorySink::new());
    let handler = Handler::new(builder.build(), Arc::new(MemoryStore::new()), sink.clone());
    let json = event("", &[record(0, r#","deliveryCount":1"#)]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let err = rt
        .block_on(handler.handle_json(json.as_bytes()))
        .expect_err("refused");
    assert!(err.to_string().contains("Queue mode"), "{err}");
    assert!(sink.records().is_empty(), "nothing was produced");
}
