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
//! and DynamoDB's 400 KB item limit enforced with a clear error. Records whose member
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

// --- The stable hash --------------------------------------------------------------

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn xxh_round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn xxh_merge(acc: u64, value: u64) -> u64 {
    (acc ^ xxh_round(0, value))
        .wrapping_mul(P1)
        .wrapping_add(P4)
}

fn read_u64_le(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(buf)
}

/// XXH64 of `data` with `seed` (Yann Collet's xxHash, 64-bit, as specified in
/// `xxhash_spec.md` of the xxHash project).
pub fn xxh64(data: &[u8], seed: u64) -> u64 {
    let len = data.len() as u64;
    let mut rest = data;
    let mut h = if rest.len() >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        while rest.len() >= 32 {
            for (i, lane) in v.iter_mut().enumerate() {
                *lane = xxh_round(*lane, read_u64_le(&rest[i * 8..]));
            }
            rest = &rest[32..];
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = xxh_merge(h, lane);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len);
    while rest.len() >= 8 {
        h ^= xxh_round(0, read_u64_le(rest));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        let mut buf = [0u8; 4];
        buf.copy_from_slice(&rest[..4]);
        h ^= u64::from(u32::from_le_bytes(buf)).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = &rest[4..];
    }
    for &byte in rest {
        h ^= u64::from(byte).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^= h >> 32;
    h
}

/// The hash [`distinct_count`](KGroupedStream::distinct_count) keeps of a member: XXH64
/// with seed 0 of the member's bytes under its serde. Fixed forever (state is persisted):
/// a change would need a new state format version.
///
/// ```
/// use lambda_streams::dsl::aggregators::member_hash;
///
/// // The reference values of XXH64 (seed 0).
/// assert_eq!(member_hash(b""), 0xEF46_DB37_51D8_E999);
/// assert_eq!(member_hash(b"abc"), 0x44BC_2CF5_AD77_0999);
/// ```
pub fn member_hash(bytes: &[u8]) -> u64 {
    xxh64(bytes, 0)
}

// --- Encoding ---------------------------------------------------------------------

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_member(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Reads a state: the header, then fields.
struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(data: Option<&'a [u8]>, kind: u8, what: &'static str) -> Result<Self, SerdeError> {
        let bytes = data.ok_or_else(|| SerdeError(format!("{what} state: null")))?;
        let mut reader = Reader { bytes, what };
        let version = reader.u8()?;
        if version != FORMAT_VERSION {
            return Err(SerdeError(format!(
                "{what} state: unknown format version {version} (this release reads {FORMAT_VERSION})"
            )));
        }
        let found = reader.u8()?;
        if found != kind {
            return Err(SerdeError(format!(
                "{what} state: kind {:?}, expected {:?} (another aggregation's state?)",
                char::from(found),
                char::from(kind)
            )));
        }
        Ok(reader)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], SerdeError> {
        if self.bytes.len() < n {
            return Err(SerdeError(format!("{} state: truncated", self.what)));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, SerdeError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<usize, SerdeError> {
        let mut buf = [0u8; 4];
        buf.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(buf) as usize)
    }

    fn bytes8(&mut self) -> Result<[u8; 8], SerdeError> {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(self.take(8)?);
        Ok(buf)
    }

    fn u64(&mut self) -> Result<u64, SerdeError> {
        Ok(u64::from_be_bytes(self.bytes8()?))
    }

    fn member<M: 'static>(&mut self, serde: &dyn Serde<M>) -> Result<(M, Vec<u8>), SerdeError> {
        let n = self.u32()?;
        let bytes = self.take(n)?.to_vec();
        let member = serde.deserialize(Some(&bytes)).map_err(|e| {
            SerdeError(format!(
                "{} state: a member does not decode: {e}",
                self.what
            ))
        })?;
        Ok((member, bytes))
    }

    fn finish(&self) -> Result<(), SerdeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(SerdeError(format!(
                "{} state: {} bytes after the end",
                self.what,
                self.bytes.len()
            )))
        }
    }
}

fn header(kind: u8) -> Vec<u8> {
    vec![FORMAT_VERSION, kind]
}

// --- Top-K by score (exact) ---------------------------------------------------------

/// A member with its bytes (identity and tie-break) and a score or count.
#[derive(Debug, Clone)]
struct Entry<M, S> {
    member: M,
    bytes: Vec<u8>,
    score: S,
}

