//! The direct read: Avro bytes into a serde type, without `apache_avro`'s generic `Value`.
//!
//! [`super::Avro`] reads a record as `apache_avro` does: the bytes into a `Value` tree (an
//! allocation per string, per record and per union), the tree checked against the schema,
//! then `apache_avro::from_value` into the type. That costs ≈ 1.2 µs per small record
//! (BENCHMARKS.md section 1a). When the writer's schema is the reader's and has no
//! references, this module reads the bytes straight into the type, making the visitor
//! calls `from_value` makes for the value the bytes hold (the same methods, with the same
//! values, in the same order), so a type decodes to the same value either way.
//!
//! It is a fast path, as the event decoder's is: it covers the common schema types (null,
//! boolean, int, long, float, double, bytes, string, record, array, enum, the date, time and
//! timestamp logical types, and unions of them; a schema with any other type, e.g. a map, a
//! fixed, a decimal or a uuid, is not read here at all: [`Node::of`] is `None`), and
//! **gives up** on anything it is not sure to read as `apache_avro` does: bytes that
//! `apache_avro` would reject or read oddly (truncated input, a bad length, a union index at
//! the end of the input), a visitor call `from_value` answers with an error, and any error
//! at all, even one the type's own `Deserialize` catches. Giving up means the record is read again the generic way, which
//! decides: every error comes from there, and the tests check that both ways agree.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use apache_avro::Schema;
use serde::de::{self, DeserializeSeed, IgnoredAny, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};

/// A schema as the direct read walks it.
#[derive(Debug, PartialEq)]
pub(super) enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array(Box<Node>),
    Union(Box<[Node]>),
    /// The fields, in the (writer's) schema's order.
    Record(Box<[Field]>),
    /// The symbols.
    Enum(Box<[String]>),
}

/// A record's field.
#[derive(Debug, PartialEq)]
pub(super) struct Field {
    pub(super) name: String,
    pub(super) node: Node,
    /// A field of the writer's schema that the reader's lacks: read (and checked) but not
    /// shown to the type, as the resolution drops it ([`Node::projection`]).
    pub(super) dropped: bool,
    /// A field of the reader's schema that the writer's lacks, a union with null first and
    /// a default: not in the bytes; the type is shown the union's null, as the resolution
    /// gives it ([`Node::projection`]).
    pub(super) null_default: bool,
}

impl Node {
    /// The node of `schema`; `None` if it holds a type the direct read does not cover.
    pub(super) fn of(schema: &Schema) -> Option<Node> {
        Some(match schema {
            Schema::Null => Node::Null,
            Schema::Boolean => Node::Boolean,
            // The logical types on an `int` or a `long` read and write as one: `from_value`
            // presents their values as it presents an `int`'s or a `long`'s, and the
            // resolution takes the same values for them (`int` only for a date or a time in
            // milliseconds; `int` or `long` for the others).
            Schema::Int | Schema::Date | Schema::TimeMillis => Node::Int,
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => Node::Long,
            Schema::Float => Node::Float,
            Schema::Double => Node::Double,
            Schema::Bytes => Node::Bytes,
            Schema::String => Node::String,
            Schema::Array(array) => Node::Array(Box::new(Node::of(&array.items)?)),
            Schema::Union(union) => Node::Union(
                union
                    .variants()
                    .iter()
                    .map(|variant| match variant {
                        // Avro forbids a union directly in a union; never read one.
                        Schema::Union(_) => None,
                        other => Node::of(other),
                    })
                    .collect::<Option<_>>()?,
            ),
            Schema::Record(record) => Node::Record(
                record
                    .fields
                    .iter()
                    .map(|field| {
                        Some(Field {
                            name: field.name.clone(),
                            node: Node::of(&field.schema)?,
                            dropped: false,
                            null_default: false,
                        })
                    })
                    .collect::<Option<_>>()?,
            ),
            Schema::Enum(schema) => Node::Enum(schema.symbols.clone().into()),
            _ => return None,
        })
    }

