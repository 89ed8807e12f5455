//! The direct read and write against the references, `apache_avro`'s generic read and
//! write. The read: the generic read as
//! [`super::super::Core::decode`] does it (the bytes into a `Value`, nothing left over, the
//! value valid for the schema, then `from_value`): on random schemas and values, on their
//! encodings cut, changed and extended, and on a typed struct that takes every method the
//! direct read serves. Wherever the direct read returns a value, the reference returns the
//! same; on every valid encoding it reads, it does return one (it is used, not only safe).

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Node, read, write};

/// `apache_avro`'s allocation limit as the serde sets it.
const MAX_BYTES: usize = super::super::MAX_ALLOCATION_BYTES;

/// The reference: what [`super::super::Core::decode`] and `from_value` make of `bytes`.
fn reference<T: DeserializeOwned>(schema: &Schema, bytes: &[u8]) -> Option<T> {
    let mut rest = bytes;
    let reader = GenericDatumReader::builder(schema).build().ok()?;
    let value = reader.read_value(&mut rest).ok()?;
    if !rest.is_empty() || !value.validate(schema) {
        return None;
    }
    apache_avro::from_value::<T>(&value).ok()
}

/// `value` encoded as [`super::super::Core::encode`] encodes.
fn encode(schema: &Schema, value: &Value) -> Vec<u8> {
    let writer = GenericDatumWriter::builder(schema)
        .build()
        .expect("a writer");
    let mut out = Vec::new();
    writer
        .write_value_ref(&mut out, value)
        .expect("a value of the schema encodes");
    out
}

/// The direct read of `bytes`, after the limit is set as the serde sets it.
fn direct<T: DeserializeOwned>(node: &Node, bytes: &[u8]) -> Option<T> {
    let max = apache_avro::util::max_allocation_bytes(MAX_BYTES);
    read(node, bytes, max, super::super::human_readable())
}

/// The cases' randomness: proptest's generator, seeded by the case.
struct Draw(TestRng);

