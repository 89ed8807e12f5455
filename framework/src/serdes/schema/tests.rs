//! Tests of the schema'd serdes. Expected bytes are worked out by hand from the
//! specifications (Avro's binary encoding, Protobuf's, Confluent's and Glue's headers),
//! not taken from the code under test.

use std::sync::Arc;

use super::*;
use crate::serdes::{Nullable, Serde};

const GLUE_ID: [u8; 16] = [
    0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
];

#[test]
fn schema_ids_parse_and_display() {
    assert_eq!(SchemaId::parse("42"), Some(SchemaId::Confluent(42)));
    assert_eq!(SchemaId::parse(" 7 "), Some(SchemaId::Confluent(7)));
    let uuid = "12345678-9abc-def0-0123-456789abcdef";
    assert_eq!(SchemaId::parse(uuid), Some(SchemaId::Glue(GLUE_ID)));
    assert_eq!(SchemaId::Glue(GLUE_ID).to_string(), uuid);
    assert_eq!(
        SchemaId::parse("12345678-9abc-def0-0123-456789abcdeg"),
        None
    );
    assert_eq!(SchemaId::parse("123456789abcdef00123456789abcdef"), None);
    assert_eq!(SchemaId::parse("99999999999"), None);
    assert_eq!(SchemaId::parse(""), None);
    assert_eq!(SchemaId::parse("-1"), None);
}

#[test]
fn headers_by_hand() {
    // Confluent: 0x00 then 1000 = 0x000003e8.
    let framed = unframe(WireFormat::Confluent, &[0, 0, 0, 3, 0xe8, 1, 2], None).unwrap();
    assert_eq!(framed.id, Some(SchemaId::Confluent(1000)));
    assert_eq!(&*framed.payload, &[1, 2]);
    assert!(
        unframe(WireFormat::Confluent, &[0, 0, 0], None)
            .unwrap_err()
            .contains("too short")
    );
    assert!(
        unframe(WireFormat::Confluent, b"{\"a\":1}", None)
            .unwrap_err()
            .contains("magic byte 123")
    );
    assert!(unframe(WireFormat::Confluent, &[], None).is_err());
    // Glue: 0x03, 0x00 (no compression), 16 bytes of UUID.
    let mut glue = vec![3, 0];
    glue.extend_from_slice(&GLUE_ID);
    glue.push(0x2a);
    let framed = unframe(WireFormat::Glue, &glue, None).unwrap();
    assert_eq!(framed.id, Some(SchemaId::Glue(GLUE_ID)));
    assert_eq!(&*framed.payload, &[0x2a]);
    glue[1] = 5;
    assert!(
        unframe(WireFormat::Glue, &glue, None)
            .unwrap_err()
            .contains("zlib")
    );
    glue[0] = 2;
    assert!(
        unframe(WireFormat::Glue, &glue, None)
            .unwrap_err()
            .contains("version byte 2")
    );
    assert!(unframe(WireFormat::Glue, &[3, 0, 1], None).is_err());
    // SOURCE: the id is in the metadata.
    let meta = SchemaMetadata {
        data_format: Some("AVRO".into()),
        schema_id: Some("9".into()),
    };
    let framed = unframe(WireFormat::Source, &[1, 2], Some(&meta)).unwrap();
    assert_eq!(framed.id, Some(SchemaId::Confluent(9)));
    assert_eq!(&*framed.payload, &[1, 2]);
    assert!(
        unframe(WireFormat::Source, &[1, 2], None)
            .unwrap_err()
            .contains("no schema metadata")
    );
    let bad = SchemaMetadata {
        data_format: None,
        schema_id: Some("x".into()),
    };
    assert!(
        unframe(WireFormat::Source, &[1], Some(&bad))
            .unwrap_err()
            .contains("\"x\"")
    );
    // Writing.
    let mut out = Vec::new();
    frame_header(WireFormat::Glue, &SchemaId::Glue(GLUE_ID), &mut out).unwrap();
    assert_eq!(out[..2], [3, 0]);
    assert_eq!(out[2..], GLUE_ID);
    assert!(frame_header(WireFormat::Glue, &SchemaId::Confluent(1), &mut out).is_err());
    assert!(frame_header(WireFormat::Confluent, &SchemaId::Glue(GLUE_ID), &mut out).is_err());
}

