//! Plans (random topologies as enum trees), the user functions they name, the inputs,
//! and how a plan is built with the real DSL.

use std::collections::HashMap;
use std::time::Duration;

use lambda_streams::dsl::{
    EmitStrategy, Grouped, JoinWindows, KGroupedStream, KStream, KTable, SessionWindows,
    SlidingWindows, TimeWindows,
};
use lambda_streams::serdes::{DecimalI64, Nullable, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// Keys of every stream: nullable strings.
pub type K = Option<String>;
/// Values of every stream: nullable numbers.
pub type V = Option<i64>;

/// Partitions of every topic (input and repartition).
pub const PARTITIONS: i32 = 3;

/// The key space of the inputs.
pub const KEYS: &[&str] = &["a", "b", "c", "d"];

/// A splitmix64 step.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small deterministic random generator (splitmix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    /// True with `percent` % probability.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }
}

/// A record predicate.
#[derive(Debug, Clone, Copy)]
pub enum Pred {
    ValueAbove(i64),
    KeyNot(&'static str),
    HasValue,
    EvenValue,
}

impl Pred {
    pub fn test(self, k: &K, v: &V) -> bool {
        match self {
            Pred::ValueAbove(t) => v.is_some_and(|x| x > t),
            Pred::KeyNot(s) => k.as_deref() != Some(s),
            Pred::HasValue => v.is_some(),
            Pred::EvenValue => v.is_some_and(|x| x % 2 == 0),
        }
    }
    fn random(rng: &mut Rng) -> Self {
        match rng.below(4) {
            0 => Pred::ValueAbove(rng.range(-2, 12)),
            1 => Pred::KeyNot(rng.pick(KEYS)),
            2 => Pred::HasValue,
            _ => Pred::EvenValue,
        }
    }
}

/// A value mapper.
#[derive(Debug, Clone, Copy)]
pub enum ValFn {
    Add(i64),
    Mul(i64),
    OrZero,
    Halve,
}

impl ValFn {
    pub fn apply(self, v: V) -> V {
        match self {
            ValFn::Add(c) => v.map(|x| x + c),
            ValFn::Mul(c) => v.map(|x| x * c),
            ValFn::OrZero => Some(v.unwrap_or(0)),
            ValFn::Halve => v.map(|x| x.div_euclid(2)),
        }
    }
    fn random(rng: &mut Rng) -> Self {
        match rng.below(4) {
            0 => ValFn::Add(rng.range(-3, 3)),
            1 => ValFn::Mul(rng.range(-2, 3)),
            2 => ValFn::OrZero,
            _ => ValFn::Halve,
        }
    }
}

/// A key mapper (for `select_key`, `map` and `group_by`).
#[derive(Debug, Clone, Copy)]
pub enum KeyFn {
    Const(&'static str),
    ByValueMod(i64),
    Suffix(&'static str),
    NullIfA,
}

impl KeyFn {
    pub fn apply(self, k: &K, v: &V) -> K {
        match self {
            KeyFn::Const(s) => Some(s.to_owned()),
            KeyFn::ByValueMod(m) => v.map(|x| format!("m{}", x.rem_euclid(m))),
            KeyFn::Suffix(s) => k.as_ref().map(|k| format!("{k}{s}")),
            KeyFn::NullIfA => k.clone().filter(|k| k != "a"),
        }
    }
    fn random(rng: &mut Rng) -> Self {
        match rng.below(4) {
            0 => KeyFn::Const(rng.pick(KEYS)),
            1 => KeyFn::ByValueMod(rng.range(2, 4)),
            2 => KeyFn::Suffix(rng.pick(&["x", "y"])),
            _ => KeyFn::NullIfA,
        }
    }
}

/// `flat_map_values`: `n` copies, the i-th valued `3v + i`.
pub fn flat(n: u8, v: V) -> Vec<V> {
    (0..i64::from(n)).map(|i| v.map(|x| x * 3 + i)).collect()
}

/// Stream–table joiner.
pub fn stream_joiner(v: V, t: Option<i64>) -> V {
    Some(v.unwrap_or(0) + 1000 * t.unwrap_or(-1))
}

/// The user function of [`S::TryMapValues`]: fails on the value `Some(bad)`, else adds 1.
pub fn try_add_one(bad: i64, v: V) -> Result<V, String> {
    match v {
        Some(x) if x == bad => Err(format!("the user function refuses {x}")),
        v => Ok(v.map(|x| x + 1)),
    }
}

/// The kind of a stream–stream join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Outer,
}

/// Stream–stream joiner: both sides (a missing side, of a left or outer join's record
/// emitted alone, as a sentinel).
pub fn stream_stream_joiner(l: Option<i64>, r: Option<i64>) -> V {
    Some(l.unwrap_or(777) * 1000 + r.unwrap_or(555))
}

/// Table–table joiner.
pub fn table_joiner(a: i64, b: Option<i64>) -> i64 {
    a * 100 + b.unwrap_or(-7)
}

/// A stream.
#[derive(Debug, Clone)]
pub enum S {
    /// Input topic `s<i>`.
    Source(usize),
    Filter(Box<S>, Pred),
    MapValues(Box<S>, ValFn),
    SelectKey(Box<S>, KeyFn),
    Map(Box<S>, KeyFn, ValFn),
    FlatMapValues(Box<S>, u8),
    Merge(Box<S>, Box<S>),
    /// `split()`: one branch with the predicate and the default branch; `true` takes the branch.
    Split(Box<S>, Pred, bool),
    /// One branch of a `split()` with a branch per predicate (in order: a record goes to
    /// the first whose predicate it matches) and a default branch (`take == preds.len()`).
    /// Every `Branch` of the same stream and predicates is a branch of one split node.
    Branch {
        of: Box<S>,
        preds: Vec<Pred>,
        take: usize,
    },
    Repartition(Box<S>),
    /// Stream–table join; `true`: left join.
    Join(Box<S>, Box<T>, bool),
    /// A table's update stream (values `Some`).
    ToStream(Box<T>),
    /// `try_map_values` with [`try_add_one`]: the records it fails on are poison records.
    TryMapValues(Box<S>, i64),
    /// Stream–stream join of the records with a key and a value of both sides, within
    /// `JoinWindows::of(difference).before(before).grace(grace)`: a right record joins a
    /// left one at `t` from `t - before` to `t + difference`.
    StreamJoin {
        left: Box<S>,
        right: Box<S>,
        kind: JoinKind,
        difference: i64,
        before: i64,
        grace: i64,
    },
    /// Stream–table join with the versioned table of input topic `t<table>` (under `op`),
    /// read as of each record's timestamp; with a grace period when `grace` is set.
    VersionedJoin {
        stream: Box<S>,
        table: usize,
        op: VOp,
        left: bool,
        grace: Option<i64>,
    },
}

/// A table operator over a versioned table (its value as of a time passes through it).
#[derive(Debug, Clone, Copy)]
pub enum VOp {
    None,
    /// `map_values(v + c)`.
    Add(i64),
    /// `filter(v > c)`.
    Above(i64),
}

impl VOp {
    pub fn apply(self, v: i64) -> Option<i64> {
        match self {
            VOp::None => Some(v),
            VOp::Add(c) => Some(v + c),
            VOp::Above(c) => (v > c).then_some(v),
        }
    }
}

/// How a stream is grouped.
#[derive(Debug, Clone, Copy)]
pub enum Group {
    Key,
    /// `group_by` with `Grouped::with` (repartition when the updates go to a topic).
    With(KeyFn),
    /// `group_by` with `Grouped::direct`.
    Direct(KeyFn),
}

impl Group {
    pub fn key(self, k: &K, v: &V) -> K {
        match self {
            Group::Key => k.clone(),
            Group::With(f) | Group::Direct(f) => f.apply(k, v),
        }
    }
}

/// An aggregation: count, sum (`aggregate`), max (`reduce` over non-null values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agg {
    Count,
    Sum,
    Max,
}

/// A table (all valued `i64`).
#[derive(Debug, Clone)]
pub enum T {
    /// `builder.table` of input topic `t<i>`.
    Source(usize),
    Agg(Box<S>, Group, Agg),
    /// `to_table` of the non-null values.
    ToTable(Box<S>),
    /// Table–table join; `true`: left join.
    Join(Box<T>, Box<T>, bool),
    MapValues(Box<T>, i64),
    /// Keeps the values above the bound.
    Filter(Box<T>, i64),
}

/// Windows: tumbling (size) or hopping (size, advance), in ms.
#[derive(Debug, Clone, Copy)]
pub enum Win {
    Tumbling(i64),
    Hopping(i64, i64),
}

impl Win {
    pub fn size(self) -> i64 {
        match self {
            Win::Tumbling(s) | Win::Hopping(s, _) => s,
        }
    }
    pub fn advance(self) -> i64 {
        match self {
            Win::Tumbling(s) => s,
            Win::Hopping(_, a) => a,
        }
    }
}

/// A windowed aggregation.
#[derive(Debug, Clone)]
pub struct W {
    pub stream: S,
    pub group: Group,
    pub windows: Win,
    pub grace: i64,
    pub agg: Agg,
    /// `EmitStrategy::OnWindowClose`: one final value per window.
    pub emit_on_close: bool,
}

/// Session or sliding windows (gap or time difference, in ms).
#[derive(Debug, Clone, Copy)]
pub enum Dyn {
    Session(i64),
    Sliding(i64),
}

/// A session- or sliding-windowed aggregation.
#[derive(Debug, Clone)]
pub struct DynW {
    pub stream: S,
    pub group: Group,
    pub windows: Dyn,
    pub grace: i64,
    pub agg: Agg,
    /// `EmitStrategy::OnWindowClose`: one final value per session or window.
    pub emit_on_close: bool,
}

/// What goes to output topic `o<i>`.
#[derive(Debug, Clone)]
pub enum Out {
    Stream(S),
    /// The table's change stream (tombstones for deletions).
    Table(T),
    /// The windowed table's change stream, keyed `<key>@<start>`.
    Windowed(W),
    /// Sessions keyed `<key>@<start>-<end>`, sliding windows keyed `<key>@<start>`.
    Dyn(DynW),
    /// Two tables' change streams merged into one topic, keyed `a:<key>` and `b:<key>`.
    Merged(T, T),
    /// A table's updates (`to_stream`) joined with a table ([`Look`]): each update's value
    /// joined with the value that table held for the key when the batch looked it up
    /// ([`stream_joiner`]).
    Looked(T, Look),
}

/// How [`Out::Looked`] joins a table's updates, and what else it sends.
#[derive(Debug, Clone, Copy)]
pub struct Look {
    /// The table of topic `t<j>`, or `None`: the updated table itself (each update looks
    /// up its own key in the table it came from).
    pub table: Option<usize>,
    /// An inner join (`join`: an update whose key the table lacks is dropped) instead of
    /// a left join.
    pub inner: bool,
    /// The same table's plain updates are sent too, so that each joined update can be
    /// checked against the update of its version.
    pub updates: LookUpdates,
}

/// Where [`Look::updates`] sends the table's plain updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookUpdates {
    /// Not sent.
    None,
    /// To topic `o<i>u`.
    Separate,
    /// Merged with the joined updates into `o<i>`: joined ones keyed `j:<key>`, plain ones
    /// `u:<key>`.
    Merged,
}

