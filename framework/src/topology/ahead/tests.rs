//! A batch's reading ahead ([`BatchAhead`]) against reading each record in turn, the
//! topology's way (every record in the event's order, its window prepared first), on small
//! windows and pieces so that an event is read in many: every slot filled holds what the
//! reader gives for that record, a panic's slot its payload; the pieces of the windows read
//! cover each record of a topic read ahead once, within the sizes; a piece is filled up to
//! and including its first error or panic, and every piece of a window up to its first
//! failed piece is read; with no failure every slot is filled; on one thread, or for a
//! topic not read ahead, none is.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use proptest::prelude::*;

use super::{BatchAhead, ReadAheadFn, Sizes, read_run, weight};
use crate::event::{
    Bytes, EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};

/// What a generated record's value is.
#[derive(Debug, Clone)]
enum Value {
    /// UTF-8 text of this many bytes.
    Text(usize),
    /// Bytes that are not UTF-8.
    Invalid,
    /// The value the reader panics on.
    Panic,
}

fn record(offset: i64, value: &Value) -> Record {
    let bytes = match value {
        Value::Text(n) => "é".repeat(*n / 2).into_bytes(),
        Value::Invalid => vec![b'a', 0xff, b'b'],
        Value::Panic => b"panic".to_vec(),
    };
    Record {
        offset,
        timestamp: offset,
        timestamp_type: TimestampType::CreateTime,
        key: None,
        value: Some(Bytes::from(bytes)),
        headers: Vec::new(),
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

/// The message of the reader's panic, which the test's panic hook keeps quiet.
const PANIC: &str = "a reader that panics";

/// The reader: the value as text, an error where it is not UTF-8; panics on `panic`.
fn read(record: &Record) -> Result<String, String> {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&PANIC) {
                hook(info);
            }
        }));
    });
    let value = record.value.as_deref().unwrap_or_default();
    if value == b"panic" {
        std::panic::panic_any(PANIC);
    }
    std::str::from_utf8(value)
        .map(str::to_owned)
        .map_err(|e| format!("offset {}: {e}", record.offset))
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        20 => (0usize..600).prop_map(Value::Text),
        1 => Just(Value::Invalid),
        1 => Just(Value::Panic),
    ]
}

fn partitions(values: &[Vec<Value>]) -> Vec<Vec<Record>> {
    values
        .iter()
        .map(|p| {
            p.iter()
                .enumerate()
                .map(|(i, v)| record(i as i64, v))
                .collect()
        })
        .collect()
}

/// What a slot holds: the reader's result, or `Err` with the message of its panic.
type Seen = Result<Result<String, String>, String>;

/// A piece of a window: partition, first and end positions.
type Piece = (usize, usize, usize);

/// What a batch's pass over the event saw: each partition's slots as [`Seen`] (`None` also
/// for a record not asked for), each window read, as its pieces, and how many windows were
/// read ahead and then not taken.
struct Pass {
    slots: Vec<Vec<Option<Seen>>>,
    windows: Vec<Vec<Piece>>,
    skipped: usize,
}

/// The event: partition `i` holds `records[i]`, of topic `t` where `read[i]`, else `u`.
fn event(records: &[Vec<Record>], read: &[bool]) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "b:9092".to_owned(),
        partitions: records
            .iter()
            .zip(read)
            .enumerate()
            .map(|(i, (records, read))| PartitionRecords {
                tp: TopicPartition::new(if *read { "t" } else { "u" }, i as i32),
                records: records.clone(),
            })
            .collect(),
    }
}

/// Reads `event` the topology's way, topic `t` read ahead on `threads` threads.
fn pass(event: &KafkaEvent, threads: usize, overlap: bool, sizes: Sizes) -> Pass {
    pass_skipping(event, threads, overlap, sizes, &[])
}