/// Whether `(score, bytes)` ranks before `(other, other_bytes)`: a higher score first,
/// then the smaller bytes.
fn ranks_before<S: Score>(score: &S, bytes: &[u8], other: &S, other_bytes: &[u8]) -> bool {
    match score.compare(other) {
        Ordering::Greater => true,
        Ordering::Less => false,
        Ordering::Equal => bytes < other_bytes,
    }
}

/// The state of [`top_k`](KGroupedStream::top_k): at most `k` members, best first.
///
/// Exact with `k` entries: a member's score (the max over its records) only grows, so a
/// member that ranks below `k` others can only come back with a record whose score beats
/// the `k`-th, which is then its score.
#[derive(Debug, Clone)]
struct TopK<M, S> {
    entries: Vec<Entry<M, S>>,
}

impl<M, S: Score> TopK<M, S> {
    fn new() -> Self {
        TopK {
            entries: Vec::new(),
        }
    }

    fn offer(&mut self, member: M, bytes: Vec<u8>, score: S, k: usize) {
        if !score.is_valid() {
            return;
        }
        if let Some(i) = self.entries.iter().position(|e| e.bytes == bytes) {
            if score.compare(&self.entries[i].score) != Ordering::Greater {
                return;
            }
            self.entries.remove(i);
        } else if self.entries.len() >= k {
            match self.entries.get(k.saturating_sub(1)) {
                Some(last) if ranks_before(&score, &bytes, &last.score, &last.bytes) => {}
                _ => return,
            }
        }
        let at = self
            .entries
            .iter()
            .position(|e| ranks_before(&score, &bytes, &e.score, &e.bytes))
            .unwrap_or(self.entries.len());
        self.entries.insert(
            at,
            Entry {
                member,
                bytes,
                score,
            },
        );
        self.entries.truncate(k);
    }
}

struct TopKSerde<M, S> {
    member: Arc<dyn Serde<M>>,
    score: PhantomData<fn() -> S>,
}

impl<M: 'static, S: Score> Serde<TopK<M, S>> for TopKSerde<M, S> {
    fn serialize(&self, value: &TopK<M, S>) -> Option<Vec<u8>> {
        let mut out = header(KIND_TOP_K);
        put_u32(&mut out, value.entries.len());
        for e in &value.entries {
            put_member(&mut out, &e.bytes);
            out.extend_from_slice(&e.score.to_be_bytes());
        }
        Some(out)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<TopK<M, S>, SerdeError> {
        let mut r = Reader::new(data, KIND_TOP_K, "top-k")?;
        let n = r.u32()?;
        let mut entries = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let (member, bytes) = r.member(&*self.member)?;
            let score = S::from_be_bytes(r.bytes8()?);
            entries.push(Entry {
                member,
                bytes,
                score,
            });
        }
        r.finish()?;
        Ok(TopK { entries })
    }
}

// --- Top-K by frequency (Space-Saving) ----------------------------------------------

/// A monitored member of [`SpaceSaving`]: its count (an upper bound of its true
/// frequency) and the error (how much of the count may not be its own).
#[derive(Debug, Clone)]
struct Counter<M> {
    entry: Entry<M, u64>,
    error: u64,
}

/// The Space-Saving summary (Metwally, Agrawal, El Abbadi: "Efficient computation of
/// frequent and top-k elements in data streams", ICDT 2005) with `capacity` counters.
///
/// A monitored member's count `c` and error `e` bound its true frequency `f`:
/// `c - e <= f <= c`, and `e <= min count <= N / capacity` (N: records counted). Every
/// member with `f > N / capacity` is monitored. With at most `capacity` distinct members
/// nothing is ever evicted: every count is exact.
#[derive(Debug, Clone)]
struct SpaceSaving<M> {
    counters: Vec<Counter<M>>,
    total: u64,
}

impl<M> SpaceSaving<M> {
    fn new() -> Self {
        SpaceSaving {
            counters: Vec::new(),
            total: 0,
        }
    }