/// A random topology.
#[derive(Debug, Clone)]
pub struct Plan {
    pub outputs: Vec<Out>,
    /// The smallest timestamp of the inputs.
    pub time_base: i64,
    /// Some input values do not deserialize; the batches run with `PoisonPolicy::Skip`.
    pub poison: bool,
    /// The output records' timestamps are not compared.
    pub ignore_timestamps: bool,
    /// The table topics' records are spread over the streams' time range (for joins that
    /// read a table as of a time), not after the streams' records.
    pub interleave_tables: bool,
    /// The table topics get more records, many of them tombstones (both tables of a join
    /// losing and regaining keys in turn).
    pub churn_tables: bool,
    /// The builder is asked for its output guarantee after the topology is declared, not
    /// before (a table–table join is then built for it when the topology is built).
    pub guarantee_after: bool,
}

impl S {
    fn size(&self) -> usize {
        match self {
            S::Source(_) => 1,
            S::Filter(s, _)
            | S::MapValues(s, _)
            | S::SelectKey(s, _)
            | S::Map(s, _, _)
            | S::FlatMapValues(s, _)
            | S::Split(s, _, _)
            | S::Repartition(s) => 1 + s.size(),
            S::Branch { of, .. } => 1 + of.size(),
            S::Merge(a, b) => 1 + a.size() + b.size(),
            S::Join(s, t, _) => 1 + s.size() + t.size(),
            S::ToStream(t) => 1 + t.size(),
            S::TryMapValues(s, _) => 1 + s.size(),
            S::StreamJoin { left, right, .. } => 1 + left.size() + right.size(),
            S::VersionedJoin { stream, .. } => 2 + stream.size(),
        }
    }
}

impl T {
    fn size(&self) -> usize {
        match self {
            T::Source(_) => 1,
            T::Agg(s, _, _) | T::ToTable(s) => 1 + s.size(),
            T::Join(a, b, _) => 1 + a.size() + b.size(),
            T::MapValues(t, _) | T::Filter(t, _) => 1 + t.size(),
        }
    }
}

/// A chain of 0..=`depth` random stateless operators over `s`. `keep_key`: only
/// operators that keep the key (so a key stays in its source partition).
fn stateless(rng: &mut Rng, mut s: S, depth: u64, keep_key: bool) -> S {
    for _ in 0..rng.below(depth + 1) {
        s = match rng.below(if keep_key { 4 } else { 6 }) {
            0 => S::Filter(Box::new(s), Pred::random(rng)),
            1 => S::MapValues(Box::new(s), ValFn::random(rng)),
            2 => S::FlatMapValues(Box::new(s), rng.below(3) as u8),
            3 => S::Split(Box::new(s), Pred::random(rng), rng.chance(50)),
            4 => S::SelectKey(Box::new(s), KeyFn::random(rng)),
            _ => S::Map(Box::new(s), KeyFn::random(rng), ValFn::random(rng)),
        };
    }
    s
}

