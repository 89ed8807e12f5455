//! Stream–stream joins within a join window, as Kafka Streams' `KStream::join(KStream,
//! ValueJoiner, JoinWindows)`.
//!
//! Every stream–stream join keeps both sides' recent records of a key in one state item (a
//! general aggregate, written exactly once), so which records join, and for left and outer
//! joins which leave alone, is decided once, in one conditional write. The items close on
//! the join's *closing time*: the lowest stream time of the source partitions feeding the
//! join (the low watermark of emit-on-close windows, with the idle-partition timeout), as
//! it stood when the batch started. A record of a left or outer join leaves once the closing
//! time passes its timestamp plus the window plus the grace (a partner at most the grace
//! behind the stream time of its own partition can then no longer come), an inner join's
//! once it passes its timestamp plus twice the wider side of the window plus the grace (as
//! long as Kafka Streams' window store keeps it, for partners later than the grace): so a
//! side whose partitions run ahead never drops a record the lagging side can still join. Of two records that meet, the one
//! written second joins the first and emits the pair, whatever the batch boundaries, and
//! also when the two sides' batches run at the same time (the conditional write orders
//! them); its timestamp is the later of the two records'. The pairs of a write are kept in
//! the item, attributed to the record that emits them, so a retried or redelivered batch
//! emits the same pairs from the same records: an aggregation after the join counts each
//! pair once, and under exactly-once output a `read_committed` consumer sees each once.
//!
//! Left and outer joins (`left_join_stream`, `outer_join_stream`, Kafka Streams 3.1+
//! semantics: a record that joined nothing is emitted alone once it can no longer join, and
//! never after it joined) also close the records of keys that get no later record, in the
//! closing pass at the end of every batch; see [`KStream::left_join_stream`].

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

    /// Whether an inner join's record at `ts` can meet no partner any more once the join's
    /// closing time is `time`: a partner at most the wider side of the window plus the grace
    /// behind the stream time of its partition is more than the window away. This keeps a
    /// record as long as Kafka Streams' window store does (before + after + grace), so a
    /// partner later than the grace still finds it while the store would.
    fn expired(&self, ts: i64, time: i64) -> bool {
        let wide = self.before.max(self.after);
        ts.saturating_add(wide.saturating_mul(2))
            .saturating_add(self.grace)
            < time
    }

    /// When a record of `this_side` at `ts` closes: the first closing time that closes it.
    fn close_at(&self, this_side: bool, ts: i64) -> i64 {
        ts.saturating_add(self.reach(this_side))
            .saturating_add(self.grace)
            .saturating_add(1)
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