    fn offer(&mut self, member: M, bytes: Vec<u8>, capacity: usize) {
        self.total += 1;
        if let Some(c) = self.counters.iter_mut().find(|c| c.entry.bytes == bytes) {
            c.entry.score += 1;
            return;
        }
        let fresh = |score, error| Counter {
            entry: Entry {
                member,
                bytes,
                score,
            },
            error,
        };
        if self.counters.len() < capacity.max(1) {
            self.counters.push(fresh(1, 0));
            return;
        }
        // Evict the member with the smallest count (of those, the largest bytes: a
        // deterministic choice, so every process folds the same records to the same state).
        let min = self
            .counters
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| {
                a.entry
                    .score
                    .cmp(&b.entry.score)
                    .then_with(|| b.entry.bytes.cmp(&a.entry.bytes))
            })
            .map(|(i, _)| i);
        if let Some(i) = min {
            let floor = self.counters[i].entry.score;
            self.counters[i] = fresh(floor + 1, floor);
        }
    }

    /// The `k` members with the highest counts, highest first (ties: smaller bytes first).
    fn top(&self, k: usize) -> Vec<&Counter<M>> {
        let mut sorted: Vec<&Counter<M>> = self.counters.iter().collect();
        sorted.sort_by(|a, b| {
            b.entry
                .score
                .cmp(&a.entry.score)
                .then_with(|| a.entry.bytes.cmp(&b.entry.bytes))
        });
        sorted.truncate(k);
        sorted
    }
}

struct SpaceSavingSerde<M> {
    member: Arc<dyn Serde<M>>,
}

impl<M: 'static> Serde<SpaceSaving<M>> for SpaceSavingSerde<M> {
    fn serialize(&self, value: &SpaceSaving<M>) -> Option<Vec<u8>> {
        let mut out = header(KIND_SPACE_SAVING);
        out.extend_from_slice(&value.total.to_be_bytes());
        put_u32(&mut out, value.counters.len());
        for c in &value.counters {
            put_member(&mut out, &c.entry.bytes);
            out.extend_from_slice(&c.entry.score.to_be_bytes());
            out.extend_from_slice(&c.error.to_be_bytes());
        }
        Some(out)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<SpaceSaving<M>, SerdeError> {
        let mut r = Reader::new(data, KIND_SPACE_SAVING, "space-saving")?;
        let total = r.u64()?;
        let n = r.u32()?;
        let mut counters = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let (member, bytes) = r.member(&*self.member)?;
            let (score, error) = (r.u64()?, r.u64()?);
            counters.push(Counter {
                entry: Entry {
                    member,
                    bytes,
                    score,
                },
                error,
            });
        }
        r.finish()?;
        Ok(SpaceSaving { counters, total })
    }
}

// --- Distinct count (exact set, then HyperLogLog) -----------------------------------

/// A HyperLogLog sketch of `2^p` registers, with Ertl's improved raw estimator (O. Ertl,
/// "New cardinality estimation algorithms for HyperLogLog sketches", 2017, algorithm 6):
/// unbiased from 0 to beyond 10^9 without empirical bias tables, relative standard error
/// about `1.04 / sqrt(2^p)`.
///
/// A hash's top `p` bits choose the register; the register keeps the maximum over its
/// hashes of `1 +` the number of leading zeros of the remaining `q = 64 - p` bits
/// (`q + 1` when they are all zero).
#[derive(Debug, Clone, PartialEq, Eq)]
struct HyperLogLog {
    p: u8,
    registers: Vec<u8>,
}

impl HyperLogLog {
    fn new(p: u8) -> Self {
        HyperLogLog {
            p,
            registers: vec![0; 1 << p],
        }
    }

    fn insert(&mut self, hash: u64) {
        let p = u32::from(self.p);
        let index = (hash >> (64 - p)) as usize;
        let rest = hash << p;
        let q = 64 - p;
        let rank = if rest == 0 {
            q + 1
        } else {
            rest.leading_zeros() + 1
        };
        let rank = rank as u8;
        if self.registers[index] < rank {
            self.registers[index] = rank;
        }
    }

    fn estimate(&self) -> f64 {
        let m = self.registers.len() as f64;
        let q = 64 - usize::from(self.p);
        let mut histogram = vec![0u64; q + 2];
        for &r in &self.registers {
            histogram[usize::from(r).min(q + 1)] += 1;
        }
        let mut z = m * tau(1.0 - histogram[q + 1] as f64 / m);
        for k in (1..=q).rev() {
            z = 0.5 * (z + histogram[k] as f64);
        }
        z += m * sigma(histogram[0] as f64 / m);
        let alpha_inf = 0.5 / std::f64::consts::LN_2;
        alpha_inf * m * m / z
    }
}