/// `s` without its `flat_map_values` (one record in, one or none out).
fn without_fan_out(s: S) -> S {
    match s {
        S::FlatMapValues(s, _) => without_fan_out(*s),
        S::Filter(s, p) => S::Filter(Box::new(without_fan_out(*s)), p),
        S::MapValues(s, f) => S::MapValues(Box::new(without_fan_out(*s)), f),
        S::Split(s, p, t) => S::Split(Box::new(without_fan_out(*s)), p, t),
        other => other,
    }
}

/// A random stateless stream: chains, merges of two chains.
fn stream(rng: &mut Rng, streams: usize, depth: u64) -> S {
    let first = S::Source(rng.below(streams as u64) as usize);
    let s = stateless(rng, first, depth, false);
    if rng.chance(25) {
        let second = S::Source(rng.below(streams as u64) as usize);
        let other = stateless(rng, second, depth, false);
        stateless(rng, S::Merge(Box::new(s), Box::new(other)), 1, false)
    } else {
        s
    }
}

fn agg(rng: &mut Rng) -> Agg {
    rng.pick(&[Agg::Count, Agg::Sum, Agg::Max])
}

fn windows(rng: &mut Rng, hopping: bool) -> Win {
    let size = rng.pick(&[2_000, 5_000, 10_000]);
    if hopping {
        let advance = rng.pick(&[size / 2, size / 5, size]);
        Win::Hopping(size, advance.max(1))
    } else {
        Win::Tumbling(size)
    }
}

/// `t` under 1..=`depth` random table operators (`filter`, `map_values`), in a chain.
fn table_chain(rng: &mut Rng, mut t: T, depth: u64) -> T {
    for _ in 0..rng.range(1, depth as i64) {
        t = if rng.chance(50) {
            T::Filter(Box::new(t), rng.range(-2, 10))
        } else {
            T::MapValues(Box::new(t), rng.range(-3, 3))
        };
    }
    t
}

/// A grace that no record can be late for (the inputs span less than this).
pub const NO_LATENESS: i64 = 10_000_000;

impl Plan {
    /// The number of operators (to pick the smallest failing case).
    pub fn size(&self) -> usize {
        self.outputs
            .iter()
            .map(|o| match o {
                Out::Stream(s) => s.size(),
                Out::Table(t) => t.size(),
                Out::Merged(a, b) => 1 + a.size() + b.size(),
                Out::Looked(t, look) => {
                    2 + t.size() + usize::from(look.updates == LookUpdates::Merged)
                }
                Out::Windowed(w) => 1 + w.stream.size(),
                Out::Dyn(w) => 1 + w.stream.size(),
            })
            .sum()
    }

