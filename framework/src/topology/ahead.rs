//! A large batch's source records deserialized ahead of the topology, on the cores
//! available.
//!
//! What a source does with a record is two steps: deserialize its key and value with the
//! source's serdes, then push them through the topology. The first is a function of the
//! record's bytes alone (a [`Serde`](crate::serdes::Serde) is `Send + Sync` and sees
//! nothing of the batch), and on a batch of JSON values it is most of the work; the second
//! must run record by record in the event's order. So a batch whose records hold at least
//! [`MIN_BYTES`] reads them ahead, a window of [`WINDOW_BYTES`] at a time. A window is cut
//! into pieces of [`PIECE_BYTES`] (runs of one partition), each taken in order by whichever
//! thread is free, deserialized into a slot per record; the batch's own thread joins in when
//! it needs the window, so the threads finish it together. The topology then takes each
//! record's slot in the event's order. With `BatchOptions::overlap_reading` the two steps
//! overlap: while the topology takes the records of one window, the next one is read on the
//! other threads (off by default: glibc's `malloc` serializes the values then allocated on
//! one thread and freed on another at the same time, see the option). It reads the
//! same values and the same errors as deserializing the record where it stands, because an
//! empty slot is read there:
//!
//! - a piece stops at its first record that does not deserialize: that record's slot holds
//!   the error (the batch names it as it would have), the slots after it stay empty, and the
//!   window's pieces after it are not started, so a serde that fails slowly (an unreachable
//!   schema registry) costs about one failure per thread and window more than without
//!   reading ahead;
//! - a panicking serde stops its piece, its record's slot holding the panic: the panic goes
//!   on where the topology takes the slot, so it is the batch's, handled as any user panic
//!   (resumed there, not raised again: the panic hook reports it once, and the serde does
//!   not run twice);
//! - a thread that cannot be started leaves its pieces to the others;
//! - the threads read in a scope that the batch ends before it awaits anything (sending a
//!   chunk of outputs): the next window's reading is then finished first and kept
//!   ([`BatchAhead::pause`]), or given up when the batch ends ([`BatchAhead::abandon`]).
//!
//! Lambda allocates CPU in proportion to memory: 1,769 MB is one vCPU of share, though a
//! function sees 2 vCPUs up to 3,008 MB. A second thread pays off only with a second vCPU
//! of share, from 3,538 MB; below, it would split the same share and add its own work, so
//! the default threads are the whole vCPUs of share (`event::cpus`).

use std::any::Any;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::Scope;

use crate::event::{KafkaEvent, Record};
use crate::serdes::SerdeError;

/// The bytes of keys and values of one topic in a batch from which its records are read
/// ahead: below, the threads' start (tens of µs) is not worth it.
pub(crate) const MIN_BYTES: usize = 256 * 1024;

/// One record read by a source's serdes: its key and value, or the side that does not
/// deserialize and why.
pub(crate) type Read<K, V> = Result<(K, V), (&'static str, SerdeError)>;

/// A source's reading ahead: a run of one partition's records read in order into one
/// type-erased [`Slots`] (by [`read_run`]), and whether it stopped at a record that does not
/// read.
pub(crate) type ReadAheadFn = Arc<dyn Fn(&[Record]) -> (Box<dyn Any + Send>, bool) + Send + Sync>;

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
/// the values read ahead and not yet taken stay bounded (one window, or with the overlap
/// two: the one the topology takes from, and the next one, read meanwhile).
pub(crate) struct BatchAhead<'e> {
    event: &'e KafkaEvent,
    /// The topics read ahead (their records hold at least [`MIN_BYTES`] in the event), with
    /// each of their sources' reading ahead, if it can.
    readers: HashMap<&'e str, Vec<Option<&'e ReadAheadFn>>>,
    threads: usize,
    /// Whether the next window is read while the topology takes from this one.
    overlap: bool,
    sizes: Sizes,
    /// The window read, one segment per piece.
    window: Vec<Segment>,
    /// The segment of `window` the last record asked for was in.
    hint: usize,
    /// The next window, read on the other threads while the topology takes from `window`.
    next: Option<Arc<Reading<'e>>>,
    /// Windows read ahead and then not taken (the topology skipped past them).
    #[cfg(test)]
    skipped: usize,
}