/// Ertl's σ(x) = x + Σ_{k≥1} x^(2^k) 2^(k-1).
fn sigma(x: f64) -> f64 {
    if x >= 1.0 {
        return f64::INFINITY;
    }
    let (mut x, mut y, mut z) = (x, 1.0, x);
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if z == before {
            return z;
        }
    }
}

/// Ertl's τ(x) = (1 - x - Σ_{k≥1} (1 - x^(2^-k))^2 2^-k) / 3.
fn tau(x: f64) -> f64 {
    if x <= 0.0 || x >= 1.0 {
        return 0.0;
    }
    let (mut x, mut y, mut z) = (x, 1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == before {
            return z / 3.0;
        }
    }
}

/// The state of [`distinct_count`](KGroupedStream::distinct_count).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Distinct {
    /// The distinct member hashes, ascending: exact (up to 64-bit hash collisions:
    /// probability below `n^2 / 2^65`, under 1.2e-13 for n = 2,048).
    Exact(Vec<u64>),
    /// Past [`EXACT_DISTINCT_LIMIT`] members.
    Sketch(HyperLogLog),
}

impl Distinct {
    fn insert(&mut self, hash: u64, limit: usize, precision: u8) {
        match self {
            Distinct::Exact(set) => {
                if let Err(at) = set.binary_search(&hash) {
                    set.insert(at, hash);
                    if set.len() > limit {
                        let mut sketch = HyperLogLog::new(precision);
                        set.iter().for_each(|&h| sketch.insert(h));
                        *self = Distinct::Sketch(sketch);
                    }
                }
            }
            Distinct::Sketch(sketch) => sketch.insert(hash),
        }
    }

    fn count(&self) -> u64 {
        match self {
            Distinct::Exact(set) => set.len() as u64,
            Distinct::Sketch(sketch) => sketch.estimate().round() as u64,
        }
    }
}

struct DistinctSerde;

impl Serde<Distinct> for DistinctSerde {
    fn serialize(&self, value: &Distinct) -> Option<Vec<u8>> {
        let mut out = header(KIND_DISTINCT);
        match value {
            Distinct::Exact(set) => {
                out.push(0);
                put_u32(&mut out, set.len());
                for h in set {
                    out.extend_from_slice(&h.to_be_bytes());
                }
            }
            Distinct::Sketch(sketch) => {
                out.push(1);
                out.push(sketch.p);
                out.extend_from_slice(&sketch.registers);
            }
        }
        Some(out)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Distinct, SerdeError> {
        let mut r = Reader::new(data, KIND_DISTINCT, "distinct-count")?;
        let state = match r.u8()? {
            0 => {
                let n = r.u32()?;
                let mut set = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    set.push(r.u64()?);
                }
                if !set.is_sorted_by(|a, b| a < b) {
                    return Err(SerdeError(
                        "distinct-count state: hashes not ascending".to_owned(),
                    ));
                }
                Distinct::Exact(set)
            }
            1 => {
                let p = r.u8()?;
                if !(4..=18).contains(&p) {
                    return Err(SerdeError(format!(
                        "distinct-count state: precision {p} out of 4..=18"
                    )));
                }
                let registers = r.take(1 << p)?.to_vec();
                Distinct::Sketch(HyperLogLog { p, registers })
            }
            mode => {
                return Err(SerdeError(format!(
                    "distinct-count state: unknown mode {mode}"
                )));
            }
        };
        r.finish()?;
        Ok(state)
    }
}

// --- The DSL ------------------------------------------------------------------------

/// What the built-in aggregations are built on: a general aggregate, per key
/// ([`KGroupedStream`]) or per key and window ([`TimeWindowedKStream`]).
trait GeneralAggregate<K, V> {
    type TableKey: Clone + Send + Sync + 'static;

    fn general_aggregate<A: Clone + Send + Sync + 'static>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        serde: impl Serde<A>,
    ) -> KTable<Self::TableKey, A>;
}

impl<K, V> GeneralAggregate<K, V> for KGroupedStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    type TableKey = K;

    fn general_aggregate<A: Clone + Send + Sync + 'static>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        serde: impl Serde<A>,
    ) -> KTable<K, A> {
        self.aggregate(store, init, adder, serde)
    }
}

