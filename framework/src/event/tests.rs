//! Unit tests of decoding rules and error reporting, on small inline events.
//!
//! Expected bytes are literals computed by hand or with Python's `base64`, never with the
//! code under test.

use super::*;

/// A self-managed event whose only list, under `key`, holds the given record objects.
fn event_with(key: &str, records: &[&str]) -> String {
    format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"127.0.0.1:9092",
"records":{{"{key}":[{}]}}}}"#,
        records.join(",")
    )
}

/// A record of topic `t`, partition 0, with `extra` fields appended.
fn record(offset: i64, extra: &str) -> String {
    format!(
        r#"{{"topic":"t","partition":0,"offset":{offset},"timestamp":1764460800000,
"timestampType":"CREATE_TIME"{extra}}}"#
    )
}

fn decode_err(json: &str) -> DecodeError {
    match KafkaEvent::decode(json.as_bytes()) {
        Ok(event) => panic!("expected an error, decoded {event:?}"),
        Err(err) => err,
    }
}

fn decode_ok(json: &str) -> KafkaEvent {
    KafkaEvent::decode(json.as_bytes()).unwrap_or_else(|err| panic!("{err}"))
}

#[test]
fn topic_partition_key_splits_at_last_dash() {
    assert_eq!(
        TopicPartition::from_key("orders-eu-west-1-12"),
        Some(TopicPartition::new("orders-eu-west-1", 12))
    );
    assert_eq!(
        TopicPartition::new("orders-eu-west-1", 12).to_string(),
        "orders-eu-west-1-12"
    );
    // Topic names may end in '-' too.
    assert_eq!(
        TopicPartition::from_key("t--0"),
        Some(TopicPartition::new("t-", 0))
    );
    assert_eq!(
        TopicPartition::from_key("t--1"),
        Some(TopicPartition::new("t-", 1))
    );
}

#[test]
fn topic_partition_key_rejects_non_canonical_forms() {
    for key in [
        "t",
        "t-",
        "-0",
        "t-01",
        "t-+1",
        "t-1a",
        "t-2147483648",
        "t- 1",
    ] {
        assert_eq!(TopicPartition::from_key(key), None, "{key}");
    }
    assert_eq!(
        TopicPartition::from_key("t-2147483647"),
        Some(TopicPartition::new("t", i32::MAX))
    );
}

#[test]
fn timestamp_above_2_pow_53_is_exact() {
    let json = event_with(
        "t-0",
        &[&record(0, "").replace("1764460800000", "9007199254740993")],
    );
    let event = decode_ok(&json);
    assert_eq!(
        event.partitions[0].records[0].timestamp,
        9_007_199_254_740_993
    );
}

