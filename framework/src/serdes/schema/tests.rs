//! Tests of the schema'd serdes. Expected bytes are worked out by hand from the
//! specifications (Avro's binary encoding, Protobuf's, Confluent's and Glue's headers),
//! not taken from the code under test.

#[cfg(any(feature = "avro", feature = "protobuf"))]
use std::sync::Arc;

use super::*;
#[cfg(any(feature = "avro", feature = "protobuf"))]
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

    /// `zlib.compress(bytes([0x0e, 4, 97, 98]))` as Python's zlib writes it (an
    /// independent encoder): `{id: 7, item: "ab"}`'s Avro bytes, compressed.
    const ORDER_7_AB_ZLIB: [u8; 12] = [
        0x78, 0x9c, 0xe3, 0x63, 0x49, 0x4c, 0x02, 0x00, 0x01, 0x6c, 0x00, 0xd6,
    ];

    #[test]
    fn zlib_compressed_glue_payloads_are_read_and_written() {
        let order = OrderV1 {
            id: 7,
            item: "ab".into(),
        };
        let glue_only = Arc::new(OfflineSchemas::new().with(
            SchemaId::Glue(GLUE_ID),
            subject(),
            SchemaType::Avro,
            V1,
        ));
        let serde = Avro::<OrderV1>::new(V1, glue_only, subject())
            .unwrap()
            .input(WireFormat::Glue)
            .output(WireFormat::Glue)
            .glue_compression(GlueCompression::Zlib);
        // Version 3, compression 5 (zlib), the UUID, Python's zlib stream.
        let mut compressed = vec![3, 5];
        compressed.extend_from_slice(&GLUE_ID);
        compressed.extend_from_slice(&ORDER_7_AB_ZLIB);
        assert_eq!(serde.deserialize(Some(&compressed)).unwrap(), order);
        // Written compressed: the header says 5, and the payload inflates to the bytes by
        // hand (read back through unframe, which the line above checked against Python's).
        let written = serde.try_serialize(&order).unwrap().unwrap();
        assert_eq!(written[..2], [3, 5]);
        assert_eq!(written[2..18], GLUE_ID);
        assert_eq!(
            written[18..20],
            [0x78, 0x9c],
            "a zlib stream, default level"
        );
        let framed = unframe(WireFormat::Glue, &written, None).unwrap();
        assert_eq!(&*framed.payload, &ORDER_7_AB);
        // Uncompressed Glue input is read by the same serde.
        let mut plain = vec![3, 0];
        plain.extend_from_slice(&GLUE_ID);
        plain.extend_from_slice(&ORDER_7_AB);
        assert_eq!(serde.deserialize(Some(&plain)).unwrap(), order);
        // A stream cut short, and garbage, are errors naming the schema version.
        let mut cut = compressed.clone();
        cut.truncate(cut.len() - 5);
        let err = serde.deserialize(Some(&cut)).unwrap_err();
        assert!(
            err.0.starts_with(
                "subject orders-value: schema version 12345678-9abc-def0-0123-456789abcdef: "
            ),
            "{err}"
        );
        let mut garbage = vec![3, 5];
        garbage.extend_from_slice(&GLUE_ID);
        garbage.extend_from_slice(&[1, 2, 3]);
        let err = serde.deserialize(Some(&garbage)).unwrap_err();
        assert!(err.0.contains("does not inflate"), "{err}");
    }

    #[test]
    fn a_zlib_bomb_is_refused() {
        use std::io::Write;
        // 17 MiB of zeros compress to a few KiB: more than the 16 MiB the header may
        // inflate to.
        let mut encoder =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(&vec![0u8; 17 << 20]).unwrap();
        let mut data = vec![3, 5];
        data.extend_from_slice(&GLUE_ID);
        data.extend_from_slice(&encoder.finish().unwrap());
        assert!(data.len() < 100_000);
        let err = unframe(WireFormat::Glue, &data, None).unwrap_err();
        assert!(err.contains("inflates past 16777216 bytes"), "{err}");
    }

    /// An order whose `address` is a named type `shop.Address` defined by another schema
    /// (a Confluent schema reference).
    const ADDRESS: &str = r#"{"type":"record","name":"Address","namespace":"shop","fields":[
        {"name":"city","type":"string"}]}"#;
    const CUSTOMER: &str = r#"{"type":"record","name":"Customer","namespace":"shop","fields":[
        {"name":"id","type":"long"},{"name":"address","type":"shop.Address"}]}"#;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Address {
        city: String,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Customer {
        id: i64,
        address: Address,
    }

    #[test]
    fn schema_references_resolve_named_types_of_other_schemas() {
        let with_address = RegisteredSchema::new(SchemaType::Avro, CUSTOMER)
            .with_dependencies([("shop.Address".to_owned(), Arc::<str>::from(ADDRESS))]);
        let s = Subject::named("customers");
        let schemas = Arc::new(OfflineSchemas::new().with_schema(
            SchemaId::Confluent(21),
            s.clone(),
            with_address.clone(),
        ));
        // Without its reference the schema does not parse.
        assert!(Avro::<Customer>::new(CUSTOMER, schemas.clone(), s.clone()).is_err());
        let serde = Avro::<Customer>::with_schema(with_address.clone(), schemas.clone(), s.clone())
            .unwrap();
        // id 5 (zig-zag 10), city "Oslo" (length 4, zig-zag 8).
        let bytes = [0, 0, 0, 0, 21, 10, 8, b'O', b's', b'l', b'o'];
        let customer = Customer {
            id: 5,
            address: Address {
                city: "Oslo".into(),
            },
        };
        assert_eq!(serde.deserialize(Some(&bytes)).unwrap(), customer);
        assert_eq!(
            serde.try_serialize(&customer).unwrap(),
            Some(bytes.to_vec())
        );
        // A reader without references reads the writer's referencing schema (resolution
        // from the writer's names to the reader's inline record).
        const INLINE: &str = r#"{"type":"record","name":"Customer","namespace":"shop","fields":[
            {"name":"id","type":"long"},{"name":"address","type":{"type":"record","name":"Address",
            "fields":[{"name":"city","type":"string"}]}}]}"#;
        let inline = Avro::<Customer>::new(INLINE, schemas, s).unwrap();
        assert_eq!(inline.deserialize(Some(&bytes)).unwrap(), customer);
        // decode_to_json (the local runner's) uses the references too.
        assert_eq!(
            decode_to_json(&with_address, &bytes[5..]).unwrap(),
            serde_json::json!({"id": 5, "address": {"city": "Oslo"}})
        );
        // Truncated: the city's bytes cut short.
        assert!(serde.deserialize(Some(&bytes[..9])).is_err());
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

