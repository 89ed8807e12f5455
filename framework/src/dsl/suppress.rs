//! Final results of windowed aggregations: [`EmitStrategy::OnWindowClose`] on time, session
//! and sliding windows, and [`KTable::suppress`] with [`Suppressed::until_window_closes`]
//! (Kafka Streams' `suppress(Suppressed.untilWindowCloses(unbounded()))`), which means the
//! same thing here: each window (or session) emitted once, with its final value, when the
//! low watermark passes its end plus grace (docs/state.md, "Emit on window close").
//!
//! A windowed aggregation registers how it switches to final results ([`FinalSwitch`]),
//! under its table's updates; `suppress` on that table turns it on, while the topology is
//! written. Kafka Streams buffers any table's updates until the window closes; here the
//! state in the store is the buffer, so `suppress` is taken directly on a windowed
//! aggregation's table and refused by [`StreamsBuilder::build`](crate::StreamsBuilder::build)
//! anywhere else (a table derived with `filter` or `map_values`, a table that is not
//! windowed, or an aggregation whose updates are also read unsuppressed).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::windowed::{EmitStrategy, Windowed};
use super::{Downstream, KTable, Shared, lock};
use crate::error::{StreamError, TopologyError};
use crate::event::TopicPartition;
use crate::runtime::poison::{failure, panic_message};
use crate::topology::context::{ClosingPoison, Ctx};
use crate::topology::describe::NodeKind;
use crate::topology::{FinalSwitch, TopologyInner};

/// Whether a windowed aggregation emits final results only: set while the topology is
/// written (by `emit_strategy` before the aggregation, or `suppress` after it) and read
/// by its processors as batches run.
#[derive(Clone, Default)]
pub(crate) struct FinalResults(Arc<AtomicBool>);

impl FinalResults {
    /// Whether the aggregation emits once per window, when it closes.
    pub(crate) fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Turns final results on.
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Registers `switch` as how the aggregation whose table's updates are `updates` switches
/// to final results, and runs it now when `emit` asks for them.
pub(crate) fn register_final<K, V>(
    shared: &Shared,
    updates: &Downstream<K, V>,
    emit: EmitStrategy,
    switch: FinalSwitch,
) where
    K: Clone,
    V: Clone,
{
    let mut inner = lock(shared);
    if emit == EmitStrategy::OnWindowClose {
        switch(&mut inner);
    }
    inner.finals.insert(updates.id(), switch);
}

/// The switch of the table whose updates are `from`, for the table derived from it whose
/// updates are `to` by a step that keeps its windows (a reduce's flattening).
pub(crate) fn alias_final<K, V, K2, V2>(
    shared: &Shared,
    from: &Downstream<K, V>,
    to: &Downstream<K2, V2>,
) where
    K: Clone,
    V: Clone,
    K2: Clone,
    V2: Clone,
{
    let mut inner = lock(shared);
    if let Some(switch) = inner.finals.get(&from.id()).cloned() {
        inner.finals.insert(to.id(), switch);
    }
}

/// How a suppressed table emits, as Kafka Streams' `Suppressed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suppressed {
    _final_results: (),
}

impl Suppressed {
    /// The final result of each window, once, when it closes: Kafka Streams'
    /// `Suppressed.untilWindowCloses(BufferConfig.unbounded())`. The buffer is the
    /// aggregation's state in the store, so it has no bound to configure.
    pub fn until_window_closes() -> Self {
        Suppressed { _final_results: () }
    }
}

