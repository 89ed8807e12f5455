//! The direct write: a serde value straight into Avro bytes, without the generic `Value`.
//!
//! [`super::super::Avro`] writes a value as `apache_avro` does: `to_value` (a `Value` tree),
//! the tree resolved against the schema (promotions, union branches, enum symbols), checked,
//! then encoded. This writes the bytes as the value is serialized, and gives up — the caller
//! then writes the generic way, which decides — wherever the generic way could choose
//! differently or fail: a record's fields out of the schema's order, missing (a default
//! would apply) or extra, a union without a branch of the value's exact kind (the generic
//! way then tries every branch), an `int` from a `long`, a map, `u64` and 128-bit integers,
//! bytes, enum variants with data, a sequence of unknown length, and any error at all.
//!
//! For the rest the rules are `to_value`'s and the resolution's: `bool`, the integers up to
//! 32 bits (and `u32` up to `i32::MAX`) are an `int`, `i64` (and larger `u32`) a `long`,
//! promoted to `long`, `float` and `double` as the schema says; `char`, strings and unit
//! variants a string or, for an enum, the symbol's index; `None` and `()` a null;
//! `Some(v)` is `v`; a union takes the branch of the value's kind; a record's fields are
//! written in the schema's order; an array in one block. The date, time and timestamp
//! logical types are written as the `int` or `long` under them ([`Node::of`]).

use serde::ser::{self, Serialize};

use super::{Field, Node};

/// Writes `value` as Avro of `node` to `out`; `false`, with `out` as it was, when the
/// direct write gives up. `human_readable` is what `apache_avro`'s serializer tells the
/// types that ask.
pub(in crate::serdes::schema::avro) fn write<T: Serialize + ?Sized>(
    node: &Node,
    value: &T,
    out: &mut Vec<u8>,
    human_readable: bool,
) -> bool {
    let start = out.len();
    let written = value
        .serialize(Enc {
            node,
            out,
            human_readable,
        })
        .is_ok();
    if !written {
        out.truncate(start);
    }
    written
}

/// The only error of the direct write: it gave up.
#[derive(Debug)]
pub(in crate::serdes::schema::avro) struct GaveUp;

impl std::fmt::Display for GaveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the direct Avro write gave up")
    }
}

impl std::error::Error for GaveUp {}

impl ser::Error for GaveUp {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        GaveUp
    }
}

/// The kind of value a serde call makes (`to_value`'s `Value` variant).
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    String,
    Array,
    Record,
}

/// Avro's zigzag varint.
fn long(n: i64, out: &mut Vec<u8>) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z > 0x7F {
        out.push((z as u8 & 0x7F) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn string(text: &str, out: &mut Vec<u8>) {
    long(text.len() as i64, out);
    out.extend_from_slice(text.as_bytes());
}

/// One value of `node`.
struct Enc<'a> {
    node: &'a Node,
    out: &'a mut Vec<u8>,
    human_readable: bool,
}

impl<'a> Enc<'a> {
    /// The node a value of `kind` is written as: for a union, the branch of exactly that
    /// kind (its index written first); the node itself otherwise.
    fn target(&mut self, kind: Kind) -> Result<&'a Node, GaveUp> {
        let Node::Union(variants) = self.node else {
            return Ok(self.node);
        };
        let mut branches = variants.iter().enumerate().filter(|(_, node)| {
            matches!(
                (kind, node),
                (Kind::Null, Node::Null)
                    | (Kind::Boolean, Node::Boolean)
                    | (Kind::Int, Node::Int)
                    | (Kind::Long, Node::Long)
                    | (Kind::Float, Node::Float)
                    | (Kind::Double, Node::Double)
                    | (Kind::String, Node::String)
                    | (Kind::Array, Node::Array(_))
                    | (Kind::Record, Node::Record(_))
            )
        });
        match (branches.next(), branches.next()) {
            (Some((index, node)), None) => {
                long(index as i64, self.out);
                Ok(node)
            }
            _ => Err(GaveUp),
        }
    }

    fn int(mut self, n: i32) -> Result<(), GaveUp> {
        match self.target(Kind::Int)? {
            Node::Int | Node::Long => long(i64::from(n), self.out),
            Node::Float => self.out.extend_from_slice(&(n as f32).to_le_bytes()),
            Node::Double => self.out.extend_from_slice(&f64::from(n).to_le_bytes()),
            _ => return Err(GaveUp),
        }
        Ok(())
    }

    fn long(mut self, n: i64) -> Result<(), GaveUp> {
        match self.target(Kind::Long)? {
            Node::Long => long(n, self.out),
            Node::Float => self.out.extend_from_slice(&(n as f32).to_le_bytes()),
            Node::Double => self.out.extend_from_slice(&(n as f64).to_le_bytes()),
            _ => return Err(GaveUp),
        }
        Ok(())
    }

    fn null(mut self) -> Result<(), GaveUp> {
        match self.target(Kind::Null)? {
            Node::Null => Ok(()),
            _ => Err(GaveUp),
        }
    }

    fn text(mut self, text: &str) -> Result<(), GaveUp> {
        match self.target(Kind::String)? {
            Node::String => string(text, self.out),
            Node::Enum(symbols) => match symbols.iter().position(|s| s == text) {
                Some(index) => long(index as i64, self.out),
                None => return Err(GaveUp),
            },
            _ => return Err(GaveUp),
        }
        Ok(())
    }
}