/// How large a window and its pieces are, in bytes of records (by [`weight`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// The bytes a window holds at most, beyond its first record.
    pub(crate) window: usize,
    /// The bytes a piece holds at most, beyond its first record.
    pub(crate) piece: usize,
}

/// The sizes a batch reads with: [`WINDOW_BYTES`] and [`PIECE_BYTES`].
const SIZES: Sizes = Sizes {
    window: WINDOW_BYTES,
    piece: PIECE_BYTES,
};

/// A partition's records `start..end` in the window read, with each source's slots.
struct Segment {
    partition: usize,
    start: usize,
    end: usize,
    slots: SourceSlots,
}

/// A run of records as each source of their topic read it: its type-erased [`Slots`], or
/// `None` for a source that does not read ahead.
type SourceSlots = Vec<Option<Box<dyn Any + Send>>>;

/// The bytes of records (by [`weight`]) a window holds at most, beyond its first record:
/// the first window is read before the topology starts, with every thread, and the
/// topology's last window runs after the reading is done, on one; a window smaller than
/// that costs a start of the other threads (tens of µs) more often.
pub(crate) const WINDOW_BYTES: usize = 1024 * 1024;

/// The bytes of records a piece of a window holds at most, beyond its first record: the
/// unit a thread takes, small enough that the threads finish a window together.
pub(crate) const PIECE_BYTES: usize = 64 * 1024;

/// A window being read: its pieces, each taken in order by whichever thread is free (the
/// threads started for it, and the batch's own when it needs the window).
struct Reading<'e> {
    pieces: Vec<Piece<'e>>,
    /// The next piece to take.
    taken: AtomicUsize,
    /// The pieces from this one on are not read: one before it stopped at a record that
    /// does not read, or the window is no longer needed.
    stop: AtomicUsize,
    /// Each piece's slots, per source, once read (`None`: not read).
    read: Vec<Mutex<Option<SourceSlots>>>,
    /// How many pieces are done with (read, or passed over).
    finished: Mutex<usize>,
    all_finished: Condvar,
}

/// A partition's records `start..end`, read as one run by one thread.
struct Piece<'e> {
    partition: usize,
    start: usize,
    end: usize,
    records: &'e [Record],
    readers: Vec<Option<&'e ReadAheadFn>>,
}

impl<'e> BatchAhead<'e> {
    /// Reads `event` ahead on `threads` threads for the `sources` (by topic, each source's
    /// reading ahead, if it can) of the topics whose keys and values hold at least
    /// [`MIN_BYTES`]; nothing on one thread. With `overlap`, the next window is read while
    /// the topology takes from this one; without, each window is read with every thread
    /// when the topology reaches it.
    pub(crate) fn new<S>(
        event: &'e KafkaEvent,
        threads: usize,
        overlap: bool,
        sources: S,
    ) -> BatchAhead<'e>
    where
        S: IntoIterator<Item = (&'e String, Vec<Option<&'e ReadAheadFn>>)>,
    {
        Self::with_sizes(event, threads, overlap, sources, SIZES, MIN_BYTES)
    }