impl<K, V> GeneralAggregate<K, V> for TimeWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    type TableKey = Windowed<K>;

    fn general_aggregate<A: Clone + Send + Sync + 'static>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        serde: impl Serde<A>,
    ) -> KTable<Windowed<K>, A> {
        self.aggregate(store, init, adder, serde)
    }
}

fn top_k_on<T, K, V, M, S>(
    target: &T,
    store: &str,
    k: usize,
    member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
    score: impl Fn(&K, &V) -> S + Send + Sync + 'static,
    member_serde: impl Serde<M>,
) -> KTable<T::TableKey, Vec<(M, S)>>
where
    T: GeneralAggregate<K, V>,
    M: Clone + Send + Sync + 'static,
    S: Score,
{
    assert!(k >= 1, "top_k of store {store:?}: k must be at least 1");
    let member_serde: Arc<dyn Serde<M>> = Arc::new(member_serde);
    let serde = TopKSerde {
        member: Arc::clone(&member_serde),
        score: PhantomData,
    };
    target
        .general_aggregate(
            store,
            TopK::new,
            move |key, value, mut top: TopK<M, S>| {
                let m = member(key, &value);
                if let Some(bytes) = member_serde.serialize(&m) {
                    top.offer(m, bytes, score(key, &value), k);
                }
                top
            },
            serde,
        )
        .map_values(|top: &TopK<M, S>| {
            top.entries
                .iter()
                .map(|e| (e.member.clone(), e.score))
                .collect()
        })
}

fn top_k_frequent_on<T, K, V, M>(
    target: &T,
    store: &str,
    k: usize,
    capacity: usize,
    member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
    member_serde: impl Serde<M>,
) -> KTable<T::TableKey, Vec<(M, u64)>>
where
    T: GeneralAggregate<K, V>,
    M: Clone + Send + Sync + 'static,
{
    assert!(
        k >= 1 && capacity >= k,
        "top_k_frequent of store {store:?}: need 1 <= k <= capacity (k = {k}, capacity = {capacity})"
    );
    let member_serde: Arc<dyn Serde<M>> = Arc::new(member_serde);
    let serde = SpaceSavingSerde {
        member: Arc::clone(&member_serde),
    };
    target
        .general_aggregate(
            store,
            SpaceSaving::new,
            move |key, value, mut summary: SpaceSaving<M>| {
                let m = member(key, &value);
                if let Some(bytes) = member_serde.serialize(&m) {
                    summary.offer(m, bytes, capacity);
                }
                summary
            },
            serde,
        )
        .map_values(move |summary: &SpaceSaving<M>| {
            summary
                .top(k)
                .into_iter()
                .map(|c| (c.entry.member.clone(), c.entry.score))
                .collect()
        })
}

fn distinct_count_on<T, K, V, M>(
    target: &T,
    store: &str,
    member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
    member_serde: impl Serde<M>,
) -> KTable<T::TableKey, u64>
where
    T: GeneralAggregate<K, V>,
    M: Send + Sync + 'static,
{
    target
        .general_aggregate(
            store,
            || Distinct::Exact(Vec::new()),
            move |key, value, mut distinct: Distinct| {
                if let Some(bytes) = member_serde.serialize(&member(key, &value)) {
                    distinct.insert(member_hash(&bytes), EXACT_DISTINCT_LIMIT, HLL_PRECISION);
                }
                distinct
            },
            DistinctSerde,
        )
        .map_values(Distinct::count)
}

