//! [`Json`]: JSON values read with `sonic-rs` where it reads exactly as `serde_json` does, and
//! with `serde_json` everywhere else; [`from_slice`]: the same reading, into types that borrow
//! their text from the bytes.
//!
//! `serde_json` is the reference: every value `Json<T>` returns is the value `serde_json` returns
//! for the same bytes, and every error is `serde_json`'s. `sonic-rs` (SIMD) reads the same bytes
//! through the same `Deserialize` implementation with about 1.4x fewer instructions, and agrees
//! with `serde_json` except in four places, measured against it on generated inputs
//! (BENCHMARKS.md section 1, "`Json<T>`: the same values as serde_json"):
//!
//! 1. **Floats with more digits than an `f64` holds.** `serde_json` without its
//!    `float_roundtrip` feature rounds such numbers within a unit in the last place, not
//!    correctly (15% of random 1–25 digit numbers differed); `sonic-rs` rounds correctly. The
//!    workspace turns `float_roundtrip` on, which makes `serde_json` round correctly too (as
//!    Rust's `str::parse` and Java's `Double.parseDouble`, hence Kafka Streams' Jackson, do):
//!    both then agree on every number tried.
//! 2. **Negative zero.** `sonic-rs` reads `-0`, `-0.0`, `-0e5` as `+0.0`; `serde_json` as
//!    `-0.0`.
//! 3. **Nesting.** `serde_json` refuses a value nested 128 deep ("recursion limit exceeded");
//!    `sonic-rs` has no limit.
//! 4. **`\u` escapes in skipped values.** `sonic-rs` does not check the four hex digits of a
//!    `\u` escape inside a value it skips (a field `T` does not have): `"\u00eo"` is accepted.
//!
//! One pass over the bytes (`scan`) finds any value where 2–4 could arise (a `-0` that can
//! start a number, 127 or more `[`/`{`, a backslash followed by a bad `\u` escape); such a value
//! goes straight to `serde_json`. So does any value `sonic-rs` refuses, whose error is then
//! `serde_json`'s own. The rest (the common case) is `sonic-rs`'s.

use std::fmt;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Serde, SerdeError, non_null};

/// JSON, for any type that derives `Serialize` and `Deserialize`.
///
/// Values are read with `sonic-rs` (SIMD; 1.4x fewer instructions than `serde_json` into a
/// struct of ten fields, BENCHMARKS.md section 1) through the type's own `Deserialize`, so the
/// same derive decides both, and `serde_json` stays the reference: a value on which the two
/// could differ (negative zero, nesting 127 deep or more, a bad `\u` escape: the
/// [module docs](self) say why), and any value `sonic-rs` refuses, is read by
/// `serde_json`, whose result (a value, or its error) is the answer. So `Json<T>` returns what
/// `serde_json::from_slice` returns, value for value and error for error, with the
/// workspace's `serde_json` features (`float_roundtrip`: floats correctly rounded). Values
/// are written with `serde_json`.
///
/// `sonic-rs` picks its SIMD code at compile time: `cargo lambda build` compiles for
/// `-C target-cpu=haswell` (AVX2, PCLMULQDQ, which every x86_64 Lambda host has), a plain
/// `cargo build` for the generic x86-64 (SSE2) code; both give the same results.
///
/// A value that is not valid JSON for `T` is a [`SerdeError`] with `serde_json`'s message
/// (line and column included); the framework adds the record's topic-partition and offset.
///
/// ```
/// use lambda_streams::serdes::{Json, Serde};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// struct PageView { page: String, user: u64 }
///
/// let serde = Json::<PageView>::new();
/// let view = PageView { page: "/home".into(), user: 7 };
/// let bytes = serde.serialize(&view).unwrap();
/// assert_eq!(bytes, br#"{"page":"/home","user":7}"#);
/// assert_eq!(serde.deserialize(Some(&bytes)), Ok(view));
/// let err = serde.deserialize(Some(br#"{"page":"/home"}"#)).unwrap_err();
/// assert_eq!(err.to_string(), "invalid JSON: missing field `user` at line 1 column 16");
/// ```
pub struct Json<T>(PhantomData<fn() -> T>);

impl<T> Json<T> {
    /// The JSON serde of `T`.
    pub fn new() -> Self {
        Json(PhantomData)
    }
}

impl<T> Default for Json<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for Json<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Json<T> {}

impl<T> fmt::Debug for Json<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Json<{}>", std::any::type_name::<T>())
    }
}