#[cfg(feature = "protobuf")]
mod protobuf_json {
    use super::*;

    /// `message Click { string page = 1; int64 ms = 2; Kind kind = 3; repeated string tags = 4;
    /// Where where = 5; bytes raw = 6; }` with `enum Kind { VIEW = 0; BUY = 1; }` and
    /// `message Where { string user_id = 1; }`, as prost would derive it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Click {
        #[prost(string, tag = "1")]
        page: String,
        #[prost(int64, tag = "2")]
        ms: i64,
        #[prost(int32, tag = "3")]
        kind: i32,
        #[prost(string, repeated, tag = "4")]
        tags: Vec<String>,
        #[prost(message, optional, tag = "5")]
        r#where: Option<Where>,
        #[prost(bytes = "vec", tag = "6")]
        raw: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Where {
        #[prost(string, tag = "1")]
        user_id: String,
    }

    const PROTO: &str = r#"syntax = "proto3";
package web;
message Click {
  string page = 1;
  int64 ms = 2;
  Kind kind = 3;
  repeated string tags = 4;
  Where where = 5;
  bytes raw = 6;
}
enum Kind { VIEW = 0; BUY = 1; }
message Where { string user_id = 1; }
"#;

    fn subject() -> Subject {
        Subject::topic("clicks", Side::Value)
    }

    fn serde() -> Protobuf<Click> {
        let schemas = Arc::new(OfflineSchemas::new().with(
            SchemaId::Confluent(8),
            subject(),
            SchemaType::Protobuf,
            PROTO,
        ));
        Protobuf::<Click>::new(PROTO, schemas, subject())
            .input(WireFormat::Json)
            .output(WireFormat::Json)
    }

