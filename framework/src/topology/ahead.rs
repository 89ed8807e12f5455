//! A large batch's source records deserialized ahead of the topology, on the cores
//! available.
//!
//! What a source does with a record is two steps: deserialize its key and value with the
//! source's serdes, then push them through the topology. The first is a function of the
//! record's bytes alone (a [`Serde`](crate::serdes::Serde) is `Send + Sync` and sees
//! nothing of the batch), and on a batch of JSON values it is most of the work; the second
//! must run record by record in the event's order. So a batch whose records hold at least
//! [`MIN_BYTES`] reads them ahead, a window of [`WINDOW_BYTES`] at a time: the window's
//! records are cut into runs of about equal bytes, one per thread, each run deserialized on
//! its thread into a slot per record, and the topology then takes each record's slot in the
//! event's order. It reads the same values and the same
//! errors as deserializing the record where it stands, because an empty slot is read there:
//!
//! - a run stops at its first record that does not deserialize: that record's slot holds the
//!   error (the batch names it as it would have), the slots after it stay empty, so a serde
//!   that fails slowly (an unreachable schema registry) costs no more than without reading
//!   ahead;
//! - a panicking serde stops its run, its record's slot holding the panic: the panic goes on
//!   where the topology takes the slot, so it is the batch's, handled as any user panic
//!   (resumed there, not raised again: the panic hook reports it once, and the serde does
//!   not run twice);
//! - a thread that cannot be started leaves its run empty.
//!
//! Lambda allocates CPU in proportion to memory: 1,769 MB is one vCPU of share, though a
//! function sees 2 vCPUs up to 3,008 MB. A second thread pays off only with a second vCPU
//! of share, from 3,538 MB; below, it would split the same share and add its own work, so
//! the default threads are the whole vCPUs of share (`event::cpus`).

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;

use crate::event::{KafkaEvent, Record};
use crate::serdes::SerdeError;

/// The bytes of keys and values of one topic in a batch from which its records are read
/// ahead: below, the threads' start (tens of µs) is not worth it.
pub(crate) const MIN_BYTES: usize = 256 * 1024;

/// One record read by a source's serdes: its key and value, or the side that does not
/// deserialize and why.
pub(crate) type Read<K, V> = Result<(K, V), (&'static str, SerdeError)>;

/// A source's reading ahead: given the partitions of its topic in a batch and the threads
/// to use, one type-erased [`Slots`] per partition.
pub(crate) type ReadAheadFn =
    Arc<dyn Fn(&[&[Record]], usize) -> Vec<Box<dyn Any + Send>> + Send + Sync>;

/// A partition's records as a source read them ahead: one slot per record, empty where the
/// record is to be read where it stands.
pub(crate) struct Slots<T>(pub(crate) Vec<Option<Slot<T>>>);

/// A record read ahead: what the source's serdes gave, or their panic.
pub(crate) enum Slot<T> {
    /// The serdes returned.
    Read(T),
    /// The serdes panicked with this payload.
    Panicked(Box<dyn Any + Send>),
}

/// What a source is handed with a record: the partition's slots, if it read them ahead,
/// and the record's position in the partition.
pub(crate) struct Ahead<'a> {
    slots: Option<&'a mut (dyn Any + Send)>,
    position: usize,
}

impl Ahead<'_> {
    /// The record's slot, taken: `None` if it is to be read where it stands. A slot that
    /// holds a panic resumes it here, on the batch's thread, as if the record's serdes
    /// panicked where it stands.
    pub(crate) fn take<T: 'static>(self) -> Option<T> {
        let slots = self.slots?.downcast_mut::<Slots<T>>()?;
        match slots.0.get_mut(self.position)?.take()? {
            Slot::Read(read) => Some(read),
            Slot::Panicked(payload) => resume_unwind(payload),
        }
    }
}