    /// A random plan of `family` (see `FAMILIES`).
    pub fn generate(family: &str, rng: &mut Rng) -> Plan {
        let d = 2;
        let mut time_base = 0;
        let mut poison = false;
        let mut ignore_timestamps = false;
        let mut interleave_tables = false;
        let mut churn_tables = false;
        let group =
            |rng: &mut Rng, direct_only: bool| match rng.below(if direct_only { 2 } else { 3 }) {
                0 => Group::Key,
                1 => Group::Direct(KeyFn::random(rng)),
                _ => Group::With(KeyFn::random(rng)),
            };
        let source_table = |rng: &mut Rng| {
            let t = T::Source(rng.below(2) as usize);
            match rng.below(4) {
                0 => T::MapValues(Box::new(t), rng.range(-2, 2)),
                1 => T::Filter(Box::new(t), rng.range(0, 5)),
                _ => t,
            }
        };
        let outputs = match family {
            "stateless" => vec![Out::Stream(stream(rng, 2, 3))],
            "repartition_once" => {
                let s = stream(rng, 2, d);
                vec![Out::Stream(stateless(
                    rng,
                    S::Repartition(Box::new(s)),
                    d,
                    false,
                ))]
            }
            "aggregate_by_key" => vec![Out::Table(T::Agg(
                Box::new(stream(rng, 2, d)),
                Group::Key,
                agg(rng),
            ))],
            "aggregate_direct" => vec![Out::Table(T::Agg(
                Box::new(stream(rng, 2, d)),
                Group::Direct(KeyFn::random(rng)),
                agg(rng),
            ))],
            "aggregate_repartition" => vec![Out::Table(T::Agg(
                Box::new(stream(rng, 2, d)),
                Group::With(KeyFn::random(rng)),
                agg(rng),
            ))],
            "tumbling" | "hopping" | "hopping_near_zero" => {
                let hopping = family != "tumbling";
                let win = windows(rng, hopping);
                if family == "hopping" {
                    // Every timestamp at or after the first window that starts at 0 ends.
                    time_base = win.size();
                }
                let g = group(rng, true);
                vec![Out::Windowed(W {
                    stream: stream(rng, 2, d),
                    group: g,
                    windows: win,
                    grace: rng.pick(&[0, 1_000, 5_000, NO_LATENESS]),
                    agg: agg(rng),
                    emit_on_close: false,
                })]
            }
            "windowed_after_repartition" => {
                let hopping = rng.chance(50);
                let win = windows(rng, hopping);
                time_base = win.size();
                let (s, g) = if rng.chance(50) {
                    (
                        S::Repartition(Box::new(stream(rng, 2, d))),
                        group(rng, true),
                    )
                } else {
                    (stream(rng, 2, d), Group::With(KeyFn::random(rng)))
                };
                vec![Out::Windowed(W {
                    stream: s,
                    group: g,
                    windows: win,
                    grace: NO_LATENESS,
                    agg: agg(rng),
                    emit_on_close: false,
                })]
            }
            "table_source" => vec![Out::Table(source_table(rng))],
            "merged_tables" => {
                // Two aggregations' updates (or an aggregation's and a topic's table's)
                // merged into one sink: each store's updates once under exactly-once output.
                let a = T::Agg(Box::new(stream(rng, 2, d)), group(rng, false), agg(rng));
                let b = if rng.chance(50) {
                    T::Agg(Box::new(stream(rng, 2, d)), group(rng, false), agg(rng))
                } else {
                    source_table(rng)
                };
                vec![Out::Merged(a, b)]
            }
            "table_updates_lookup" => {
                // An aggregation's updates joined (left or inner) with a topic's table or
                // with the aggregation's own table; the same table's plain updates sent
                // beside them (another topic, or merged into theirs), and a second output
                // of an aggregation of the same plan (another store).
                let a = T::Agg(Box::new(stream(rng, 2, d)), group(rng, false), agg(rng));
                let look = Look {
                    table: (!rng.chance(30)).then(|| rng.below(2) as usize),
                    inner: rng.chance(50),
                    updates: match rng.below(3) {
                        0 => LookUpdates::None,
                        1 => LookUpdates::Separate,
                        _ => LookUpdates::Merged,
                    },
                };
                let mut outputs = vec![Out::Looked(a.clone(), look)];
                if rng.chance(50) {
                    outputs.push(Out::Table(a));
                }
                outputs
            }
            "to_table" => {
                let source = S::Source(rng.below(2) as usize);
                let s = stateless(rng, source, d, true);
                vec![Out::Table(T::ToTable(Box::new(s)))]
            }
            "versioned_table_join" | "versioned_grace_join" => {
                let op = match rng.below(4) {
                    0 => VOp::Add(rng.range(-2, 2)),
                    1 => VOp::Above(rng.range(0, 5)),
                    _ => VOp::None,
                };
                interleave_tables = true;
                let grace = (family == "versioned_grace_join")
                    .then(|| rng.pick(&[0, 500, 2_000, 8_000, NO_LATENESS]));
                let s = S::VersionedJoin {
                    stream: Box::new(stream(rng, 2, d)),
                    table: rng.below(2) as usize,
                    op,
                    left: rng.chance(50),
                    grace,
                };
                vec![Out::Stream(stateless(rng, s, 1, false))]
            }
            "stream_table_join" => {
                let s = S::Join(
                    Box::new(stream(rng, 2, d)),
                    Box::new(source_table(rng)),
                    rng.chance(50),
                );
                vec![Out::Stream(stateless(rng, s, d, false))]
            }
            "table_table_join_churn" => {
                // The two tables (not a table with itself) lose and regain keys often, so
                // both sides of a key are deleted in turn, in one batch or in two, crashed
                // and retried among the faults.
                churn_tables = true;
                let (a, b) = if rng.chance(50) { (0, 1) } else { (1, 0) };
                vec![Out::Table(T::Join(
                    Box::new(T::Source(a)),
                    Box::new(T::Source(b)),
                    rng.chance(50),
                ))]
            }
            "table_table_join" => {
                let a = source_table(rng);
                let b = T::Source(1 - rng.below(2) as usize);
                vec![Out::Table(T::Join(
                    Box::new(a),
                    Box::new(b),
                    rng.chance(50),
                ))]
            }
            "join_then_aggregate" => {
                let s = S::Join(
                    Box::new(stream(rng, 2, d)),
                    Box::new(source_table(rng)),
                    rng.chance(50),
                );
                let s = stateless(rng, s, 1, false);
                vec![Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))]
            }
            "join_then_window" => {
                let s = S::Join(
                    Box::new(stream(rng, 2, d)),
                    Box::new(source_table(rng)),
                    rng.chance(50),
                );
                let win = windows(rng, false);
                vec![Out::Windowed(W {
                    stream: s,
                    group: group(rng, true),
                    windows: win,
                    grace: rng.pick(&[0, 1_000]),
                    agg: agg(rng),
                    emit_on_close: false,
                })]
            }
            "two_joins_then_aggregate" => {
                let s = S::Join(
                    Box::new(stream(rng, 2, 1)),
                    Box::new(T::Source(0)),
                    rng.chance(50),
                );
                let s = S::Join(
                    Box::new(stateless(rng, s, 1, true)),
                    Box::new(T::Source(1)),
                    rng.chance(50),
                );
                vec![Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))]
            }
            "two_repartition_hops" => {
                let s = S::Repartition(Box::new(stream(rng, 2, 1)));
                let s = S::Repartition(Box::new(stateless(rng, s, 1, false)));
                let s = stateless(rng, s, 1, false);
                if rng.chance(50) {
                    vec![Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))]
                } else {
                    vec![Out::Stream(s)]
                }
            }
            "merge_direct_with_repartitioned" => {
                let base = stream(rng, 2, 1);
                let copy = S::Repartition(Box::new(stateless(rng, base.clone(), 1, false)));
                let s = S::Merge(Box::new(base), Box::new(copy));
                vec![Out::Table(T::Agg(Box::new(s), group(rng, true), agg(rng)))]
            }
            "table_update_stream_to_table" => {
                let inner = T::Agg(Box::new(stream(rng, 2, 1)), group(rng, true), agg(rng));
                vec![Out::Table(T::ToTable(Box::new(S::ToStream(Box::new(
                    inner,
                )))))]
            }
            "session"
            | "session_late"
            | "sliding"
            | "sliding_late"
            | "sliding_null_values"
            | "session_close"
            | "sliding_close" => {
                let late = family.ends_with("_late");
                // Emit on close: a grace of at least the inputs' disorder (8 s), so no
                // record is late and no session or window closes before its last record.
                let close = family.ends_with("_close");
                let windows = if family.starts_with("session") {
                    Dyn::Session(rng.pick(&[500, 1_500, 4_000]))
                } else {
                    Dyn::Sliding(rng.pick(&[1_000, 3_000, 6_000]))
                };
                // With lateness, one partition feeds each key in offset order (as Kafka
                // Streams' task does), so the records' order, hence lateness, is defined.
                let (stream, group) = if late {
                    let source = S::Source(rng.below(2) as usize);
                    (stateless(rng, source, d, true), Group::Key)
                } else {
                    (stream(rng, 2, d), group(rng, true))
                };
                // Sliding windows keep their records' values: null values only in
                // `sliding_null_values`.
                let stream = if family.starts_with("sliding") && family != "sliding_null_values" {
                    S::Filter(Box::new(stream), Pred::HasValue)
                } else {
                    stream
                };
                vec![Out::Dyn(DynW {
                    stream,
                    group,
                    windows,
                    grace: if late {
                        rng.pick(&[0, 1_000, 3_000])
                    } else if close {
                        rng.pick(&[8_000, 9_000])
                    } else {
                        NO_LATENESS
                    },
                    agg: agg(rng),
                    emit_on_close: close,
                })]
            }
            "emit_on_close" => {
                // A grace of at least the inputs' disorder (8 s): no record is late, so
                // each window's final value is that of all its records.
                let hopping = rng.chance(30);
                let win = windows(rng, hopping);
                time_base = win.size();
                vec![Out::Windowed(W {
                    stream: stream(rng, 2, d),
                    group: group(rng, true),
                    windows: win,
                    grace: rng.pick(&[8_000, 9_000]),
                    agg: agg(rng),
                    emit_on_close: true,
                })]
            }
            "stream_stream_join"
            | "stream_stream_join_close"
            | "stream_stream_self_join"
            | "stream_stream_join_timestamps"
            | "stream_stream_join_fan_out" => {
                // Timestamps of the results compared only in `stream_stream_join_timestamps`.
                ignore_timestamps = family != "stream_stream_join_timestamps";
                // Both sides keep their keys (so a key stays in its partition, as Kafka
                // Streams' co-partitioning requires).
                let mut l = stateless(rng, S::Source(0), d, true);
                // A self-join (both sides of one topic) only in its own family.
                let right = S::Source(usize::from(family != "stream_stream_self_join"));
                let mut r = stateless(rng, right, d, true);
                if family == "stream_stream_join_fan_out" {
                    // One source record, two records into the join.
                    l = S::FlatMapValues(Box::new(l), 2);
                } else {
                    l = without_fan_out(l);
                    r = without_fan_out(r);
                }
                let kind = rng.pick(&[JoinKind::Inner, JoinKind::Left, JoinKind::Outer]);
                let difference = rng.pick(&[0, 500, 2_000]);
                // Asymmetric windows (`before` other than the difference) in the family
                // whose windows close.
                let before = if family == "stream_stream_join_close" {
                    rng.pick(&[difference, difference, 0, 1_000, 3_000])
                } else {
                    difference
                };
                let s = S::StreamJoin {
                    left: Box::new(l),
                    right: Box::new(r),
                    kind,
                    difference,
                    before,
                    // A grace of at least the inputs' disorder (8 s): no record is late.
                    // `stream_stream_join`: so long that no window closes before the end.
                    grace: if family != "stream_stream_join_close" {
                        NO_LATENESS
                    } else {
                        8_000
                    },
                };
                vec![Out::Stream(stateless(rng, s, 1, false))]
            }
            "stream_stream_join_aggregate" => {
                // An inner join's pairs aggregated (directly or through a repartition
                // topic): a pair must count once whichever record's retry, zombie or
                // concurrent batch meets its partner.
                let l = without_fan_out(stateless(rng, S::Source(0), d, true));
                let r = without_fan_out(stateless(rng, S::Source(1), d, true));
                let difference = rng.pick(&[0, 500, 2_000]);
                let s = S::StreamJoin {
                    left: Box::new(l),
                    right: Box::new(r),
                    kind: JoinKind::Inner,
                    difference,
                    before: difference,
                    grace: NO_LATENESS,
                };
                let s = stateless(rng, s, 1, true);
                vec![Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))]
            }
            "poison_stateless" | "poison_aggregate" | "poison_window" => {
                poison = true;
                let s = stream(rng, 2, 1);
                let bad = rng.range(-5, 20);
                let s = stateless(rng, S::TryMapValues(Box::new(s), bad), 1, false);
                match family {
                    "poison_stateless" => vec![Out::Stream(s)],
                    "poison_aggregate" => {
                        vec![Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))]
                    }
                    _ => vec![Out::Windowed(W {
                        stream: s,
                        group: group(rng, true),
                        windows: windows(rng, false),
                        grace: rng.pick(&[0, 1_000]),
                        agg: agg(rng),
                        emit_on_close: false,
                    })],
                }
            }
            "join_merge_aggregate" | "join_merge_window" | "join_merge_repartition_count" => {
                // Records that waited at a stream–table join merged with records that did
                // not: the join's own input (each source record reaching the merge on both
                // paths) or another stream; sometimes with records that waited at another
                // join.
                let base = stream(rng, 2, 1);
                let joined = S::Join(
                    Box::new(base.clone()),
                    Box::new(source_table(rng)),
                    rng.chance(50),
                );
                let joined = stateless(rng, joined, 1, false);
                let other = match rng.below(5) {
                    0 | 1 => stateless(rng, base, 1, false),
                    2 | 3 => stream(rng, 2, 1),
                    _ => S::Join(
                        Box::new(stream(rng, 2, 1)),
                        Box::new(source_table(rng)),
                        rng.chance(50),
                    ),
                };
                let (a, b) = if rng.chance(50) {
                    (joined, other)
                } else {
                    (other, joined)
                };
                let s = S::Merge(Box::new(a), Box::new(b));
                match family {
                    "join_merge_aggregate" => {
                        vec![Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))]
                    }
                    "join_merge_window" => {
                        let hopping = rng.chance(40);
                        vec![Out::Windowed(W {
                            stream: s,
                            group: group(rng, true),
                            windows: windows(rng, hopping),
                            grace: rng.pick(&[0, 1_000, NO_LATENESS]),
                            agg: agg(rng),
                            emit_on_close: false,
                        })]
                    }
                    // A repartition, then a count: an explicit `repartition` before a
                    // grouping by key or a direct one, or `group_by` with `Grouped::with`.
                    _ => {
                        let (s, g) = if rng.chance(50) {
                            let s = S::Repartition(Box::new(s));
                            (stateless(rng, s, 1, false), group(rng, true))
                        } else {
                            (s, Group::With(KeyFn::random(rng)))
                        };
                        vec![Out::Table(T::Agg(Box::new(s), g, Agg::Count))]
                    }
                }
            }
            "split_branch_aggregates" | "split_merge_branches" => {
                // One split with one or two predicates and a default branch.
                let of = stream(rng, 2, 1);
                let preds: Vec<Pred> = (0..rng.range(1, 2)).map(|_| Pred::random(rng)).collect();
                let arms = preds.len() + 1;
                let branch = |take: usize| S::Branch {
                    of: Box::new(of.clone()),
                    preds: preds.clone(),
                    take,
                };
                if family == "split_branch_aggregates" {
                    // Each branch (at least two of them) aggregated into its own store.
                    let skip = if arms > 2 && rng.chance(50) {
                        Some(rng.below(arms as u64) as usize)
                    } else {
                        None
                    };
                    (0..arms)
                        .filter(|take| Some(*take) != skip)
                        .map(|take| {
                            let s = stateless(rng, branch(take), 1, false);
                            Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))
                        })
                        .collect()
                } else {
                    // Two branches merged again, aggregated or streamed out; sometimes a
                    // third branch as a stream of its own.
                    let first = rng.below(arms as u64) as usize;
                    let second = (first + 1 + rng.below(arms as u64 - 1) as usize) % arms;
                    let a = stateless(rng, branch(first), 1, false);
                    let b = stateless(rng, branch(second), 1, false);
                    let merged = S::Merge(Box::new(a), Box::new(b));
                    let mut outputs = vec![if rng.chance(50) {
                        Out::Table(T::Agg(Box::new(merged), group(rng, false), agg(rng)))
                    } else {
                        Out::Stream(stateless(rng, merged, 1, false))
                    }];
                    if arms > 2 && rng.chance(50) {
                        let third = (0..arms).find(|t| *t != first && *t != second).unwrap_or(0);
                        outputs.push(Out::Stream(branch(third)));
                    }
                    outputs
                }
            }
            "joined_table_lookup" => {
                // A table–table join used as the table of a stream–table join.
                let i = rng.below(2) as usize;
                let a = match rng.below(3) {
                    0 => T::MapValues(Box::new(T::Source(i)), rng.range(-2, 2)),
                    1 => T::Filter(Box::new(T::Source(i)), rng.range(0, 5)),
                    _ => T::Source(i),
                };
                let joined = T::Join(Box::new(a), Box::new(T::Source(1 - i)), rng.chance(50));
                let s = S::Join(
                    Box::new(stream(rng, 2, d)),
                    Box::new(joined),
                    rng.chance(50),
                );
                if rng.chance(50) {
                    vec![Out::Stream(stateless(rng, s, 1, false))]
                } else {
                    vec![Out::Table(T::Agg(Box::new(s), group(rng, false), agg(rng)))]
                }
            }
            "table_join_chain" => {
                // A table–table join joined again with a third table (a stream's table or
                // a topic's), on either side.
                let i = rng.below(2) as usize;
                let joined = T::Join(
                    Box::new(T::Source(i)),
                    Box::new(T::Source(1 - i)),
                    rng.chance(50),
                );
                let joined = if rng.chance(50) {
                    table_chain(rng, joined, 2)
                } else {
                    joined
                };
                let source = S::Source(rng.below(2) as usize);
                let third = T::ToTable(Box::new(stateless(rng, source, d, true)));
                let (a, b) = if rng.chance(50) {
                    (joined, third)
                } else {
                    (third, joined)
                };
                vec![Out::Table(T::Join(
                    Box::new(a),
                    Box::new(b),
                    rng.chance(50),
                ))]
            }
            "to_table_table_join" => {
                // A stream read into a table (its key in its source partition, so its last
                // value is defined), joined with a table of a topic or another stream's
                // table; filters and value mappers on the sides and the result.
                let i = rng.below(2) as usize;
                let fed = T::ToTable(Box::new(stateless(rng, S::Source(i), d, true)));
                let fed = if rng.chance(50) {
                    table_chain(rng, fed, 2)
                } else {
                    fed
                };
                let other = if rng.chance(60) {
                    T::Source(rng.below(2) as usize)
                } else {
                    T::ToTable(Box::new(stateless(rng, S::Source(1 - i), d, true)))
                };
                let other = if rng.chance(50) {
                    table_chain(rng, other, 2)
                } else {
                    other
                };
                let (a, b) = if rng.chance(50) {
                    (fed, other)
                } else {
                    (other, fed)
                };
                let joined = T::Join(Box::new(a), Box::new(b), rng.chance(50));
                vec![Out::Table(if rng.chance(50) {
                    table_chain(rng, joined, 3)
                } else {
                    joined
                })]
            }
            "table_chains" => {
                // `filter` and `map_values` in chains over an aggregation's table, a
                // stream's table or a topic's table.
                let base = match rng.below(3) {
                    0 => T::Agg(Box::new(stream(rng, 2, d)), group(rng, false), agg(rng)),
                    1 => {
                        let source = S::Source(rng.below(2) as usize);
                        T::ToTable(Box::new(stateless(rng, source, d, true)))
                    }
                    _ => T::Source(rng.below(2) as usize),
                };
                vec![Out::Table(table_chain(rng, base, 4))]
            }
            other => panic!("unknown family {other}"),
        };
        let guarantee_after = rng.chance(50);
        Plan {
            outputs,
            time_base,
            poison,
            ignore_timestamps,
            interleave_tables,
            churn_tables,
            guarantee_after,
        }
    }

    /// Builds the plan with the real DSL (it may panic: the builder refused it).
    pub fn build(&self) -> Topology {
        self.build_with(lambda_streams::OutputGuarantee::AtLeastOnce)
    }

    /// The plan's topology under the output guarantee `output` (the builder may refuse it:
    /// a panic).
    pub fn build_with(&self, output: lambda_streams::OutputGuarantee) -> Topology {
        let builder = StreamsBuilder::new();
        if !self.guarantee_after {
            builder.output_guarantee(output);
        }
        let mut b = Builder {
            builder: &builder,
            streams: HashMap::new(),
            tables: HashMap::new(),
            versioned: HashMap::new(),
            splits: HashMap::new(),
            next: 0,
        };
        for (i, out) in self.outputs.iter().enumerate() {
            let topic = format!("o{i}");
            match out {
                Out::Stream(s) => b.stream(s).to(&topic, Nullable(Utf8), Nullable(DecimalI64)),
                Out::Table(t) => {
                    b.table(t)
                        .to_change_stream()
                        .to(&topic, Nullable(Utf8), Nullable(DecimalI64))
                }
                Out::Looked(t, look) => {
                    let table = b.table(t);
                    let other = look.table.map(|j| b.table(&T::Source(j)));
                    let lookup = other.as_ref().unwrap_or(&table);
                    let updates = table.to_stream().map_values(Some);
                    let joined = if look.inner {
                        updates.join(lookup, |_, v, x| stream_joiner(v, Some(x)))
                    } else {
                        updates.left_join(lookup, |_, v, x| stream_joiner(v, x))
                    };
                    let prefixed = |s: KStream<K, V>, prefix: &'static str| {
                        s.map(move |k, v| (Some(format!("{prefix}{}", k.unwrap_or_default())), v))
                    };
                    match look.updates {
                        LookUpdates::None => {
                            joined.to(&topic, Nullable(Utf8), Nullable(DecimalI64));
                        }
                        LookUpdates::Separate => {
                            joined.to(&topic, Nullable(Utf8), Nullable(DecimalI64));
                            updates.to(&format!("{topic}u"), Nullable(Utf8), Nullable(DecimalI64));
                        }
                        LookUpdates::Merged => prefixed(joined, "j:")
                            .merge(&prefixed(updates, "u:"))
                            .to(&topic, Nullable(Utf8), Nullable(DecimalI64)),
                    }
                }
                Out::Merged(t, u) => {
                    let prefixed = |table: KTable<K, i64>, prefix: &'static str| {
                        table.to_change_stream().map(move |k, v| {
                            (Some(format!("{prefix}{}", k.unwrap_or_default())), v)
                        })
                    };
                    let (t, u) = (b.table(t), b.table(u));
                    prefixed(t, "a:").merge(&prefixed(u, "b:")).to(
                        &topic,
                        Nullable(Utf8),
                        Nullable(DecimalI64),
                    )
                }
                Out::Windowed(w) => b
                    .windowed(w)
                    .to_change_stream()
                    .map(|w, v| {
                        (
                            Some(format!("{}@{}", w.key.unwrap_or_default(), w.start)),
                            v,
                        )
                    })
                    .to(&topic, Nullable(Utf8), Nullable(DecimalI64)),
                Out::Dyn(w) => {
                    let session = matches!(w.windows, Dyn::Session(_));
                    b.dyn_windowed(w)
                        .to_change_stream()
                        .map(move |w, v| {
                            let key = w.key.unwrap_or_default();
                            let key = if session {
                                format!("{key}@{}-{}", w.start, w.end)
                            } else {
                                format!("{key}@{}", w.start)
                            };
                            (Some(key), v)
                        })
                        .to(&topic, Nullable(Utf8), Nullable(DecimalI64))
                }
            }
        }
        drop(b);
        if self.guarantee_after {
            builder.output_guarantee(output);
        }
        builder.build()
    }
}