impl<T: Serialize + DeserializeOwned + 'static> Serde<T> for Json<T> {
    /// Encodes `value`; `None` only if `serde_json` cannot encode it (a map with
    /// non-string keys, or a failing `Serialize` implementation): the sinks call
    /// [`try_serialize`](Serde::try_serialize), which reports that as an error.
    fn serialize(&self, value: &T) -> Option<Vec<u8>> {
        serde_json::to_vec(value).ok()
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<T, SerdeError> {
        from_slice(non_null(data, "Json")?)
    }
    fn try_serialize(&self, value: &T) -> Result<Option<Vec<u8>>, SerdeError> {
        serde_json::to_vec(value)
            .map(Some)
            .map_err(|e| SerdeError(format!("cannot encode as JSON: {e}")))
    }
}

/// Reads `bytes` as JSON into a `T` that may borrow from them: what [`Json<T>`] reads, for
/// types with `&'a str` or `#[serde(borrow)] Cow<'a, str>` fields, which keep their text
/// as views of `bytes` instead of allocating a `String` per field.
///
/// The same arbitration as [`Json<T>`]: `sonic-rs` where it reads exactly as `serde_json`
/// does, `serde_json` elsewhere, so the value or the error is `serde_json::from_slice`'s. A
/// `&'a str` field cannot hold a string with an escape (`\n`, `\u00e9`): both libraries
/// refuse it ("expected a borrowed string"); a `Cow<'a, str>` field takes it as an owned
/// string. Pair it with [`ReadWith`](super::ReadWith) to read a record's value through a
/// borrowed view and keep only what the topology needs:
///
/// ```
/// use std::borrow::Cow;
/// use lambda_streams::serdes::{json, Nullable, ReadWith, Serde, Utf8};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct View<'a> {
///     #[serde(borrow)]
///     url: Cow<'a, str>,
///     #[serde(rename = "durationMs")]
///     duration_ms: u32,
/// }
///
/// // The URL of an engaged view, `None` for the others: one `String` per engaged record,
/// // none for the fields the topology does not keep.
/// let engaged = ReadWith::new(
///     |bytes: &[u8]| {
///         let view: View<'_> = json::from_slice(bytes)?;
///         Ok((view.duration_ms >= 30_000).then(|| view.url.into_owned()))
///     },
///     Nullable(Utf8),
/// );
/// let value = br#"{"url":"/cart","durationMs":41000,"device":"mobile"}"#;
/// assert_eq!(engaged.deserialize(Some(value)), Ok(Some("/cart".to_owned())));
/// let err = engaged.deserialize(Some(br#"{"url":"/cart"}"#)).unwrap_err();
/// assert_eq!(err.to_string(), "invalid JSON: missing field `durationMs` at line 1 column 15");
/// ```
pub fn from_slice<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, SerdeError> {
    if sonic_rs_reads_as_serde_json(bytes)
        && let Ok(value) = sonic_rs::from_slice(bytes)
    {
        return Ok(value);
    }
    // The reference: its value, or its error's wording.
    serde_json::from_slice(bytes).map_err(|e| SerdeError(format!("invalid JSON: {e}")))
}

/// `[` and `{` from which a value may be nested deeply enough for `serde_json`'s recursion
/// limit (it refuses 128 levels; one less, to stay clear of an off-by-one).
const DEEP: usize = 127;

/// Whether `sonic-rs` reads `json` as `serde_json` does, as far as [`scan`] can tell: `false`
/// sends the value to `serde_json` (always correct, only slower).
fn sonic_rs_reads_as_serde_json(json: &[u8]) -> bool {
    let found = scan(json);
    !(found.minus_zero && may_hold_negative_zero(json)
        || found.backslash && may_hold_bad_unicode_escape(json)
        || found.opens >= DEEP && nesting_reaches(json, DEEP))
}

/// What one pass over a value found: the cheap signs of the places where `sonic-rs` and
/// `serde_json` differ (see the module docs), each checked exactly only when present.
#[derive(Debug, Default, PartialEq)]
struct Scan {
    /// How many `[` and `{` (strings included).
    opens: usize,
    /// Whether a `\` occurs.
    backslash: bool,
    /// Whether `-0` occurs.
    minus_zero: bool,
}

/// Bytes per step of [`scan`]: a block the compiler turns into SIMD compares (one AVX2
/// register, or two SSE2 ones).
const LANES: usize = 32;