    /// The node that reads records of the `writer`'s schema as `apache_avro` resolves them
    /// to the `reader`'s, in the cases where the resolution only drops and adds fields:
    /// both records; every field of the reader's either in the writer's with the same
    /// schema (logical types and all), these in the same order in both, or missing there
    /// and a union with null first and a default (the resolution gives it the union's null,
    /// whatever the default says); the writer's other fields dropped (the resolution skips
    /// them). The reader's fields are then shown in its order, as the resolution shows
    /// them. `None` for anything else, e.g. another default, a promotion, fields in another
    /// order, or a union of two records among the shared fields (the resolution picks the
    /// first record a value fits).
    pub(super) fn projection(writer: &Schema, reader: &Schema) -> Option<Node> {
        let (Schema::Record(writer_record), Schema::Record(reader_record)) = (writer, reader)
        else {
            return None;
        };
        let (Node::Record(writer_nodes), Node::Record(reader_nodes)) =
            (Node::of(writer)?, Node::of(reader)?)
        else {
            return None;
        };
        // The same schema, logical types and all (a timestamp the reader reads as a plain
        // `long` fails the resolution): compared as their JSON.
        let same = |a: &Schema, b: &Schema| match (serde_json::to_value(a), serde_json::to_value(b))
        {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        let in_reader = |name: &str| reader_record.fields.iter().any(|f| f.name == name);
        let mut writer_fields = writer_record.fields.iter().zip(writer_nodes);
        let mut fields = Vec::new();
        for (reader_field, reader_node) in reader_record.fields.iter().zip(reader_nodes) {
            if writer_record
                .fields
                .iter()
                .any(|f| f.name == reader_field.name)
            {
                // The writer's fields up to this one; it must come later than the last.
                loop {
                    let (schema, mut field) = writer_fields.next()?;
                    if field.name == reader_field.name {
                        if !same(&schema.schema, &reader_field.schema)
                            || field.node.picks_among_records()
                        {
                            return None;
                        }
                        fields.push(field);
                        break;
                    }
                    if in_reader(&field.name) {
                        return None;
                    }
                    field.dropped = true;
                    fields.push(field);
                }
            } else {
                let null_first = matches!(&reader_field.schema,
                    Schema::Union(union) if matches!(union.variants().first(), Some(Schema::Null)));
                if !(null_first && reader_field.default.is_some()) {
                    return None;
                }
                let mut field = reader_node;
                field.null_default = true;
                fields.push(field);
            }
        }
        for (_, mut field) in writer_fields {
            if in_reader(&field.name) {
                return None;
            }
            field.dropped = true;
            fields.push(field);
        }
        Some(Node::Record(fields.into()))
    }

    /// Whether a union in the node holds two records or more.
    fn picks_among_records(&self) -> bool {
        match self {
            Node::Union(variants) => {
                variants
                    .iter()
                    .filter(|v| matches!(v, Node::Record(_)))
                    .count()
                    > 1
                    || variants.iter().any(Node::picks_among_records)
            }
            Node::Array(item) => item.picks_among_records(),
            Node::Record(fields) => fields.iter().any(|f| f.node.picks_among_records()),
            _ => false,
        }
    }
}

/// Reads `bytes`, all of them, as one value of `node` into a `T`; `None` when the direct
/// read gives up (the caller then reads the generic way). `max_bytes` is `apache_avro`'s
/// allocation limit, which bounds lengths and collections as it does there;
/// `human_readable` what `from_value` tells the types that ask.
pub(super) fn read<'de, T: Deserialize<'de>>(
    node: &'de Node,
    bytes: &'de [u8],
    max_bytes: usize,
    human_readable: bool,
) -> Option<T> {
    let gave_up = Cell::new(false);
    let mut input = Input {
        bytes,
        max_bytes,
        human_readable,
        gave_up: &gave_up,
    };
    let value = T::deserialize(De {
        node,
        input: &mut input,
    });
    let rest = input.bytes.len();
    match value {
        Ok(value) if !gave_up.get() && rest == 0 => Some(value),
        _ => None,
    }
}

/// The only error of the direct read: it gave up (why is not kept: the generic read
/// decides the error).
#[derive(Debug)]
pub(super) struct GaveUp;

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the direct Avro read gave up")
    }
}

impl std::error::Error for GaveUp {}

impl de::Error for GaveUp {
    fn custom<T: fmt::Display>(_: T) -> Self {
        GaveUp
    }
}

/// The bytes left to read, and whether the read gave up: set by every error that passes
/// through the read, so that one a visitor catches still sends the record the generic way.
struct Input<'a, 'de> {
    bytes: &'de [u8],
    max_bytes: usize,
    human_readable: bool,
    gave_up: &'a Cell<bool>,
}

