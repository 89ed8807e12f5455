//! The order of a batch's steps, derived from the topology's graph when it is built.
//!
//! A batch first takes every record through the stateless operators; what reaches an
//! aggregation is folded in memory per state item, and what reaches a join waits there
//! for the table's value of its key. Then each store is written once, and the records
//! waiting at a join go on once the joined store has been written. The records that go on
//! may reach another store (an aggregation of joined records) or another join (a chain of
//! joins), and a store's updates flow on after its write, into other stores and joins. So
//! the stores are written in an order in which every store comes after all of its
//! *feeders*: the stores whose updates, or whose joins, lie upstream of its aggregation.
//! That order is a topological order of the feeder graph, computed here; a cycle in it
//! (a store that would feed itself in one batch) is refused at build.
//!
//! The same walk refuses the shapes a batch cannot run exactly once:
//!
//! - **A table's update stream aggregated** (`table.to_stream().group_by_key().count()`,
//!   `to_table`, a count of a count): a batch emits one update per key per batch, where
//!   Kafka Streams (record at a time, without caching) emits one per input record, so what
//!   an aggregation of updates folds depends on batch boundaries; and an update has no
//!   source record whose watermark would apply it once (design notes, section 4). One
//!   exception, under exactly-once output: a table–table join's decision store
//!   ([`Roles::decides`]), whose writes are attributed to the outbox entries of the
//!   updates that feed it, and whose fold keeps the decision of the newest states.
//! - **A table's update stream repartitioned or buffered by a stream–stream join**: both
//!   need each record's source coordinates, which an update does not have.
//! - **A join of an emit-on-close window's updates** (time windows, sessions, sliding
//!   windows): those updates are emitted after the batch's joins, when the window closes.
//!
//! One more thing the walk finds: a **repartition topic fed by records that waited at
//! different joins** (records that waited at a stream–table join merged with records that
//! did not, or with records that waited at other joins). The records of each group go on
//! when their join's store has been written, so one group reaches the topic after the
//! other, not in offset order, while a hop's exactly-once rule needs offset order per source
//! partition (`dsl::repartition`: a record produced after a later one of its partition is
//! taken for a copy and dropped). For such a topology the batch puts its repartition records
//! back in source order before it sends them ([`WriteOrder::sort_hops`]).
//!
//! And for exactly-once output: the sinks fed by a store's updates from its write (through
//! stateless operators and stream–table joins), whose stores keep the outbox of updates
//! ([`WriteOrder::outboxed`]), and the sinks of records with no source record the outbox
//! and the claims do not cover, which exactly-once output refuses
//! ([`WriteOrder::unsourced_sinks`]).

use std::collections::{BTreeMap, BTreeSet};

use super::StoreSpec;
use super::describe::{Graph, NodeId};
use crate::error::TopologyError;

/// What the nodes of the graph do with state, as the DSL declares it.
#[derive(Debug, Default)]
pub(crate) struct Roles {
    /// Aggregation nodes, and the store (by index) each writes.
    pub(crate) writes: BTreeMap<NodeId, usize>,
    /// Join nodes, and the stores their records wait at (read after the store's write).
    pub(crate) reads: BTreeMap<NodeId, BTreeSet<usize>>,
    /// Nodes that need source records (their coordinates), and what they are, for errors.
    pub(crate) records_only: BTreeMap<NodeId, &'static str>,
    /// Nodes that need the records of each source partition in offset order (repartition
    /// topics' sinks).
    pub(crate) in_order: BTreeSet<NodeId>,
    /// Left and outer stream–stream joins, and their store: besides the records of the
    /// batch, they emit the records whose window closed in the closing pass at the end of
    /// the batch, after every write, with no source record.
    pub(crate) closes: BTreeMap<NodeId, usize>,
    /// Under exactly-once output, the aggregations that decide a table–table join's
    /// result per key (`dsl::join`): fed by the two tables' updates, each attributed to
    /// the event record its outbox entry is kept under, so that the decision is made once.
    pub(crate) decides: BTreeSet<NodeId>,
    /// Stream–table joins (`KStream::join`, `left_join` with a table): each record looks
    /// up the table's value of its key after the table's write and goes on alone, so a
    /// table's update that waits there goes on in its outbox entry's transaction.
    pub(crate) lookups: BTreeSet<NodeId>,
}