/// A batch's reading ahead, one window of the event at a time: from the record the
/// topology asks for, the next [`WINDOW_BYTES`] of the records of topics read ahead, so that
/// the values read ahead and not yet taken stay bounded (a few MB on a 6 MB event).
pub(crate) struct BatchAhead<'e> {
    event: &'e KafkaEvent,
    /// The topics read ahead (their records hold at least [`MIN_BYTES`] in the event), with
    /// each of their sources' reading ahead, if it can.
    readers: HashMap<&'e str, Vec<Option<&'e ReadAheadFn>>>,
    threads: usize,
    /// The window read: partition index, its first and end positions in it, and the
    /// slots of each of its topic's sources.
    window: Vec<Segment>,
}

/// A partition's records `start..end` in the window read, with each source's slots.
struct Segment {
    partition: usize,
    start: usize,
    end: usize,
    slots: Vec<Option<Box<dyn Any + Send>>>,
}

/// The bytes of records (by [`weight`]) a window holds at most, beyond its first record.
pub(crate) const WINDOW_BYTES: usize = 2 * 1024 * 1024;

impl<'e> BatchAhead<'e> {
    /// Reads `event` ahead on `threads` threads for the `sources` (by topic, each source's
    /// reading ahead, if it can) of the topics whose keys and values hold at least
    /// [`MIN_BYTES`]; nothing on one thread.
    pub(crate) fn new<S>(event: &'e KafkaEvent, threads: usize, sources: S) -> BatchAhead<'e>
    where
        S: IntoIterator<Item = (&'e String, Vec<Option<&'e ReadAheadFn>>)>,
    {
        let mut readers = HashMap::new();
        if threads >= 2 {
            for (topic, read) in sources {
                let bytes: usize = event
                    .partitions
                    .iter()
                    .filter(|p| p.tp.topic == *topic)
                    .flat_map(|p| p.records.iter())
                    .map(weight)
                    .sum();
                if bytes >= MIN_BYTES && read.iter().any(Option::is_some) {
                    readers.insert(topic.as_str(), read);
                }
            }
        }
        BatchAhead {
            event,
            readers,
            threads,
            window: Vec::new(),
        }
    }

    /// What source `source` is handed with the record at `position` of partition
    /// `partition` (the topology asks in the event's order): its slot, the window from it
    /// read first if it is not in the window read.
    pub(crate) fn get(&mut self, partition: usize, source: usize, position: usize) -> Ahead<'_> {
        let covers = |w: &Segment| w.partition == partition && (w.start..w.end).contains(&position);
        if !self.window.iter().any(covers) {
            let Some(topic) = self.event.partitions.get(partition).map(|p| &p.tp.topic) else {
                return Ahead {
                    slots: None,
                    position,
                };
            };
            if !self.readers.contains_key(topic.as_str()) {
                return Ahead {
                    slots: None,
                    position,
                };
            }
            self.read_window(partition, position);
        }
        match self.window.iter_mut().find(|w| covers(w)) {
            Some(segment) => Ahead {
                slots: segment.slots.get_mut(source).and_then(|s| s.as_deref_mut()),
                position: position - segment.start,
            },
            None => Ahead {
                slots: None,
                position,
            },
        }
    }

    /// Reads the window that starts at `position` of partition `partition`.
    fn read_window(&mut self, partition: usize, position: usize) {
        self.window.clear();
        let mut filled = 0;
        for (index, batch) in self.event.partitions.iter().enumerate().skip(partition) {
            if filled >= WINDOW_BYTES {
                break;
            }
            if !self.readers.contains_key(batch.tp.topic.as_str()) {
                continue;
            }
            let start = if index == partition { position } else { 0 };
            let mut end = start;
            while end < batch.records.len() && filled < WINDOW_BYTES {
                filled += weight(&batch.records[end]);
                end += 1;
            }
            if end > start {
                let slots = Vec::new();
                self.window.push(Segment {
                    partition: index,
                    start,
                    end,
                    slots,
                });
            }
        }
        let topics: BTreeSet<&str> = self
            .window
            .iter()
            .map(|w| self.event.partitions[w.partition].tp.topic.as_str())
            .collect();
        for topic in topics {
            let segments: Vec<usize> = (0..self.window.len())
                .filter(|&i| self.event.partitions[self.window[i].partition].tp.topic == topic)
                .collect();
            let records: Vec<&[Record]> = segments
                .iter()
                .map(|&i| {
                    let w = &self.window[i];
                    &self.event.partitions[w.partition].records[w.start..w.end]
                })
                .collect();
            let readers = self.readers.get(topic).map_or(&[][..], Vec::as_slice);
            for (source, reader) in readers.iter().enumerate() {
                let Some(read) = reader else { continue };
                for (&i, slots) in segments.iter().zip(read(&records, self.threads)) {
                    let row = &mut self.window[i].slots;
                    if row.len() <= source {
                        row.resize_with(source + 1, || None);
                    }
                    row[source] = Some(slots);
                }
            }
        }
    }
}