    /// [`new`](Self::new) with other sizes (tests read small events in many windows).
    pub(crate) fn with_sizes<S>(
        event: &'e KafkaEvent,
        threads: usize,
        overlap: bool,
        sources: S,
        sizes: Sizes,
        min_bytes: usize,
    ) -> BatchAhead<'e>
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
                if bytes >= min_bytes && read.iter().any(Option::is_some) {
                    readers.insert(topic.as_str(), read);
                }
            }
        }
        BatchAhead {
            event,
            readers,
            threads: threads.min(crate::event::MAX_THREADS),
            overlap,
            sizes,
            window: Vec::new(),
            hint: 0,
            next: None,
            #[cfg(test)]
            skipped: 0,
        }
    }

    /// Makes the window read hold the record at `position` of partition `partition` (the
    /// topology asks in the event's order), if its topic is read ahead: the next window is
    /// the one to wait for, unless the topology skipped past it; after it, with the
    /// overlap, the window that follows starts being read on the other threads, in `scope`,
    /// while the topology takes from this one.
    pub(crate) fn prepare<'s>(
        &mut self,
        scope: &'s Scope<'s, '_>,
        partition: usize,
        position: usize,
    ) where
        'e: 's,
    {
        if self.readers.is_empty() || self.find(partition, position).is_some() {
            return;
        }
        let Some(topic) = self.event.partitions.get(partition).map(|p| &p.tp.topic) else {
            return;
        };
        if !self.readers.contains_key(topic.as_str()) {
            return;
        }
        let reading = match self.next.take() {
            Some(next) if next.covers(partition, position) => next,
            skipped => {
                if let Some(skipped) = skipped {
                    skipped.abandon();
                    #[cfg(test)]
                    {
                        self.skipped += 1;
                    }
                }
                let reading = Arc::new(self.plan(partition, position));
                self.start(scope, &reading);
                reading
            }
        };
        reading.wait();
        self.window = reading.segments();
        if !self.overlap {
            return;
        }
        let after =
            self.window
                .last()
                .map(|last| match self.event.partitions.get(last.partition) {
                    Some(batch) if last.end < batch.records.len() => (last.partition, last.end),
                    _ => (last.partition + 1, 0),
                });
        if let Some((partition, position)) = after {
            let next = Arc::new(self.plan(partition, position));
            if !next.pieces.is_empty() {
                self.start(scope, &next);
                self.next = Some(next);
            }
        }
    }

    /// Before the scope of the threads reading ends while the batch goes on (it sends its
    /// outputs): the next window's reading finished, with this thread's help, and kept.
    pub(crate) fn pause(&mut self) {
        if let Some(next) = &self.next {
            next.wait();
        }
    }

    /// Before the scope of the threads reading ends with the batch: the next window is
    /// not read further (its threads stop after the piece they read).
    pub(crate) fn abandon(&mut self) {
        if let Some(next) = self.next.take() {
            next.abandon();
        }
    }

    /// What source `source` is handed with the record at `position` of partition
    /// `partition`, after [`prepare`](Self::prepare): its slot, if it was read ahead.
    pub(crate) fn get(&mut self, partition: usize, source: usize, position: usize) -> Ahead<'_> {
        match self.find(partition, position) {
            Some(index) => {
                let segment = &mut self.window[index];
                Ahead {
                    slots: segment.slots.get_mut(source).and_then(|s| s.as_deref_mut()),
                    position: position - segment.start,
                }
            }
            None => Ahead {
                slots: None,
                position,
            },
        }
    }

    /// The segment of the window read that holds the record, if any (remembered as the
    /// hint: the topology asks for the records in order).
    fn find(&mut self, partition: usize, position: usize) -> Option<usize> {
        let covers = |w: &Segment| w.partition == partition && (w.start..w.end).contains(&position);
        if self.window.get(self.hint).is_some_and(covers) {
            return Some(self.hint);
        }
        let found = self.window.iter().position(covers)?;
        self.hint = found;
        Some(found)
    }

    /// The window that starts at `position` of partition `partition`, cut into pieces.
    fn plan(&self, partition: usize, position: usize) -> Reading<'e> {
        let event: &'e KafkaEvent = self.event;
        let mut pieces = Vec::new();
        let mut filled = 0;
        // A window holds its first record and a piece its own, whatever the sizes: the
        // limits count the bytes beyond them.
        for (index, batch) in event.partitions.iter().enumerate().skip(partition) {
            if filled >= self.sizes.window && !pieces.is_empty() {
                break;
            }
            let Some(readers) = self.readers.get(batch.tp.topic.as_str()) else {
                continue;
            };
            let mut start = if index == partition { position } else { 0 };
            while start < batch.records.len() && (pieces.is_empty() || filled < self.sizes.window) {
                let (mut end, mut piece) = (start, 0);
                while end < batch.records.len()
                    && (end == start || (piece < self.sizes.piece && filled < self.sizes.window))
                {
                    let bytes = weight(&batch.records[end]);
                    (piece, filled) = (piece + bytes, filled + bytes);
                    end += 1;
                }
                pieces.push(Piece {
                    partition: index,
                    start,
                    end,
                    records: &batch.records[start..end],
                    readers: readers.clone(),
                });
                start = end;
            }
        }
        Reading {
            read: pieces.iter().map(|_| Mutex::new(None)).collect(),
            pieces,
            taken: AtomicUsize::new(0),
            stop: AtomicUsize::new(usize::MAX),
            finished: Mutex::new(0),
            all_finished: Condvar::new(),
        }
    }

    /// Starts the threads other than this one on `reading`, in `scope`.
    fn start<'s>(&self, scope: &'s Scope<'s, '_>, reading: &Arc<Reading<'e>>)
    where
        'e: 's,
    {
        for _ in 1..self.threads.min(reading.pieces.len()) {
            let reading = Arc::clone(reading);
            // A thread that cannot be started leaves its pieces to the threads that were,
            // and to this one, which takes what is left when it waits for the window.
            let _ = std::thread::Builder::new()
                .name("lambda-streams-read".to_owned())
                .spawn_scoped(scope, move || reading.work());
        }
    }

    #[cfg(test)]
    /// How many windows were read ahead and then not taken.
    pub(crate) fn skipped(&self) -> usize {
        self.skipped
    }

    #[cfg(test)]
    /// The pieces of the window read: partition, first and end positions.
    pub(crate) fn pieces(&self) -> Vec<(usize, usize, usize)> {
        self.window
            .iter()
            .map(|w| (w.partition, w.start, w.end))
            .collect()
    }
}