impl<'de> Input<'_, 'de> {
    /// Gives up: the error to return.
    fn give_up<T>(&self) -> Result<T, GaveUp> {
        self.gave_up.set(true);
        Err(GaveUp)
    }

    /// Marks an error that passes through (from a visitor or a nested read) as giving up.
    fn check<T>(&self, result: Result<T, GaveUp>) -> Result<T, GaveUp> {
        if result.is_err() {
            self.gave_up.set(true);
        }
        result
    }

    fn take(&mut self, n: usize) -> Result<&'de [u8], GaveUp> {
        match self.bytes.split_at_checked(n) {
            Some((head, rest)) => {
                self.bytes = rest;
                Ok(head)
            }
            None => self.give_up(),
        }
    }

    /// A varint as `apache_avro` reads one: at most ten bytes, seven bits each, the bits
    /// past 64 dropped.
    fn varint(&mut self) -> Result<u64, GaveUp> {
        let mut n = 0u64;
        for (j, &byte) in self.bytes.iter().enumerate().take(10) {
            n |= u64::from(byte & 0x7F) << (j * 7);
            if byte & 0x80 == 0 {
                self.bytes = &self.bytes[j + 1..];
                return Ok(n);
            }
        }
        self.give_up()
    }

    fn long(&mut self) -> Result<i64, GaveUp> {
        let z = self.varint()?;
        Ok(if z & 1 == 0 {
            (z >> 1) as i64
        } else {
            !(z >> 1) as i64
        })
    }

    fn int(&mut self) -> Result<i32, GaveUp> {
        let long = self.long()?;
        match i32::try_from(long) {
            Ok(int) => Ok(int),
            Err(_) => self.give_up(),
        }
    }

    fn boolean(&mut self) -> Result<bool, GaveUp> {
        match self.take(1)? {
            [0] => Ok(false),
            [1] => Ok(true),
            _ => self.give_up(),
        }
    }

    fn float(&mut self) -> Result<f32, GaveUp> {
        let mut le = [0; 4];
        le.copy_from_slice(self.take(4)?);
        Ok(f32::from_le_bytes(le))
    }

    fn double(&mut self) -> Result<f64, GaveUp> {
        let mut le = [0; 8];
        le.copy_from_slice(self.take(8)?);
        Ok(f64::from_le_bytes(le))
    }

    /// Bytes: a length (not negative, within the limit), then that many bytes.
    fn bytes(&mut self) -> Result<&'de [u8], GaveUp> {
        let len = self.long()?;
        match usize::try_from(len) {
            Ok(len) if len <= self.max_bytes => self.take(len),
            _ => self.give_up(),
        }
    }

    fn string(&mut self) -> Result<&'de str, GaveUp> {
        let bytes = self.bytes()?;
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(text),
            Err(_) => self.give_up(),
        }
    }

    /// A union's branch.
    fn branch<'n>(&mut self, variants: &'n [Node]) -> Result<&'n Node, GaveUp> {
        let index = self.long()?;
        match usize::try_from(index).ok().and_then(|i| variants.get(i)) {
            Some(node) => Ok(node),
            None => self.give_up(),
        }
    }

    /// An enum's symbol.
    fn symbol<'n>(&mut self, symbols: &'n [String]) -> Result<&'n str, GaveUp> {
        let index = self.int()?;
        match usize::try_from(index).ok().and_then(|i| symbols.get(i)) {
            Some(symbol) => Ok(symbol),
            None => self.give_up(),
        }
    }
}

/// One value of `node` in the input.
struct De<'a, 'b, 'de> {
    node: &'de Node,
    input: &'a mut Input<'b, 'de>,
}

impl<'a, 'b, 'de> De<'a, 'b, 'de> {
    fn at(node: &'de Node, input: &'a mut Input<'b, 'de>) -> Self {
        De { node, input }
    }