/// [`pass`], leaving partition `p` after its first `stops[p]` records where given (as a batch
/// leaves a partition at a failed record under a partial batch response).
fn pass_skipping(
    event: &KafkaEvent,
    threads: usize,
    overlap: bool,
    sizes: Sizes,
    stops: &[Option<usize>],
) -> Pass {
    let reader: ReadAheadFn = Arc::new(|records| {
        let (slots, stopped) = read_run(records, &read);
        (Box::new(slots) as Box<dyn Any + Send>, stopped)
    });
    let topic = "t".to_owned();
    let mut ahead = BatchAhead::with_sizes(
        event,
        threads,
        overlap,
        [(&topic, vec![Some(&reader)])],
        sizes,
        0,
    );
    let (mut slots, mut windows) = (Vec::new(), Vec::new());
    std::thread::scope(|scope| {
        for (p, batch) in event.partitions.iter().enumerate() {
            let mut row = vec![None; batch.records.len()];
            let stop = stops.get(p).copied().flatten().unwrap_or(usize::MAX);
            for (position, seen) in row.iter_mut().enumerate().take(stop) {
                ahead.prepare(scope, p, position);
                let window = ahead.pieces();
                if !window.is_empty() && windows.last() != Some(&window) {
                    windows.push(window);
                }
                let slot = catch_unwind(AssertUnwindSafe(|| {
                    ahead.get(p, 0, position).take::<Result<String, String>>()
                }));
                *seen = match slot {
                    Ok(slot) => slot.map(Ok),
                    Err(payload) => Some(Err(payload
                        .downcast_ref::<&str>()
                        .map_or_else(|| "another payload".to_owned(), |m| (*m).to_owned()))),
                };
            }
            slots.push(row);
        }
        ahead.abandon();
    });
    Pass {
        slots,
        windows,
        skipped: ahead.skipped(),
    }
}

/// Partitions of valid text values of these sizes.
fn texts(sizes: &[Vec<usize>]) -> Vec<Vec<Record>> {
    let values: Vec<Vec<Value>> = sizes
        .iter()
        .map(|p| p.iter().map(|&n| Value::Text(n)).collect())
        .collect();
    partitions(&values)
}

fn sizes() -> impl Strategy<Value = Sizes> {
    (0usize..6_000, 0usize..2_000).prop_map(|(window, piece)| Sizes { window, piece })
}

/// Whether reading the record fails (an error or a panic).
fn fails(record: &Record) -> bool {
    record.value.as_deref() == Some(b"panic".as_slice()) || read(record).is_err()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_filled_slot_holds_what_reading_the_record_gives(
        values in prop::collection::vec(prop::collection::vec(value(), 0..300), 0..6),
        read_ahead in prop::collection::vec(any::<bool>(), 6),
        threads in 1usize..6,
        overlap in any::<bool>(),
        sizes in sizes(),
    ) {
        let records = partitions(&values);
        let event = event(&records, &read_ahead);
        let Pass { slots, windows, skipped } = pass(&event, threads, overlap, sizes);
        prop_assert_eq!(skipped, 0, "every window read ahead is taken");
        prop_assert_eq!(slots.len(), records.len());
        for (p, (records, slots)) in records.iter().zip(&slots).enumerate() {
            prop_assert_eq!(slots.len(), records.len());
            if threads == 1 || !read_ahead[p] {
                prop_assert!(slots.iter().all(Option::is_none), "nothing read ahead");
            }
            for (record, slot) in records.iter().zip(slots) {
                if record.value.as_deref() == Some(b"panic".as_slice()) {
                    if let Some(slot) = slot {
                        prop_assert_eq!(slot, &Err(PANIC.to_owned()), "a panic's slot holds it");
                    }
                } else if let Some(slot) = slot {
                    prop_assert_eq!(slot, &Ok(read(record)));
                }
            }
        }
        // The pieces: each record of `t` once, in the event's order, each piece within one
        // partition and its sizes; a window within its size.
        let pieces: Vec<Piece> = windows.iter().flatten().copied().collect();
        let expected: Vec<(usize, usize)> = if threads == 1 {
            Vec::new()
        } else {
            records
                .iter()
                .enumerate()
                .filter(|(p, _)| read_ahead[*p])
                .flat_map(|(p, r)| (0..r.len()).map(move |i| (p, i)))
                .collect()
        };
        let covered: Vec<(usize, usize)> =
            pieces.iter().flat_map(|&(p, s, e)| (s..e).map(move |i| (p, i))).collect();
        prop_assert_eq!(covered, expected);
        let bytes = |&(p, s, e): &Piece| -> (usize, usize) {
            let w: Vec<usize> = records[p][s..e].iter().map(weight).collect();
            (w.iter().sum(), w.last().copied().unwrap_or(0))
        };
        for piece in &pieces {
            let (all, last) = bytes(piece);
            prop_assert!(piece.1 < piece.2 && all - last < sizes.piece.max(1), "{:?}", piece);
        }
        for window in &windows {
            let (all, last): (usize, usize) = window.iter().map(bytes).fold((0, 0), |a, b| (a.0 + b.0, b.1));
            prop_assert!(all - last < sizes.window.max(1), "{:?}", window);
        }
    }

    #[test]
    fn a_window_s_pieces_are_read_up_to_the_first_failed_one(
        values in prop::collection::vec(prop::collection::vec(value(), 0..200), 1..5),
        threads in 2usize..5,
        overlap in any::<bool>(),
        sizes in sizes(),
    ) {
        let records = partitions(&values);
        let event = event(&records, &vec![true; records.len()]);
        let Pass { slots, windows, .. } = pass(&event, threads, overlap, sizes);
        for window in &windows {
            let mut failed_before = false;
            for &(p, s, e) in window {
                let filled = slots[p][s..e].iter().take_while(|s| s.is_some()).count();
                prop_assert!(slots[p][s + filled..e].iter().all(Option::is_none), "a prefix");
                let first_failure = records[p][s..e].iter().position(fails);
                let whole = first_failure.map_or(e - s, |f| f + 1);
                if failed_before {
                    prop_assert!(filled == 0 || filled == whole, "read as a piece is, or not");
                } else {
                    prop_assert_eq!(filled, whole, "every piece up to the first failed one");
                }
                failed_before |= first_failure.is_some();
            }
        }
    }

    #[test]
    fn without_failures_every_slot_is_filled_on_two_threads_or_more(
        sizes_of in prop::collection::vec(prop::collection::vec(0usize..2_000, 0..200), 0..6),
        threads in 2usize..6,
        overlap in any::<bool>(),
        sizes in sizes(),
    ) {
        let records = texts(&sizes_of);
        let event = event(&records, &vec![true; records.len()]);
        for (records, slots) in records.iter().zip(pass(&event, threads, overlap, sizes).slots) {
            let read: Vec<_> = records.iter().map(|r| Some(Ok(read(r)))).collect();
            prop_assert_eq!(slots, read);
        }
    }

    #[test]
    fn a_partition_left_early_leaves_the_next_windows_read(
        sizes_of in prop::collection::vec(prop::collection::vec(0usize..2_000, 0..200), 1..6),
        stops in prop::collection::vec(prop::option::of(0usize..200), 6),
        threads in 2usize..5,
        overlap in any::<bool>(),
        sizes in sizes(),
    ) {
        let records = texts(&sizes_of);
        let event = event(&records, &vec![true; records.len()]);
        let seen = pass_skipping(&event, threads, overlap, sizes, &stops);
        for (p, (records, slots)) in records.iter().zip(&seen.slots).enumerate() {
            let stop = stops[p].unwrap_or(usize::MAX);
            for (i, (record, slot)) in records.iter().zip(slots).enumerate() {
                let expected = (i < stop).then(|| Ok(read(record)));
                prop_assert_eq!(slot, &expected, "partition {} record {}", p, i);
            }
        }
        if !overlap {
            prop_assert_eq!(seen.skipped, 0, "nothing read before it is asked for");
        }
    }
}