impl<K, V> KGroupedStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The `k` members with the highest score per key, best first: each record is a
    /// `member(key, value)` with a `score(key, value)` (`i64`, `u64` or `f64`; a member's
    /// score is the maximum over its records; equal scores rank by the member's bytes
    /// under `member_serde`, smaller first). Exact, with at most `k` members in the state.
    ///
    /// Built on [`aggregate`](Self::aggregate) (same exactly-once effect, costs and
    /// 400 KB limit); the state format is in the [module documentation](self).
    ///
    /// # Panics
    /// When `k` is 0, or the store name is invalid or used twice (at build time).
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{DecimalI64, Json, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Per game, the 2 best players ("player:points" records keyed by game).
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("scores", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .top_k(
    ///         "best-players",
    ///         2,
    ///         |_, v: &String| v.split(':').next().unwrap_or_default().to_owned(),
    ///         |_, v: &String| v.rsplit(':').next().and_then(|p| p.parse::<i64>().ok()).unwrap_or(0),
    ///         Utf8,
    ///     )
    ///     .to_stream()
    ///     .to("podium", Utf8, Json::<Vec<(String, i64)>>::new());
    /// let driver = TestDriver::new(builder.build());
    /// let mut scores = driver.input_topic("scores", Utf8, Utf8);
    /// for v in ["ann:5", "bob:9", "cy:7", "ann:12", "bob:3"] {
    ///     scores.pipe_input("chess".to_owned(), v.to_owned())?;
    /// }
    /// let podium = driver.output_topic("podium", Utf8, Json::<Vec<(String, i64)>>::new());
    /// let last = podium.read_values()?.pop().unwrap();
    /// assert_eq!(last, [("ann".to_owned(), 12), ("bob".to_owned(), 9)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn top_k<M, S>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        score: impl Fn(&K, &V) -> S + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, Vec<(M, S)>>
    where
        M: Clone + Send + Sync + 'static,
        S: Score,
    {
        top_k_on(self, store, k, member, score, member_serde)
    }

    /// The `k` most frequent members per key, most frequent first, with their counts
    /// (ties: the member's bytes, smaller first), by the Space-Saving algorithm with a
    /// capacity of `10 k` members ([`DEFAULT_CAPACITY_FACTOR`]); see
    /// [`top_k_frequent_with_capacity`](Self::top_k_frequent_with_capacity) for the bound.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{Json, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// // The 2 most visited pages per site ("site/page" records).
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("visits", Unit, Utf8)
    ///     .group_by(|_, v: &String| v.split('/').next().unwrap_or_default().to_owned(), Grouped::with(Utf8, Utf8))
    ///     .top_k_frequent("top-pages", 2, |_, v: &String| v.clone(), Utf8)
    ///     .to_stream()
    ///     .to("top-pages", Utf8, Json::<Vec<(String, u64)>>::new());
    /// let driver = TestDriver::new(builder.build());
    /// driver
    ///     .input_topic("visits", Unit, Utf8)
    ///     .pipe_values(["a/x", "a/y", "a/x", "a/z", "a/y", "a/x", "b/q"])?;
    /// let top = driver
    ///     .output_topic("top-pages", Utf8, Json::<Vec<(String, u64)>>::new())
    ///     .read_key_values_to_map()?;
    /// assert_eq!(top["a"], [("a/x".to_owned(), 3), ("a/y".to_owned(), 2)]);
    /// assert_eq!(top["b"], [("b/q".to_owned(), 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn top_k_frequent<M>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        let capacity = k.saturating_mul(DEFAULT_CAPACITY_FACTOR);
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// [`top_k_frequent`](Self::top_k_frequent) with `capacity` monitored members
    /// (`capacity >= k`; the state holds at most `capacity` members with two counters).
    ///
    /// **Exact** while the key has at most `capacity` distinct members. Beyond that,
    /// Space-Saving (Metwally et al., 2005) guarantees, with N the key's records: every
    /// reported count is at least the member's true count and **at most N / capacity
    /// above it**, and every member whose true count exceeds N / capacity is monitored (so
    /// a member that is truly in the top `k` by more than that margin is reported).
    ///
    /// # Panics
    /// When `k` is 0 or `capacity < k`, or the store name is invalid or used twice.
    pub fn top_k_frequent_with_capacity<M>(
        &self,
        store: &str,
        k: usize,
        capacity: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// The number of distinct members per key, `member(key, value)` identified by its
    /// bytes under `member_serde`.
    ///
    /// **Exact** up to [`EXACT_DISTINCT_LIMIT`] (2,048) distinct members: the state is the
    /// sorted set of their 64-bit [`member_hash`]es (8 bytes each). Past it, a HyperLogLog
    /// sketch of precision [`HLL_PRECISION`] (2^14 one-byte registers: 16 KiB), whose
    /// estimate has a relative standard error of `1.04 / sqrt(2^14)` ≈ 0.81% (measured in
    /// this module's tests: within 3 standard errors, 2.44%, over random sets of 10^3 to
    /// 10^6 members). The state never exceeds 16 KiB + 8 bytes, well under DynamoDB's
    /// 400 KB; note that each write of such an item costs one write unit per KB.
    ///
    /// Both forms are independent of the order of the records, so a retried batch with
    /// other boundaries ends in the same state.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Distinct visitors per page (records: page -> user).
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("views", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .distinct_count("visitors", |_, user: &String| user.clone(), Utf8)
    ///     .to_stream()
    ///     .map_values(|n| n as i64)
    ///     .to("visitors", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut views = driver.input_topic("views", Utf8, Utf8);
    /// for (page, user) in [("/", "ann"), ("/", "bob"), ("/", "ann"), ("/faq", "ann")] {
    ///     views.pipe_input(page.to_owned(), user.to_owned())?;
    /// }
    /// let visitors = driver.output_topic("visitors", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!(visitors["/"], 2);
    /// assert_eq!(visitors["/faq"], 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn distinct_count<M>(
        &self,
        store: &str,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, u64>
    where
        M: Send + Sync + 'static,
    {
        distinct_count_on(self, store, member, member_serde)
    }
}

impl<K, V> TimeWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// [`KGroupedStream::top_k`] per key and window.
    pub fn top_k<M, S>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        score: impl Fn(&K, &V) -> S + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, Vec<(M, S)>>
    where
        M: Clone + Send + Sync + 'static,
        S: Score,
    {
        top_k_on(self, store, k, member, score, member_serde)
    }

    /// [`KGroupedStream::top_k_frequent`] per key and window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::{EmitStrategy, TimeWindows};
    /// use lambda_streams::serdes::{Json, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// // The top 2 pages per minute, emitted once per minute when it closes.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("views", Unit, Utf8)
    ///     .group_by(|_, _| "all".to_owned(), Grouped::with(Utf8, Utf8))
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
    ///     .emit_strategy(EmitStrategy::OnWindowClose)
    ///     .top_k_frequent("top-pages", 2, |_, page: &String| page.clone(), Utf8)
    ///     .to_stream()
    ///     .map(|w, top| (w.start.to_string(), top))
    ///     .to("top-pages", Utf8, Json::<Vec<(String, u64)>>::new());
    /// let driver = TestDriver::new(builder.build());
    /// let mut views = driver.input_topic("views", Unit, Utf8);
    /// for (page, at) in [("/a", 1_000), ("/b", 2_000), ("/a", 3_000), ("/c", 4_000), ("/c", 5_000), ("/c", 61_000)] {
    ///     views.pipe_input_with_timestamp((), page.to_owned(), at)?;
    /// }
    /// let top = driver.output_topic("top-pages", Utf8, Json::<Vec<(String, u64)>>::new());
    /// assert_eq!(
    ///     top.read_key_values()?,
    ///     [("0".to_owned(), vec![("/a".to_owned(), 2), ("/c".to_owned(), 2)])]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn top_k_frequent<M>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        let capacity = k.saturating_mul(DEFAULT_CAPACITY_FACTOR);
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// [`KGroupedStream::top_k_frequent_with_capacity`] per key and window.
    pub fn top_k_frequent_with_capacity<M>(
        &self,
        store: &str,
        k: usize,
        capacity: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// [`KGroupedStream::distinct_count`] per key and window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::TimeWindows;
    /// use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// // Distinct users per minute.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("logins", Unit, Utf8)
    ///     .group_by(|_, _| "all".to_owned(), Grouped::with(Utf8, Utf8))
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
    ///     .distinct_count("users-per-minute", |_, user: &String| user.clone(), Utf8)
    ///     .to_stream()
    ///     .map(|w, n| (w.start.to_string(), n as i64))
    ///     .to("users", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut logins = driver.input_topic("logins", Unit, Utf8);
    /// for (user, at) in [("ann", 1_000), ("bob", 2_000), ("ann", 3_000), ("ann", 61_000)] {
    ///     logins.pipe_input_with_timestamp((), user.to_owned(), at)?;
    /// }
    /// let users = driver.output_topic("users", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!(users["0"], 2);
    /// assert_eq!(users["60000"], 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn distinct_count<M>(
        &self,
        store: &str,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, u64>
    where
        M: Send + Sync + 'static,
    {
        distinct_count_on(self, store, member, member_serde)
    }
}

#[cfg(test)]
mod tests;
