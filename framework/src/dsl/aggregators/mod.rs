//! Built-in aggregations: top-K and distinct count, per key or per key and window.
//!
//! | aggregation | table value | exact? | state per item |
//! |---|---|---|---|
//! | [`top_k`](KGroupedStream::top_k) | `Vec<(M, S)>`: the `k` members with the highest score, best first | yes | `k` members and scores |
//! | [`top_k_frequent`](KGroupedStream::top_k_frequent) | `Vec<(M, u64)>`: the `k` most frequent members, most frequent first | while the distinct members fit the capacity `c`; then each count is at most `N / c` too high | `c` members with two counters (default `c = 10 k`) |
//! | [`distinct_count`](KGroupedStream::distinct_count) | `u64` | up to [`EXACT_DISTINCT_LIMIT`] distinct members; then a HyperLogLog sketch, standard error 0.81% | at most 16 KiB |
//!
//! All three are built on the general aggregate ([`KGroupedStream::aggregate`],
//! [`TimeWindowedKStream::aggregate`]), so everything that holds for it holds for them:
//! an exactly-once effect through the per-partition watermarks (a redelivered or retried
//! record is never folded twice), one version-conditioned write per touched item per
//! batch, windows with grace, late records dropped and counted, emit on window close,
//! and DynamoDB's 400 KB item limit enforced before the write (the record that would pass
//! it is a poison record, named with the store and key). Records whose member
//! serializes to null are ignored.
//!
//! # Members and the stable hash
//!
//! Members are identified by their bytes under the member serde (`member_serde`): two
//! members are the same member when their bytes are equal, ties between equal scores or
//! counts are broken by these bytes (lexicographically smaller first), and
//! [`distinct_count`](KGroupedStream::distinct_count) hashes them with [`member_hash`]:
//! XXH64 with seed 0, a published, fixed function, so that a state written by one
//! process or release is read the same by every other. (Never std's `DefaultHasher`:
//! its output may change between releases, and `RandomState` between processes.)
//!
//! # State format (version 1)
//!
//! Every state starts with the format version byte (`1`) and a kind byte (`T` top-K,
//! `S` Space-Saving, `D` distinct count); a state of another version or kind does not
//! decode (the batch fails, naming the store and key) rather than being misread. Integers
//! are big-endian; a member is its length (`u32`) and its bytes.
//!
//! - `T`: `u32` n, then n × (member, score as 8 bytes: `i64`/`u64` big-endian, `f64`
//!   IEEE-754 bits big-endian), best first.
//! - `S`: `u64` N (records counted), `u32` n, then n × (member, `u64` count, `u64` error).
//! - `D`: a mode byte; `0` exact: `u32` n, then the n distinct member hashes (`u64`),
//!   ascending; `1` sketch: the precision `p` (14), then the 2^p registers, one byte each.

use std::cmp::Ordering;
use std::marker::PhantomData;
use std::sync::Arc;

use super::{KGroupedStream, KTable, TimeWindowedKStream, Windowed};
use crate::serdes::{Serde, SerdeError};

/// The format version byte that starts every state of this module.
const FORMAT_VERSION: u8 = 1;
const KIND_TOP_K: u8 = b'T';
const KIND_SPACE_SAVING: u8 = b'S';
const KIND_DISTINCT: u8 = b'D';

/// [`top_k_frequent`](KGroupedStream::top_k_frequent)'s default capacity, per `k`: it
/// monitors `10 k` members.
pub const DEFAULT_CAPACITY_FACTOR: usize = 10;

/// Up to this many distinct members, [`distinct_count`](KGroupedStream::distinct_count)
/// keeps the set of their hashes and is exact (2,048 hashes of 8 bytes: 16 KiB, the size
/// of the sketch). Past it, it switches to a HyperLogLog sketch of precision
/// [`HLL_PRECISION`].
pub const EXACT_DISTINCT_LIMIT: usize = 2048;

/// The HyperLogLog precision `p` of [`distinct_count`](KGroupedStream::distinct_count):
/// `2^14` registers (16 KiB), relative standard error `1.04 / sqrt(2^14)` ≈ 0.81%.
pub const HLL_PRECISION: u8 = 14;

/// The score of a [`top_k`](KGroupedStream::top_k) member: `i64`, `u64` or `f64`.
///
/// Scores are compared with a total order; for `f64` it is IEEE-754's `totalOrder`
/// (`f64::total_cmp`), and a NaN score is ignored (its record does not count).
pub trait Score: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Compares two scores (a total order).
    fn compare(&self, other: &Self) -> Ordering;
    /// Whether a record with this score takes part (false for NaN).
    fn is_valid(&self) -> bool {
        true
    }
    /// The score's 8 bytes in the state format.
    fn to_be_bytes(&self) -> [u8; 8];
    /// The score of 8 bytes of the state format.
    fn from_be_bytes(bytes: [u8; 8]) -> Self;
}

impl Score for i64 {
    fn compare(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
    fn to_be_bytes(&self) -> [u8; 8] {
        i64::to_be_bytes(*self)
    }
    fn from_be_bytes(bytes: [u8; 8]) -> Self {
        i64::from_be_bytes(bytes)
    }
}

impl Score for u64 {
    fn compare(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
    fn to_be_bytes(&self) -> [u8; 8] {
        u64::to_be_bytes(*self)
    }
    fn from_be_bytes(bytes: [u8; 8]) -> Self {
        u64::from_be_bytes(bytes)
    }
}

impl Score for f64 {
    fn compare(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
    fn is_valid(&self) -> bool {
        !self.is_nan()
    }
    fn to_be_bytes(&self) -> [u8; 8] {
        self.to_bits().to_be_bytes()
    }
    fn from_be_bytes(bytes: [u8; 8]) -> Self {
        f64::from_bits(u64::from_be_bytes(bytes))
    }
}

mod distinct;
mod dsl;
mod encoding;
mod hash;
mod space_saving;
mod top_k;

use distinct::*;
use encoding::*;
pub use hash::{member_hash, xxh64};
use space_saving::*;
use top_k::*;

#[cfg(test)]
mod tests;