/// A record's share of the work: its key's and value's bytes, and a constant for the rest.
fn weight(record: &Record) -> usize {
    64 + record.key.as_ref().map_or(0, |k| k.len()) + record.value.as_ref().map_or(0, |v| v.len())
}

/// A run of records and their slots, as one thread fills them.
type Run<'a, T> = Vec<(&'a [Record], &'a mut [Option<Slot<T>>])>;

/// Reads `partitions` with `read` on up to `threads` threads (this one among them): one
/// slot per record, filled as the [module](self) says.
pub(crate) fn read_ahead<T, E>(
    partitions: &[&[Record]],
    threads: usize,
    read: &(dyn Fn(&Record) -> Result<T, E> + Sync),
) -> Vec<Slots<Result<T, E>>>
where
    T: Send,
    E: Send,
{
    let mut slots: Vec<Slots<Result<T, E>>> = partitions
        .iter()
        .map(|records| Slots(records.iter().map(|_| None).collect()))
        .collect();
    let total: usize = partitions.iter().flat_map(|r| r.iter()).map(weight).sum();
    let share = total
        .div_ceil(threads.clamp(1, crate::event::MAX_THREADS))
        .max(1);
    let mut runs: Vec<Run<'_, Result<T, E>>> = Vec::new();
    let (mut run, mut filled): (Run<'_, Result<T, E>>, usize) = (Vec::new(), 0);
    for (records, partition) in partitions.iter().zip(slots.iter_mut()) {
        let (mut records, mut partition) = (*records, partition.0.as_mut_slice());
        while !records.is_empty() {
            let mut taken = 0;
            while taken < records.len() && filled < share {
                filled += weight(&records[taken]);
                taken += 1;
            }
            let (head, tail) = records.split_at(taken);
            let (head_slots, tail_slots) = std::mem::take(&mut partition).split_at_mut(taken);
            if !head.is_empty() {
                run.push((head, head_slots));
            }
            (records, partition) = (tail, tail_slots);
            if filled >= share {
                runs.push(std::mem::take(&mut run));
                filled = 0;
            }
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    std::thread::scope(|scope| {
        let mut runs = runs.into_iter();
        let here = runs.next();
        for run in runs {
            // A thread that cannot be started leaves its run to be read where it stands.
            let _ = std::thread::Builder::new()
                .name("lambda-streams-read".to_owned())
                .spawn_scoped(scope, move || fill(run, read));
        }
        if let Some(run) = here {
            fill(run, read);
        }
    });
    slots
}

/// Fills one run's slots in order, up to and including its first error or panic.
fn fill<T, E>(run: Run<'_, Result<T, E>>, read: &(dyn Fn(&Record) -> Result<T, E> + Sync)) {
    for (records, slots) in run {
        for (record, slot) in records.iter().zip(slots.iter_mut()) {
            let (filled, stop) = match catch_unwind(AssertUnwindSafe(|| read(record))) {
                Ok(result) => {
                    let failed = result.is_err();
                    (Slot::Read(result), failed)
                }
                Err(payload) => (Slot::Panicked(payload), true),
            };
            *slot = Some(filled);
            if stop {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
