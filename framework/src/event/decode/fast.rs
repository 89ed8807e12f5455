//! The fast path: a scanner specialised for well-formed events of the usual shape.
//!
//! It parses the JSON bytes directly (no `serde_json`), finds the end of each `key` and
//! `value` string with `memchr` and decodes its base64 with `base64-simd`, appending it to
//! one buffer for the whole event (the *arena*; header values go there too), and gives up — returns `None` — on anything it does not handle or that
//! would be an error: a backslash escape or control character in a string, an unknown
//! field, a duplicate, a float or an out-of-range number, invalid or non-canonical
//! base64, a record listed under another key, offsets out of order, and so on.
//!
//! A `None` sends the input to the `serde_json` path ([`super::decode`]), which decides
//! everything and produces the located errors. So the fast path never decides an error:
//! it only has to accept a subset of what the full path accepts, and build the same
//! value for it. `tests::fast_path_agrees_with_serde_path` checks that on mutated events.
//!
//! Decoding runs in two steps. The scan appends every decoded byte string to the arena and
//! notes where it is ([`Span`]) in a [`Pending`] record; header names are shared: one
//! `Arc<str>` per distinct name ([`Parser::header_name`]). Then the arena becomes one
//! [`Bytes`] and each record takes its views of it ([`build`]). So an event costs a few
//! allocations per partition and one per record with headers (its header list), instead
//! of one per key, value, header name and header value.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;

use crate::event::{EventSource, Header, KafkaEvent, PartitionRecords, Record, SchemaMetadata};
use crate::event::{TimestampType, TopicPartition};

/// Decodes `json` if it is a well-formed event of the usual shape; `None` otherwise. A
/// large event is decoded in chunks on up to `threads` threads ([`Parser::records`]).
pub(crate) fn decode(json: &[u8], threads: usize) -> Option<KafkaEvent> {
    let mut p = Parser::new(json, 0, json.len());
    p.threads = threads;
    let event = p.event()?;
    p.ws();
    (p.i == json.len()).then_some(event)
}

/// Events (the `records` object) from this size up are split across threads: below it, a
/// thread's start costs more than it saves (≈ 30 µs against ≈ 0.5 ms of decoding per MB).
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// A decoded byte string: its place in the arena.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
}

/// A header as scanned: its shared name and the place of its value in the arena.
struct PendingHeader {
    name: Arc<str>,
    value: Span,
}

/// A record as scanned: a [`Record`] whose byte strings are still places in the arena.
struct Pending {
    offset: i64,
    timestamp: i64,
    timestamp_type: TimestampType,
    key: Option<Span>,
    value: Option<Span>,
    /// The record's headers: `headers.0..headers.1` in [`Parser::headers`].
    headers: (usize, usize),
    key_schema_metadata: Option<SchemaMetadata>,
    value_schema_metadata: Option<SchemaMetadata>,
}

/// The second step: the arena becomes one [`Bytes`], and each record gets its views of it.
fn build(
    partitions: Vec<(TopicPartition, Vec<Pending>)>,
    arena: Vec<u8>,
    headers: &[PendingHeader],
) -> Vec<PartitionRecords> {
    let arena = Bytes::from(arena);
    let view = |s: Span| arena.slice(s.start..s.end);
    partitions
        .into_iter()
        .map(|(tp, pending)| PartitionRecords {
            tp,
            records: pending
                .into_iter()
                .map(|r| Record {
                    offset: r.offset,
                    timestamp: r.timestamp,
                    timestamp_type: r.timestamp_type,
                    key: r.key.map(view),
                    value: r.value.map(view),
                    headers: headers[r.headers.0..r.headers.1]
                        .iter()
                        .map(|h| Header {
                            name: Arc::clone(&h.name),
                            value: view(h.value),
                        })
                        .collect(),
                    key_schema_metadata: r.key_schema_metadata,
                    value_schema_metadata: r.value_schema_metadata,
                })
                .collect(),
        })
        .collect()
}

/// Where a partition other than the first starts nearest to `target`, after `after`: the
/// `"` of a key that follows `],` (the end of the previous partition's list) and is itself
/// followed by `:[`, the key a topic-partition. Only a guess: a split is kept only if the
/// partitions before it end exactly there ([`Parser::partitions_until`]).
///
/// The nearest, not the first at or after `target`: with the usual partitions of about equal
/// size, the first after the middle of an event of four is the third (75%), and the
/// two threads' shares would be three to one.
fn partition_start(s: &[u8], after: usize, target: usize, within: usize) -> Option<usize> {
    nearest(s, after, target, within, b"],\"", |found| {
        partition_key_at(s, found)
    })
}