    /// The value as `from_value`'s `deserialize_any` presents it.
    fn any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        if let Node::Union(_) = self.node {
            return self.unwrap()?.any(visitor);
        }
        let input = self.input;
        match self.node {
            Node::Null => visitor.visit_unit(),
            Node::Boolean => visitor.visit_bool(input.boolean()?),
            Node::Int => visitor.visit_i32(input.int()?),
            Node::Long => visitor.visit_i64(input.long()?),
            Node::Float => visitor.visit_f32(input.float()?),
            Node::Double => visitor.visit_f64(input.double()?),
            Node::Bytes => visitor.visit_bytes(input.bytes()?),
            Node::String => visitor.visit_borrowed_str(input.string()?),
            Node::Enum(symbols) => visitor.visit_borrowed_str(input.symbol(symbols)?),
            Node::Record(fields) => record(fields, input, visitor),
            Node::Array(item) => array(item, true, input, visitor),
            // Read as its branch above (a branch is never a union: `Node::of`).
            Node::Union(_) => input.give_up(),
        }
    }

    /// The union's branch, where the value is a union: `from_value` reads a union's value
    /// with the same method for most methods (Avro has no union directly in a union).
    fn unwrap(self) -> Result<Self, GaveUp> {
        match self.node {
            Node::Union(variants) => {
                let node = self.input.branch(variants)?;
                Ok(De::at(node, self.input))
            }
            _ => Ok(self),
        }
    }
}

/// Runs a `Deserializer` method's body and marks its error, if any, as giving up.
macro_rules! checked {
    ($self:ident, $body:expr) => {{
        let gave_up = $self.input.gave_up;
        let result = $body;
        if result.is_err() {
            gave_up.set(true);
        }
        result
    }};
}

impl<'de> de::Deserializer<'de> for De<'_, '_, 'de> {
    type Error = GaveUp;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(self, self.any(visitor))
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 u8 u16 u32 f32 f64
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(self, {
            let de = self.unwrap()?;
            let n = match de.node {
                Node::Int => u64::try_from(de.input.int()?).ok(),
                Node::Long => u64::try_from(de.input.long()?).ok(),
                _ => None,
            };
            match n {
                Some(n) => visitor.visit_u64(n),
                None => de.input.give_up(),
            }
        })
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(self, {
            let de = self.unwrap()?;
            let text = match de.node {
                Node::String => Some(de.input.string()?),
                Node::Bytes => std::str::from_utf8(de.input.bytes()?).ok(),
                _ => None,
            };
            let mut chars = text.map(str::chars);
            match chars.as_mut().map(|c| (c.next(), c.next())) {
                Some((Some(c), None)) => visitor.visit_char(c),
                _ => de.input.give_up(),
            }
        })
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(self, {
            let de = self.unwrap()?;
            match de.node {
                Node::String => visitor.visit_borrowed_str(de.input.string()?),
                Node::Bytes => match std::str::from_utf8(de.input.bytes()?) {
                    Ok(text) => visitor.visit_borrowed_str(text),
                    Err(_) => de.input.give_up(),
                },
                _ => de.input.give_up(),
            }
        })
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(self, {
            let de = self.unwrap()?;
            match de.node {
                Node::String => visitor.visit_borrowed_str(de.input.string()?),
                Node::Enum(symbols) => visitor.visit_borrowed_str(de.input.symbol(symbols)?),
                Node::Bytes => match String::from_utf8(de.input.bytes()?.to_vec()) {
                    Ok(text) => visitor.visit_string(text),
                    Err(_) => de.input.give_up(),
                },
                _ => de.input.give_up(),
            }
        })
    }

    /// `from_value` hands `bytes` over borrowed or not by a setting of its own: only a
    /// string is read here.
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(
            self,
            match self.node {
                Node::String => visitor.visit_bytes(self.input.string()?.as_bytes()),
                _ => self.input.give_up(),
            }
        )
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(
            self,
            match self.node {
                Node::String => visitor.visit_byte_buf(self.input.string()?.as_bytes().to_vec()),
                Node::Bytes => visitor.visit_byte_buf(self.input.bytes()?.to_vec()),
                _ => self.input.give_up(),
            }
        )
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(
            self,
            match self.node {
                Node::Union(variants) => match self.input.branch(variants)? {
                    Node::Null => visitor.visit_none(),
                    node => visitor.visit_some(De::at(node, self.input)),
                },
                _ => self.input.give_up(),
            }
        )
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(self, {
            let de = self.unwrap()?;
            match de.node {
                Node::Null => visitor.visit_unit(),
                _ => de.input.give_up(),
            }
        })
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, GaveUp> {
        de::Deserializer::deserialize_unit(self, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, GaveUp> {
        let gave_up = self.input.gave_up;
        let result = visitor.visit_newtype_struct(self);
        if result.is_err() {
            gave_up.set(true);
        }
        result
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(
            self,
            match self.node {
                Node::Array(item) => array(item, true, self.input, visitor),
                Node::Union(variants) => match self.input.branch(variants)? {
                    Node::Array(item) => array(item, true, self.input, visitor),
                    Node::Null => array(&Node::Null, false, self.input, visitor),
                    _ => self.input.give_up(),
                },
                _ => self.input.give_up(),
            }
        )
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, GaveUp> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, GaveUp> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        checked!(
            self,
            match self.node {
                Node::Record(fields) => record(fields, self.input, visitor),
                _ => self.input.give_up(),
            }
        )
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, GaveUp> {
        checked!(
            self,
            match self.node {
                Node::Record(fields) => record(fields, self.input, visitor),
                Node::Union(variants) => match self.input.branch(variants)? {
                    Node::Record(fields) => record(fields, self.input, visitor),
                    Node::Null => record(&[], self.input, visitor),
                    _ => self.input.give_up(),
                },
                _ => self.input.give_up(),
            }
        )
    }

    /// A unit variant named by a string or an enum's symbol; the other shapes `from_value`
    /// reads (a record, a union's branch) give up.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, GaveUp> {
        checked!(
            self,
            match self.node {
                Node::String => visitor.visit_enum(UnitVariant(self.input.string()?)),
                Node::Enum(symbols) => visitor.visit_enum(UnitVariant(self.input.symbol(symbols)?)),
                _ => self.input.give_up(),
            }
        )
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        de::Deserializer::deserialize_str(self, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        de::Deserializer::deserialize_any(self, visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.input.human_readable
    }

    /// Read the generic way (`from_value` converts with methods of its own).
    fn deserialize_u128<V: Visitor<'de>>(self, _: V) -> Result<V::Value, GaveUp> {
        self.input.give_up()
    }

    /// Read the generic way, as [`deserialize_u128`](Self::deserialize_u128).
    fn deserialize_i128<V: Visitor<'de>>(self, _: V) -> Result<V::Value, GaveUp> {
        self.input.give_up()
    }
}

/// A record's fields as a map, each name then its value; fields the visitor leaves unread
/// are read (and checked) after it returns, so the input stays in step.
fn record<'de, V: Visitor<'de>>(
    fields: &'de [Field],
    input: &mut Input<'_, 'de>,
    visitor: V,
) -> Result<V::Value, GaveUp> {
    let mut access = Fields {
        fields,
        at: 0,
        unread: None,
        input,
    };
    let value = visitor.visit_map(&mut access);
    let value = access.input.check(value)?;
    access.finish()?;
    Ok(value)
}

struct Fields<'a, 'b, 'de> {
    fields: &'de [Field],
    at: usize,
    /// The field whose name was read and value not yet.
    unread: Option<&'de Field>,
    input: &'a mut Input<'b, 'de>,
}