    fn click() -> Click {
        Click {
            page: "/cart".into(),
            ms: 9_007_199_254_740_993, // 2^53 + 1: not exact as a JSON double
            kind: 1,
            tags: vec!["a".into(), "b".into()],
            r#where: Some(Where {
                user_id: "u1".into(),
            }),
            raw: vec![0xff, 0x00],
        }
    }

    fn meta() -> SchemaMetadata {
        SchemaMetadata {
            data_format: Some("PROTOBUF".into()),
            schema_id: Some("8".into()),
        }
    }

    #[test]
    fn json_mapping_read_into_the_prost_message() {
        // Protobuf's JSON mapping, by hand: lowerCamelCase names, int64 as a string, the
        // enum by name, bytes in base64 ("/wA=" is ff 00).
        let json = br#"{"page":"/cart","ms":"9007199254740993","kind":"BUY","tags":["a","b"],
            "where":{"userId":"u1"},"raw":"/wA="}"#;
        assert_eq!(
            serde()
                .deserialize_with_schema(Some(json), Some(&meta()))
                .unwrap(),
            click()
        );
        // Parsers accept the .proto's own names, numbers for int64 and enums too, and skip
        // a field the .proto does not know (a newer writer).
        let json = br#"{"page":"/cart","ms":9007199254740993,"kind":1,"tags":["a","b"],
            "where":{"user_id":"u1"},"raw":"/wA=","added_later":true}"#;
        assert_eq!(serde().deserialize(Some(json)).unwrap(), click());
        // Default values may be absent.
        assert_eq!(serde().deserialize(Some(b"{}")).unwrap(), Click::default());
    }

    #[test]
    fn json_mapping_written() {
        let out = serde().try_serialize(&click()).unwrap().unwrap();
        let out: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"page": "/cart", "ms": "9007199254740993", "kind": "BUY",
                "tags": ["a", "b"], "where": {"userId": "u1"}, "raw": "/wA="})
        );
    }

    #[test]
    fn json_that_does_not_fit_is_an_error_naming_the_id() {
        for (json, reason) in [
            (&br#"{"ms":"x"}"#[..], "the JSON is not a web.Click message"),
            (br#"{"page":7}"#, "the JSON is not a web.Click message"),
            (br#"{"page":"/a"} x"#, "bytes after the JSON value"),
            (b"not json", "the JSON is not a web.Click message"),
        ] {
            let err = serde()
                .deserialize_with_schema(Some(json), Some(&meta()))
                .unwrap_err();
            assert!(
                err.0
                    .starts_with(&format!("schema id 8 (subject clicks-value): {reason}")),
                "{err}"
            );
        }
        // A .proto that does not compile is an error naming the subject, not a panic.
        let broken =
            Protobuf::<Click>::new("message {", Arc::new(OfflineSchemas::new()), subject())
                .input(WireFormat::Json);
        let err = broken.deserialize(Some(b"{}")).unwrap_err();
        assert!(
            err.0
                .starts_with("subject clicks-value: the .proto does not compile"),
            "{err}"
        );
        // A message index the .proto does not have.
        let missing = serde().message_index(vec![5]);
        let err = missing.deserialize(Some(b"{}")).unwrap_err();
        assert!(err.0.contains("no message at index [5]"), "{err}");
    }

    #[test]
    fn a_proto_with_imports_and_nested_messages() {
        // `Where` in a file of its own, imported; the serde reads the message nested in
        // the file's first message ([0, 0]).
        const WHERE: &str =
            "syntax = \"proto3\";\npackage geo;\nmessage Where { string user_id = 1; }\n";
        const OUTER: &str = "syntax = \"proto3\";\npackage web;\nimport \"geo/where.proto\";\nimport \"google/protobuf/timestamp.proto\";\nmessage Outer { message Visit { geo.Where where = 1; google.protobuf.Timestamp at = 2; } }\n";
        #[derive(Clone, PartialEq, prost::Message)]
        struct Visit {
            #[prost(message, optional, tag = "1")]
            r#where: Option<Where>,
            #[prost(message, optional, tag = "2")]
            at: Option<Timestamp>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Timestamp {
            #[prost(int64, tag = "1")]
            seconds: i64,
            #[prost(int32, tag = "2")]
            nanos: i32,
        }
        let schema = RegisteredSchema::new(SchemaType::Protobuf, OUTER)
            .with_dependencies([("geo/where.proto".to_owned(), Arc::<str>::from(WHERE))]);
        let serde = Protobuf::<Visit>::with_schema(
            schema.clone(),
            Arc::new(OfflineSchemas::new()),
            subject(),
        )
        .message_index(vec![0, 0])
        .input(WireFormat::Json);
        // The well-known Timestamp in its JSON mapping: an RFC 3339 string.
        let visit = serde
            .deserialize(Some(
                br#"{"where":{"userId":"u9"},"at":"1970-01-01T00:00:10.5Z"}"#,
            ))
            .unwrap();
        assert_eq!(
            visit,
            Visit {
                r#where: Some(Where {
                    user_id: "u9".into()
                }),
                at: Some(Timestamp {
                    seconds: 10,
                    nanos: 500_000_000
                }),
            }
        );
        // The local runner's decode_to_json: message indexes [0, 0] (count 2 = zig-zag 4,
        // then 0, 0), then field 1 (tag 0x0a), length 4: field 1 (0x0a), length 2, "u9".
        let payload = [4, 0, 0, 0x0a, 4, 0x0a, 2, b'u', b'9'];
        assert_eq!(
            decode_to_json(&schema, &payload).unwrap(),
            serde_json::json!({"where": {"userId": "u9"}})
        );
        // Without its import the .proto does not compile.
        let alone = RegisteredSchema::new(SchemaType::Protobuf, OUTER);
        assert!(
            decode_to_json(&alone, &payload)
                .unwrap_err()
                .contains("does not compile")
        );
    }
}