#[test]
fn float_timestamp_is_an_error_naming_the_record() {
    let json = event_with(
        "t-0",
        &[&record(7, "").replace("1764460800000", "1764460800000.0")],
    );
    let err = decode_err(&json);
    assert!(
        matches!(err.kind(), DecodeErrorKind::InvalidTimestamp(_)),
        "{err:?}"
    );
    assert_eq!(err.field(), Some("timestamp"));
    assert_eq!(err.offset(), Some(7));
    assert_eq!(err.location(), r#"records["t-0"][0]"#);
    let text = err.to_string();
    assert!(
        text.contains(r#"records["t-0"][0] (t-0 offset 7), field "timestamp""#),
        "{text}"
    );
    assert!(text.contains("1764460800000"), "{text}");
}

#[test]
fn string_timestamp_is_an_error() {
    let json = event_with(
        "t-0",
        &[&record(0, "").replace("1764460800000", "\"1764460800000\"")],
    );
    let err = decode_err(&json);
    // serde_json reports the type mismatch itself (kind `Invalid`), in the timestamp field.
    assert!(matches!(err.kind(), DecodeErrorKind::Invalid(_)), "{err:?}");
    assert_eq!(err.field(), Some("timestamp"));
    assert!(err.to_string().contains("invalid type: string"), "{err}");
}

#[test]
fn timestamp_above_i64_max_is_an_error() {
    let json = event_with(
        "t-0",
        &[&record(0, "").replace("1764460800000", "9223372036854775808")],
    );
    let err = decode_err(&json);
    assert!(
        matches!(err.kind(), DecodeErrorKind::InvalidTimestamp(_)),
        "{err:?}"
    );
}

#[test]
fn bad_base64_value_names_partition_offset_and_field() {
    let bad = record(41, r#","value":"not base64!""#);
    let json = event_with("t-0", &[&record(40, r#","value":"aGVsbG8=""#), &bad]);
    let err = decode_err(&json);
    assert!(
        matches!(err.kind(), DecodeErrorKind::InvalidBase64(_)),
        "{err:?}"
    );
    assert_eq!(err.topic_partition(), Some(&TopicPartition::new("t", 0)));
    assert_eq!(err.offset(), Some(41));
    assert_eq!(err.field(), Some("value"));
    let text = err.to_string();
    assert!(
        text.starts_with(
            r#"malformed Kafka event at records["t-0"][1] (t-0 offset 41), field "value": invalid base64"#
        ),
        "{text}"
    );
    assert!(err.line_column().is_some());
}

#[test]
fn unpadded_base64_is_an_error() {
    // "aGVsbG8" is "hello" without its padding: the ESM always pads.
    let json = event_with("t-0", &[&record(0, r#","key":"aGVsbG8""#)]);
    let err = decode_err(&json);
    assert!(
        matches!(err.kind(), DecodeErrorKind::InvalidBase64(_)),
        "{err:?}"
    );
    assert_eq!(err.field(), Some("key"));
}

#[test]
fn header_byte_300_names_header_and_record() {
    let json = event_with("t-0", &[&record(9, r#","headers":[{"trace":[1,300]}]"#)]);
    let err = decode_err(&json);
    assert_eq!(
        err.kind(),
        &DecodeErrorKind::HeaderByteOutOfRange {
            header: "trace".to_owned(),
            value: 300
        }
    );
    let text = err.to_string();
    assert!(
        text.contains(r#"(t-0 offset 9), field "headers""#),
        "{text}"
    );
    assert!(
        text.contains(r#"header "trace" has byte value 300"#),
        "{text}"
    );
}

#[test]
fn header_byte_below_minus_128_is_an_error() {
    let json = event_with("t-0", &[&record(0, r#","headers":[{"h":[-129]}]"#)]);
    let err = decode_err(&json);
    assert!(matches!(
        err.kind(),
        DecodeErrorKind::HeaderByteOutOfRange { value: -129, .. }
    ));
}

#[test]
fn signed_and_unsigned_header_bytes_agree() {
    let signed = record(0, r#","headers":[{"h":[-17,-69,-65,104,-128,-1]}]"#);
    let unsigned = record(1, r#","headers":[{"h":[239,187,191,104,128,255]}]"#);
    let event = decode_ok(&event_with("t-0", &[&signed, &unsigned]));
    let expected = vec![0xEF, 0xBB, 0xBF, 0x68, 0x80, 0xFF];
    for r in &event.partitions[0].records {
        assert_eq!(
            r.headers,
            vec![Header {
                name: "h".to_owned(),
                value: expected.clone()
            }]
        );
    }
}

#[test]
fn record_topic_not_matching_its_key_is_an_error() {
    let json = event_with("u-0", &[&record(3, "")]);
    let err = decode_err(&json);
    assert_eq!(
        err.kind(),
        &DecodeErrorKind::WrongPartition {
            key: "u-0".to_owned(),
            topic: "t".to_owned(),
            partition: 0
        }
    );
    let text = err.to_string();
    assert!(
        text.contains(r#"at records["u-0"][0] (u-0 offset 3)"#),
        "{text}"
    );
}

#[test]
fn record_partition_not_matching_its_key_is_an_error() {
    let json = event_with("t-1", &[&record(3, "")]);
    let err = decode_err(&json);
    assert!(matches!(
        err.kind(),
        DecodeErrorKind::WrongPartition { partition: 0, .. }
    ));
    assert_eq!(err.topic_partition(), Some(&TopicPartition::new("t", 1)));
}

#[test]
fn malformed_records_key_is_an_error() {
    let err = decode_err(&event_with("no_partition", &[&record(0, "")]));
    assert_eq!(
        err.kind(),
        &DecodeErrorKind::BadPartitionKey("no_partition".to_owned())
    );
    assert_eq!(err.location(), r#"records["no_partition"]"#);
}

#[test]
fn duplicate_records_key_is_an_error() {
    let json = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b",
"records":{{"t-0":[{}],"t-0":[{}]}}}}"#,
        record(0, ""),
        record(1, "")
    );
    let err = decode_err(&json);
    assert_eq!(
        err.kind(),
        &DecodeErrorKind::DuplicatePartitionKey("t-0".to_owned())
    );
}

#[test]
fn offsets_out_of_order_are_an_error() {
    let json = event_with("t-0", &[&record(5, ""), &record(6, ""), &record(6, "")]);
    let err = decode_err(&json);
    assert_eq!(
        err.kind(),
        &DecodeErrorKind::OffsetOutOfOrder {
            previous: 6,
            offset: 6
        }
    );
    assert_eq!(err.location(), r#"records["t-0"][2]"#);
    let json = event_with("t-0", &[&record(5, ""), &record(4, "")]);
    let err = decode_err(&json);
    assert_eq!(
        err.kind(),
        &DecodeErrorKind::OffsetOutOfOrder {
            previous: 5,
            offset: 4
        }
    );
}

#[test]
fn msk_without_arn_is_an_error() {
    let json = event_with("t-0", &[&record(0, "")]).replace("SelfManagedKafka", "aws:kafka");
    let err = decode_err(&json);
    assert_eq!(err.kind(), &DecodeErrorKind::MissingEventSourceArn);
    assert_eq!(err.field(), Some("eventSourceArn"));
    assert_eq!(err.topic_partition(), None);
    let with_null = json.replace(
        r#""bootstrapServers""#,
        r#""eventSourceArn":null,"bootstrapServers""#,
    );
    assert_eq!(
        decode_err(&with_null).kind(),
        &DecodeErrorKind::MissingEventSourceArn
    );
}

#[test]
fn unknown_event_source_is_an_error_naming_it() {
    let json = event_with("t-0", &[&record(0, "")]).replace("SelfManagedKafka", "aws:sqs");
    let err = decode_err(&json);
    assert_eq!(
        err.kind(),
        &DecodeErrorKind::UnknownEventSource("aws:sqs".to_owned())
    );
    assert!(err.to_string().contains(r#""aws:sqs""#), "{err}");
    assert_eq!(err.location(), "event");
}

#[test]
fn truncated_json_reports_line_and_column() {
    let json = event_with("t-0", &[&record(0, ""), &record(1, "")]);
    let cut = &json[..json.len() - 40];
    let err = decode_err(cut);
    assert!(matches!(err.kind(), DecodeErrorKind::Syntax(_)), "{err:?}");
    let (line, column) = err.line_column().expect("a syntax error has a position");
    assert_eq!(line, cut.matches('\n').count() + 1);
    assert!(column > 0);
    assert!(
        err.to_string()
            .contains(&format!("(line {line}, column {column})")),
        "{err}"
    );
}

#[test]
fn trailing_garbage_is_an_error() {
    let json = event_with("t-0", &[&record(0, "")]) + " {}";
    assert!(matches!(
        decode_err(&json).kind(),
        DecodeErrorKind::Syntax(_)
    ));
}

#[test]
fn missing_required_record_field_is_an_error() {
    let json = event_with(
        "t-0",
        &[&record(8, "").replace(r#""timestampType":"CREATE_TIME""#, r#""x":1"#)],
    );
    let err = decode_err(&json);
    assert_eq!(err.kind(), &DecodeErrorKind::MissingField("timestampType"));
    assert_eq!(err.offset(), Some(8));
}

#[test]
fn unknown_timestamp_type_is_an_error_in_that_field() {
    let json = event_with(
        "t-0",
        &[&record(0, "").replace("CREATE_TIME", "WALL_CLOCK")],
    );
    let err = decode_err(&json);
    assert_eq!(err.field(), Some("timestampType"));
    assert!(err.to_string().contains("WALL_CLOCK"), "{err}");
}

#[test]
fn duplicate_record_field_is_an_error() {
    let json = event_with("t-0", &[&record(0, r#","value":"dg==","value":null"#)]);
    assert_eq!(
        decode_err(&json).kind(),
        &DecodeErrorKind::DuplicateField("value")
    );
}

#[test]
fn absent_value_reads_as_tombstone_and_absent_headers_as_empty() {
    let event = decode_ok(&event_with("t-0", &[&record(0, "")]));
    let r = &event.partitions[0].records[0];
    assert_eq!((&r.key, &r.value, r.headers.len()), (&None, &None, 0));
}

#[test]
fn escaped_base64_string_decodes() {
    // "\u0061Gk=" is "aGk=" written with an escape: "hi".
    let event = decode_ok(&event_with("t-0", &[&record(0, r#","value":"\u0061Gk=""#)]));
    assert_eq!(
        event.partitions[0].records[0].value.as_deref(),
        Some(&b"hi"[..])
    );
}

#[test]
fn empty_records_map_is_an_event_without_records() {
    let json = r#"{"eventSource":"SelfManagedKafka","bootstrapServers":"b","records":{}}"#;
    let event = decode_ok(json);
    assert_eq!(event.record_count(), 0);
    assert!(event.partitions.is_empty());
}

#[test]
fn missing_records_is_an_error() {
    let json = r#"{"eventSource":"SelfManagedKafka","bootstrapServers":"b"}"#;
    assert_eq!(
        decode_err(json).kind(),
        &DecodeErrorKind::MissingField("records")
    );
}