/// The place nearest to `target` (the one before on a tie), after `after` and no further
/// than about `within` from `target`, of those that `place` gives for the matches of
/// `pattern` in `s` (from a match's start; `None` to pass it over). A place lies within
/// its match or just after it, so the searches overlap at `target` by the pattern's length:
/// a match across `target` is seen.
fn nearest(
    s: &[u8],
    after: usize,
    target: usize,
    within: usize,
    pattern: &[u8],
    place: impl Fn(usize) -> Option<usize>,
) -> Option<usize> {
    let from = (after + 1).min(s.len());
    let target = target.clamp(from, s.len());
    let head_from = target.saturating_sub(within).max(from);
    let head = &s[head_from..(target + pattern.len()).min(s.len())];
    let before = memchr::memmem::rfind_iter(head, pattern)
        .filter_map(|found| place(head_from + found))
        .find(|&at| at > after && at <= target);
    let tail_from = target.saturating_sub(pattern.len()).max(from);
    let tail = &s[tail_from..target.saturating_add(within).min(s.len())];
    let at_or_after = memchr::memmem::find_iter(tail, pattern)
        .filter_map(|found| place(tail_from + found))
        .find(|&at| at > target);
    match (before, at_or_after) {
        (Some(b), Some(a)) => Some(if target - b <= a - target { b } else { a }),
        (b, a) => b.or(a),
    }
}

/// The start of a topic-partition key (its `"`) if the `],"` at `found` is followed by one.
fn partition_key_at(s: &[u8], found: usize) -> Option<usize> {
    let key_start = found + 2;
    let key_len = memchr::memchr(b'"', s.get(key_start + 1..)?)?;
    let key_end = key_start + 1 + key_len;
    let is_partition = s.get(key_end + 1..key_end + 3) == Some(b":[")
        && std::str::from_utf8(&s[key_start + 1..key_end])
            .ok()
            .and_then(TopicPartition::from_key)
            .is_some();
    is_partition.then_some(key_start)
}

/// Where a record other than a partition's first starts nearest to `target`, after
/// `after`: the `{` of `},{"topic":"`, a record that follows another in a partition's list
/// (the ESM writes `topic` first; a record whose fields come in another order is never a
/// guess, and its partition splits only at its boundaries). Only a guess, as
/// [`partition_start`] is: the chunk before must end exactly there, inside a list.
fn record_start(s: &[u8], after: usize, target: usize) -> Option<usize> {
    nearest(
        s,
        after,
        target,
        RECORD_REACH,
        b"},{\"topic\":\"",
        |found| Some(found + 2),
    )
}

/// How far from a share's end a partition boundary is taken before a nearer record start:
/// 64 KiB of imbalance costs the threads ≈ 25 µs, the copy of a partition's records onto
/// another more.
pub(crate) const PARTITION_REACH: usize = 64 * 1024;

/// How far from a share's end a record start is looked for: records are at most a few
/// hundred KB; with none that near (the fields in another order), only a partition
/// boundary splits.
const RECORD_REACH: usize = 256 * 1024;

/// The topic-partition a record at `at` names (`{"topic":"…","partition":N`, the ESM's
/// order): what a chunk that starts inside a partition's list takes for its partition. The
/// chunk before must end in that same partition ([`Parser::records_in_parallel`] checks).
fn record_tp(s: &[u8], at: usize) -> Option<TopicPartition> {
    let mut p = Parser::new(s, at, s.len());
    p.eat(b'{')?;
    if !p.literal(b"\"topic\":") {
        return None;
    }
    let topic = std::str::from_utf8(p.raw_str()?).ok()?;
    p.eat(b',')?;
    if !p.literal(b"\"partition\":") {
        return None;
    }
    let partition = i32::try_from(p.int()?).ok()?;
    Some(TopicPartition::new(topic, partition))
}

/// Where a chunk of the `records` object starts, and so where the chunk before ends: the
/// place, and what starts there.
#[derive(Clone, Copy)]
enum Seam {
    /// A partition's key: the chunk before ends at the `,` after a partition.
    Partition(usize),
    /// A record inside a partition's list: the chunk before ends at the `,` after a record
    /// of that list.
    Record(usize),
}

impl Seam {
    /// The seam at `at`, a chunk's start: a record's `{` or a partition's key.
    fn at(s: &[u8], at: usize) -> Seam {
        if s[at] == b'{' {
            Seam::Record(at)
        } else {
            Seam::Partition(at)
        }
    }

    /// The place: where the chunk starts.
    fn start(self) -> usize {
        match self {
            Seam::Partition(at) | Seam::Record(at) => at,
        }
    }
}

/// Decodes the partitions from `from` up to `end` (the start of the next chunk), or to the
/// end of the `records` object when `end` is `None`: the partitions, and where it stopped.
/// A chunk that starts at a [`Seam::Record`] starts inside a partition's list: its first
/// partition is the one its first record names ([`record_tp`]), the rest of a list the
/// chunk before holds the start of.
fn decode_chunk(s: &[u8], from: Seam, end: Option<Seam>) -> Option<(Vec<PartitionRecords>, usize)> {
    let (at, inside) = match from {
        Seam::Partition(at) => (at, None),
        Seam::Record(at) => (at, Some(record_tp(s, at)?)),
    };
    let mut p = Parser::new(s, at, end.map_or(s.len(), Seam::start));
    p.reserve_arena();
    let pending = p.partitions_until(end, inside)?;
    let partitions = build(pending, std::mem::take(&mut p.arena), &p.headers);
    Some((partitions, p.i))
}

/// How many distinct header names an event's decoding shares (more are allocated each time).
const MAX_SHARED_NAMES: usize = 32;