/// Builds plans with the DSL; sources are read once per topic.
struct Builder<'a> {
    builder: &'a StreamsBuilder,
    streams: HashMap<usize, KStream<K, V>>,
    tables: HashMap<usize, KTable<K, i64>>,
    /// The versioned tables of the table topics.
    versioned: HashMap<usize, KTable<K, i64>>,
    /// The branches of each split, by the split stream and predicates (`S::Branch`).
    splits: HashMap<String, Vec<KStream<K, V>>>,
    next: usize,
}

impl Builder<'_> {
    fn name(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn stream(&mut self, s: &S) -> KStream<K, V> {
        match s {
            S::Source(i) => {
                let builder = self.builder;
                let source = self.streams.entry(*i).or_insert_with(|| {
                    builder.stream(&format!("s{i}"), Nullable(Utf8), Nullable(DecimalI64))
                });
                // A pass-through child: the same source node for every use.
                source.filter(|_, _| true)
            }
            S::Filter(s, p) => {
                let p = *p;
                self.stream(s).filter(move |k, v| p.test(k, v))
            }
            S::MapValues(s, f) => {
                let f = *f;
                self.stream(s).map_values(move |v| f.apply(v))
            }
            S::SelectKey(s, f) => {
                let f = *f;
                self.stream(s).select_key(move |k, v| f.apply(k, v))
            }
            S::Map(s, kf, vf) => {
                let (kf, vf) = (*kf, *vf);
                self.stream(s)
                    .map(move |k, v| (kf.apply(&k, &v), vf.apply(v)))
            }
            S::FlatMapValues(s, n) => {
                let n = *n;
                self.stream(s).flat_map_values(move |v| flat(n, v))
            }
            S::Merge(a, b) => {
                let a = self.stream(a);
                let b = self.stream(b);
                a.merge(&b)
            }
            S::Split(s, p, take) => {
                let p = *p;
                let split = self.stream(s).split();
                let branch = split.branch("yes", move |k, v| p.test(k, v));
                let default = split.default_branch("no");
                if *take { branch } else { default }
            }
            S::Branch { of, preds, take } => {
                let id = format!("{of:?}/{preds:?}");
                if !self.splits.contains_key(&id) {
                    let split = self.stream(of).split();
                    let mut branches: Vec<KStream<K, V>> = preds
                        .iter()
                        .enumerate()
                        .map(|(i, p)| {
                            let p = *p;
                            split.branch(&format!("b{i}"), move |k, v| p.test(k, v))
                        })
                        .collect();
                    branches.push(split.default_branch("rest"));
                    self.splits.insert(id.clone(), branches);
                }
                // A pass-through child: every use of a branch reads the same branch node.
                self.splits[&id][*take].filter(|_, _| true)
            }
            S::Repartition(s) => {
                let topic = self.name("rp");
                self.stream(s)
                    .repartition(&topic, Nullable(Utf8), Nullable(DecimalI64))
            }
            S::Join(s, t, left) => {
                let stream = self.stream(s);
                let table = self.table(t);
                if *left {
                    stream.left_join(&table, |_, v, t| stream_joiner(v, t))
                } else {
                    stream.join(&table, |_, v, t| stream_joiner(v, Some(t)))
                }
            }
            S::ToStream(t) => self.table(t).to_stream().map_values(Some),
            S::VersionedJoin {
                stream,
                table,
                op,
                left,
                grace,
            } => {
                let s = self.stream(stream);
                let builder = self.builder;
                let source = self.versioned.entry(*table).or_insert_with(|| {
                    builder.versioned_table(
                        &format!("t{table}"),
                        Nullable(Utf8),
                        DecimalI64,
                        &format!("vtable{table}"),
                        Duration::from_secs(1_000_000),
                    )
                });
                let t = match *op {
                    VOp::None => source.filter(|_, _| true),
                    VOp::Add(c) => source.map_values(move |v| v + c),
                    VOp::Above(c) => source.filter(move |_, v| *v > c),
                };
                let serdes = (Nullable(Utf8), Nullable(DecimalI64));
                match (grace, left) {
                    (None, true) => s.left_join(&t, |_, v, t| stream_joiner(v, t)),
                    (None, false) => s.join(&t, |_, v, t| stream_joiner(v, Some(t))),
                    (Some(g), true) => {
                        let store = self.name("grace");
                        let g = Duration::from_millis(*g as u64);
                        s.left_join_with_grace(&t, g, &store, serdes, |_, v, t| stream_joiner(v, t))
                    }
                    (Some(g), false) => {
                        let store = self.name("grace");
                        let g = Duration::from_millis(*g as u64);
                        s.join_with_grace(&t, g, &store, serdes, |_, v, t| {
                            stream_joiner(v, Some(t))
                        })
                    }
                }
            }
            S::TryMapValues(s, bad) => {
                let bad = *bad;
                self.stream(s).try_map_values(move |v| try_add_one(bad, v))
            }
            S::StreamJoin {
                left,
                right,
                kind,
                difference,
                before,
                grace,
            } => {
                let present = |k: &K, v: &V| k.is_some() && v.is_some();
                let l = self.stream(left).filter(present);
                let r = self.stream(right).filter(present);
                let windows = JoinWindows::of(Duration::from_millis(*difference as u64))
                    .before(Duration::from_millis(*before as u64))
                    .grace(Duration::from_millis(*grace as u64));
                let store = self.name("join");
                let serdes = (Nullable(Utf8), Nullable(DecimalI64), Nullable(DecimalI64));
                match kind {
                    JoinKind::Inner => l.join_stream(&r, windows, &store, serdes, |_, a, b| {
                        stream_stream_joiner(*a, *b)
                    }),
                    JoinKind::Left => l.left_join_stream(&r, windows, &store, serdes, |_, a, b| {
                        stream_stream_joiner(*a, b.copied().flatten())
                    }),
                    JoinKind::Outer => {
                        l.outer_join_stream(&r, windows, &store, serdes, |_, a, b| {
                            stream_stream_joiner(a.copied().flatten(), b.copied().flatten())
                        })
                    }
                }
            }
        }
    }

    fn grouped(&mut self, s: &S, group: Group, agg: Agg) -> KGroupedStream<K, V> {
        let mut stream = self.stream(s);
        if agg == Agg::Max {
            stream = stream.filter(|_, v| v.is_some());
        }
        match group {
            Group::Key => stream.group_by_key(Nullable(Utf8)),
            Group::With(f) => stream.group_by(
                move |k, v| f.apply(k, v),
                Grouped::with(Nullable(Utf8), Nullable(DecimalI64)),
            ),
            Group::Direct(f) => {
                stream.group_by(move |k, v| f.apply(k, v), Grouped::direct(Nullable(Utf8)))
            }
        }
    }

    fn table(&mut self, t: &T) -> KTable<K, i64> {
        match t {
            T::Source(i) => {
                let builder = self.builder;
                let store = format!("table{i}");
                let table = self.tables.entry(*i).or_insert_with(|| {
                    builder.table(&format!("t{i}"), Nullable(Utf8), DecimalI64, &store)
                });
                table.filter(|_, _| true)
            }
            T::Agg(s, group, agg) => {
                let store = self.name("agg");
                let g = self.grouped(s, *group, *agg);
                match agg {
                    Agg::Count => g.count(&store),
                    Agg::Sum => {
                        g.aggregate(&store, || 0i64, |_, v, a| a + v.unwrap_or(0), DecimalI64)
                    }
                    Agg::Max => g
                        .reduce(&store, |a, b| a.max(b), Nullable(DecimalI64))
                        .map_values(|v| v.unwrap_or(i64::MIN)),
                }
            }
            T::ToTable(s) => {
                let store = self.name("totable");
                self.stream(s)
                    .filter(|_, v| v.is_some())
                    .map_values(|v| v.unwrap_or_default())
                    .to_table(&store, Nullable(Utf8), DecimalI64)
            }
            T::Join(a, b, left) => {
                let a = self.table(a);
                let b = self.table(b);
                if *left {
                    a.left_join(&b, |_, x, y| table_joiner(*x, y.copied()))
                } else {
                    a.join(&b, |_, x, y| table_joiner(*x, Some(*y)))
                }
            }
            T::MapValues(t, c) => {
                let c = *c;
                self.table(t).map_values(move |v| v + c)
            }
            T::Filter(t, c) => {
                let c = *c;
                self.table(t).filter(move |_, v| *v > c)
            }
        }
    }

    fn windowed(&mut self, w: &W) -> KTable<lambda_streams::dsl::Windowed<K>, i64> {
        let store = self.name("win");
        let g = self.grouped(&w.stream, w.group, w.agg);
        let windows = TimeWindows::of_size(Duration::from_millis(w.windows.size() as u64))
            .advance_by(Duration::from_millis(w.windows.advance() as u64))
            .grace(Duration::from_millis(w.grace as u64));
        let mut wg = g.windowed_by(windows);
        if w.emit_on_close {
            wg = wg.emit_strategy(EmitStrategy::OnWindowClose);
        }
        match w.agg {
            Agg::Count => wg.count(&store),
            Agg::Sum => wg.aggregate(&store, || 0i64, |_, v, a| a + v.unwrap_or(0), DecimalI64),
            Agg::Max => wg.aggregate(
                &store,
                || i64::MIN,
                |_, v, a| a.max(v.unwrap_or(i64::MIN)),
                DecimalI64,
            ),
        }
    }
}

