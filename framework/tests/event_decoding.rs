//! Decoding and encoding of the Lambda Kafka event on fixture files: the shared fixtures,
//! edge cases of design.md section 2, malformed input, round trips, interop with
//! `aws_lambda_events`, and a full-size (10,000-record, ~6 MB) event.
//!
//! Expected bytes are literals computed by hand or with Python's `base64`.

use lambda_streams::event::{
    DecodeErrorKind, EventSource, Header, KafkaEvent, PartitionRecords, Record, SchemaMetadata,
    TimestampType, TopicPartition,
};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|err| panic!("{path}: {err}"))
}

fn decode_fixture(name: &str) -> KafkaEvent {
    KafkaEvent::decode(&fixture(name)).unwrap_or_else(|err| panic!("{name}: {err}"))
}

fn header(name: &str, value: &[u8]) -> Header {
    Header::new(name, value.to_vec())
}

#[test]
fn msk_fixture_decodes_to_known_values() {
    let event = decode_fixture("msk-event.json");
    assert_eq!(
        event.source,
        EventSource::Msk {
            arn: "arn:aws:kafka:us-east-1:123456789012:cluster/demo-cluster/6b1a6a2c-4d1e-4a7b-9c1e-000000000001-3".to_owned()
        }
    );
    assert_eq!(
        event.bootstrap_servers,
        "b-1.demo.kafka.us-east-1.amazonaws.com:9092,b-2.demo.kafka.us-east-1.amazonaws.com:9092"
    );
    assert_eq!(event.record_count(), 3);
    let keys: Vec<String> = event.partitions.iter().map(|p| p.tp.to_string()).collect();
    assert_eq!(keys, ["page-views-0", "page-views-1"]);

    let first = &event.partitions[0].records[0];
    assert_eq!(first.offset, 15);
    assert_eq!(first.timestamp, 1_764_460_800_123);
    assert_eq!(first.timestamp_type, TimestampType::CreateTime);
    assert_eq!(first.key.as_deref(), Some(&b"user-1"[..]));
    assert_eq!(
        first.value.as_deref(),
        Some(&br#"{"page":"/home","ms":31}"#[..])
    );
    assert_eq!(first.headers, vec![header("trace-id", b"abc")]);

    let second = &event.partitions[0].records[1];
    assert_eq!((second.offset, second.timestamp), (16, 1_764_460_801_999));
    assert_eq!(second.key.as_deref(), Some(&b"user-2"[..]));
    assert_eq!(
        second.value.as_deref(),
        Some(&br#"{"page":"/cart","ms":12}"#[..])
    );
    assert!(second.headers.is_empty());

    let other = &event.partitions[1];
    assert_eq!(other.tp, TopicPartition::new("page-views", 1));
    assert_eq!(other.records[0].offset, 7);
    assert_eq!(
        other.records[0].timestamp_type,
        TimestampType::LogAppendTime
    );
    assert_eq!(
        other.records[0].value.as_deref(),
        Some(&br#"{"page":"/home","ms":18}"#[..])
    );
}

#[test]
fn self_managed_fixture_decodes_to_known_values() {
    let event = decode_fixture("self-managed-event.json");
    assert_eq!(event.source, EventSource::SelfManaged);
    assert_eq!(event.bootstrap_servers, "127.0.0.1:9092");
    assert_eq!(event.partitions.len(), 1);
    let p = &event.partitions[0];
    assert_eq!(p.tp, TopicPartition::new("text-lines", 0));
    // Absent key, then null key.
    assert_eq!(p.records[0].key, None);
    assert_eq!(p.records[1].key, None);
    assert_eq!(
        p.records[0].value.as_deref(),
        Some(&b"the quick brown fox"[..])
    );
    assert_eq!(
        p.records[1].value.as_deref(),
        Some(&b"jumps over the lazy dog"[..])
    );
    assert_eq!(p.records[1].timestamp, 1_764_460_800_001);
    // Signed Java bytes [-17, -69, -65, 104] are a UTF-8 BOM and 'h'.
    assert_eq!(
        p.records[1].headers,
        vec![header("source", &[0xEF, 0xBB, 0xBF, 0x68])]
    );
}

#[test]
fn edge_case_fixture_keeps_keys_tombstones_headers_and_timestamps_exact() {
    let event = decode_fixture("self-managed-edge-cases.json");
    assert_eq!(event.bootstrap_servers, "kafka-1:9092,kafka-2:9092");
    let expected = PartitionRecords {
        tp: TopicPartition::new("text-lines", 3),
        records: vec![
            Record {
                offset: 100,
                timestamp: 9_007_199_254_740_993, // 2^53 + 1: not representable as f64
                timestamp_type: TimestampType::CreateTime,
                key: None,                         // absent
                value: Some(b"A".to_vec().into()), // "QQ=="
                headers: vec![],                   // field missing
                key_schema_metadata: None,
                value_schema_metadata: None,
            },
            Record {
                offset: 101,
                timestamp: 1_764_460_802_000,
                timestamp_type: TimestampType::LogAppendTime,
                key: None,                                               // null
                value: None,                                             // tombstone
                headers: vec![header("bin", &[0x00, 0xFF, 0x10, 0x80])], // unsigned bytes
                key_schema_metadata: None,
                value_schema_metadata: None,
            },
            Record {
                offset: 105,
                timestamp: -1,
                timestamp_type: TimestampType::CreateTime,
                key: Some(b"tomb-key".to_vec().into()),
                value: None,
                // A two-entry header object keeps both entries, in order; names may repeat.
                headers: vec![header("a", &[1]), header("b", &[2, 0xFF]), header("a", &[])],
                key_schema_metadata: None,
                value_schema_metadata: None,
            },
            Record {
                offset: 106,
                timestamp: i64::MAX,
                timestamp_type: TimestampType::CreateTime,
                key: Some(b"A".to_vec().into()), // "\u0051Q==" is "QQ==" with an escape
                value: Some(vec![0x00, 0xFF, 0x10].into()), // "AP8Q"
                headers: vec![],                 // null
                key_schema_metadata: None,
                value_schema_metadata: None,
            },
        ],
    };
    assert_eq!(event.partitions, vec![expected]);
}

#[test]
fn multi_topic_fixture_keeps_partition_order_dashed_topics_and_schema_metadata() {
    let event = decode_fixture("msk-multi-topic.json");
    let tps: Vec<&TopicPartition> = event.partitions.iter().map(|p| &p.tp).collect();
    assert_eq!(
        tps,
        [
            &TopicPartition::new("orders-eu-west-1", 12),
            &TopicPartition::new("orders-eu-west-1", 3),
            &TopicPartition::new("page-views", 0),
        ]
    );
    assert_eq!(event.record_count(), 4);
    let orders = &event.partitions[0].records;
    assert_eq!(orders[0].offset, 4_000_000_000);
    assert_eq!(orders[0].key.as_deref(), Some(&b"order-17"[..]));
    assert_eq!(orders[0].value.as_deref(), Some(&br#"{"total":12.5}"#[..]));
    assert_eq!(
        orders[0].headers,
        vec![header("content-type", b"application/json")]
    );
    assert_eq!(
        orders[0].key_schema_metadata,
        Some(SchemaMetadata {
            data_format: Some("AVRO".to_owned()),
            schema_id: Some("a1b2c3d4-0001".to_owned()),
        })
    );
    assert_eq!(
        orders[0]
            .value_schema_metadata
            .as_ref()
            .and_then(|m| m.data_format.as_deref()),
        Some("JSON")
    );
    assert_eq!(
        orders[1].value_schema_metadata,
        Some(SchemaMetadata {
            data_format: Some("PROTOBUF".to_owned()),
            schema_id: None,
        })
    );
    assert_eq!(orders[1].key_schema_metadata, None);
    let eu3 = &event.partitions[1].records[0];
    assert_eq!(eu3.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(
        eu3.headers,
        vec![header("tab\tname \"quoted\"", &[0x80, 0x7F])]
    );
    assert_eq!(
        event.partitions[2].records[0].key.as_deref(),
        Some(&b"user-1"[..])
    );
}

#[test]
fn fixtures_round_trip_through_to_json() {
    for name in [
        "msk-event.json",
        "self-managed-event.json",
        "self-managed-edge-cases.json",
        "msk-multi-topic.json",
    ] {
        let event = decode_fixture(name);
        let json = event.to_json();
        let again = KafkaEvent::decode(&json).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(again, event, "{name}");
        // Encoding is deterministic: a second trip writes the same bytes.
        assert_eq!(again.to_json(), json, "{name}");
    }
}

#[test]
fn to_json_writes_the_lambda_shape() {
    let event = decode_fixture("self-managed-event.json");
    let json: serde_json::Value =
        serde_json::from_slice(&event.to_json()).expect("to_json writes valid JSON");
    assert_eq!(json["eventSource"], "SelfManagedKafka");
    assert!(json.get("eventSourceArn").is_none());
    let records = &json["records"]["text-lines-0"];
    assert_eq!(records[0]["key"], serde_json::Value::Null);
    assert_eq!(records[0]["value"], "dGhlIHF1aWNrIGJyb3duIGZveA==");
    assert_eq!(
        records[1]["headers"],
        serde_json::json!([{ "source": [-17, -69, -65, 104] }])
    );
    assert_eq!(records[1]["timestampType"], "CREATE_TIME");

    let edge = decode_fixture("self-managed-edge-cases.json");
    let json: serde_json::Value =
        serde_json::from_slice(&edge.to_json()).expect("to_json writes valid JSON");
    let records = &json["records"]["text-lines-3"];
    assert_eq!(records[1]["value"], serde_json::Value::Null);
    // Unsigned input bytes come out as Java's signed bytes.
    assert_eq!(
        records[1]["headers"],
        serde_json::json!([{ "bin": [0, -1, 16, -128] }])
    );
    // Exact, as an integer literal (serde_json keeps u64/i64 exactly).
    assert_eq!(
        records[0]["timestamp"].as_i64(),
        Some(9_007_199_254_740_993)
    );
}

#[test]
fn aws_lambda_events_parses_our_output() {
    // aws_lambda_events needs `headers` on every record; to_json always writes it.
    let event = decode_fixture("msk-multi-topic.json");
    let theirs: aws_lambda_events::event::kafka::KafkaEvent =
        serde_json::from_slice(&event.to_json()).expect("aws_lambda_events parses to_json");
    assert_eq!(theirs.event_source.as_deref(), Some("aws:kafka"));
    assert_eq!(
        theirs.bootstrap_servers.as_deref(),
        Some("b-1.orders.kafka.eu-west-1.amazonaws.com:9098")
    );
    let orders = &theirs.records["orders-eu-west-1-12"];
    assert_eq!(orders.len(), 2);
    assert_eq!(orders[0].topic.as_deref(), Some("orders-eu-west-1"));
    assert_eq!(orders[0].partition, 12);
    assert_eq!(orders[0].offset, 4_000_000_000);
    assert_eq!(orders[0].key.as_deref(), Some("b3JkZXItMTc="));
    let eu3 = &theirs.records["orders-eu-west-1-3"][0];
    assert_eq!(eu3.headers[0]["tab\tname \"quoted\""], vec![-128i8, 127]);

    // The self-managed fixture has an absent key in its input; our output writes `null`,
    // and signed bytes for the header. (The edge-case fixture is not used here: its
    // timestamps, e.g. 2^53 + 1 ms, are beyond chrono's range and aws_lambda_events rejects them.)
    let plain = decode_fixture("self-managed-event.json");
    let theirs: aws_lambda_events::event::kafka::KafkaEvent =
        serde_json::from_slice(&plain.to_json()).expect("aws_lambda_events parses to_json");
    let records = &theirs.records["text-lines-0"];
    assert_eq!(records[0].key, None);
    assert_eq!(
        records[0].value.as_deref(),
        Some("dGhlIHF1aWNrIGJyb3duIGZveA==")
    );
    assert_eq!(records[1].headers[0]["source"], vec![-17i8, -69, -65, 104]);
}

#[test]
fn malformed_fixture_edits_give_located_errors() {
    let good = String::from_utf8(fixture("msk-event.json")).expect("fixture is UTF-8");
    let cases: [(&str, &str, &str, &str); 4] = [
        (
            r#""value": "eyJwYWdlIjoiL2NhcnQiLCJtcyI6MTJ9""#,
            r#""value": "eyJwYWdlIjoiL2NhcnQiLCJtcyI6MTJ9!""#,
            r#"at records["page-views-0"][1] (page-views-0 offset 16), field "value": invalid base64"#,
            "base64",
        ),
        (
            "[\n              97,",
            "[\n              300,",
            r#"at records["page-views-0"][0] (page-views-0 offset 15), field "headers": header "trace-id" has byte value 300"#,
            "header byte",
        ),
        (
            r#""eventSource": "aws:kafka""#,
            r#""eventSource": "aws:kinesis""#,
            r#"field "eventSource": unknown eventSource "aws:kinesis""#,
            "event source",
        ),
        (
            "\"partition\": 1,",
            "\"partition\": 2,",
            r#"at records["page-views-1"][0] (page-views-1 offset 7): record has topic "page-views" and partition 2 but is listed under key "page-views-1""#,
            "wrong partition",
        ),
    ];
    for (from, to, expected, what) in cases {
        assert!(good.contains(from), "{what}: fixture changed");
        let bad = good.replacen(from, to, 1);
        let err = KafkaEvent::decode(bad.as_bytes()).expect_err(what);
        assert!(err.to_string().contains(expected), "{what}: {err}");
    }
}

#[test]
fn truncation_anywhere_is_an_error_not_a_panic() {
    let json = fixture("self-managed-edge-cases.json");
    for len in 0..json.len() {
        // Cutting only trailing whitespace leaves a complete document.
        if json[len..].iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let err = KafkaEvent::decode(&json[..len]).expect_err("a truncated event fails");
        assert!(
            err.to_string().starts_with("malformed Kafka event"),
            "{err}"
        );
        if let DecodeErrorKind::Syntax(_) = err.kind() {
            assert!(err.line_column().is_some(), "{err}");
        }
    }
}

/// A self-managed event of `count` records spread over 4 partitions, each value ~`value_len`
/// bytes, with one header per record. Built by hand (not with `to_json`).
fn large_event(count: usize, value_len: usize) -> Vec<u8> {
    use std::fmt::Write as _;
    // 'x' * 3 bytes is "eHh4" in base64; keep value_len a multiple of 3 for exact sizes.
    let value_b64 = "eHh4".repeat(value_len / 3);
    let mut json = String::with_capacity(count * (value_b64.len() + 200));
    json.push_str(
        r#"{"eventSource":"SelfManagedKafka","bootstrapServers":"127.0.0.1:9092","records":{"#,
    );
    let partitions = 4;
    for p in 0..partitions {
        if p > 0 {
            json.push(',');
        }
        write!(json, r#""bench-topic-{p}":["#).expect("write to String");
        for i in (p..count).step_by(partitions) {
            if i >= partitions {
                json.push(',');
            }
            write!(
                json,
                r#"{{"topic":"bench-topic","partition":{p},"offset":{i},"timestamp":{},"timestampType":"CREATE_TIME","key":"a2V5","value":"{value_b64}","headers":[{{"seq":[{},-1]}}]}}"#,
                1_764_460_800_000u64 + i as u64,
                i % 128,
            )
            .expect("write to String");
        }
        json.push(']');
    }
    json.push_str("}}");
    json.into_bytes()
}

#[test]
fn full_size_event_decodes() {
    let json = large_event(10_000, 321);
    assert!(
        json.len() > 5_500_000 && json.len() < 6_291_456,
        "size {}",
        json.len()
    );
    let event = KafkaEvent::decode(&json).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(event.record_count(), 10_000);
    assert_eq!(event.partitions.len(), 4);
    let last = &event.partitions[3].records[2499];
    assert_eq!(last.offset, 9_999);
    assert_eq!(last.timestamp, 1_764_460_809_999);
    assert_eq!(last.key.as_deref(), Some(&b"key"[..]));
    assert_eq!(last.value.as_ref().map(|v| v.len()), Some(321));
    assert_eq!(last.headers, vec![header("seq", &[15, 0xFF])]); // 9999 % 128 = 15
    assert_eq!(KafkaEvent::decode(&event.to_json()).ok(), Some(event));
}
