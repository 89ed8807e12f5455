//! Stream–stream joins within a join window, as Kafka Streams' `KStream::join(KStream,
//! ValueJoiner, JoinWindows)`.
//!
//! Each side keeps its recent records per key in a state item (a buffer, written exactly
//! once like every aggregate). Both close on the join's *closing time*: the lowest stream
//! time of the source partitions feeding the join (the low watermark of emit-on-close
//! windows, with the idle-partition timeout), as it stood when the batch started. A buffer
//! drops a record once the closing time passes its timestamp plus twice the window plus
//! the grace: a partner at most window + grace behind the stream time of its own partition
//! is then more than the window away. So a side whose partitions run ahead never drops a
//! record the lagging side can still join. A record joins the other side's buffer as it
//! stands after the batch's own buffer writes, so two records of one batch meet; of such a
//! pair only the later one (by timestamp, then source) emits, so the pair is emitted once
//! (a record that meets its own copy, in a self-join, emits that pair from this side
//! only). A pair whose records arrive in two batches is emitted by the later batch; its
//! timestamp is the later of the two records' whichever emits it. So with every record
//! delivered once, each pair is emitted once whatever the batch boundaries. A redelivered
//! record (a retry with the same or other boundaries) emits its pairs again, and two
//! batches running at the same time (one per side) can each see the other's record: the
//! pair is then emitted twice, identically (the output is at least once; the
//! `lambda-streams-source` header names the record that emitted it). Under exactly-once
//! output, a topology that produces the pairs is refused by `build()` for that reason.
//! The buffers themselves are exact.
//!
//! Left and outer joins (`left_join_stream`, `outer_join_stream`, Kafka Streams 3.1+
//! semantics: a record that joined nothing is emitted alone once it can no longer join, and
//! never after it joined) keep both sides of a key in one item instead, so that which
//! records join and which leave alone is decided once, in one conditional write; the
//! records of keys that get no later record close in the closing pass at the end of every
//! batch; see [`KStream::left_join_stream`].

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::state_codec::StateCodec;
use super::table::Lookup;
use super::{Downstream, KStream, KTable, lock};
use crate::error::StreamError;
use crate::event::TopicPartition;
use crate::serdes::{Serde, SerdeError};
use crate::topology::context::Ctx;
use crate::topology::describe::NodeKind;

mod grace;
mod inner;
mod outer;

/// How close in time two records must be to join, as Kafka Streams' `JoinWindows`: a record
/// of the other stream joins a record of this stream at `t` when its timestamp is in
/// `[t - before, t + after]` (both `difference` for [`of`](Self::of)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinWindows {
    before: i64,
    after: i64,
    grace: i64,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl JoinWindows {
    /// Records join when their timestamps differ by at most `difference`, either way (Kafka
    /// Streams' `JoinWindows.ofTimeDifferenceWithNoGrace`).
    pub fn of(difference: Duration) -> Self {
        JoinWindows {
            before: millis(difference),
            after: millis(difference),
            grace: 0,
        }
    }

    /// How long past the window a record is still kept for a late partner.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = millis(grace);
        self
    }

    /// The window's start: a record of the other stream at most `difference` before this
    /// stream's record joins it (Kafka Streams' `JoinWindows.before`; the end stays).
    pub fn before(mut self, difference: Duration) -> Self {
        self.before = millis(difference);
        self
    }

    /// The window's end: a record of the other stream at most `difference` after this
    /// stream's record joins it (Kafka Streams' `JoinWindows.after`; the start stays).
    pub fn after(mut self, difference: Duration) -> Self {
        self.after = millis(difference);
        self
    }

    /// Whether a record of this stream at `this` and one of the other at `other` join.
    fn joins(&self, this: i64, other: i64) -> bool {
        other >= this.saturating_sub(self.before) && other <= this.saturating_add(self.after)
    }

    /// How far past its own timestamp a record of this stream (`this_side`) or of the other
    /// can still meet a partner: `after`, or `before` (Kafka Streams' outer-join look-back).
    fn reach(&self, this_side: bool) -> i64 {
        if this_side { self.after } else { self.before }
    }

    /// Whether a record of `this_side` at `ts` can meet no partner any more once the join's
    /// closing time is `time`: its window and grace have passed (Kafka Streams' rule for
    /// emitting a left or outer join's unjoined record).
    fn closed(&self, this_side: bool, ts: i64, time: i64) -> bool {
        ts.saturating_add(self.reach(this_side))
            .saturating_add(self.grace)
            < time
    }

    /// When a record of `this_side` at `ts` closes: the first closing time that closes it.
    fn close_at(&self, this_side: bool, ts: i64) -> i64 {
        ts.saturating_add(self.reach(this_side))
            .saturating_add(self.grace)
            .saturating_add(1)
    }

    /// Whether a buffered record at `ts` can meet no partner any more once the join's
    /// closing time is `close`: a partner at most the wider side of the window plus the
    /// grace behind the stream time of its partition is more than the window away.
    fn expired(&self, ts: i64, close: i64) -> bool {
        let wide = self.before.max(self.after);
        ts.saturating_add(wide.saturating_mul(2))
            .saturating_add(self.grace)
            < close
    }
}

/// A buffered record of one side: its timestamp, its source, its value's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Buffered {
    ts: i64,
    topic: String,
    partition: i32,
    offset: i64,
    value: Option<Vec<u8>>,
    /// The join's closing time at the start of the record's batch (not stored): buffered
    /// records whose window and grace it passed can meet no partner any more.
    #[serde(skip, default = "no_time")]
    close: i64,
}

fn no_time() -> i64 {
    i64::MIN
}

impl Buffered {
    /// The order in which records of one batch emit their pairs: the later one emits.
    fn position(&self) -> (i64, &str, i32, i64) {
        (self.ts, &self.topic, self.partition, self.offset)
    }
}

/// A stored record's value that does not decode: the error names that record (its source
/// topic-partition and offset, as stored with it), not the current record that met it.
fn stored_value_error(topic: &str, partition: i32, offset: i64, e: SerdeError) -> StreamError {
    StreamError::Deserialize {
        tp: TopicPartition::new(topic, partition),
        offset,
        side: "value",
        reason: format!("a joined value does not decode: {}", e.0),
    }
}

/// A join's key serde and its two sides, from its `serdes` (key, this value, other value).
fn sides<K, V, VO>(
    (key, this, that): (impl Serde<K>, impl Serde<V>, impl Serde<VO>),
) -> (Arc<dyn Serde<K>>, Side<V>, Side<VO>) {
    (
        Arc::new(key),
        Side {
            serde: Arc::new(this),
        },
        Side {
            serde: Arc::new(that),
        },
    )
}

/// A side of a join: how its values are encoded in the buffers.
struct Side<V> {
    serde: Arc<dyn Serde<V>>,
}