#[test]
fn bounded_cache_forgets_the_oldest() {
    let cache = BoundedCache::new(2);
    cache.insert(1, "a");
    cache.insert(2, "b");
    cache.insert(1, "a2"); // a replacement is not a new entry
    cache.insert(3, "c");
    assert_eq!(cache.len(), 2);
    assert_eq!(cache.get(&1), None);
    assert_eq!(cache.get(&2), Some("b"));
    assert_eq!(cache.get(&3), Some("c"));
}

#[cfg(feature = "avro")]
mod avro {
    use super::*;
    use serde::{Deserialize, Serialize};

    const V1: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"id","type":"long"},
        {"name":"item","type":"string"}]}"#;
    /// V1 plus a field with a default (a compatible evolution).
    const V2: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"id","type":"long"},
        {"name":"item","type":"string"},
        {"name":"qty","type":"int","default":1}]}"#;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct OrderV1 {
        id: i64,
        item: String,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct OrderV2 {
        id: i64,
        item: String,
        qty: i32,
    }

    fn subject() -> Subject {
        Subject::topic("orders", Side::Value)
    }

    fn schemas() -> Arc<OfflineSchemas> {
        Arc::new(
            OfflineSchemas::new()
                .with(SchemaId::Confluent(1), subject(), SchemaType::Avro, V1)
                .with(SchemaId::Confluent(2), subject(), SchemaType::Avro, V2)
                .with(SchemaId::Glue(GLUE_ID), subject(), SchemaType::Avro, V1),
        )
    }

    /// `{id: 7, item: "ab"}` in Avro's binary encoding, by hand: long 7 is zig-zag 14
    /// (0x0e); the string is its length 2 (zig-zag 4) and its bytes.
    const ORDER_7_AB: [u8; 4] = [0x0e, 0x04, b'a', b'b'];

    #[test]
    fn confluent_bytes_by_hand() {
        let serde = Avro::<OrderV1>::new(V1, schemas(), subject()).unwrap();
        let order = OrderV1 {
            id: 7,
            item: "ab".into(),
        };
        let mut expected = vec![0, 0, 0, 0, 1];
        expected.extend_from_slice(&ORDER_7_AB);
        assert_eq!(serde.try_serialize(&order).unwrap(), Some(expected.clone()));
        assert_eq!(serde.deserialize(Some(&expected)).unwrap(), order);
        // A negative long: -3 is zig-zag 5.
        let neg = [0, 0, 0, 0, 1, 0x05, 0x00];
        assert_eq!(
            serde.deserialize(Some(&neg)).unwrap(),
            OrderV1 {
                id: -3,
                item: String::new()
            }
        );
    }

    #[test]
    fn glue_source_and_json_formats() {
        let order = OrderV1 {
            id: 7,
            item: "ab".into(),
        };
        // Glue.
        let serde = Avro::<OrderV1>::new(V1, schemas(), subject())
            .unwrap()
            .input(WireFormat::Glue)
            .output(WireFormat::Glue);
        let mut glue = vec![3, 0];
        glue.extend_from_slice(&GLUE_ID);
        glue.extend_from_slice(&ORDER_7_AB);
        assert_eq!(serde.deserialize(Some(&glue)).unwrap(), order);
        // The output id is looked up by subject and schema: V1 is both id 1 and the Glue
        // version; a Glue output needs the Glue one.
        let glue_only = Arc::new(OfflineSchemas::new().with(
            SchemaId::Glue(GLUE_ID),
            subject(),
            SchemaType::Avro,
            V1,
        ));
        let writer = Avro::<OrderV1>::new(V1, glue_only, subject())
            .unwrap()
            .output(WireFormat::Glue);
        assert_eq!(writer.try_serialize(&order).unwrap(), Some(glue));
        // SOURCE: bytes without prefix, the id in the record's metadata.
        let serde = Avro::<OrderV1>::new(V1, schemas(), subject())
            .unwrap()
            .input(WireFormat::Source)
            .output(WireFormat::Source);
        let meta = SchemaMetadata {
            data_format: Some("AVRO".into()),
            schema_id: Some("1".into()),
        };
        assert_eq!(
            serde
                .deserialize_with_schema(Some(&ORDER_7_AB), Some(&meta))
                .unwrap(),
            order
        );
        assert_eq!(
            serde.try_serialize(&order).unwrap(),
            Some(ORDER_7_AB.to_vec())
        );
        let err = serde.deserialize(Some(&ORDER_7_AB)).unwrap_err();
        assert!(err.0.contains("subject orders-value"), "{err}");
        assert!(err.0.contains("no schema metadata"), "{err}");
        // SOURCE with a Glue schema version id in the metadata.
        let glue_meta = SchemaMetadata {
            data_format: Some("AVRO".into()),
            schema_id: Some("12345678-9abc-def0-0123-456789abcdef".into()),
        };
        assert_eq!(
            serde
                .deserialize_with_schema(Some(&ORDER_7_AB), Some(&glue_meta))
                .unwrap(),
            order
        );
        // JSON: the event source decoded the record already.
        let serde = Avro::<OrderV1>::new(V1, schemas(), subject())
            .unwrap()
            .input(WireFormat::Json)
            .output(WireFormat::Json);
        let json = br#"{"id":7,"item":"ab"}"#;
        assert_eq!(
            serde
                .deserialize_with_schema(Some(json), Some(&meta))
                .unwrap(),
            order
        );
        assert_eq!(serde.try_serialize(&order).unwrap(), Some(json.to_vec()));
        let err = serde
            .deserialize_with_schema(Some(b"{\"id\":\"x\"}"), Some(&meta))
            .unwrap_err();
        assert!(
            err.0
                .starts_with("schema id 1 (subject orders-value): invalid JSON"),
            "{err}"
        );
    }

    #[test]
    fn evolution_added_field_with_default_and_removed_field() {
        // Writer v1, reader v2: qty takes its default 1.
        let reader_v2 = Avro::<OrderV2>::new(V2, schemas(), subject()).unwrap();
        let mut v1_bytes = vec![0, 0, 0, 0, 1];
        v1_bytes.extend_from_slice(&ORDER_7_AB);
        assert_eq!(
            reader_v2.deserialize(Some(&v1_bytes)).unwrap(),
            OrderV2 {
                id: 7,
                item: "ab".into(),
                qty: 1
            }
        );
        // Writer v2 (qty 3 is zig-zag 6), reader v1: qty is skipped.
        let reader_v1 = Avro::<OrderV1>::new(V1, schemas(), subject()).unwrap();
        let mut v2_bytes = vec![0, 0, 0, 0, 2];
        v2_bytes.extend_from_slice(&ORDER_7_AB);
        v2_bytes.push(0x06);
        assert_eq!(
            reader_v1.deserialize(Some(&v2_bytes)).unwrap(),
            OrderV1 {
                id: 7,
                item: "ab".into()
            }
        );
        assert_eq!(
            reader_v2.deserialize(Some(&v2_bytes)).unwrap(),
            OrderV2 {
                id: 7,
                item: "ab".into(),
                qty: 3
            }
        );
        // V2 output registers (looks up) id 2.
        let bytes = reader_v2
            .try_serialize(&OrderV2 {
                id: 7,
                item: "ab".into(),
                qty: 3,
            })
            .unwrap();
        assert_eq!(bytes, Some(v2_bytes));
    }

    #[test]
    fn an_incompatible_writer_is_an_error_naming_id_and_subject() {
        // A writer without `item`, which the reader needs and has no default for.
        const NO_ITEM: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
            {"name":"id","type":"long"}]}"#;
        let schemas = Arc::new(OfflineSchemas::new().with(
            SchemaId::Confluent(5),
            subject(),
            SchemaType::Avro,
            NO_ITEM,
        ));
        let serde = Avro::<OrderV1>::new(V1, schemas, subject()).unwrap();
        let err = serde.deserialize(Some(&[0, 0, 0, 0, 5, 0x0e])).unwrap_err();
        assert!(
            err.0.starts_with("schema id 5 (subject orders-value): "),
            "{err}"
        );
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        let serde = Avro::<OrderV1>::new(V1, schemas(), subject()).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                vec![0, 0, 0, 0, 9, 0x0e, 0x00],
                "schema id 9 (subject orders-value): not among the compiled-in schemas",
            ),
            (vec![1, 2, 3], "subject orders-value: magic byte 1"),
            // The string's length says 100 bytes, 1 follows.
            (
                vec![0, 0, 0, 0, 1, 0x0e, 0xc8, 0x01, b'a'],
                "schema id 1 (subject orders-value): the bytes are not Avro",
            ),
            // A string length of 2^33 (zig-zag varint 80 80 80 80 40): refused, not allocated.
            (
                vec![0, 0, 0, 0, 1, 0x0e, 0x80, 0x80, 0x80, 0x80, 0x40],
                "schema id 1 (subject orders-value): the bytes are not Avro",
            ),
            // A value and one byte too many.
            (
                vec![0, 0, 0, 0, 1, 0x0e, 0x00, 0xff],
                "schema id 1 (subject orders-value): 1 bytes left",
            ),
            // A varint that never ends.
            (
                vec![
                    0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ],
                "schema id 1",
            ),
        ];
        for (bytes, expected) in cases {
            let err = serde.deserialize(Some(&bytes)).unwrap_err();
            assert!(err.0.starts_with(expected), "{bytes:?}: {err}");
        }
        assert!(serde.deserialize(None).unwrap_err().0.contains("null"));
        assert_eq!(Nullable(serde).deserialize(None).unwrap(), None);
    }

    #[test]
    fn unknown_output_schema_is_an_error() {
        // The source knows V1 only: writing with V2 cannot find an id.
        let schemas = Arc::new(OfflineSchemas::new().with(
            SchemaId::Confluent(1),
            subject(),
            SchemaType::Avro,
            V1,
        ));
        let serde = Avro::<OrderV2>::new(V2, schemas, subject()).unwrap();
        let err = serde
            .try_serialize(&OrderV2 {
                id: 1,
                item: "x".into(),
                qty: 1,
            })
            .unwrap_err();
        assert!(err.0.contains("subject orders-value"), "{err}");
        assert!(Avro::<OrderV1>::new("{", schemas_arc(), subject()).is_err());
    }

    fn schemas_arc() -> Arc<dyn SchemaSource> {
        schemas()
    }

    #[test]
    fn generic_values_and_optional_fields() {
        const WITH_NOTE: &str = r#"{"type":"record","name":"Note","fields":[
            {"name":"id","type":"long"},
            {"name":"note","type":["null","string"],"default":null}]}"#;
        let s = Subject::named("notes");
        let schemas = Arc::new(OfflineSchemas::new().with(
            SchemaId::Confluent(3),
            s.clone(),
            SchemaType::Avro,
            WITH_NOTE,
        ));
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        struct Note {
            id: i64,
            note: Option<String>,
        }
        let serde = Avro::<Note>::new(WITH_NOTE, schemas.clone(), s.clone()).unwrap();
        // id 1 (zig-zag 2), union branch 1 (zig-zag 2) string "x" (length zig-zag 2).
        let some = [0, 0, 0, 0, 3, 0x02, 0x02, 0x02, b'x'];
        // id 1, union branch 0 (null).
        let none = [0, 0, 0, 0, 3, 0x02, 0x00];
        let note = |n: Option<&str>| Note {
            id: 1,
            note: n.map(str::to_owned),
        };
        assert_eq!(serde.deserialize(Some(&some)).unwrap(), note(Some("x")));
        assert_eq!(serde.deserialize(Some(&none)).unwrap(), note(None));
        assert_eq!(
            serde.try_serialize(&note(Some("x"))).unwrap(),
            Some(some.to_vec())
        );
        assert_eq!(
            serde.try_serialize(&note(None)).unwrap(),
            Some(none.to_vec())
        );
        let generic = AvroGeneric::new(WITH_NOTE, schemas, s).unwrap();
        let value = generic.deserialize(Some(&some)).unwrap();
        assert_eq!(
            value,
            apache_avro::types::Value::Record(vec![
                ("id".into(), apache_avro::types::Value::Long(1)),
                (
                    "note".into(),
                    apache_avro::types::Value::Union(
                        1,
                        Box::new(apache_avro::types::Value::String("x".into()))
                    )
                ),
            ])
        );
        assert_eq!(generic.try_serialize(&value).unwrap(), Some(some.to_vec()));
        // serde_json::Value as the generic type of the JSON world.
        let as_json =
            Avro::<serde_json::Value>::new(WITH_NOTE, schemas_arc_notes(), Subject::named("notes"))
                .unwrap();
        assert_eq!(
            as_json.deserialize(Some(&none)).unwrap(),
            serde_json::json!({"id": 1, "note": null})
        );
    }

    fn schemas_arc_notes() -> Arc<dyn SchemaSource> {
        const WITH_NOTE: &str = r#"{"type":"record","name":"Note","fields":[
            {"name":"id","type":"long"},
            {"name":"note","type":["null","string"],"default":null}]}"#;
        Arc::new(OfflineSchemas::new().with(
            SchemaId::Confluent(3),
            Subject::named("notes"),
            SchemaType::Avro,
            WITH_NOTE,
        ))
    }
}