impl<K, V> KTable<Windowed<K>, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The windowed aggregation's final results, as Kafka Streams'
    /// `suppress(Suppressed.untilWindowCloses(unbounded()))`: each window (or session) once,
    /// with its final value and Kafka Streams' timestamp, when the low watermark passes its
    /// end plus grace, and no intermediate update. Here it is the aggregation's
    /// [`EmitStrategy::OnWindowClose`] (the state in the store is the buffer): the same
    /// records, costs and delivery (docs/state.md, "Emit on window close").
    ///
    /// Taken directly on the table of a windowed `count`, `aggregate` or `reduce` (time,
    /// session or sliding windows), whose updates nothing else reads. Anywhere else
    /// [`StreamsBuilder::build`](crate::StreamsBuilder::build) refuses the topology, naming
    /// the suppress operator: a table derived with `filter` or `map_values` (suppress first,
    /// then derive), a table that is not a windowed aggregation's, or an aggregation whose
    /// updates are also read unsuppressed (two aggregations, one suppressed).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::{Suppressed, TimeWindows};
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("clicks", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(10)))
    ///     .count("clicks-per-10s")
    ///     .suppress(Suppressed::until_window_closes())
    ///     .to_stream()
    ///     .map(|w, n| (format!("{}@{}", w.key, w.start), n))
    ///     .to("final-clicks", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut clicks = driver.input_topic("clicks", Utf8, Utf8);
    /// let mut out = driver.output_topic("final-clicks", Utf8, DecimalI64);
    /// clicks.pipe_input_with_timestamp("u1", "a".to_owned(), 1_000)?;
    /// clicks.pipe_input_with_timestamp("u1", "b".to_owned(), 2_000)?;
    /// assert!(out.read_key_values()?.is_empty()); // [0, 10 s) is open
    /// clicks.pipe_input_with_timestamp("u2", "c".to_owned(), 10_000)?;
    /// assert_eq!(out.read_key_values()?, [("u1@0".to_owned(), 2)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn suppress(&self, suppressed: Suppressed) -> KTable<Windowed<K>, V> {
        let _ = suppressed;
        let updates = self.updates();
        let mut inner = lock(&self.shared);
        let node = inner.description.add_node(
            "KTABLE-SUPPRESS",
            NodeKind::Processor { stores: Vec::new() },
            &self.nodes,
        );
        let name = inner.description.name(node).to_owned();
        match inner.finals.get(&updates.id()).cloned() {
            Some(switch) if updates.readers() == 0 => switch(&mut inner),
            Some(_) => inner.refused.push(read_twice(name)),
            None => inner.refused.push(TopologyError::new(
                name,
                "suppress(untilWindowCloses) is given a table that is not a windowed \
                 aggregation's own (a table derived with filter or map_values, or one \
                 that is not windowed): the final results are those of a windowed \
                 aggregation's state"
                    .into(),
                "call suppress on the table a windowed count, aggregate or reduce returns \
                 (then filter or map it), or use `emit_strategy(EmitStrategy::OnWindowClose)`",
            )),
        }
        let reads = updates.clone();
        inner
            .suppressions
            .push((node, Box::new(move || reads.readers())));
        drop(inner);
        let (next, deletes) = (Downstream::new(), Downstream::new());
        let out = next.clone();
        updates.add(Arc::new(move |ctx, key, value| {
            out.forward(ctx, key, value)
        }));
        let removed = deletes.clone();
        self.deletes()
            .add(Arc::new(move |ctx, key, ()| removed.forward(ctx, key, ())));
        KTable::from_nodes(self.shared.clone(), next, vec![node]).with_deletes(deletes)
    }
}

/// The refusal of a suppressed aggregation whose updates are also read unsuppressed.
fn read_twice(operator: String) -> TopologyError {
    TopologyError::new(
        operator,
        "suppress(untilWindowCloses) is given a windowed aggregation whose updates are also \
         read without it; its final results come from the aggregation itself, so those \
         readers would get final results too"
            .into(),
        "aggregate twice, into two stores, and suppress one of them",
    )
}

/// The build's check of the suppressed tables: the first refusal recorded while the
/// topology was written, or a suppressed aggregation whose updates something else reads.
pub(crate) fn check(inner: &TopologyInner) -> Result<(), TopologyError> {
    if let Some(refused) = inner.refused.first() {
        return Err(refused.clone());
    }
    for (node, readers) in &inner.suppressions {
        if readers() > 1 {
            return Err(read_twice(inner.description.name(*node).to_owned()));
        }
    }
    Ok(())
}

/// Emits one final result in a closing pass (`emit`: through the aggregation's downstream
/// operators). A failure of user code there (a panic, a user error) is a poison record of
/// `at`, the record that last changed the session or window (`(topic-partition, offset)`):
/// its outputs are taken back and the batch's poison policy decides (`Ctx::closing_poison`:
/// `fail` fails the batch naming it; `skip` and `dead-letter` go on, the dead letter holding
/// `key` and `value`), so that no key's final result stops every batch. Without a record to
/// blame (an item written before records were kept), the batch fails.
pub(crate) fn emit_final(
    ctx: &mut Ctx,
    at: Option<&(String, i64)>,
    key: &[u8],
    value: Option<Vec<u8>>,
    timestamp: i64,
    emit: impl FnOnce(&mut Ctx) -> Result<(), StreamError>,
) -> Result<(), StreamError> {
    let before = ctx.outputs.len();
    let result = catch_unwind(AssertUnwindSafe(|| emit(ctx)));
    let blamed = at.and_then(|(tp, offset)| {
        let (topic, partition) = tp.rsplit_once('-')?;
        Some((TopicPartition::new(topic, partition.parse().ok()?), *offset))
    });
    let Some((tp, offset)) = blamed else {
        return result.unwrap_or_else(|panic| {
            Err(StreamError::Config(format!(
                "user code panicked on a final result: {}",
                panic_message(panic.as_ref())
            )))
        });
    };
    if let Some(error) = failure(result, &tp, offset)? {
        ctx.outputs.truncate(before);
        ctx.closing_poison.push(ClosingPoison {
            error,
            tp,
            offset,
            key: key.to_vec(),
            value,
            timestamp,
        });
    }
    Ok(())
}