/// A cursor over the input, and what the scan has decoded so far. Every method returns
/// `None` to give up.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    /// Where this parser's part of the input ends (the next chunk's start, or the input's end).
    limit: usize,
    /// How many threads may decode the `records` object.
    threads: usize,
    /// Every decoded key, value and header value of the event, one after the other.
    arena: Vec<u8>,
    /// Every header of the event, in order; each [`Pending`] record names its range.
    headers: Vec<PendingHeader>,
    /// The distinct header names met so far (at most [`MAX_SHARED_NAMES`]).
    names: Vec<Arc<str>>,
}

/// Which fields of an object were seen (to give up on duplicates and missing fields).
#[derive(Default, Clone, Copy)]
struct Seen(u16);

impl Seen {
    /// Marks field `bit`; `None` if it was already there.
    fn first(&mut self, bit: u16) -> Option<()> {
        let mask = 1 << bit;
        if self.0 & mask != 0 {
            return None;
        }
        self.0 |= mask;
        Some(())
    }
}

impl<'a> Parser<'a> {
    /// A parser of `s[at..limit]` (it may read on past `limit` to finish a value). Its
    /// arena is sized when partitions are read ([`reserve_arena`](Self::reserve_arena)).
    fn new(s: &'a [u8], at: usize, limit: usize) -> Self {
        Parser {
            s,
            i: at,
            limit,
            threads: 1,
            arena: Vec::new(),
            headers: Vec::new(),
            names: Vec::new(),
        }
    }

    /// Sizes the arena for the partitions from the cursor to [`limit`](Self::limit): every
    /// decoded byte comes from at least 4/3 bytes of base64 or, for header values, from at
    /// least two bytes of JSON (`0,`), so the arena never grows.
    fn reserve_arena(&mut self) {
        self.arena
            .reserve(self.limit.saturating_sub(self.i) / 4 * 3 + 3);
    }