/// One pass over `json`, [`LANES`] bytes a step (the tail copied into a zeroed block).
fn scan(json: &[u8]) -> Scan {
    let mut lanes = Lanes::default();
    let mut at = 0;
    while let (Some(here), Some(next)) = (
        json[at..].first_chunk::<LANES>(),
        json.get(at + 1..).and_then(<[u8]>::first_chunk::<LANES>),
    ) {
        lanes.add(here, next);
        at += LANES;
    }
    // At most LANES bytes are left (the loop stops when LANES + 1 are not).
    let mut tail = [0; LANES + 1];
    tail[..json.len() - at].copy_from_slice(&json[at..]);
    if let (Some(here), Some(next)) = (tail.first_chunk::<LANES>(), tail[1..].first_chunk()) {
        lanes.add(here, next);
    }
    lanes.finish()
}

/// [`scan`]'s counters, one per byte position of a block, summed only at the end (and every
/// 255 blocks, before a `u8` could overflow), so that a block is a few SIMD instructions.
#[derive(Default)]
struct Lanes {
    opens: [u8; LANES],
    /// Bit 0: a `\`; bit 1: a `-` followed by `0`.
    flags: [u8; LANES],
    blocks: u8,
    total_opens: usize,
}

impl Lanes {
    /// One block: `next` is `here` one byte on. Without branches, so that it vectorises.
    #[inline(always)]
    fn add(&mut self, here: &[u8; LANES], next: &[u8; LANES]) {
        for i in 0..LANES {
            self.opens[i] += u8::from(here[i] == b'[') | u8::from(here[i] == b'{');
            self.flags[i] |= u8::from(here[i] == b'\\')
                | (u8::from(here[i] == b'-') & u8::from(next[i] == b'0')) << 1;
        }
        self.blocks += 1;
        if self.blocks == u8::MAX {
            self.sum_opens();
        }
    }

    fn sum_opens(&mut self) {
        self.total_opens += self.opens.iter().map(|&n| usize::from(n)).sum::<usize>();
        self.opens = [0; LANES];
        self.blocks = 0;
    }

    fn finish(mut self) -> Scan {
        self.sum_opens();
        let flags = self
            .flags
            .as_chunks::<8>()
            .0
            .iter()
            .fold(0, |all, eight| all | u64::from_ne_bytes(*eight));
        Scan {
            opens: self.total_opens,
            backslash: flags & 0x0101_0101_0101_0101 != 0,
            minus_zero: flags & 0x0202_0202_0202_0202 != 0,
        }
    }
}

/// Whether a `-0` in `json` may start a number whose value is zero (`-0`, `-0.00`, `-0e7`,
/// `-0.0E-2`): `sonic-rs` reads those as `+0.0`. A number starts the value or follows `[`, `:`,
/// `,` or JSON whitespace; a `-0` elsewhere (`"2025-01-05"`, a UUID) cannot start one, and
/// `-0.5` is not zero. Anything else says yes: `serde_json` then decides.
fn may_hold_negative_zero(json: &[u8]) -> bool {
    memchr::memchr_iter(b'-', json).any(|at| {
        let starts_a_number = at == 0
            || matches!(
                json[at - 1],
                b'[' | b':' | b',' | b' ' | b'\t' | b'\n' | b'\r'
            );
        let rest = &json[at + 1..];
        starts_a_number
            && match rest {
                [b'0', b'.', fraction @ ..] => !fraction
                    .iter()
                    .find(|&&digit| digit != b'0')
                    .is_some_and(|&digit| matches!(digit, b'1'..=b'9')),
                [b'0', ..] => true,
                _ => false,
            }
    })
}

/// Whether `json` holds a `\u` not followed by four hex digits (`sonic-rs` does not check
/// them in a value it skips). An escaped backslash (`\\`) is stepped over, so `\\u` is not
/// taken for an escape.
fn may_hold_bad_unicode_escape(json: &[u8]) -> bool {
    let mut at = 0;
    while let Some(found) = json.get(at..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        let escape = at + found;
        if json.get(escape + 1) == Some(&b'u')
            && !json
                .get(escape + 2..escape + 6)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
        {
            return true;
        }
        at = escape + 2;
    }
    false
}

/// Whether `[`/`{` outside strings nest `depth` deep somewhere in `json` (a byte-wise walk,
/// run only when [`scan`] counted that many).
fn nesting_reaches(json: &[u8], depth: usize) -> bool {
    let (mut level, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in json {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    level += 1;
                    if level >= depth {
                        return true;
                    }
                }
                b']' | b'}' => level = level.saturating_sub(1),
                _ => {}
            }
        }
    }
    false
}

#[cfg(test)]
mod tests;