impl<'de> Fields<'_, '_, 'de> {
    /// Reads `field`'s value with `seed`: from the input or, for a null default, from the
    /// encoding of the union's null (index 0).
    fn value<S: DeserializeSeed<'de>>(
        &mut self,
        field: &'de Field,
        seed: S,
    ) -> Result<S::Value, GaveUp> {
        if field.null_default {
            let mut default = Input {
                bytes: &[0],
                max_bytes: self.input.max_bytes,
                human_readable: self.input.human_readable,
                gave_up: self.input.gave_up,
            };
            seed.deserialize(De::at(&field.node, &mut default))
        } else {
            seed.deserialize(De::at(&field.node, self.input))
        }
    }

    fn skip(&mut self, field: &'de Field) -> Result<(), GaveUp> {
        self.value(field, PhantomData::<IgnoredAny>).map(drop)
    }

    fn skip_unread(&mut self) -> Result<(), GaveUp> {
        match self.unread.take() {
            Some(field) => self.skip(field),
            None => Ok(()),
        }
    }

    /// Reads the fields the visitor left.
    fn finish(&mut self) -> Result<(), GaveUp> {
        self.skip_unread()?;
        while let Some(field) = self.fields.get(self.at) {
            self.at += 1;
            self.skip(field)?;
        }
        Ok(())
    }
}