impl Reading<'_> {
    /// Whether the window holds the record at `position` of partition `partition`.
    fn covers(&self, partition: usize, position: usize) -> bool {
        self.pieces
            .iter()
            .any(|p| p.partition == partition && (p.start..p.end).contains(&position))
    }

    /// Takes pieces and reads them until none is left.
    fn work(&self) {
        loop {
            let index = self.taken.fetch_add(1, Ordering::Relaxed);
            let Some(piece) = self.pieces.get(index) else {
                return;
            };
            if index < self.stop.load(Ordering::Relaxed) {
                // A reader returns what its serdes gave or their panic, record by record;
                // should it panic itself, the piece stays unread (its records are read
                // where they stand) and the window is still finished.
                let read = catch_unwind(AssertUnwindSafe(|| {
                    let mut failed = false;
                    let slots: Vec<_> = piece
                        .readers
                        .iter()
                        .map(|reader| {
                            reader.map(|read| {
                                let (slots, stopped) = read(piece.records);
                                failed |= stopped;
                                slots
                            })
                        })
                        .collect();
                    (slots, failed)
                }));
                if let Ok((slots, failed)) = read {
                    *self.read[index]
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(slots);
                    if failed {
                        self.stop.fetch_min(index + 1, Ordering::Relaxed);
                    }
                }
            }
            let mut finished = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
            *finished += 1;
            if *finished == self.pieces.len() {
                self.all_finished.notify_all();
            }
        }
    }

    /// Reads what is left of the window on this thread, then waits for the pieces the
    /// other threads read.
    fn wait(&self) {
        self.work();
        let mut finished = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        while *finished < self.pieces.len() {
            finished = self
                .all_finished
                .wait(finished)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// No piece is started any more.
    fn abandon(&self) {
        self.stop.store(0, Ordering::Relaxed);
    }

    /// The window's segments, after [`wait`](Self::wait): one per piece, its slots taken.
    fn segments(&self) -> Vec<Segment> {
        self.pieces
            .iter()
            .zip(&self.read)
            .map(|(piece, read)| Segment {
                partition: piece.partition,
                start: piece.start,
                end: piece.end,
                slots: read
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .unwrap_or_default(),
            })
            .collect()
    }
}

/// A record's share of the work: its key's and value's bytes, and a constant for the rest.
fn weight(record: &Record) -> usize {
    64 + record.key.as_ref().map_or(0, |k| k.len()) + record.value.as_ref().map_or(0, |v| v.len())
}

/// Reads `records` with `read` in order, one slot per record, up to and including the
/// first that does not read (an error or a panic): the slots after it stay empty, so a
/// serde that fails slowly (an unreachable schema registry) costs no more than without
/// reading ahead. Returns whether it stopped there.
pub(crate) fn read_run<T, E>(
    records: &[Record],
    read: &dyn Fn(&Record) -> Result<T, E>,
) -> (Slots<Result<T, E>>, bool) {
    let mut slots: Vec<Option<Slot<Result<T, E>>>> = Vec::with_capacity(records.len());
    for record in records {
        let (filled, stop) = match catch_unwind(AssertUnwindSafe(|| read(record))) {
            Ok(result) => {
                let failed = result.is_err();
                (Slot::Read(result), failed)
            }
            Err(payload) => (Slot::Panicked(payload), true),
        };
        slots.push(Some(filled));
        if stop {
            slots.resize_with(records.len(), || None);
            return (Slots(slots), true);
        }
    }
    (Slots(slots), false)
}

#[cfg(test)]
mod tests;