impl Roles {
    /// Declares that `node` writes store `store`.
    pub(crate) fn write(&mut self, node: NodeId, store: usize) {
        self.writes.insert(node, store);
    }

    /// Declares that records at `node` wait for store `store`'s value of their key.
    pub(crate) fn read(&mut self, node: NodeId, store: usize) {
        self.reads.entry(node).or_default().insert(store);
    }

    /// Declares that `node` needs source records (`what` names it in errors).
    pub(crate) fn records_only(&mut self, node: NodeId, what: &'static str) {
        self.records_only.insert(node, what);
    }

    /// Declares that `node` needs each source partition's records in offset order.
    pub(crate) fn in_order(&mut self, node: NodeId) {
        self.in_order.insert(node);
    }

    /// Declares that `node` also emits in the closing pass of store `store`.
    pub(crate) fn closes(&mut self, node: NodeId, store: usize) {
        self.closes.insert(node, store);
    }

    /// Declares that `node` decides a table–table join's result from the updates of the
    /// two tables (see [`Roles::decides`]).
    pub(crate) fn decides(&mut self, node: NodeId) {
        self.decides.insert(node);
    }

    /// Declares that `node` is a stream–table join (see [`Roles::lookups`]).
    pub(crate) fn lookup(&mut self, node: NodeId) {
        self.lookups.insert(node);
    }
}

/// What flows out of a node, as far as ordering is concerned.
#[derive(Debug, Clone, Default)]
struct Flow {
    /// The stores that must be written (and their joins resumed) before a record leaves it.
    after: BTreeSet<usize>,
    /// When its records are a table's updates: the store whose updates they are.
    updates_of: Option<usize>,
    /// When its records are updates of an emit-on-close store: that store.
    on_close_of: Option<usize>,
    /// Every store whose updates its records may be, and whether some of them waited at
    /// a join on the way (then they are emitted after the store's write, at the join).
    update_stores: BTreeSet<usize>,
    updates_via_join: bool,
    /// The stores whose updates its records may be after a stream–table join (each
    /// update joined with the table's value of its key, alone).
    looked_up: BTreeSet<usize>,
    /// When its records may come from the closing pass of a left or outer stream–stream
    /// join: that join's store.
    closing_of: Option<usize>,
    /// The ways its records may have come since their source: per way, the stores of the
    /// joins they waited at, in order. Records of different ways go on at different steps
    /// of the batch, so they leave the node out of offset order.
    ways: BTreeSet<Vec<usize>>,
}

/// What the build derives for the batches of a topology.
#[derive(Debug, Default)]
pub(crate) struct WriteOrder {
    /// The order in which a batch writes the stores (indices into `stores`).
    pub(crate) stores: Vec<usize>,
    /// Whether a repartition topic is fed by records that waited at different joins, so
    /// that a batch must put its repartition records back in source order before sending
    /// them (see the module documentation).
    pub(crate) sort_hops: bool,
    /// The sinks that produce records with no source record whose transaction they could
    /// go in, neither kept in an outbox nor claimed: under `exactly_once`, the topology is
    /// refused with the first of these. Since stores' updates (also merged, also through
    /// stream–table joins), closes and closing passes are all covered, what is left is a
    /// table–table join of a topology built for at-least-once output, checked under
    /// exactly-once output (it emits straight from the two tables' writes).
    pub(crate) unsourced_sinks: Vec<TopologyError>,
    /// The stores whose updates reach a sink from their write (through stateless operators
    /// and stream–table joins): under exactly-once output they keep the outbox of updates
    /// (`state::outbox`), and their updates go in the transaction of the record that made
    /// them.
    pub(crate) outboxed: BTreeSet<usize>,
    /// Of those, the stores whose updates feed a table–table join's decision store
    /// ([`Roles::decides`]): their updates go on with the item's state the entry holds.
    pub(crate) decision_inputs: BTreeSet<usize>,
}