impl Builder<'_> {
    fn dyn_windowed(&mut self, w: &DynW) -> KTable<lambda_streams::dsl::Windowed<K>, i64> {
        let store = self.name("dyn");
        let g = self.grouped(&w.stream, w.group, w.agg);
        let ms = |x: i64| Duration::from_millis(x as u64);
        let sum = |_: &K, v: V, a: i64| a + v.unwrap_or(0);
        let max = |_: &K, v: V, a: i64| a.max(v.unwrap_or(i64::MIN));
        match w.windows {
            Dyn::Session(gap) => {
                let mut sg = g.windowed_by_session(
                    SessionWindows::with_inactivity_gap(ms(gap)).grace(ms(w.grace)),
                );
                if w.emit_on_close {
                    sg = sg.emit_strategy(EmitStrategy::OnWindowClose);
                }
                match w.agg {
                    Agg::Count => sg.count(&store),
                    Agg::Sum => sg.aggregate(&store, || 0i64, sum, |_, a, b| a + b, DecimalI64),
                    Agg::Max => sg.aggregate(
                        &store,
                        || i64::MIN,
                        max,
                        |_, a: i64, b: i64| a.max(b),
                        DecimalI64,
                    ),
                }
            }
            Dyn::Sliding(difference) => {
                let mut sg = g.windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    ms(difference),
                    ms(w.grace),
                ));
                if w.emit_on_close {
                    sg = sg.emit_strategy(EmitStrategy::OnWindowClose);
                }
                match w.agg {
                    Agg::Count => sg.count(&store),
                    Agg::Sum => sg.aggregate(&store, || 0i64, sum, Nullable(DecimalI64)),
                    Agg::Max => sg.aggregate(&store, || i64::MIN, max, Nullable(DecimalI64)),
                }
            }
        }
    }
}

