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
        assert_eq!(r.headers, vec![Header::new("h", expected.clone())]);
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

// The fast path (decode/fast.rs) against the full serde_json path and the `base64` crate.

mod fast_path {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use proptest::prelude::*;

    use super::super::decode::{decode_full, fast};
    use super::*;

    const FIXTURES: [&str; 4] = [
        include_str!("../../tests/fixtures/msk-event.json"),
        include_str!("../../tests/fixtures/msk-multi-topic.json"),
        include_str!("../../tests/fixtures/self-managed-edge-cases.json"),
        include_str!("../../tests/fixtures/self-managed-event.json"),
    ];

    /// The invariant: whenever the fast path decodes, the full path decodes the same event.
    fn agree(json: &[u8]) {
        if let Some(event) = fast::decode(json, 1) {
            assert_eq!(
                decode_full(json).as_ref(),
                Ok(&event),
                "fast path accepted {:?}",
                String::from_utf8_lossy(json)
            );
        }
    }

    /// A compact event of the usual shape, the one the benchmark and the ESM produce.
    fn usual_event() -> KafkaEvent {
        let json = r#"{"eventSource":"aws:kafka","eventSourceArn":"arn:aws:kafka:eu-west-1:1:cluster/c/1",
"bootstrapServers":"b-1:9098,b-2:9098","records":{"page-views-0":[
{"topic":"page-views","partition":0,"offset":41,"timestamp":9007199254740993,"timestampType":"CREATE_TIME",
"key":"dXNlci0x","value":"eyJwYWdlIjoiL2hvbWUifQ==","headers":[{"source":[119,101,98]},{"t":[-17,239,0,-128,127,255]}]},
{"topic":"page-views","partition":0,"offset":42,"timestamp":-5,"timestampType":"LOG_APPEND_TIME",
"key":null,"value":null,"headers":[],"keySchemaMetadata":{"dataFormat":"AVRO","schemaId":"a1"},"valueSchemaMetadata":null},
{"topic":"page-views","partition":0,"offset":43,"timestamp":0,"timestampType":"CREATE_TIME","value":"","headers":null}],
"orders-eu-12":[]}}"#;
        let event = fast::decode(json.as_bytes(), 1).expect("the fast path takes the usual shape");
        assert_eq!(decode_full(json.as_bytes()), Ok(event.clone()));
        event
    }

    /// The fast path's records are views of one buffer, in the order of the event, and
    /// a header name met twice is one shared string.
    #[test]
    fn fast_path_records_share_one_buffer_and_header_names() {
        let json = r#"{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{"t-0":[
{"topic":"t","partition":0,"offset":1,"timestamp":1,"timestampType":"CREATE_TIME","key":"azE=","value":"djE=","headers":[{"h":[1,2]}]},
{"topic":"t","partition":0,"offset":2,"timestamp":2,"timestampType":"CREATE_TIME","key":"azI=","value":"djI=","headers":[{"h":[3]}]}]}}"#;
        let event = fast::decode(json.as_bytes(), 1).expect("the usual shape");
        let [a, b] = &event.partitions[0].records[..] else {
            panic!("two records")
        };
        let bytes = [
            a.key().unwrap(),
            a.value().unwrap(),
            a.header("h").unwrap(),
            b.key().unwrap(),
            b.value().unwrap(),
            b.header("h").unwrap(),
        ];
        assert_eq!(bytes, [&b"k1"[..], b"v1", &[1, 2], b"k2", b"v2", &[3]]);
        for pair in bytes.windows(2) {
            assert_eq!(pair[0].as_ptr_range().end, pair[1].as_ptr(), "contiguous");
        }
        assert!(std::sync::Arc::ptr_eq(
            &a.headers[0].name,
            &b.headers[0].name
        ));
        assert_eq!(decode_full(json.as_bytes()), Ok(event));
    }

    #[test]
    fn fast_path_takes_the_usual_shape_and_agrees() {
        let event = usual_event();
        let records = &event.partitions[0].records;
        assert_eq!(records[0].timestamp, 9_007_199_254_740_993);
        assert_eq!(
            records[0].headers[1].value,
            vec![0xEF, 0xEF, 0, 0x80, 0x7F, 0xFF]
        );
        assert_eq!(records[2].value.as_deref(), Some(&b""[..]));
        // Its own output (to_json) takes the fast path too.
        assert_eq!(fast::decode(&event.to_json(), 1), Some(event));
        for fixture in FIXTURES {
            agree(fixture.as_bytes());
            // (Strings with escapes, as one header name there, go to the full path.)
            agree(&decode_full(fixture.as_bytes()).unwrap().to_json());
        }
    }

    #[test]
    fn fast_path_gives_up_on_what_it_does_not_handle() {
        for json in [
            // An escape, an unknown field, a float, -0, a duplicate field, bad base64.
            event_with("t-0", &[&record(0, r#","value":"\u0061Gk=""#)]),
            event_with("t-0", &[&record(0, r#","extra":1"#)]),
            event_with("t-0", &[&record(0, "").replace("1764460800000", "1.5")]),
            event_with(
                "t-0",
                &[&record(0, "").replace("\"offset\":0", "\"offset\":-0")],
            ),
            event_with("t-0", &[&record(0, r#","key":null,"key":null"#)]),
            event_with("t-0", &[&record(0, r#","value":"QR==""#)]),
            event_with("t-0", &[&record(1, ""), &record(1, "")]),
            event_with("u-0", &[&record(0, "")]),
        ] {
            assert_eq!(fast::decode(json.as_bytes(), 1), None, "{json}");
            agree(json.as_bytes());
        }
    }

    /// An event of about `bytes` bytes of JSON over `partitions` partitions of two topics
    /// (every third partition empty), with headers whose names look like a partition
    /// boundary (`],` and a key-like name), deterministic. (No escapes: the fast path would
    /// leave the whole event to the full path.)
    fn big_event(partitions: usize, bytes: usize) -> KafkaEvent {
        let per_record = 420;
        let records = bytes / per_record;
        let filled = partitions - partitions / 3;
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 33
        };
        let partitions = (0..partitions)
            .map(|p| {
                let topic = if p % 2 == 0 {
                    "page-views"
                } else {
                    "orders-eu"
                };
                let count = if p % 3 == 2 { 0 } else { records / filled };
                let records = (0..count)
                    .map(|i| {
                        let value: Vec<u8> =
                            (0..200 + next() % 200).map(|_| next() as u8).collect();
                        let headers = match next() % 3 {
                            0 => vec![],
                            1 => vec![Header::new("],", vec![next() as u8; 3])],
                            _ => vec![
                                Header::new("t-1],:[", vec![1, 2]),
                                Header::new("source", b"web".to_vec()),
                            ],
                        };
                        Record {
                            offset: 1_000 + i as i64,
                            timestamp: 1_764_460_800_000 + i as i64,
                            timestamp_type: TimestampType::CreateTime,
                            key: (next() % 5 != 0).then(|| bytes::Bytes::from(format!("user-{i}"))),
                            value: (next() % 7 != 0).then(|| bytes::Bytes::from(value)),
                            headers,
                            key_schema_metadata: None,
                            value_schema_metadata: None,
                        }
                    })
                    .collect();
                PartitionRecords {
                    tp: TopicPartition::new(topic, p as i32),
                    records,
                }
            })
            .collect();
        KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: "b-1:9092".to_owned(),
            partitions,
        }
    }

    /// A large event's `records` object read in chunks on 2–4 threads gives exactly the
    /// partitions one pass gives (the chunks were really used: `records_in_parallel` is
    /// called directly), for one to nine partitions (one partition split inside its list);
    /// `decode` agrees on any thread count.
    #[test]
    fn chunks_on_threads_read_what_one_pass_reads() {
        for partitions in [1, 2, 3, 4, 5, 9] {
            let event = big_event(partitions, 1_600_000);
            let json = event.to_json();
            assert!(json.len() > 1 << 20, "{} bytes", json.len());
            for threads in 1..=4 {
                let decoded = KafkaEvent::decode_with_threads(&json, threads).unwrap();
                assert!(
                    decoded == event,
                    "{partitions} partitions on {threads} threads"
                );
                let parallel = fast::records_in_parallel(&json, threads);
                if threads == 1 {
                    assert!(parallel.is_none(), "{partitions}/{threads}: one chunk");
                } else {
                    assert!(
                        parallel.as_ref() == Some(&event.partitions),
                        "{partitions} partitions in chunks on {threads} threads"
                    );
                }
            }
        }
    }

    /// A large event's chunks start at boundaries, each the nearest one to the end of an
    /// equal share of the `records` object: a partition's key or a record inside a list,
    /// within half the largest record of that share's end (one partition splits too), but a
    /// partition's key within `PARTITION_REACH` first. (The first partition boundary at or
    /// after the share's end gave three quarters of an event of four equal partitions to one
    /// of two threads, and an event of one partition to one.)
    #[test]
    fn chunks_on_threads_start_at_the_boundary_nearest_an_equal_share() {
        const REACH: usize = fast::PARTITION_REACH;
        for partitions in [1, 2, 3, 4, 5, 8, 9] {
            let event = big_event(partitions, 1_600_000);
            let json = event.to_json();
            let text = std::str::from_utf8(&json).unwrap();
            let object = text.find("\"records\":{").unwrap() + "\"records\":{".len();
            // Where a chunk may start: a partition's key, or a record that is not its
            // partition's first (the encoder writes `topic` first).
            let keys: Vec<usize> = event
                .partitions
                .iter()
                .map(|p| {
                    text.find(&format!("\"{}-{}\":[", p.tp.topic, p.tp.partition))
                        .unwrap()
                })
                .collect();
            let records: Vec<usize> = text
                .match_indices("},{\"topic\":")
                .map(|(at, _)| at + 2)
                .collect();
            let mut bounds: Vec<usize> = keys[1..].iter().chain(&records).copied().collect();
            bounds.sort_unstable();
            let mut edges = vec![object];
            edges.extend(&bounds);
            edges.push(json.len());
            let largest = edges.windows(2).map(|w| w[1] - w[0]).max().unwrap();
            for threads in 2..=4 {
                let starts = fast::chunk_starts(&json, threads).unwrap();
                assert_eq!(starts[0], object, "{partitions}/{threads}");
                assert_eq!(starts.len(), threads, "{partitions}/{threads}: {starts:?}");
                for (k, &start) in starts.iter().enumerate().skip(1) {
                    assert!(bounds.contains(&start), "{partitions}/{threads}: {start}");
                    let target = object + (json.len() - object) / threads * k;
                    let key_near = keys.iter().any(|&key| key.abs_diff(target) <= REACH);
                    let near = if keys.contains(&start) {
                        // A partition boundary that near is taken before a nearer record.
                        start.abs_diff(target) <= REACH.max(largest / 2)
                    } else {
                        start.abs_diff(target) <= largest / 2 && !key_near
                    };
                    assert!(
                        near,
                        "{partitions} partitions on {threads} threads: chunk {k} starts at \
                         {start}, {} from its share's end {target} (largest record {largest})",
                        start.abs_diff(target)
                    );
                }
            }
        }
    }

    /// Edits anywhere in a large event (a partition's records out of order or under another
    /// key, a broken byte, a duplicate partition): on any number of threads, the same event
    /// or the same error as on one.
    #[test]
    fn chunks_on_threads_fail_as_one_pass_fails() {
        for partitions in [4, 1] {
            edits_on_threads_fail_as_one_pass_fails(&big_event(partitions, 1_200_000).to_json());
        }
    }

    /// [`chunks_on_threads_fail_as_one_pass_fails`] on one event.
    fn edits_on_threads_fail_as_one_pass_fails(json: &[u8]) {
        let json = json.to_vec();
        let mut edits: Vec<Vec<u8>> = Vec::new();
        let text = String::from_utf8(json.clone()).unwrap();
        edits.push(
            text.replacen("\"offset\":1001", "\"offset\":999", 3)
                .into_bytes(),
        );
        edits.push(
            text.replacen("\"orders-eu-1\"", "\"orders-eu-3\"", 1)
                .into_bytes(),
        );
        edits.push(
            text.replacen("\"orders-eu-1\"", "\"page-views-0\"", 1)
                .into_bytes(),
        );
        edits.push(text.replacen("],\"", "] ,\"", 2).into_bytes());
        // Where a chunk starts inside a list: the record there in another partition, out of
        // order, or the list broken or spaced just before it.
        for threads in 2..=4 {
            for &at in &fast::chunk_starts(&json, threads).unwrap()[1..] {
                if json[at] != b'{' {
                    continue;
                }
                let (head, record) = text.split_at(at);
                let (head, comma) = head.split_at(at - 1);
                let partition = record.find("\"partition\":").unwrap() + "\"partition\":".len();
                let offset = record.find("\"offset\":").unwrap() + "\"offset\":".len();
                let digits = record[offset..].find(',').unwrap();
                let number = &record[partition..partition + record[partition..].find(',').unwrap()];
                let named = format!("\"partition\":{number},");
                let renamed = format!("\"partition\":{},", number.parse::<i32>().unwrap() + 100);
                for edited in [
                    // The rest of the event (of the list, for one partition) in another
                    // partition, every record consistent with it.
                    format!("{head},{}", record.replace(&named, &renamed)),
                    format!("{head},{}9{}", &record[..partition], &record[partition..]),
                    format!(
                        "{head},{}0{}",
                        &record[..offset],
                        &record[offset + digits..]
                    ),
                    format!("{head},{}-{}", &record[..offset], &record[offset..]),
                    format!("{head}{record}"),
                    format!("{head}]{record}"),
                    format!("{head}]]{record}"),
                    format!("{head}{comma} {record}"),
                    format!("{head}{comma}\n{record}"),
                ] {
                    edits.push(edited.into_bytes());
                }
            }
        }
        for k in 0..16u64 {
            let edit = (
                k.wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize,
                k as u8,
                b"]\",{0-"[k as usize % 6],
            );
            edits.push(mutate(&json, &[edit]));
        }
        for edited in edits {
            let one = KafkaEvent::decode_with_threads(&edited, 1);
            for threads in 2..=4 {
                let many = KafkaEvent::decode_with_threads(&edited, threads);
                assert!(
                    many == one,
                    "on {threads} threads: {:?} against {:?}",
                    many.err(),
                    one.as_ref().err()
                );
            }
        }
    }

    /// One random edit: replace, insert or delete a byte, biased to JSON's own characters.
    fn mutate(json: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
        const INTERESTING: &[u8] = b"{}[]\",:-0123456789.eE nul\\=+/AQ";
        let mut out = json.to_vec();
        for &(at, op, byte) in edits {
            let at = at % (out.len() + 1);
            let byte = if byte < 128 {
                INTERESTING[byte as usize % INTERESTING.len()]
            } else {
                byte
            };
            match op % 3 {
                0 if at < out.len() => out[at] = byte,
                1 => out.insert(at, byte),
                _ if at < out.len() => {
                    out.remove(at);
                }
                _ => {}
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn base64_agrees_with_the_base64_crate_on_any_text(
            text in proptest::collection::vec(
                prop_oneof![
                    8 => proptest::sample::select(
                        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".to_vec()),
                    1 => Just(b'='),
                    1 => any::<u8>(),
                ],
                0..40,
            )
        ) {
            prop_assert_eq!(fast::base64_decode(&text), STANDARD.decode(&text).ok());
        }

        #[test]
        fn base64_decodes_what_the_base64_crate_encodes(
            bytes in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            let text = STANDARD.encode(&bytes);
            prop_assert_eq!(fast::base64_decode(text.as_bytes()), Some(bytes));
        }

        /// Long texts (the SIMD decoder works on 32- and 64-byte blocks): valid encodings
        /// with up to three bytes replaced, anywhere, by base64 symbols, `=` or any byte.
        #[test]
        fn base64_agrees_with_the_base64_crate_on_long_texts(
            bytes in proptest::collection::vec(any::<u8>(), 0..700),
            edits in proptest::collection::vec(
                (any::<usize>(), prop_oneof![
                    4 => proptest::sample::select(
                        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".to_vec()),
                    1 => Just(b'='),
                    1 => any::<u8>(),
                ]),
                0..3,
            ),
        ) {
            let mut text = STANDARD.encode(&bytes).into_bytes();
            for (at, byte) in edits {
                if !text.is_empty() {
                    let at = at % text.len();
                    text[at] = byte;
                }
            }
            prop_assert_eq!(fast::base64_decode(&text), STANDARD.decode(&text).ok());
        }

        /// Header values built from number-like tokens, the edge cases of the compact
        /// loop among them (leading zeros, `-0`, out of range, fractions, exponents,
        /// whitespace, four digits): the fast path agrees with the full path wherever it
        /// answers, and it answers for every compact array of bytes in range.
        #[test]
        fn fast_path_agrees_with_serde_path_on_header_values(
            tokens in proptest::collection::vec(
                prop_oneof![
                    4 => (-128i32..=255).prop_map(|n| n.to_string()),
                    1 => proptest::sample::select(vec![
                        "-0", "00", "01", "-01", "256", "-129", "1000", "999", "-1000", "1.0",
                        "1e2", "2E1", " 7", "7 ", "-", "", "+1", "0x1", "\"1\"",
                    ]).prop_map(str::to_owned),
                ],
                0..12,
            ),
        ) {
            let array = format!("[{}]", tokens.join(","));
            let json = event_with("t-0", &[&record(0, &format!(r#","headers":[{{"h":{array}}}]"#))]);
            agree(json.as_bytes());
            let compact = tokens.iter().all(|t| {
                t.parse::<i32>().is_ok_and(|n| (-128..=255).contains(&n))
                    && t.trim() == t
                    && !t.starts_with('+')
                    && t != "-0"
                    && !(t.len() > 1 && t.trim_start_matches('-').starts_with('0'))
            });
            if compact {
                let event = fast::decode(json.as_bytes(), 1);
                let expected: Vec<u8> = tokens.iter().map(|t| t.parse::<i32>().unwrap() as u8).collect();
                prop_assert_eq!(
                    event.map(|e| e.partitions[0].records[0].headers[0].value.to_vec()),
                    Some(expected),
                    "{}", array
                );
            }
        }

        #[test]
        fn fast_path_agrees_with_serde_path_on_mutated_events(
            which in 0..5usize,
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
        ) {
            let json = match FIXTURES.get(which) {
                Some(fixture) => fixture.as_bytes().to_vec(),
                None => usual_event().to_json(),
            };
            agree(&mutate(&json, &edits));
        }
    }
}

/// Lambda's CPU share bounds the threads: one per 1,769 MB of memory (AWS's "at 1,769 MB a
/// function has the equivalent of one vCPU"), whatever the vCPUs it sees; outside Lambda,
/// the cores.
#[test]
fn the_threads_are_the_cores_and_in_lambda_its_whole_vcpus_of_share() {
    use super::decode::cpus_of;
    for (cores, memory, cpus) in [
        (2, None, 2),
        (4, None, 4),
        (2, Some("128"), 1),
        (2, Some("1769"), 1),
        (2, Some("3008"), 1),
        (3, Some("3538"), 2),
        (6, Some("10240"), 5),
        (1, Some("10240"), 1),
        (2, Some("not a size"), 2),
    ] {
        assert_eq!(cpus_of(cores, memory), cpus, "{cores} cores, {memory:?} MB");
    }
}