    /// Skips JSON whitespace.
    #[inline]
    fn ws(&mut self) {
        while let Some(&b) = self.s.get(self.i) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                break;
            }
            self.i += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    /// Consumes `c` after whitespace.
    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        if self.peek()? == c {
            self.i += 1;
            Some(())
        } else {
            None
        }
    }

    /// After a member or an element: `true` for `,`, `false` for `close`.
    #[inline]
    fn more(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            c if c == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// Enters an object or array: consumes `open`; `true` if it is not empty.
    #[inline]
    fn open(&mut self, open: u8, close: u8) -> Option<bool> {
        self.eat(open)?;
        if self.peek()? == close {
            self.i += 1;
            return Some(false);
        }
        Some(true)
    }

    /// Consumes `null` if it comes next.
    #[inline]
    fn null(&mut self) -> Option<bool> {
        if self.peek()? == b'n' {
            if self.s.get(self.i..self.i + 4)? != b"null" {
                return None;
            }
            self.i += 4;
            return Some(true);
        }
        Some(false)
    }

    /// A string without escapes or control characters, as raw bytes (not checked for UTF-8).
    #[inline]
    fn raw_str(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        let rest = self.s.get(start..)?;
        let len = find_stop(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        self.i = start + len + 1;
        Some(&rest[..len])
    }

    /// An object key followed by its `:`.
    #[inline]
    fn key(&mut self) -> Option<&'a [u8]> {
        let key = self.raw_str()?;
        self.eat(b':')?;
        Some(key)
    }

    /// Consumes `literal` if the input continues with exactly those bytes (no whitespace
    /// skipped); `false` leaves the cursor where it was. The length is a constant, so the
    /// comparison is inlined (a few word compares, no `memcmp` call).
    #[inline(always)]
    fn literal<const N: usize>(&mut self, literal: &[u8; N]) -> bool {
        let found = self
            .s
            .get(self.i..)
            .and_then(|rest| rest.get(..N))
            .is_some_and(|head| head == literal);
        if found {
            self.i += N;
        }
        found
    }

    /// A record's field name and its `:`. The usual layout (compact JSON, the fields in
    /// the ESM's order: topic, partition, offset, timestamp, timestampType, key, value,
    /// headers) is recognised with one comparison against the field expected `next`;
    /// anything else goes through [`key`](Self::key), with the same result.
    /// `None` for an unknown field, as for any other reason to give up.
    #[inline]
    fn record_key(&mut self, next: &mut usize) -> Option<Field> {
        let expected = match *next {
            0 => self.literal(b"\"topic\":").then_some(Field::Topic),
            1 => self.literal(b"\"partition\":").then_some(Field::Partition),
            2 => self.literal(b"\"offset\":").then_some(Field::Offset),
            3 => self.literal(b"\"timestamp\":").then_some(Field::Timestamp),
            4 => self
                .literal(b"\"timestampType\":")
                .then_some(Field::TimestampType),
            5 => self.literal(b"\"key\":").then_some(Field::Key),
            6 => self.literal(b"\"value\":").then_some(Field::Value),
            7 => self.literal(b"\"headers\":").then_some(Field::Headers),
            _ => None,
        };
        if let Some(field) = expected {
            *next += 1;
            return Some(field);
        }
        Some(match self.key()? {
            b"topic" => Field::Topic,
            b"partition" => Field::Partition,
            b"offset" => Field::Offset,
            b"timestamp" => Field::Timestamp,
            b"timestampType" => Field::TimestampType,
            b"key" => Field::Key,
            b"value" => Field::Value,
            b"headers" => Field::Headers,
            b"keySchemaMetadata" => Field::KeySchemaMetadata,
            b"valueSchemaMetadata" => Field::ValueSchemaMetadata,
            _ => return None,
        })
    }

    /// A string checked for UTF-8.
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.raw_str()?).ok()
    }

    /// An integer in canonical JSON form that fits an `i64`, and is not `-0` (which
    /// `serde_json` reads as a float). Fractions and exponents give up.
    #[inline]
    fn int(&mut self) -> Option<i64> {
        self.ws();
        let negative = self.s.get(self.i) == Some(&b'-');
        if negative {
            self.i += 1;
        }
        let start = self.i;
        let mut n: i64 = 0;
        while let Some(&b) = self.s.get(self.i) {
            if !b.is_ascii_digit() {
                break;
            }
            n = n.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.s[start] == b'0') {
            return None;
        }
        if matches!(self.s.get(self.i), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        if negative {
            if n == 0 {
                return None;
            }
            n = -n;
        }
        Some(n)
    }

    /// `null` or a base64 string, decoded into the arena.
    #[inline]
    fn bytes(&mut self) -> Option<Option<Span>> {
        if self.null()? {
            return Some(None);
        }
        self.eat(b'"')?;
        let start = self.i;
        let len = memchr::memchr(b'"', self.s.get(start..)?)?;
        let span = base64_decode_into(&self.s[start..start + len], &mut self.arena)?;
        self.i = start + len + 1;
        Some(Some(span))
    }

    /// A header name (an object key, checked for UTF-8), shared with the earlier headers
    /// of the same name.
    #[inline]
    fn header_name(&mut self) -> Option<Arc<str>> {
        let raw = self.key()?;
        if let Some(name) = self.names.iter().find(|n| n.as_bytes() == raw) {
            return Some(Arc::clone(name));
        }
        let name: Arc<str> = Arc::from(std::str::from_utf8(raw).ok()?);
        if self.names.len() < MAX_SHARED_NAMES {
            self.names.push(Arc::clone(&name));
        }
        Some(name)
    }

    /// `null` or a string.
    fn opt_string(&mut self) -> Option<Option<String>> {
        if self.null()? {
            return Some(None);
        }
        Some(Some(self.str()?.to_owned()))
    }

    fn event(&mut self) -> Option<KafkaEvent> {
        let mut seen = Seen::default();
        let mut msk = None;
        let mut arn = None;
        let mut bootstrap_servers = None;
        let mut partitions = None;
        if self.open(b'{', b'}')? {
            loop {
                match self.key()? {
                    b"eventSource" => {
                        seen.first(0)?;
                        msk = Some(match self.str()? {
                            "aws:kafka" => true,
                            "SelfManagedKafka" => false,
                            _ => return None,
                        });
                    }
                    b"eventSourceArn" => {
                        seen.first(1)?;
                        arn = self.opt_string()?;
                    }
                    b"bootstrapServers" => {
                        seen.first(2)?;
                        bootstrap_servers = Some(self.str()?.to_owned());
                    }
                    b"records" => {
                        seen.first(3)?;
                        partitions = Some(self.records()?);
                    }
                    _ => return None,
                }
                if !self.more(b'}')? {
                    break;
                }
            }
        }
        let source = if msk? {
            EventSource::Msk { arn: arn? }
        } else {
            EventSource::SelfManaged
        };
        Some(KafkaEvent {
            source,
            bootstrap_servers: bootstrap_servers?,
            partitions: partitions?,
        })
    }

    /// The `records` object. A large one is split at partition or record boundaries into
    /// chunks of about equal size, each decoded on a thread of its own
    /// ([`records_in_parallel`](Self::records_in_parallel)); otherwise, or if that gives up,
    /// in one pass here.
    fn records(&mut self) -> Option<Vec<PartitionRecords>> {
        let mut partitions = Vec::new();
        if self.open(b'{', b'}')? {
            partitions = match self.records_in_parallel() {
                Some(partitions) => partitions,
                None => {
                    self.reserve_arena();
                    let pending = self.partitions_until(None, None)?;
                    build(pending, std::mem::take(&mut self.arena), &self.headers)
                }
            };
        }
        if partitions.len() > 1 {
            let mut seen = HashSet::with_capacity(partitions.len());
            if !partitions.iter().all(|p| seen.insert(&p.tp)) {
                return None;
            }
        }
        Some(partitions)
    }

    /// The partitions of the `records` object, from the cursor (after its `{`) to its `}`,
    /// decoded in chunks on up to [`threads`](Self::threads) threads; `None` when the object
    /// is too small, no boundary splits it, a thread cannot be started, or a chunk gives up
    /// (the caller then decodes it in one pass, which decides).
    ///
    /// A chunk starts at a guessed boundary ([`chunk_starts`](Self::chunk_starts)) and must
    /// end exactly at the next chunk's start. The first chunk starts where the sequential
    /// parse would, so if it ends exactly at the second's start, on a `,` between partitions
    /// (the second starting at a key) or between two records of a list (the second starting
    /// at a record, and taking the partition the first ended in), the second starts where
    /// the sequential parse would too, and so on: the chunks together read exactly what one
    /// pass reads, and build the same partitions.
    fn records_in_parallel(&mut self) -> Option<Vec<PartitionRecords>> {
        let s = self.s;
        let starts = self.chunk_starts()?;
        // Each chunk's start and end; the first starts at the first partition's key.
        let seams: Vec<Seam> = std::iter::once(Seam::Partition(starts[0]))
            .chain(starts[1..].iter().map(|&at| Seam::at(s, at)))
            .collect();
        let chunks: Vec<(Seam, Option<Seam>)> = (0..seams.len())
            .map(|j| (seams[j], seams.get(j + 1).copied()))
            .collect();
        let results: Vec<Option<(Vec<PartitionRecords>, usize)>> = std::thread::scope(|scope| {
            let spawned: Vec<_> = chunks[1..]
                .iter()
                .map(|&(from, end)| {
                    std::thread::Builder::new()
                        .name("lambda-streams-decode".into())
                        .spawn_scoped(scope, move || decode_chunk(s, from, end))
                })
                .collect();
            let first = decode_chunk(s, chunks[0].0, chunks[0].1);
            std::iter::once(first)
                .chain(spawned.into_iter().map(|thread| thread.ok()?.join().ok()?))
                .collect()
        });
        let mut partitions: Vec<PartitionRecords> = Vec::new();
        for (result, &(from, _)) in results.into_iter().zip(&chunks) {
            let (chunk, end) = result?;
            let mut chunk = chunk.into_iter();
            if let Seam::Record(_) = from {
                // The chunk went on with the list the one before stopped in: the same
                // partition, its offsets still increasing (as one pass checks).
                let (last, first) = (partitions.last_mut()?, chunk.next()?);
                let (before, after) = (last.records.last()?, first.records.first()?);
                if last.tp != first.tp || after.offset <= before.offset {
                    return None;
                }
                last.records.extend(first.records);
            }
            partitions.extend(chunk);
            self.i = end;
        }
        Some(partitions)
    }

    /// Where the chunks of the `records` object start (the first at the cursor, after its
    /// `{`): at the boundaries nearest to equal shares of the rest of the input, one per
    /// thread, a partition's ([`partition_start`]) or a record's inside a partition
    /// ([`record_start`]: an event of one partition splits too, and unequal partitions
    /// split evenly); `None` when it is too small to split or no boundary splits it.
    fn chunk_starts(&self) -> Option<Vec<usize>> {
        let (s, start) = (self.s, self.i);
        let len = s.len() - start;
        if self.threads < 2 || len < PARALLEL_MIN_BYTES {
            return None;
        }
        let mut starts = vec![start];
        for k in 1..self.threads {
            let (after, target) = (starts[starts.len() - 1], start + len / self.threads * k);
            // A record start is near (a record away at most). A partition boundary is
            // looked for only that near, or as near as [`PARTITION_REACH`] (a search across
            // megabytes costs milliseconds), and taken if it is that near: a chunk that
            // starts at a record costs a copy of its first list onto the one before.
            let record = record_start(s, after, target);
            let reach = record.map_or(usize::MAX, |r| r.abs_diff(target));
            let partition = partition_start(s, after, target, reach.max(PARTITION_REACH));
            let next = match (partition, record) {
                (Some(p), Some(r))
                    if p.abs_diff(target) > PARTITION_REACH
                        && r.abs_diff(target) < p.abs_diff(target) =>
                {
                    Some(r)
                }
                (p, r) => p.or(r),
            };
            starts.extend(next);
        }
        (starts.len() >= 2).then_some(starts)
    }

    /// Partitions (`"key":[records]`, separated by `,`) from the cursor: up to the `}` that
    /// closes the `records` object (consumed) when `end` is `None`; else up to `end`, the
    /// next chunk's start, which must come right after a `,` that follows a partition, for a
    /// [`Seam::Partition`], or a record, for a [`Seam::Record`] (the cursor is left there).
    /// With `inside`, the cursor is at a record inside that partition's list, the first
    /// partition read from there. `None` for anything else, e.g. the object closing before
    /// `end`, or a partition running past it.
    fn partitions_until(
        &mut self,
        end: Option<Seam>,
        mut inside: Option<TopicPartition>,
    ) -> Option<Vec<(TopicPartition, Vec<Pending>)>> {
        let mut partitions = Vec::new();
        loop {
            let (tp, (records, stopped)) = match inside.take() {
                Some(tp) => {
                    let records = self.records_until(&tp, end)?;
                    (tp, records)
                }
                None => {
                    let key = std::str::from_utf8(self.key()?).ok()?;
                    let tp = TopicPartition::from_key(key)?;
                    let records = self.record_list(&tp, end)?;
                    (tp, records)
                }
            };
            partitions.push((tp, records));
            if stopped {
                // Inside the list, before the next chunk's first record.
                return Some(partitions);
            }
            if let Some(seam) = end {
                let at = seam.start();
                if let Seam::Partition(_) = seam
                    && self.peek()? == b','
                    && self.i + 1 == at
                {
                    self.i = at;
                    return Some(partitions);
                }
                if self.i >= at {
                    return None;
                }
            }
            if !self.more(b'}')? {
                return end.is_none().then_some(partitions);
            }
        }
    }

    /// A partition's list (`[records]`), up to its `]` (consumed), or up to `end` as
    /// [`records_until`](Self::records_until) says.
    fn record_list(
        &mut self,
        tp: &TopicPartition,
        end: Option<Seam>,
    ) -> Option<(Vec<Pending>, bool)> {
        if !self.open(b'[', b']')? {
            return Some((Vec::new(), false));
        }
        self.records_until(tp, end)
    }

    /// The records of `tp`'s list from the cursor (at a record), up to the list's `]`
    /// (consumed); or, when `end` is a [`Seam::Record`], up to it if it comes right after a
    /// `,` that follows a record here (the cursor is left there, and `true` says so).
    fn records_until(
        &mut self,
        tp: &TopicPartition,
        end: Option<Seam>,
    ) -> Option<(Vec<Pending>, bool)> {
        let mut records: Vec<Pending> = Vec::new();
        loop {
            let start = self.i;
            let record = self.record(tp)?;
            match records.last() {
                Some(previous) if record.offset <= previous.offset => return None,
                Some(_) => {}
                None => {
                    // Size the list from the first record (an event holds at most 10,000).
                    let len = (self.i - start).max(1);
                    let left = self.limit.saturating_sub(self.i);
                    records.reserve((left / len + 1).min(10_000));
                }
            }
            records.push(record);
            if let Some(Seam::Record(end)) = end {
                if self.peek()? == b',' && self.i + 1 == end {
                    self.i = end;
                    return Some((records, true));
                }
                if self.i >= end {
                    return None;
                }
            }
            if !self.more(b']')? {
                break;
            }
        }
        Some((records, false))
    }

    fn record(&mut self, tp: &TopicPartition) -> Option<Pending> {
        let mut seen = Seen::default();
        let mut offset = 0;
        let mut timestamp = 0;
        let mut timestamp_type = TimestampType::CreateTime;
        let mut key = None;
        let mut value = None;
        let mut headers = (0, 0);
        let mut key_schema_metadata = None;
        let mut value_schema_metadata = None;
        let mut next = 0;
        if self.open(b'{', b'}')? {
            loop {
                match self.record_key(&mut next)? {
                    Field::Topic => {
                        seen.first(Field::Topic as u16)?;
                        // The topic of the key has no byte that ends a string: found
                        // between quotes, it is what `raw_str` would return.
                        let quoted = self.s.get(self.i..).is_some_and(|rest| {
                            rest.first() == Some(&b'"')
                                && rest[1..].starts_with(tp.topic.as_bytes())
                                && rest.get(1 + tp.topic.len()) == Some(&b'"')
                        });
                        if quoted {
                            self.i += tp.topic.len() + 2;
                        } else if self.raw_str()? != tp.topic.as_bytes() {
                            return None;
                        }
                    }
                    Field::Partition => {
                        seen.first(Field::Partition as u16)?;
                        if self.int()? != i64::from(tp.partition) {
                            return None;
                        }
                    }
                    Field::Offset => {
                        seen.first(Field::Offset as u16)?;
                        offset = self.int()?;
                    }
                    Field::Timestamp => {
                        seen.first(Field::Timestamp as u16)?;
                        timestamp = self.int()?;
                    }
                    Field::TimestampType => {
                        seen.first(Field::TimestampType as u16)?;
                        timestamp_type = if self.literal(b"\"CREATE_TIME\"") {
                            TimestampType::CreateTime
                        } else {
                            match self.raw_str()? {
                                b"CREATE_TIME" => TimestampType::CreateTime,
                                b"LOG_APPEND_TIME" => TimestampType::LogAppendTime,
                                _ => return None,
                            }
                        };
                    }
                    Field::Key => {
                        seen.first(Field::Key as u16)?;
                        key = self.bytes()?;
                    }
                    Field::Value => {
                        seen.first(Field::Value as u16)?;
                        value = self.bytes()?;
                    }
                    Field::Headers => {
                        seen.first(Field::Headers as u16)?;
                        headers = self.headers()?;
                    }
                    Field::KeySchemaMetadata => {
                        seen.first(Field::KeySchemaMetadata as u16)?;
                        key_schema_metadata = self.schema_metadata()?;
                    }
                    Field::ValueSchemaMetadata => {
                        seen.first(Field::ValueSchemaMetadata as u16)?;
                        value_schema_metadata = self.schema_metadata()?;
                    }
                }
                if !self.more(b'}')? {
                    break;
                }
            }
        }
        // topic, partition, offset, timestamp and timestampType are required.
        if seen.0 & 0b1_1111 != 0b1_1111 {
            return None;
        }
        Some(Pending {
            offset,
            timestamp,
            timestamp_type,
            key,
            value,
            headers,
            key_schema_metadata,
            value_schema_metadata,
        })
    }

    /// `headers`: `null` or `[{"name": [bytes...]}, ...]`, appended to
    /// [`headers`](Self::headers) (the values to the arena); returns their range there.
    fn headers(&mut self) -> Option<(usize, usize)> {
        let first = self.headers.len();
        if self.null()? || !self.open(b'[', b']')? {
            return Some((first, first));
        }
        loop {
            if self.open(b'{', b'}')? {
                loop {
                    let name = self.header_name()?;
                    let start = self.arena.len();
                    if !self.compact_byte_array() && self.open(b'[', b']')? {
                        loop {
                            // Two's complement: -17 and 239 are both 0xEF.
                            let byte = self.int()?;
                            if !(-128..=255).contains(&byte) {
                                return None;
                            }
                            self.arena.push(byte as u8);
                            if !self.more(b']')? {
                                break;
                            }
                        }
                    }
                    let end = self.arena.len();
                    let value = Span { start, end };
                    self.headers.push(PendingHeader { name, value });
                    if !self.more(b'}')? {
                        break;
                    }
                }
            }
            if !self.more(b']')? {
                break;
            }
        }
        Some((first, self.headers.len()))
    }

    /// A header value in the usual layout, compact JSON (`[119,101,98]`, each integer one to
    /// three digits, no whitespace), appended to the arena in one tight loop: `true` if the
    /// whole array was read. Anything else (whitespace, a leading zero, `-0`, a fraction or
    /// exponent, a number out of -128..=255) leaves the cursor and the arena as they were
    /// and returns `false`, for the general loop in [`headers`](Self::headers) to read it or
    /// give up, with the same result.
    #[inline]
    fn compact_byte_array(&mut self) -> bool {
        let (s, start, arena_start) = (self.s, self.i, self.arena.len());
        let mut i = start;
        if s.get(i) != Some(&b'[') {
            return false;
        }
        i += 1;
        if s.get(i) == Some(&b']') {
            self.i = i + 1;
            return true;
        }
        loop {
            let negative = s.get(i) == Some(&b'-');
            i += usize::from(negative);
            let Some(first) = s.get(i).map(|b| b.wrapping_sub(b'0')).filter(|d| *d <= 9) else {
                break;
            };
            i += 1;
            let mut n = u32::from(first);
            // No leading zero: a `0` must be the whole number.
            if first != 0 {
                for _ in 0..2 {
                    match s.get(i).map(|b| b.wrapping_sub(b'0')) {
                        Some(d) if d <= 9 => {
                            n = n * 10 + u32::from(d);
                            i += 1;
                        }
                        _ => break,
                    }
                }
            }
            // Two's complement: -17 and 239 are both 0xEF. `-0` is a float to serde_json.
            let byte = match (negative, n) {
                (false, 0..=255) => n as u8,
                (true, 1..=128) => (n as u8).wrapping_neg(),
                _ => break,
            };
            self.arena.push(byte);
            match s.get(i) {
                Some(b',') => i += 1,
                Some(b']') => {
                    self.i = i + 1;
                    return true;
                }
                _ => break,
            }
        }
        self.arena.truncate(arena_start);
        false
    }

    /// `keySchemaMetadata` / `valueSchemaMetadata`: `null` or an object of optional strings.
    fn schema_metadata(&mut self) -> Option<Option<SchemaMetadata>> {
        if self.null()? {
            return Some(None);
        }
        let mut seen = Seen::default();
        let mut meta = SchemaMetadata::default();
        if self.open(b'{', b'}')? {
            loop {
                match self.key()? {
                    b"dataFormat" => {
                        seen.first(0)?;
                        meta.data_format = self.opt_string()?;
                    }
                    b"schemaId" => {
                        seen.first(1)?;
                        meta.schema_id = self.opt_string()?;
                    }
                    _ => return None,
                }
                if !self.more(b'}')? {
                    break;
                }
            }
        }
        Some(Some(meta))
    }
}