impl<'de> de::MapAccess<'de> for Fields<'_, '_, 'de> {
    type Error = GaveUp;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, GaveUp> {
        self.skip_unread()?;
        // The writer's fields the reader's schema lacks are read past.
        while let Some(field) = self.fields.get(self.at).filter(|f| f.dropped) {
            self.at += 1;
            self.skip(field)?;
        }
        let Some(field) = self.fields.get(self.at) else {
            return Ok(None);
        };
        self.at += 1;
        self.unread = Some(field);
        let key = seed.deserialize(Name(&field.name));
        self.input.check(key).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, GaveUp> {
        match self.unread.take() {
            Some(field) => self.value(field, seed),
            None => self.input.give_up(),
        }
    }
}

/// An array's items in blocks (a count, negative with a byte size after it, then the
/// items; a count of 0 ends), or, without `blocks`, no items (a union's null read as a
/// sequence); items the visitor leaves unread are read after it returns.
fn array<'de, V: Visitor<'de>>(
    item: &'de Node,
    blocks: bool,
    input: &mut Input<'_, 'de>,
    visitor: V,
) -> Result<V::Value, GaveUp> {
    let mut access = Items {
        item,
        left: 0,
        total: 0,
        done: !blocks,
        input,
    };
    let value = visitor.visit_seq(&mut access);
    let value = access.input.check(value)?;
    while access.next()? {
        IgnoredAny::deserialize(De::at(item, access.input))?;
    }
    Ok(value)
}

struct Items<'a, 'b, 'de> {
    item: &'de Node,
    /// Items left in the current block.
    left: usize,
    /// Items in the blocks read so far (bounded as `apache_avro` bounds them).
    total: usize,
    done: bool,
    input: &'a mut Input<'b, 'de>,
}

impl Items<'_, '_, '_> {
    /// Whether an item follows; reads a block's header when one is due.
    fn next(&mut self) -> Result<bool, GaveUp> {
        if self.left == 0 && !self.done {
            {
                let count = self.input.long()?;
                let count = match count {
                    0 => {
                        self.done = true;
                        0
                    }
                    n if n < 0 => {
                        self.input.long()?;
                        n.checked_neg().unwrap_or(-1)
                    }
                    n => n,
                };
                let Ok(count) = usize::try_from(count) else {
                    return self.input.give_up();
                };
                let value_size = std::mem::size_of::<apache_avro::types::Value>();
                let total = self.total.checked_add(count);
                match total.and_then(|t| t.checked_mul(value_size)) {
                    Some(bytes)
                        if count <= self.input.max_bytes && bytes <= self.input.max_bytes =>
                    {
                        self.total += count;
                        self.left = count;
                    }
                    _ => return self.input.give_up(),
                }
            }
        }
        if self.left == 0 {
            return Ok(false);
        }
        self.left -= 1;
        Ok(true)
    }
}

impl<'de> de::SeqAccess<'de> for Items<'_, '_, 'de> {
    type Error = GaveUp;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, GaveUp> {
        if !self.next()? {
            return Ok(None);
        }
        seed.deserialize(De::at(self.item, self.input)).map(Some)
    }
}

/// A field's name, as `from_value` presents it: a string for every method.
struct Name<'de>(&'de str);

impl<'de> de::Deserializer<'de> for Name<'de> {
    type Error = GaveUp;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GaveUp> {
        visitor.visit_str(self.0)
    }

    forward_to_deserialize_any! {
        bool u8 u16 u32 u64 i8 i16 i32 i64 f32 f64 char str string unit option
        seq bytes byte_buf map unit_struct newtype_struct
        tuple_struct struct tuple enum identifier ignored_any u128 i128
    }
}

/// A unit variant by name, as `from_value` reads a string or an enum's symbol.
struct UnitVariant<'de>(&'de str);

impl<'de> de::EnumAccess<'de> for UnitVariant<'de> {
    type Error = GaveUp;
    type Variant = Self;

    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self), GaveUp> {
        Ok((seed.deserialize(Name(self.0))?, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant<'de> {
    type Error = GaveUp;

    fn unit_variant(self) -> Result<(), GaveUp> {
        Ok(())
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, _: S) -> Result<S::Value, GaveUp> {
        Err(GaveUp)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, GaveUp> {
        Err(GaveUp)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, GaveUp> {
        Err(GaveUp)
    }
}

mod write;
pub(super) use write::write;

#[cfg(test)]
mod tests;