impl<'a> ser::Serializer for Enc<'a> {
    type Ok = ();
    type Error = GaveUp;
    type SerializeSeq = Items<'a>;
    type SerializeTuple = Items<'a>;
    type SerializeTupleStruct = ser::Impossible<(), GaveUp>;
    type SerializeTupleVariant = ser::Impossible<(), GaveUp>;
    type SerializeMap = ser::Impossible<(), GaveUp>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = ser::Impossible<(), GaveUp>;

    fn serialize_bool(mut self, v: bool) -> Result<(), GaveUp> {
        match self.target(Kind::Boolean)? {
            Node::Boolean => {
                self.out.push(u8::from(v));
                Ok(())
            }
            _ => Err(GaveUp),
        }
    }

    fn serialize_i8(self, v: i8) -> Result<(), GaveUp> {
        self.int(i32::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<(), GaveUp> {
        self.int(i32::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<(), GaveUp> {
        self.int(v)
    }

    fn serialize_i64(self, v: i64) -> Result<(), GaveUp> {
        self.long(v)
    }

    fn serialize_u8(self, v: u8) -> Result<(), GaveUp> {
        self.int(i32::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<(), GaveUp> {
        self.int(i32::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<(), GaveUp> {
        match i32::try_from(v) {
            Ok(v) => self.int(v),
            Err(_) => self.long(i64::from(v)),
        }
    }

    /// `to_value` makes a `fixed` of it: written the generic way.
    fn serialize_u64(self, _: u64) -> Result<(), GaveUp> {
        Err(GaveUp)
    }

    fn serialize_f32(mut self, v: f32) -> Result<(), GaveUp> {
        match self.target(Kind::Float)? {
            Node::Float => self.out.extend_from_slice(&v.to_le_bytes()),
            Node::Double => self.out.extend_from_slice(&f64::from(v).to_le_bytes()),
            _ => return Err(GaveUp),
        }
        Ok(())
    }

    fn serialize_f64(mut self, v: f64) -> Result<(), GaveUp> {
        match self.target(Kind::Double)? {
            Node::Double => self.out.extend_from_slice(&v.to_le_bytes()),
            Node::Float => self.out.extend_from_slice(&(v as f32).to_le_bytes()),
            _ => return Err(GaveUp),
        }
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), GaveUp> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Result<(), GaveUp> {
        self.text(v)
    }

    /// Bytes, `fixed` or `bytes` by a setting of `apache_avro`'s own: written the generic way.
    fn serialize_bytes(self, _: &[u8]) -> Result<(), GaveUp> {
        Err(GaveUp)
    }

    fn serialize_none(self) -> Result<(), GaveUp> {
        self.null()
    }

    /// `to_value` wraps the value in a union that the resolution unwraps: the value itself
    /// (an option of an option is a union in a union: written the generic way).
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), GaveUp> {
        value.serialize(Inner(self))
    }

    fn serialize_unit(self) -> Result<(), GaveUp> {
        self.null()
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), GaveUp> {
        self.null()
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), GaveUp> {
        self.text(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), GaveUp> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), GaveUp> {
        Err(GaveUp)
    }

    /// One block of the known length, then the end (`0`); an empty array is the end alone.
    fn serialize_seq(mut self, len: Option<usize>) -> Result<Items<'a>, GaveUp> {
        let len = len.ok_or(GaveUp)?;
        let Node::Array(item) = self.target(Kind::Array)? else {
            return Err(GaveUp);
        };
        if len > 0 {
            long(len as i64, self.out);
        }
        Ok(Items {
            item,
            left: len,
            out: self.out,
            human_readable: self.human_readable,
        })
    }

    fn serialize_tuple(self, len: usize) -> Result<Items<'a>, GaveUp> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, GaveUp> {
        Err(GaveUp)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, GaveUp> {
        Err(GaveUp)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, GaveUp> {
        Err(GaveUp)
    }

    fn serialize_struct(mut self, _: &'static str, _: usize) -> Result<Fields<'a>, GaveUp> {
        let Node::Record(fields) = self.target(Kind::Record)? else {
            return Err(GaveUp);
        };
        Ok(Fields {
            fields,
            at: 0,
            out: self.out,
            human_readable: self.human_readable,
        })
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, GaveUp> {
        Err(GaveUp)
    }

    fn is_human_readable(&self) -> bool {
        self.human_readable
    }
}

/// The value inside `Some`: any value but another option.
struct Inner<'a>(Enc<'a>);

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(fn $method(self, $($arg: $ty),*) -> Result<$ret, GaveUp> {
            ser::Serializer::$method(self.0, $($arg),*)
        })*
    };
}

impl<'a> ser::Serializer for Inner<'a> {
    type Ok = ();
    type Error = GaveUp;
    type SerializeSeq = Items<'a>;
    type SerializeTuple = Items<'a>;
    type SerializeTupleStruct = ser::Impossible<(), GaveUp>;
    type SerializeTupleVariant = ser::Impossible<(), GaveUp>;
    type SerializeMap = ser::Impossible<(), GaveUp>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = ser::Impossible<(), GaveUp>;

    forward! {
        serialize_bool(v: bool) -> ();
        serialize_i8(v: i8) -> ();
        serialize_i16(v: i16) -> ();
        serialize_i32(v: i32) -> ();
        serialize_i64(v: i64) -> ();
        serialize_u8(v: u8) -> ();
        serialize_u16(v: u16) -> ();
        serialize_u32(v: u32) -> ();
        serialize_u64(v: u64) -> ();
        serialize_f32(v: f32) -> ();
        serialize_f64(v: f64) -> ();
        serialize_char(v: char) -> ();
        serialize_str(v: &str) -> ();
        serialize_bytes(v: &[u8]) -> ();
        serialize_unit() -> ();
        serialize_unit_struct(name: &'static str) -> ();
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str) -> ();
        serialize_seq(len: Option<usize>) -> Items<'a>;
        serialize_tuple(len: usize) -> Items<'a>;
        serialize_tuple_struct(name: &'static str, len: usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(name: &'static str, index: u32, variant: &'static str, len: usize) -> Self::SerializeTupleVariant;
        serialize_map(len: Option<usize>) -> Self::SerializeMap;
        serialize_struct(name: &'static str, len: usize) -> Fields<'a>;
        serialize_struct_variant(name: &'static str, index: u32, variant: &'static str, len: usize) -> Self::SerializeStructVariant;
    }

    fn serialize_none(self) -> Result<(), GaveUp> {
        Err(GaveUp)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), GaveUp> {
        Err(GaveUp)
    }

    /// Still inside the option: the newtype's value may not be an option either.
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), GaveUp> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), GaveUp> {
        Err(GaveUp)
    }

    fn is_human_readable(&self) -> bool {
        self.0.human_readable
    }
}

/// An array's items: exactly as many as announced, then the end.
pub(in crate::serdes::schema::avro) struct Items<'a> {
    item: &'a Node,
    left: usize,
    out: &'a mut Vec<u8>,
    human_readable: bool,
}

impl Items<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GaveUp> {
        self.left = self.left.checked_sub(1).ok_or(GaveUp)?;
        value.serialize(Enc {
            node: self.item,
            out: self.out,
            human_readable: self.human_readable,
        })
    }

    fn finish(self) -> Result<(), GaveUp> {
        if self.left != 0 {
            return Err(GaveUp);
        }
        self.out.push(0);
        Ok(())
    }
}

impl ser::SerializeSeq for Items<'_> {
    type Ok = ();
    type Error = GaveUp;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GaveUp> {
        self.element(value)
    }

    fn end(self) -> Result<(), GaveUp> {
        self.finish()
    }
}

impl ser::SerializeTuple for Items<'_> {
    type Ok = ();
    type Error = GaveUp;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GaveUp> {
        self.element(value)
    }

    fn end(self) -> Result<(), GaveUp> {
        self.finish()
    }
}

/// A record's fields, each the next of the schema's.
pub(in crate::serdes::schema::avro) struct Fields<'a> {
    fields: &'a [Field],
    at: usize,
    out: &'a mut Vec<u8>,
    human_readable: bool,
}

impl ser::SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = GaveUp;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), GaveUp> {
        match self.fields.get(self.at) {
            Some(field) if field.name == key && !field.dropped && !field.null_default => {
                self.at += 1;
                value.serialize(Enc {
                    node: &field.node,
                    out: self.out,
                    human_readable: self.human_readable,
                })
            }
            _ => Err(GaveUp),
        }
    }

    fn end(self) -> Result<(), GaveUp> {
        if self.at == self.fields.len() {
            Ok(())
        } else {
            Err(GaveUp)
        }
    }
}