/// A window holds its first record and a piece its own whatever the sizes (the limits count
/// the bytes beyond them): windows and pieces of 0 bytes read one record each, pieces of 0
/// bytes in a large window one record each too, and every record is read ahead. (The plan
/// once read nothing with a window of 0 bytes, and never ended with pieces of 0 bytes.)
#[test]
fn a_window_and_a_piece_hold_their_first_record_whatever_the_sizes() {
    let records = texts(&[vec![10, 20, 30], vec![40]]);
    let event = event(&records, &[true, true]);
    let single = |p, i| (p, i, i + 1);
    let cases: [(Sizes, Vec<Vec<Piece>>); 3] = [
        (
            Sizes {
                window: 0,
                piece: 0,
            },
            vec![
                vec![single(0, 0)],
                vec![single(0, 1)],
                vec![single(0, 2)],
                vec![single(1, 0)],
            ],
        ),
        (
            Sizes {
                window: 1 << 20,
                piece: 0,
            },
            vec![vec![single(0, 0), single(0, 1), single(0, 2), single(1, 0)]],
        ),
        (
            Sizes {
                window: 0,
                piece: 1 << 20,
            },
            vec![
                vec![single(0, 0)],
                vec![single(0, 1)],
                vec![single(0, 2)],
                vec![single(1, 0)],
            ],
        ),
    ];
    for (sizes, windows) in cases {
        let seen = pass(&event, 2, false, sizes);
        assert_eq!(seen.windows, windows, "{sizes:?}");
        for (records, slots) in records.iter().zip(&seen.slots) {
            let read: Vec<_> = records.iter().map(|r| Some(Ok(read(r)))).collect();
            assert_eq!(slots, &read, "{sizes:?}");
        }
    }
}