/// One input record.
#[derive(Debug, Clone)]
pub struct In {
    pub key: K,
    pub value: V,
    pub ts: i64,
    /// A value that does not deserialize (a poison record).
    pub bad: bool,
}

/// The inputs: per topic and partition, the records in offset order.
#[derive(Clone)]
pub struct Inputs {
    /// `(topic, partition) -> records`.
    pub logs: std::collections::BTreeMap<(String, i32), Vec<In>>,
}

impl std::fmt::Debug for Inputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for ((topic, p), records) in &self.logs {
            let rs: Vec<String> = records
                .iter()
                .map(|r| {
                    format!(
                        "{}={}@{}",
                        r.key.as_deref().unwrap_or("null"),
                        if r.bad {
                            "BAD".to_owned()
                        } else {
                            r.value.map_or("null".to_owned(), |v| v.to_string())
                        },
                        r.ts
                    )
                })
                .collect();
            m.entry(&format!("{topic}-{p}"), &rs.join(" "));
        }
        m.finish()
    }
}

/// The partition of a key (the same for input and repartition topics); `None` for a
/// null key.
pub fn partition_of(key: Option<&[u8]>) -> Option<i32> {
    key.map(|k| (k.iter().map(|b| u32::from(*b)).sum::<u32>() % PARTITIONS as u32) as i32)
}