/// The order in which a batch writes the stores (indices into `stores`): every store after
/// all of its feeders. Refuses a cycle, and the shapes the module documentation lists.
pub(crate) fn write_order(
    graph: &Graph,
    roles: &Roles,
    stores: &[StoreSpec],
) -> Result<WriteOrder, TopologyError> {
    let mut walk = Walk {
        graph,
        roles,
        stores,
        flows: vec![None; graph.len()],
        visiting: vec![false; graph.len()],
        feeders: vec![BTreeSet::new(); stores.len()],
        writer: vec![None; stores.len()],
        sort_hops: false,
        unsourced_sinks: Vec::new(),
        outboxed: BTreeSet::new(),
        decision_inputs: BTreeSet::new(),
    };
    for node in 0..graph.len() {
        walk.flow(node)?;
    }
    let Walk {
        feeders,
        writer,
        sort_hops,
        unsourced_sinks,
        outboxed,
        decision_inputs,
        ..
    } = walk;
    let name = |store: usize| {
        writer[store].map_or_else(|| stores[store].name.clone(), |n| graph.name(n).to_owned())
    };
    // Kahn's algorithm, the lowest index first among the stores that are ready, so that
    // independent stores keep the order they were declared in.
    let mut remaining: Vec<BTreeSet<usize>> = feeders.clone();
    let mut order = Vec::with_capacity(stores.len());
    let mut done = vec![false; stores.len()];
    while order.len() < stores.len() {
        let Some(next) = (0..stores.len()).find(|&s| !done[s] && remaining[s].is_empty()) else {
            let stuck = (0..stores.len()).find(|&s| !done[s]).unwrap_or_default();
            return Err(TopologyError::new(
                name(stuck),
                format!(
                    "store {:?} is fed, within one batch, by its own updates or joins \
                     (a cycle through the stores {:?})",
                    stores[stuck].name,
                    (0..stores.len())
                        .filter(|&s| !done[s])
                        .map(|s| stores[s].name.as_str())
                        .collect::<Vec<_>>()
                ),
                "break the cycle with a topic: produce the updates with `to` and read them \
                 with `builder.stream` or `builder.table` in another sub-topology",
            ));
        };
        done[next] = true;
        order.push(next);
        for r in &mut remaining {
            r.remove(&next);
        }
    }
    Ok(WriteOrder {
        stores: order,
        sort_hops,
        unsourced_sinks,
        outboxed,
        decision_inputs,
    })
}

/// The walk over the graph that computes each node's [`Flow`] from its parents'.
struct Walk<'a> {
    graph: &'a Graph,
    roles: &'a Roles,
    stores: &'a [StoreSpec],
    flows: Vec<Option<Flow>>,
    visiting: Vec<bool>,
    /// Per store: the stores that must be written before it.
    feeders: Vec<BTreeSet<usize>>,
    /// Per store: the node that writes it.
    writer: Vec<Option<NodeId>>,
    /// Whether a node that needs offset order is fed by records of different ways.
    sort_hops: bool,
    /// See [`WriteOrder::unsourced_sinks`].
    unsourced_sinks: Vec<TopologyError>,
    /// See [`WriteOrder::outboxed`].
    outboxed: BTreeSet<usize>,
    /// See [`WriteOrder::decision_inputs`].
    decision_inputs: BTreeSet<usize>,
}

