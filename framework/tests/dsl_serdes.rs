//! Serdes end to end: a poison record fails the batch with an error naming its
//! topic-partition and offset, through `Topology::process` as in Lambda and through the
//! test driver.

#![allow(clippy::unwrap_used)]

use lambda_streams::driver::TestDriver;
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{BigEndianI64, Json, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{StreamError, StreamsBuilder, Topology};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PageView {
    page: String,
    user: u64,
}

fn views_topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("page-views", Utf8, Json::<PageView>::new())
        .map_values(|view| view.user as i64)
        .to("users", Utf8, BigEndianI64);
    builder.build()
}

#[tokio::test]
async fn bad_json_value_names_the_record_through_process() {
    // Partition 4: offset 10 is `{"page":"/a","user":1}`, offset 11 is `{"page":` (cut short).
    let event = KafkaEvent::decode(
        br#"{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{
        "page-views-4":[
          {"topic":"page-views","partition":4,"offset":10,"timestamp":1,"timestampType":"CREATE_TIME",
           "key":"dTE=","value":"eyJwYWdlIjoiL2EiLCJ1c2VyIjoxfQ==","headers":[]},
          {"topic":"page-views","partition":4,"offset":11,"timestamp":2,"timestampType":"CREATE_TIME",
           "key":"dTE=","value":"eyJwYWdlIjo=","headers":[]}]}}"#,
    )
    .unwrap();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let err = views_topology()
        .process(&event, &store, &sink)
        .await
        .unwrap_err();
    match &err {
        StreamError::Deserialize {
            tp,
            offset,
            side,
            reason,
        } => {
            assert_eq!(tp.to_string(), "page-views-4");
            assert_eq!(*offset, 11);
            assert_eq!(*side, "value");
            assert_eq!(
                reason,
                "invalid JSON: EOF while parsing a value at line 1 column 8"
            );
        }
        other => panic!("expected a deserialize error, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "record page-views-4 offset 11: cannot deserialize the value: \
         invalid JSON: EOF while parsing a value at line 1 column 8"
    );
    // The batch failed as a whole: nothing was produced.
    assert!(sink.records().is_empty());
}

#[test]
fn json_values_through_the_driver() {
    let driver = TestDriver::new(views_topology());
    let mut views = driver.input_topic("page-views", Utf8, Json::<PageView>::new());
    views
        .pipe_input(
            "k",
            PageView {
                page: "/home".into(),
                user: 300,
            },
        )
        .unwrap();
    let out = driver.read_output("users");
    // 300 = 0x012c, as Kafka's LongSerializer writes it.
    assert_eq!(
        out[0].value.as_deref(),
        Some(&[0, 0, 0, 0, 0, 0, 0x01, 0x2c][..])
    );
    // A value of the wrong shape (user is a string) on partition 2.
    let err = driver
        .pipe(
            "page-views",
            2,
            Some(b"k".to_vec()),
            Some(br#"{"page":"/","user":"x"}"#.to_vec()),
            0,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "record page-views-2 offset 0: cannot deserialize the value: invalid JSON: \
         invalid type: string \"x\", expected u64 at line 1 column 22"
    );
}

#[test]
fn null_key_with_a_non_nullable_serde_is_a_key_error() {
    let driver = TestDriver::new(views_topology());
    let err = driver
        .pipe(
            "page-views",
            0,
            None,
            Some(br#"{"page":"/","user":1}"#.to_vec()),
            0,
        )
        .unwrap_err();
    assert!(matches!(
        &err,
        StreamError::Deserialize {
            side: "key",
            offset: 0,
            ..
        }
    ));
}
