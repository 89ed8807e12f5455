//! `read_ahead` against reading each record in turn: every slot it fills holds what the
//! reader gives for that record; with no failure every slot is filled, on any number of
//! threads; on one thread the slots are filled up to and including the first error or panic,
//! a panic's slot holding its payload.

use proptest::prelude::*;

use super::{Slot, Slots, read_ahead};
use crate::event::{Bytes, Record, TimestampType};

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

/// Each partition's slots as [`Seen`].
fn run(records: &[Vec<Record>], threads: usize) -> Vec<Vec<Option<Seen>>> {
    let slices: Vec<&[Record]> = records.iter().map(Vec::as_slice).collect();
    let slots: Vec<Slots<Result<String, String>>> = read_ahead(&slices, threads, &read);
    slots
        .into_iter()
        .map(|Slots(slots)| {
            slots
                .into_iter()
                .map(|slot| {
                    slot.map(|slot| match slot {
                        Slot::Read(read) => Ok(read),
                        Slot::Panicked(payload) => Err(payload
                            .downcast_ref::<&str>()
                            .map_or_else(|| "another payload".to_owned(), |m| (*m).to_owned())),
                    })
                })
                .collect()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_filled_slot_holds_what_reading_the_record_gives(
        values in prop::collection::vec(prop::collection::vec(value(), 0..300), 0..6),
        threads in 1usize..6,
    ) {
        let records = partitions(&values);
        let slots = run(&records, threads);
        prop_assert_eq!(slots.len(), records.len());
        for (records, slots) in records.iter().zip(&slots) {
            prop_assert_eq!(slots.len(), records.len());
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
    }

    #[test]
    fn without_failures_every_slot_is_filled_on_any_number_of_threads(
        sizes in prop::collection::vec(prop::collection::vec(0usize..2_000, 0..200), 0..6),
        threads in 1usize..6,
    ) {
        let values: Vec<Vec<Value>> = sizes
            .iter()
            .map(|p| p.iter().map(|&n| Value::Text(n)).collect())
            .collect();
        let records = partitions(&values);
        for (records, slots) in records.iter().zip(run(&records, threads)) {
            let read: Vec<_> = records.iter().map(|r| Some(Ok(read(r)))).collect();
            prop_assert_eq!(slots, read);
        }
    }

    #[test]
    fn on_one_thread_slots_are_filled_up_to_the_first_failure(
        values in prop::collection::vec(prop::collection::vec(value(), 0..100), 0..5),
    ) {
        let records = partitions(&values);
        let slots = run(&records, 1);
        let mut stopped = false;
        for (records, slots) in records.iter().zip(&slots) {
            for (record, slot) in records.iter().zip(slots) {
                if stopped {
                    prop_assert!(slot.is_none());
                } else if record.value.as_deref() == Some(b"panic".as_slice()) {
                    stopped = true;
                    prop_assert_eq!(slot, &Some(Err(PANIC.to_owned())));
                } else {
                    let read = read(record);
                    stopped = read.is_err();
                    prop_assert_eq!(slot, &Some(Ok(read)));
                }
            }
        }
    }
}