impl Inputs {
    pub fn len(&self) -> usize {
        self.logs.values().map(Vec::len).sum()
    }

    /// Random records for the stream topics `s0`, `s1` and the table topics `t0`, `t1`,
    /// partitioned by key (a null key: a random partition).
    pub fn generate(plan: &Plan, rng: &mut Rng) -> Inputs {
        let mut logs = std::collections::BTreeMap::new();
        for topic in ["s0", "s1", "t0", "t1"] {
            for p in 0..PARTITIONS {
                logs.insert((topic.to_owned(), p), Vec::new());
            }
        }
        let n_stream = rng.below(40) as usize;
        let n_table = rng.below(if plan.churn_tables { 48 } else { 16 }) as usize;
        let tombstones = if plan.churn_tables { 40 } else { 25 };
        let mut clock = plan.time_base;
        for i in 0..n_stream + n_table {
            let table = if plan.interleave_tables {
                rng.below((n_stream + n_table) as u64) < n_table as u64
            } else {
                i >= n_stream
            };
            let key = if rng.chance(if table { 5 } else { 10 }) {
                None
            } else {
                Some(rng.pick(KEYS).to_owned())
            };
            let value = if rng.chance(if table { tombstones } else { 10 }) {
                None
            } else if table {
                Some(rng.range(0, 9))
            } else {
                Some(rng.range(-5, 20))
            };
            // Mostly forward, sometimes far back (out of order).
            clock += rng.range(0, 1_500);
            let ts = if rng.chance(20) {
                (clock - rng.range(0, 8_000)).max(plan.time_base)
            } else {
                clock
            };
            let topic = if table {
                format!("t{}", rng.below(2))
            } else {
                format!("s{}", rng.below(2))
            };
            let p = partition_of(key.as_deref().map(str::as_bytes))
                .unwrap_or_else(|| rng.below(PARTITIONS as u64) as i32);
            logs.get_mut(&(topic, p)).unwrap().push(In {
                key,
                value,
                ts,
                bad: plan.poison && !table && rng.chance(10),
            });
        }
        Inputs { logs }
    }
}