impl Walk<'_> {
    /// Whether `store` closes on its content in its own closing pass without being a
    /// join's buffer: a session or sliding window emitted on close, whose closing pass
    /// claims its rewrites under exactly-once output.
    fn closes_on_content(&self, store: usize) -> bool {
        self.stores[store]
            .closing
            .as_ref()
            .is_some_and(|c| c.close.is_some())
            && !self.roles.closes.values().any(|&s| s == store)
    }

    /// Whether `store`'s updates straight from its write are exactly once through its
    /// outbox: no closing pass, not emitted on close.
    fn outboxable(&self, store: usize) -> bool {
        let spec = &self.stores[store];
        spec.closing.is_none() && spec.emit_on_close.is_none()
    }

    /// Whether `store` emits on close and claims each close before it is emitted: a time
    /// window (the claim register), or a session or sliding window store (its closing
    /// pass's rewrite).
    fn claims_its_closes(&self, store: usize) -> bool {
        let spec = &self.stores[store];
        let time_window = spec.emit_on_close.is_some()
            && !spec.fans_out
            && spec.closing.as_ref().is_none_or(|c| c.close.is_none());
        time_window || self.closes_on_content(store)
    }

    fn flow(&mut self, node: NodeId) -> Result<Flow, TopologyError> {
        if let Some(flow) = &self.flows[node] {
            return Ok(flow.clone());
        }
        let name = self.graph.name(node).to_owned();
        if std::mem::replace(&mut self.visiting[node], true) {
            return Err(TopologyError::new(
                name,
                "the operator reads, within one batch, records it emits itself (a cycle)".into(),
                "break the cycle with a topic read in another sub-topology",
            ));
        }
        let mut input = Flow::default();
        for &parent in self.graph.parents(node) {
            let flow = self.flow(parent)?;
            input.after.extend(flow.after);
            input.updates_of = input.updates_of.or(flow.updates_of);
            input.on_close_of = input.on_close_of.or(flow.on_close_of);
            input.closing_of = input.closing_of.or(flow.closing_of);
            input.ways.extend(flow.ways);
            input.update_stores.extend(flow.update_stores);
            input.updates_via_join |= flow.updates_via_join;
            input.looked_up.extend(flow.looked_up);
        }
        if self.graph.parents(node).is_empty() {
            // A source: its records come in offset order, from no join.
            input.ways.insert(Vec::new());
        }
        let store_name = |s: usize| self.stores[s].name.as_str();
        if let Some(join) = input.closing_of {
            let what = if self.roles.writes.contains_key(&node) {
                Some("an aggregation")
            } else if let Some(what) = self.roles.records_only.get(&node) {
                Some(*what)
            } else if self.roles.reads.contains_key(&node) {
                Some("a join")
            } else {
                None
            };
            if let Some(what) = what {
                return Err(TopologyError::new(
                    name,
                    format!(
                        "{what} is given the output of the join of store {:?}, which emits \
                         records in a closing pass after the batch's writes (a left or outer \
                         stream–stream join's records that joined nothing, a stream–table \
                         join's records held for its grace period), with no source record \
                         to apply them exactly once",
                        store_name(join)
                    ),
                    "produce the join's output with `to` and read that topic with \
                     `builder.stream` in another sub-topology",
                ));
            }
        }
        let flow = if let Some(&store) = self.roles.writes.get(&node) {
            if self.roles.decides.contains(&node) {
                // A table–table join's decision: its inputs are the two tables' updates,
                // each attributed to the event record of its outbox entry, so the tables
                // keep the outbox.
                self.outboxed.extend(input.update_stores.iter().copied());
                self.decision_inputs
                    .extend(input.update_stores.iter().copied());
            } else if let Some(table) = input.updates_of {
                return Err(TopologyError::new(
                    name,
                    format!(
                        "it aggregates into store {:?} the update stream of the table in store \
                         {:?}; a batch emits one update per key per batch (Kafka Streams one \
                         per input record), so the result would depend on batch boundaries, \
                         and an update has no source record to apply it exactly once",
                        store_name(store),
                        store_name(table)
                    ),
                    "aggregate the stream that feeds that table (group it and \
                     aggregate), or use the table itself (`KTable::map_values`, `filter`, \
                     joins) for its latest value per key",
                ));
            }
            if input.after.contains(&store) {
                return Err(TopologyError::new(
                    name,
                    format!(
                        "store {:?} is fed, within one batch, by its own updates or joins \
                         (a cycle)",
                        store_name(store)
                    ),
                    "break the cycle with a topic read in another sub-topology",
                ));
            }
            self.feeders[store].extend(input.after.iter().copied());
            self.writer[store] = Some(node);
            let mut after = input.after;
            after.insert(store);
            // Time windows emitted on close, and sessions and sliding windows emitted on
            // close (in their closing pass): both emit after the batch's joins have run.
            let on_close =
                self.stores[store].emit_on_close.is_some() || self.closes_on_content(store);
            Flow {
                after,
                // Updates, one per item after its write (what takes updates is refused above).
                ways: BTreeSet::from([Vec::new()]),
                updates_of: Some(store),
                update_stores: BTreeSet::from([store]),
                updates_via_join: false,
                looked_up: BTreeSet::new(),
                on_close_of: if on_close {
                    Some(store)
                } else {
                    input.on_close_of
                },
                closing_of: input.closing_of,
            }
        } else {
            if let (Some(what), Some(table)) =
                (self.roles.records_only.get(&node), input.updates_of)
            {
                return Err(TopologyError::new(
                    name,
                    format!(
                        "{what} takes source records, and it is given the update stream of \
                         the table in store {:?} (an update has no source coordinates)",
                        store_name(table)
                    ),
                    "apply it to the stream that feeds that table, or produce the \
                     updates with `to` and read that topic with `builder.stream`",
                ));
            }
            let reads = self.roles.reads.get(&node);
            if let (Some(_), Some(windows)) = (reads, input.on_close_of) {
                return Err(TopologyError::new(
                    name,
                    format!(
                        "it joins the updates of store {:?}, which emits once per window when \
                         the window closes, after the batch's joins have run",
                        store_name(windows)
                    ),
                    "emit the windows on every update (`EmitStrategy::OnWindowUpdate`), or \
                     produce them with `to` and join that topic in another sub-topology",
                ));
            }
            if self.graph.is_sink(node) {
                let straight = |store: usize| {
                    !input.updates_via_join
                        && input.looked_up.is_empty()
                        && input.update_stores.len() == 1
                        && input.closing_of.is_none()
                        && !self.stores[store].fans_out
                };
                let from = match (input.updates_of, input.closing_of) {
                    // Straight from several stores, merged: each store's outbox makes its own
                    // updates exactly once, in the transaction of its write's record (a
                    // session or sliding window store's entry holds the state its write
                    // left, as alone), and each store emitting on close claims its closes
                    // as alone (a time window's in the claim register, a session's or
                    // sliding window's in its closing pass's rewrite), whatever else the
                    // sink is given: a stream–stream or grace join's output among them
                    // (what an arrival emits is kept with its record, what the closing
                    // pass emits claimed by its rewrite). A key's versions are then per
                    // store (`docs/state.md`, "Exactly-once output").
                    // Updates that waited at a stream–table join among them go on in
                    // their outbox entry's transaction (what a close would meet there is
                    // refused at the join).
                    (Some(_), _)
                        if (input.update_stores.len() > 1 || input.closing_of.is_some())
                            && !input.updates_via_join
                            && input.looked_up.iter().all(|&s| self.outboxable(s))
                            && input
                                .update_stores
                                .iter()
                                .all(|&s| self.outboxable(s) || self.claims_its_closes(s)) =>
                    {
                        let outboxed = input.update_stores.iter().copied();
                        self.outboxed
                            .extend(outboxed.filter(|&s| self.outboxable(s)).collect::<Vec<_>>());
                        None
                    }
                    // A time window's close straight from its store: claimed before it is
                    // emitted (`Topology::claim_and_close_windows`), so exactly once.
                    (Some(store), _)
                        if input.on_close_of == Some(store)
                            && straight(store)
                            && self.stores[store]
                                .closing
                                .as_ref()
                                .is_none_or(|c| c.close.is_none()) =>
                    {
                        None
                    }
                    // A session's or sliding window's close straight from its store: the
                    // closing pass claims its rewrites (`runtime::claims`), so exactly once.
                    (Some(store), _)
                        if !input.updates_via_join
                            && input.looked_up.is_empty()
                            && input.update_stores.len() == 1
                            && input.closing_of.is_none()
                            && self.closes_on_content(store) =>
                    {
                        None
                    }
                    (Some(store), _) if input.on_close_of == Some(store) => Some(format!(
                        "the windows of store {:?} when they close (through a join or merged \
                         with another store's records)",
                        store_name(store)
                    )),
                    // Straight from one store's write: its outbox makes them exactly once
                    // (a session or sliding window store's entry holds the state its write
                    // left, from which the updates of that write alone are derived). Also
                    // through stream–table joins: an update that waits at one goes on in
                    // the transaction of its outbox entry's record, joined with the table's
                    // value as the attempt that commits reads it.
                    (Some(store), _)
                        if !input.updates_via_join
                            && input.update_stores.len() == 1
                            && input.closing_of.is_none()
                            && self.stores[store].closing.is_none()
                            && (input.looked_up.is_empty() || self.outboxable(store)) =>
                    {
                        self.outboxed.insert(store);
                        None
                    }
                    (Some(store), _) if self.stores[store].closing.is_some() => Some(format!(
                        "the closing pass of store {:?} (sessions or sliding windows emitted \
                         when they close, through a join or merged with another store's \
                         records, or a stream–stream join's buffer)",
                        store_name(store)
                    )),
                    (Some(store), _) if self.stores[store].fans_out => Some(format!(
                        "the sessions or sliding windows of store {:?} that a batch's \
                         records changed, through a table–table join",
                        store_name(store)
                    )),
                    (Some(store), _) => Some(format!(
                        "the updates of the table in store {:?} through a table–table join \
                         of a topology built for at-least-once output (such a join emits \
                         straight from the two tables' writes; a topology built for \
                         exactly-once output, by \
                         `StreamsBuilder::output_guarantee(OutputGuarantee::ExactlyOnce)` \
                         before `build` or by LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once \
                         set when `StreamsBuilder::new` runs, decides its results in a \
                         store of their own)",
                        store_name(store)
                    )),
                    // The closing pass of a left or outer stream–stream join (its records
                    // that joined nothing) or of a grace join (its held records), through
                    // stateless operators: the pass's rewrite of the join's item claims
                    // what it emits (`runtime::claims`), dead letters among them, so
                    // exactly once. What an arrival emits is kept in the item with the
                    // record that emits it, in that record's transaction (as an inner
                    // join's pairs).
                    (None, Some(_)) => None,
                    (None, None) => None,
                };
                if let Some(from) = from {
                    self.unsourced_sinks.push(TopologyError::new(
                        name.clone(),
                        format!(
                            "under LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once, it produces {from}, \
                             which have no source record whose partition's transaction they \
                             could go in (the outbox of aggregate updates covers a store's \
                             updates straight from its write only)"
                        ),
                        "use the at_least_once output guarantee for this topology (its state \
                         stays exactly once; downstream de-duplicates by key and the \
                         lambda-streams-version header), or produce only records of the \
                         source streams",
                    ));
                }
            }
            if self.roles.in_order.contains(&node) && input.ways.len() > 1 {
                self.sort_hops = true;
            }
            let mut after = input.after;
            after.extend(reads.into_iter().flatten().copied());
            let ways = match reads {
                Some(reads) => input
                    .ways
                    .into_iter()
                    .map(|mut way| {
                        way.extend(reads.iter().copied());
                        way
                    })
                    .collect(),
                None => input.ways,
            };
            let lookup = self.roles.lookups.contains(&node);
            let mut looked_up = input.looked_up;
            if lookup && input.updates_of.is_some() {
                looked_up.extend(input.update_stores.iter().copied());
            }
            Flow {
                after,
                ways,
                update_stores: input.update_stores,
                updates_via_join: input.updates_via_join
                    || (reads.is_some() && input.updates_of.is_some() && !lookup),
                looked_up,
                updates_of: input.updates_of,
                on_close_of: input.on_close_of,
                closing_of: self.roles.closes.get(&node).copied().or(input.closing_of),
            }
        };
        self.visiting[node] = false;
        self.flows[node] = Some(flow.clone());
        Ok(flow)
    }
}