impl Draw {
    fn new(seed: u64) -> Self {
        let mut bytes = [0; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Draw(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn long(&mut self) -> i64 {
        match self.below(5) {
            0 => [0, -1, 1, i64::MIN, i64::MAX][self.below(5) as usize],
            1 => self.next() as i64,
            _ => self.below(2_000) as i64 - 1_000,
        }
    }

    fn string(&mut self) -> String {
        let pieces = ["", "a", "é", "x", "日本", "🦀", "order-", "0"];
        (0..self.below(4))
            .map(|_| pieces[self.below(pieces.len() as u64) as usize])
            .collect()
    }
}

/// A random schema (JSON) of the types the direct read covers, and some it does not (a
/// map, a fixed, a uuid), `depth` levels deep at most.
fn schema_json(rng: &mut Draw, depth: u32, names: &mut u32) -> String {
    let kind = if depth == 0 {
        rng.below(10)
    } else {
        rng.below(16)
    };
    match kind {
        0..=9 => PRIMITIVES[kind as usize].1.to_owned(),
        10 => format!(
            r#"{{"type":"array","items":{}}}"#,
            schema_json(rng, depth - 1, names)
        ),
        11 | 12 => {
            // A union of kinds of distinct base types (a timestamp is a long), often with
            // null first (an option).
            let mut kinds: Vec<(&str, &str)> = Vec::new();
            if rng.below(2) == 0 {
                kinds.push(PRIMITIVES[0]);
            }
            for _ in 0..1 + rng.below(2) {
                let kind = PRIMITIVES[1 + rng.below(9) as usize];
                if !kinds.iter().any(|(base, _)| *base == kind.0) {
                    kinds.push(kind);
                }
            }
            let mut branches: Vec<String> =
                kinds.iter().map(|(_, json)| (*json).to_owned()).collect();
            if rng.below(3) == 0 {
                *names += 1;
                branches.push(record_json(rng, depth - 1, names));
            }
            format!("[{}]", branches.join(","))
        }
        13 => {
            *names += 1;
            format!(
                r#"{{"type":"enum","name":"E{}","symbols":["A","B","C"]}}"#,
                names
            )
        }
        14 => {
            *names += 1;
            record_json(rng, depth - 1, names)
        }
        _ => match rng.below(3) {
            0 => format!(
                r#"{{"type":"map","values":{}}}"#,
                schema_json(rng, depth - 1, names)
            ),
            1 => {
                *names += 1;
                format!(r#"{{"type":"fixed","name":"F{names}","size":2}}"#)
            }
            _ => r#"{"type":"string","logicalType":"uuid"}"#.to_owned(),
        },
    }
}

/// The unnamed types the generator draws, by base type (a union holds one of each), null
/// first.
const PRIMITIVES: [(&str, &str); 10] = [
    ("null", r#""null""#),
    ("boolean", r#""boolean""#),
    ("int", r#""int""#),
    ("long", r#""long""#),
    ("float", r#""float""#),
    ("double", r#""double""#),
    ("bytes", r#""bytes""#),
    ("string", r#""string""#),
    (
        "long",
        r#"{"type":"long","logicalType":"timestamp-millis"}"#,
    ),
    ("int", r#"{"type":"int","logicalType":"date"}"#),
];

fn record_json(rng: &mut Draw, depth: u32, names: &mut u32) -> String {
    let name = *names;
    let fields: Vec<String> = (0..1 + rng.below(4))
        .map(|i| {
            format!(
                r#"{{"name":"f{i}","type":{}}}"#,
                schema_json(rng, depth, names)
            )
        })
        .collect();
    format!(
        r#"{{"type":"record","name":"R{name}","fields":[{}]}}"#,
        fields.join(",")
    )
}

/// A random value of `schema`.
fn value_of(schema: &Schema, rng: &mut Draw) -> Value {
    match schema {
        Schema::Null => Value::Null,
        Schema::Boolean => Value::Boolean(rng.below(2) == 1),
        Schema::Int => Value::Int(rng.long() as i32),
        Schema::Long => Value::Long(rng.long()),
        Schema::TimestampMillis => Value::TimestampMillis(rng.long()),
        Schema::Date => Value::Date(rng.long() as i32),
        Schema::Uuid(_) => Value::String(format!(
            "{:08x}-0000-4000-8000-000000000000",
            rng.next() as u32
        ))
        .resolve(schema)
        .expect("a uuid"),
        Schema::Float => Value::Float(f32::from_bits(rng.next() as u32)),
        Schema::Double => Value::Double(match rng.below(3) {
            0 => f64::from_bits(rng.next()),
            _ => rng.long() as f64 / 8.0,
        }),
        Schema::Bytes => Value::Bytes(rng.string().into_bytes()),
        Schema::String => Value::String(rng.string()),
        Schema::Fixed(fixed) => Value::Fixed(fixed.size, vec![rng.below(256) as u8; fixed.size]),
        Schema::Array(array) => Value::Array(
            (0..rng.below(4))
                .map(|_| value_of(&array.items, rng))
                .collect(),
        ),
        Schema::Map(map) => Value::Map(
            (0..rng.below(3))
                .map(|i| (format!("k{i}"), value_of(&map.types, rng)))
                .collect(),
        ),
        Schema::Union(union) => {
            let index = rng.below(union.variants().len() as u64);
            let inner = value_of(&union.variants()[index as usize], rng);
            Value::Union(index as u32, Box::new(inner))
        }
        Schema::Record(record) => Value::Record(
            record
                .fields
                .iter()
                .map(|f| (f.name.clone(), value_of(&f.schema, rng)))
                .collect(),
        ),
        Schema::Enum(e) => {
            let index = rng.below(e.symbols.len() as u64) as usize;
            Value::Enum(index as u32, e.symbols[index].clone())
        }
        other => unreachable!("the generator makes no {other:?}"),
    }
}

/// The encoding of `value` and variants of it: cut short, a byte changed, a byte added.
fn encodings(schema: &Schema, value: Value, rng: &mut Draw) -> (Vec<u8>, Vec<Vec<u8>>) {
    let bytes = encode(schema, &value);
    let mut variants = Vec::new();
    if !bytes.is_empty() {
        variants.push(bytes[..rng.below(bytes.len() as u64) as usize].to_vec());
        let mut changed = bytes.clone();
        let at = rng.below(bytes.len() as u64) as usize;
        changed[at] = rng.below(256) as u8;
        variants.push(changed);
    }
    let mut longer = bytes.clone();
    longer.push(rng.below(256) as u8);
    variants.push(longer);
    (bytes, variants)
}

/// Checks the direct read of `bytes` as `T` against the reference: the same value whenever
/// it returns one (compared by their `Debug` text, so that NaN equals a NaN of the same bits); when `valid` (an encoding of a value of the schema) and `must_read`, a
/// value whenever the reference has one.
fn agree<T: DeserializeOwned + std::fmt::Debug>(
    schema: &Schema,
    node: &Node,
    bytes: &[u8],
    must_read: bool,
) -> Result<(), TestCaseError> {
    let expected = reference::<T>(schema, bytes);
    match direct::<T>(node, bytes) {
        Some(got) => prop_assert_eq!(
            format!("{:?}", Some(got)),
            format!("{expected:?}"),
            "bytes {:?}",
            bytes
        ),
        None => prop_assert!(
            !must_read || expected.is_none(),
            "the direct read gave up on {:?}, which the reference reads as {:?}",
            bytes,
            expected
        ),
    }
    Ok(())
}

/// Every field type of [`Typed`]'s schema, and a field it does not have.
const TYPED_SCHEMA: &str = r#"{"type":"record","name":"Typed","fields":[
  {"name":"s","type":"string"},{"name":"l","type":"long"},{"name":"i","type":"int"},
  {"name":"u","type":"long"},{"name":"small","type":"int"},{"name":"opt","type":["null","string"]},
  {"name":"d","type":"double"},{"name":"f","type":"float"},{"name":"b","type":"boolean"},
  {"name":"items","type":{"type":"array","items":"long"}},
  {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID","SHIPPED"]}},
  {"name":"status_text","type":"string"},
  {"name":"c","type":"string"},{"name":"extra","type":["null","long","string"]},
  {"name":"nested","type":["null",{"type":"record","name":"Inner","fields":[
    {"name":"x","type":"int"},{"name":"tags","type":{"type":"array","items":"string"}}]}]},
  {"name":"maybe_list","type":["null",{"type":"array","items":"int"}]},
  {"name":"num_or_text","type":["long","string"]},{"name":"nothing","type":"null"},
  {"name":"label","type":"string"}]}"#;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Status {
    #[serde(rename = "NEW")]
    New,
    #[serde(rename = "PAID")]
    Paid,
    #[serde(rename = "SHIPPED")]
    Shipped,
}

#[derive(Debug, PartialEq, Deserialize)]
struct Inner {
    x: i32,
    tags: Vec<String>,
}

#[derive(Debug, PartialEq, Deserialize)]
struct Label(String);

#[derive(Debug, PartialEq, Deserialize)]
struct Typed {
    s: String,
    l: i64,
    i: i32,
    u: u64,
    small: u8,
    opt: Option<String>,
    d: f64,
    f: f32,
    b: bool,
    items: Vec<i64>,
    status: Status,
    status_text: String,
    c: char,
    nested: Option<Inner>,
    maybe_list: Vec<i32>,
    num_or_text: serde_json::Value,
    nothing: (),
    label: Label,
}

/// A value of [`TYPED_SCHEMA`], its strings sometimes one character (for `c`) and its
/// `status_text` sometimes a symbol (both read as their Rust types only then).
fn typed_value(schema: &Schema, rng: &mut Draw) -> Value {
    let Value::Record(mut fields) = value_of(schema, rng) else {
        unreachable!("a record")
    };
    for (name, value) in &mut fields {
        match name.as_str() {
            "c" if rng.below(3) > 0 => {
                *value = Value::String(["x", "é", "🦀"][rng.below(3) as usize].into())
            }
            "small" if rng.below(2) > 0 => *value = Value::Int(rng.below(300) as i32),
            "u" if rng.below(2) > 0 => *value = Value::Long(rng.below(1 << 40) as i64),
            _ => {}
        }
    }
    Value::Record(fields)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random schemas read as `serde_json::Value` (every value through `deserialize_any`).
    #[test]
    fn the_direct_read_agrees_with_the_generic_read_on_random_schemas(seed in any::<u64>()) {
        let mut rng = Draw::new(seed);
        let json = record_json(&mut rng, 3, &mut 0);
        let schema = Schema::parse_str(&json).expect("the generator makes valid schemas");
        let value = value_of(&schema, &mut rng);
        let (bytes, variants) = encodings(&schema, value, &mut rng);
        match Node::of(&schema) {
            Some(node) => {
                agree::<serde_json::Value>(&schema, &node, &bytes, true)?;
                for variant in &variants {
                    agree::<serde_json::Value>(&schema, &node, variant, false)?;
                }
            }
            // Only the types the direct read leaves to the generic read keep it out.
            None => prop_assert!(
                json.contains("\"map\"") || json.contains("\"fixed\"") || json.contains("uuid"),
                "no direct read for {}", json
            ),
        }
    }

    /// A struct that takes every `Deserializer` method the direct read serves (strings,
    /// integers converted, options, sequences, enums, chars, a unit, a newtype, a union
    /// as a JSON value), and a field it does not have (skipped).
    #[test]
    fn the_direct_read_agrees_with_the_generic_read_on_a_typed_struct(seed in any::<u64>()) {
        let mut rng = Draw::new(seed);
        let schema = Schema::parse_str(TYPED_SCHEMA).expect("valid");
        let node = Node::of(&schema).expect("covered");
        let value = typed_value(&schema, &mut rng);
        let (bytes, variants) = encodings(&schema, value, &mut rng);
        agree::<Typed>(&schema, &node, &bytes, true)?;
        for variant in &variants {
            agree::<Typed>(&schema, &node, variant, false)?;
        }
    }
}

/// An array written in blocks, one with a negative count (its byte size after it), as
/// other Avro writers write them: the same items both ways.
#[test]
fn arrays_in_blocks_with_negative_counts_read_the_same() {
    let schema = Schema::parse_str(r#"{"type":"array","items":"long"}"#).expect("valid");
    let node = Node::of(&schema).expect("covered");
    // [-2 items, 2 bytes] 1 2, [1 item] 3, end. Zigzag: -2 = 3, 2 = 4, 1 = 2, 3 = 6.
    let bytes = [3, 4, 2, 4, 2, 6, 0];
    let expected: Option<Vec<i64>> = reference(&schema, &bytes);
    assert_eq!(expected, Some(vec![1, 2, 3]));
    assert_eq!(direct::<Vec<i64>>(&node, &bytes), expected);
}

/// A visitor that stops reading a record early or catches an error still gets the
/// reference's value: the direct read keeps the input in step, or gives up.
#[test]
fn values_a_type_leaves_unread_or_an_error_it_catches_do_not_change_the_result() {
    #[derive(Debug, PartialEq)]
    struct FirstFieldOnly(String);
    impl<'de> Deserialize<'de> for FirstFieldOnly {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = FirstFieldOnly;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a record")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<FirstFieldOnly, A::Error> {
                    let (_, first): (String, String) = map
                        .next_entry()?
                        .ok_or_else(|| serde::de::Error::custom("empty"))?;
                    Ok(FirstFieldOnly(first))
                }
            }
            d.deserialize_map(V)
        }
    }
    #[derive(Debug, PartialEq, Deserialize)]
    struct Outer {
        a: FirstFieldOnly,
        tail: i64,
        #[serde(deserialize_with = "zero_on_error")]
        caught: u64,
        after: String,
    }
    fn zero_on_error<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        Ok(u64::deserialize(d).unwrap_or(0))
    }
    let schema = Schema::parse_str(
        r#"{"type":"record","name":"Outer","fields":[
            {"name":"a","type":{"type":"record","name":"A","fields":[
                {"name":"x","type":"string"},{"name":"y","type":"string"},{"name":"z","type":"long"}]}},
            {"name":"tail","type":"long"},{"name":"caught","type":"long"},{"name":"after","type":"string"}]}"#,
    )
    .expect("valid");
    let node = Node::of(&schema).expect("covered");
    for caught in [7, -7] {
        let value = Value::Record(vec![
            (
                "a".into(),
                Value::Record(vec![
                    ("x".into(), Value::String("first".into())),
                    ("y".into(), Value::String("second".into())),
                    ("z".into(), Value::Long(9)),
                ]),
            ),
            ("tail".into(), Value::Long(42)),
            ("caught".into(), Value::Long(caught)),
            ("after".into(), Value::String("end".into())),
        ]);
        let bytes = encode(&schema, &value);
        let expected: Option<Outer> = reference(&schema, &bytes);
        assert_eq!(
            expected
                .as_ref()
                .map(|o| (o.a.0.as_str(), o.tail, o.caught)),
            Some(("first", 42, caught.max(0) as u64))
        );
        let got = direct::<Outer>(&node, &bytes);
        if caught >= 0 {
            assert_eq!(got, expected, "read straight");
        } else {
            // u64 of a negative long is an error `zero_on_error` catches: given up.
            assert_eq!(got, None);
        }
    }
}

/// The reference write: what [`super::super::Avro`]'s generic write makes of `value`
/// (`to_value`, the resolution to the schema, the writer).
fn reference_write<T: Serialize>(schema: &Schema, value: &T) -> Option<Vec<u8>> {
    let generic = apache_avro::to_value(value).ok()?;
    let resolved = generic.resolve(schema).ok()?;
    let writer = GenericDatumWriter::builder(schema).build().ok()?;
    let mut out = Vec::new();
    writer.write_value_ref(&mut out, &resolved).ok()?;
    Some(out)
}

/// The direct write of `value` after bytes already in the buffer (kept as they were when it
/// gives up).
fn direct_write<T: Serialize>(node: &Node, value: &T) -> Option<Vec<u8>> {
    let mut out = vec![0xAB];
    let written = write(node, value, &mut out, super::super::human_readable());
    assert_eq!(out[0], 0xAB, "the bytes before are kept");
    if written {
        Some(out[1..].to_vec())
    } else {
        assert_eq!(
            out.len(),
            1,
            "nothing is left behind when the write gives up"
        );
        None
    }
}

#[derive(Debug, Clone, Serialize)]
struct InnerOut {
    x: i32,
    tags: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
struct Name(String);

#[derive(Debug, Clone, Serialize)]
struct Out {
    s: String,
    l: i64,
    i: i32,
    small: u8,
    u: u32,
    opt: Option<String>,
    d: f64,
    f: f32,
    b: bool,
    items: Vec<i64>,
    stage: Status,
    c: char,
    nested: Option<InnerOut>,
    unit: (),
    name: Name,
    ts: i64,
    day: i32,
    maybe_ts: Option<i64>,
}

fn out_value(rng: &mut Draw) -> Out {
    Out {
        s: rng.string(),
        l: rng.long(),
        i: rng.long() as i32,
        small: rng.below(256) as u8,
        u: match rng.below(2) {
            0 => rng.below(1000) as u32,
            _ => rng.next() as u32,
        },
        opt: (rng.below(2) == 0).then(|| rng.string()),
        d: rng.long() as f64 / 4.0,
        f: rng.long() as f32 / 2.0,
        b: rng.below(2) == 0,
        items: (0..rng.below(4)).map(|_| rng.long()).collect(),
        stage: [Status::New, Status::Paid, Status::Shipped][rng.below(3) as usize],
        c: ['a', 'é', '🦀'][rng.below(3) as usize],
        nested: (rng.below(2) == 0).then(|| InnerOut {
            x: rng.long() as i32,
            tags: (0..rng.below(3)).map(|_| rng.string()).collect(),
        }),
        unit: (),
        name: Name(rng.string()),
        ts: rng.long(),
        day: rng.long() as i32,
        maybe_ts: (rng.below(2) == 0).then(|| rng.long()),
    }
}

/// Schemas `Out` is written with, and whether the direct write must write every value the
/// generic write writes (`false`: it may give up where the generic way resolves otherwise).
fn out_schemas() -> Vec<(&'static str, bool)> {
    let inner = r#"{"type":"record","name":"InnerOut","fields":[{"name":"x","type":"int"},{"name":"tags","type":{"type":"array","items":"string"}}]}"#;
    let stage = r#"{"type":"enum","name":"Stage","symbols":["NEW","PAID","SHIPPED"]}"#;
    let make = |fields: &[(&str, String)]| -> &'static str {
        let fields: Vec<String> = fields
            .iter()
            .map(|(name, schema)| format!(r#"{{"name":"{name}","type":{schema}}}"#))
            .collect();
        Box::leak(
            format!(
                r#"{{"type":"record","name":"Out","fields":[{}]}}"#,
                fields.join(",")
            )
            .into_boxed_str(),
        )
    };
    let base = |over: &[(&str, &str)]| -> Vec<(&'static str, String)> {
        let mut fields: Vec<(&'static str, String)> = vec![
            ("s", r#""string""#.into()),
            ("l", r#""long""#.into()),
            ("i", r#""int""#.into()),
            ("small", r#""int""#.into()),
            ("u", r#""long""#.into()),
            ("opt", r#"["null","string"]"#.into()),
            ("d", r#""double""#.into()),
            ("f", r#""float""#.into()),
            ("b", r#""boolean""#.into()),
            ("items", r#"{"type":"array","items":"long"}"#.into()),
            ("stage", stage.into()),
            ("c", r#""string""#.into()),
            ("nested", format!(r#"["null",{inner}]"#)),
            ("unit", r#""null""#.into()),
            ("name", r#""string""#.into()),
            (
                "ts",
                r#"{"type":"long","logicalType":"timestamp-millis"}"#.into(),
            ),
            ("day", r#"{"type":"int","logicalType":"date"}"#.into()),
            (
                "maybe_ts",
                r#"["null",{"type":"long","logicalType":"timestamp-micros"}]"#.into(),
            ),
        ];
        for (name, schema) in over {
            let field = fields.iter_mut().find(|(n, _)| n == name).expect("a field");
            field.1 = (*schema).to_owned();
        }
        fields
    };
    let exact = base(&[]);
    // Promotions and other branch orders: int to long, float to double, long to double, an
    // enum's symbol as a string, null second in a union.
    let promoted = base(&[
        ("i", r#""long""#),
        ("small", r#""double""#),
        ("f", r#""double""#),
        ("l", r#""double""#),
        ("items", r#"{"type":"array","items":"double"}"#),
        ("stage", r#""string""#),
        ("opt", r#"["string","null"]"#),
    ]);
    let mut nested_second = base(&[]);
    nested_second[12].1 = format!(r#"[{inner},"null"]"#);
    // Where the generic way resolves by trying branches, by defaults or by narrowing.
    let unions = base(&[
        ("opt", r#"["null","long","string"]"#),
        ("i", r#"["null","long"]"#),
        ("d", r#"["float","double"]"#),
        ("l", r#"["null","long"]"#),
        ("stage", r#"["null","string"]"#),
    ]);
    let narrowed = base(&[("l", r#""int""#), ("d", r#""float""#)]);
    let mut permuted = base(&[]);
    permuted.swap(0, 1);
    let mut with_default = base(&[]);
    with_default.push(("extra", r#""long","default":7"#.into()));
    let mut missing = base(&[]);
    missing.remove(3);
    let fewer_symbols = base(&[(
        "stage",
        r#"{"type":"enum","name":"Stage","symbols":["NEW","PAID"],"default":"NEW"}"#,
    )]);
    vec![
        (make(&exact), true),
        (make(&promoted), true),
        (make(&nested_second), true),
        (make(&unions), false),
        (make(&narrowed), false),
        (make(&permuted), false),
        (make(&with_default), false),
        (make(&missing), false),
        (make(&fewer_symbols), false),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A struct of every kind the direct write serves, written with schemas that take it
    /// as it is, promote it, or make the generic way choose (unions by trial, defaults,
    /// narrowing, another field order, a missing field, an enum's default): the direct
    /// write's bytes are the generic write's whenever it writes, and it writes whenever
    /// the schema takes the value as it is or by promotion.
    #[test]
    fn the_direct_write_agrees_with_the_generic_write(seed in any::<u64>()) {
        let mut rng = Draw::new(seed);
        let value = out_value(&mut rng);
        for (json, must_write) in out_schemas() {
            let schema = Schema::parse_str(json).expect("valid");
            let node = Node::of(&schema).expect("covered");
            let expected = reference_write(&schema, &value);
            match direct_write(&node, &value) {
                Some(bytes) => prop_assert_eq!(Some(bytes), expected, "{}", json),
                None => prop_assert!(
                    !must_write || expected.is_none(),
                    "the direct write gave up on {:?} with {}, which the generic write writes",
                    value,
                    json
                ),
            }
        }
    }
}

/// The reference read under resolution: what [`super::super::Core::decode`] and
/// `from_value` make of `bytes` written with `writer`'s schema, for the `reader`'s.
fn reference_resolved<T: DeserializeOwned>(
    writer: &Schema,
    reader: &Schema,
    bytes: &[u8],
) -> Option<T> {
    let mut rest = bytes;
    let generic = GenericDatumReader::builder(writer)
        .reader_schema(reader)
        .build()
        .ok()?;
    let value = generic.read_value(&mut rest).ok()?;
    if !rest.is_empty() || !value.validate(reader) {
        return None;
    }
    apache_avro::from_value::<T>(&value).ok()
}

/// `base`'s record with fields added at random places: `prefix0`, `prefix1`, ... of random
/// schemas, or, `optional`, unions with null first and a null default.
fn with_added_fields(
    base: &str,
    prefix: &str,
    optional: bool,
    rng: &mut Draw,
    names: &mut u32,
) -> String {
    let mut record: serde_json::Value = serde_json::from_str(base).expect("json");
    let mut fields = record["fields"].as_array().expect("a record").clone();
    for k in 0..rng.below(3) {
        let at = rng.below(fields.len() as u64 + 1) as usize;
        let schema: serde_json::Value =
            serde_json::from_str(&schema_json(rng, 1, names)).expect("json");
        let field = if optional {
            let inner = match schema {
                // A union in a union is not a schema: its branches join null's.
                serde_json::Value::Array(branches) => {
                    branches.into_iter().filter(|b| b != "null").collect()
                }
                other => vec![other],
            };
            let mut union = vec![serde_json::json!("null")];
            union.extend(inner);
            serde_json::json!({"name": format!("{prefix}{k}"), "type": union, "default": null})
        } else {
            serde_json::json!({"name": format!("{prefix}{k}"), "type": schema})
        };
        fields.insert(at, field);
    }
    record["fields"] = serde_json::Value::Array(fields);
    record.to_string()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Schema evolution where the writer added fields (the reader lacks them) and the reader
    /// added optional ones (null first, a default): the direct read drops and adds them as
    /// the resolution does, and agrees with the generic read with resolution on the value,
    /// the encoding cut, changed and extended.
    #[test]
    fn the_direct_read_drops_and_adds_fields_as_the_resolution_does(seed in any::<u64>()) {
        let mut rng = Draw::new(seed);
        let mut names = 0;
        let base = record_json(&mut rng, 2, &mut names);
        let writer_json = with_added_fields(&base, "added", false, &mut rng, &mut names);
        let reader_json = with_added_fields(&base, "optional", true, &mut rng, &mut names);
        let (Ok(reader), Ok(writer)) = (Schema::parse_str(&reader_json), Schema::parse_str(&writer_json)) else {
            // Two named types of one name, or a union of two of a kind: not a schema.
            return Ok(());
        };
        let Some(node) = Node::projection(&writer, &reader) else {
            prop_assert!(
                Node::of(&writer).is_none() || Node::of(&reader).is_none(),
                "no projection of {} to {}", writer_json, reader_json
            );
            return Ok(());
        };
        let (bytes, variants) = encodings(&writer, value_of(&writer, &mut rng), &mut rng);
        for (bytes, valid) in std::iter::once((&bytes, true)).chain(variants.iter().map(|v| (v, false))) {
            let expected = reference_resolved::<serde_json::Value>(&writer, &reader, bytes);
            match direct::<serde_json::Value>(&node, bytes) {
                Some(got) => prop_assert_eq!(Some(got), expected, "{} to {}", writer_json, reader_json),
                None => prop_assert!(!valid || expected.is_none(), "gave up on {:?}", bytes),
            }
        }
    }
}

/// The resolutions that do more than drop fields are left to the generic read.
#[test]
fn a_projection_is_only_of_dropped_fields() {
    let record = |fields: &str| {
        Schema::parse_str(&format!(
            r#"{{"type":"record","name":"R","fields":[{fields}]}}"#
        ))
        .expect("valid")
    };
    let reader = record(r#"{"name":"a","type":"long"},{"name":"b","type":"string"}"#);
    let cases = [
        // The writer's extra field, first, between and last: dropped.
        (
            r#"{"name":"x","type":"int"},{"name":"a","type":"long"},{"name":"b","type":"string"}"#,
            true,
        ),
        (
            r#"{"name":"a","type":"long"},{"name":"x","type":"int"},{"name":"b","type":"string"}"#,
            true,
        ),
        (
            r#"{"name":"a","type":"long"},{"name":"b","type":"string"},{"name":"x","type":"int"}"#,
            true,
        ),
        // Another order, a missing field (its type not a union with null first), a
        // promotion.
        (
            r#"{"name":"b","type":"string"},{"name":"a","type":"long"}"#,
            false,
        ),
        (r#"{"name":"a","type":"long"}"#, false),
        (
            r#"{"name":"a","type":"int"},{"name":"b","type":"string"}"#,
            false,
        ),
        // A timestamp the reader reads as a plain long: the resolution refuses it (below).
        (
            r#"{"name":"x","type":"int"},{"name":"a","type":{"type":"long","logicalType":"timestamp-millis"}},{"name":"b","type":"string"}"#,
            false,
        ),
    ];
    for (fields, projected) in cases {
        let writer = record(fields);
        assert_eq!(
            Node::projection(&writer, &reader).is_some(),
            projected,
            "{fields}"
        );
    }
    let timestamp = record(cases[6].0);
    let bytes = encode(
        &timestamp,
        &Value::Record(vec![
            ("x".into(), Value::Int(1)),
            ("a".into(), Value::TimestampMillis(2)),
            ("b".into(), Value::String("b".into())),
        ]),
    );
    assert_eq!(
        reference_resolved::<serde_json::Value>(&timestamp, &reader, &bytes),
        None,
        "the resolution refuses a timestamp for a long"
    );
    let two_records = r#"["null",{"type":"record","name":"P","fields":[{"name":"p","type":"int"}]},
        {"type":"record","name":"Q","fields":[{"name":"p","type":"int"}]}]"#;
    let reader = record(&format!(r#"{{"name":"u","type":{two_records}}}"#));
    let writer = record(&format!(
        r#"{{"name":"x","type":"int"}},{{"name":"u","type":{two_records}}}"#
    ));
    assert!(
        Node::projection(&writer, &reader).is_none(),
        "a union of two records"
    );
}