/// The fields of a record the fast path knows; the discriminant is the field's bit in
/// [`Seen`] (the first five are required).
#[derive(Clone, Copy)]
enum Field {
    Topic,
    Partition,
    Offset,
    Timestamp,
    TimestampType,
    Key,
    Value,
    Headers,
    KeySchemaMetadata,
    ValueSchemaMetadata,
}

/// The index of the first byte of `s` that ends the fast scan of a string (`"`, `\\` or a
/// control character), eight bytes at a time; `None` if there is none.
#[inline]
fn find_stop(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    /// Exact zero-byte test: the high bit of each byte of `x` that is zero, and no other.
    #[inline(always)]
    fn zeros(x: u64) -> u64 {
        !(((x & !HIGHS).wrapping_add(!HIGHS)) | x | !HIGHS)
    }
    let mut chunks = s.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        // `"`, `\`, and the bytes below 0x20 (those whose top three bits are zero).
        let stop = zeros(x ^ (ONES * u64::from(b'"')))
            | zeros(x ^ (ONES * u64::from(b'\\')))
            | zeros(x & (ONES * 0xE0));
        if stop != 0 {
            return Some(at + (stop.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| STOP[b as usize])
        .map(|k| at + k)
}

/// Bytes that end the fast scan of a string: `"`, `\\` and control characters.
static STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Decodes standard base64 with canonical padding, exactly as
/// `base64::engine::general_purpose::STANDARD` does (padding required, no stray bits in
/// the last symbol, no whitespace); `None` wherever it would fail. The work is done by
/// `base64-simd` (SIMD with runtime CPU detection, a table decoder elsewhere); the tests
/// check the agreement with the `base64` crate.
#[cfg(test)]
pub(crate) fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let span = base64_decode_into(text, &mut out)?;
    Some(out[span.start..span.end].to_vec())
}

/// Texts shorter than this are decoded by [`base64_decode_short`]: `base64-simd` hands
/// anything under 38 symbols to its scalar fallback anyway, after a dispatch and checks that
/// cost more than the decoding of a 16-symbol key (BENCHMARKS.md section 1).
const SHORT_BASE64: usize = 38;

/// [`base64_decode`], appending the bytes to `arena`; returns where they are.
#[inline]
fn base64_decode_into(text: &[u8], arena: &mut Vec<u8>) -> Option<Span> {
    let start = arena.len();
    if text.len() < SHORT_BASE64 {
        if base64_decode_short(text, arena).is_none() {
            arena.truncate(start);
            return None;
        }
        return Some(Span {
            start,
            end: arena.len(),
        });
    }
    // At most 3 bytes per 4 symbols. `decode_append` reserves exactly what it needs,
    // which would reallocate on every call once the arena is full: grow it geometrically
    // first (the arena is sized for the whole event, so this does not happen in practice).
    arena.reserve(text.len() / 4 * 3 + 3);
    if base64_simd::STANDARD.decode_append(text, arena).is_err() {
        arena.truncate(start);
        return None;
    }
    Some(Span {
        start,
        end: arena.len(),
    })
}

/// The value of each base64 symbol of the standard alphabet; `INVALID` for every other byte
/// (`=` included: padding is handled apart, in the last group only).
static SYMBOL: [u8; 256] = {
    let mut t = [INVALID; 256];
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut i = 0;
    while i < 64 {
        t[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Marks a byte that is not a base64 symbol in [`SYMBOL`] (its high bit is the test).
const INVALID: u8 = 0xFF;

/// A short text (under [`SHORT_BASE64`] symbols), four symbols at a time into a buffer on
/// the stack, with the same rules as [`base64_decode`]: a length that is a multiple of four,
/// `=` only as the padding of the last group (one or two), and no stray bits in the symbol
/// before the padding.
#[inline]
fn base64_decode_short(text: &[u8], arena: &mut Vec<u8>) -> Option<()> {
    let (groups, rest) = text.as_chunks::<4>();
    let (&last, groups) = match (groups.split_last(), rest.is_empty()) {
        (Some(split), true) => split,
        (None, true) => return Some(()),
        _ => return None,
    };
    // Three bytes per group, written four at a time (the fourth is overwritten or cut).
    let mut out = [0u8; SHORT_BASE64 / 4 * 3 + 4];
    let mut invalid = 0;
    let mut at = 0;
    for &[a, b, c, d] in groups {
        let [a, b, c, d] = [a, b, c, d].map(|c| u32::from(SYMBOL[usize::from(c)]));
        invalid |= a | b | c | d;
        let n = a << 26 | b << 20 | c << 14 | d << 8;
        out[at..at + 4].copy_from_slice(&n.to_be_bytes());
        at += 3;
    }
    let [a, b, c, d] = last.map(|c| u32::from(SYMBOL[usize::from(c)]));
    let n = (a << 26 | b << 20 | c << 14 | d << 8).to_be_bytes();
    let (tail, len) = match (last[2], last[3]) {
        (b'=', b'=') if b & 0x0F == 0 => (a | b, 1),
        (_, b'=') if c & 0x03 == 0 => (a | b | c, 2),
        _ => (a | b | c | d, 3),
    };
    if (invalid | tail) & 0x80 != 0 {
        return None;
    }
    out[at..at + 4].copy_from_slice(&n);
    arena.extend_from_slice(&out[..at + len]);
    Some(())
}

/// The `records` object of `json` read by [`Parser::records_in_parallel`] on `threads`
/// threads (for the tests: `None` also when the object is not found).
#[cfg(test)]
pub(crate) fn records_in_parallel(json: &[u8], threads: usize) -> Option<Vec<PartitionRecords>> {
    records_parser(json, threads)?.records_in_parallel()
}

/// Where [`Parser::records_in_parallel`] starts its chunks of the `records` object of `json`
/// on `threads` threads (for the tests).
#[cfg(test)]
pub(crate) fn chunk_starts(json: &[u8], threads: usize) -> Option<Vec<usize>> {
    records_parser(json, threads)?.chunk_starts()
}

/// A parser at the start of the `records` object of `json` (after its `{`).
#[cfg(test)]
fn records_parser(json: &[u8], threads: usize) -> Option<Parser<'_>> {
    let at = memchr::memmem::find(json, b"\"records\":{")? + b"\"records\":{".len();
    let mut p = Parser::new(json, at, json.len());
    p.threads = threads;
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::{STOP, find_stop};

    /// `find_stop` agrees with a byte-by-byte scan, at every position of every length.
    #[test]
    fn find_stop_agrees_with_the_table() {
        for len in 0..24 {
            for at in 0..=len {
                for stop in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    if at < len {
                        s[at] = stop;
                    }
                    // A second candidate later must not hide the first one.
                    if at + 1 < len {
                        s[at + 1] = b'"';
                    }
                    let expected = s.iter().position(|&b| STOP[b as usize]);
                    assert_eq!(find_stop(&s), expected, "{s:?}");
                }
            }
        }
    }
}
