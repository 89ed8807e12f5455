//! The DSL methods of the aggregators on grouped and windowed streams.

use super::*;

/// What the built-in aggregations are built on: a general aggregate, per key
/// ([`KGroupedStream`]) or per key and window ([`TimeWindowedKStream`]).
pub(super) trait GeneralAggregate<K, V> {
    type TableKey: Clone + Send + Sync + 'static;

    fn general_aggregate<A: Clone + Send + Sync + 'static>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        serde: impl Serde<A>,
    ) -> KTable<Self::TableKey, A>;
}

impl<K, V> GeneralAggregate<K, V> for KGroupedStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    type TableKey = K;

    fn general_aggregate<A: Clone + Send + Sync + 'static>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        serde: impl Serde<A>,
    ) -> KTable<K, A> {
        self.aggregate(store, init, adder, serde)
    }
}

impl<K, V> GeneralAggregate<K, V> for TimeWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    type TableKey = Windowed<K>;

    fn general_aggregate<A: Clone + Send + Sync + 'static>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        serde: impl Serde<A>,
    ) -> KTable<Windowed<K>, A> {
        self.aggregate(store, init, adder, serde)
    }
}

pub(super) fn top_k_on<T, K, V, M, S>(
    target: &T,
    store: &str,
    k: usize,
    member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
    score: impl Fn(&K, &V) -> S + Send + Sync + 'static,
    member_serde: impl Serde<M>,
) -> KTable<T::TableKey, Vec<(M, S)>>
where
    T: GeneralAggregate<K, V>,
    M: Clone + Send + Sync + 'static,
    S: Score,
{
    assert!(k >= 1, "top_k of store {store:?}: k must be at least 1");
    let member_serde: Arc<dyn Serde<M>> = Arc::new(member_serde);
    let serde = TopKSerde {
        member: Arc::clone(&member_serde),
        score: PhantomData,
    };
    target
        .general_aggregate(
            store,
            TopK::new,
            move |key, value, mut top: TopK<M, S>| {
                let m = member(key, &value);
                if let Some(bytes) = member_serde.serialize(&m) {
                    top.offer(m, bytes, score(key, &value), k);
                }
                top
            },
            serde,
        )
        .map_values(|top: &TopK<M, S>| {
            top.entries
                .iter()
                .map(|e| (e.member.clone(), e.score))
                .collect()
        })
}

pub(super) fn top_k_frequent_on<T, K, V, M>(
    target: &T,
    store: &str,
    k: usize,
    capacity: usize,
    member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
    member_serde: impl Serde<M>,
) -> KTable<T::TableKey, Vec<(M, u64)>>
where
    T: GeneralAggregate<K, V>,
    M: Clone + Send + Sync + 'static,
{
    assert!(
        k >= 1 && capacity >= k,
        "top_k_frequent of store {store:?}: need 1 <= k <= capacity (k = {k}, capacity = {capacity})"
    );
    let member_serde: Arc<dyn Serde<M>> = Arc::new(member_serde);
    let serde = SpaceSavingSerde {
        member: Arc::clone(&member_serde),
    };
    target
        .general_aggregate(
            store,
            SpaceSaving::new,
            move |key, value, mut summary: SpaceSaving<M>| {
                let m = member(key, &value);
                if let Some(bytes) = member_serde.serialize(&m) {
                    summary.offer(m, bytes, capacity);
                }
                summary
            },
            serde,
        )
        .map_values(move |summary: &SpaceSaving<M>| {
            summary
                .top(k)
                .into_iter()
                .map(|c| (c.entry.member.clone(), c.entry.score))
                .collect()
        })
}

pub(super) fn distinct_count_on<T, K, V, M>(
    target: &T,
    store: &str,
    member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
    member_serde: impl Serde<M>,
) -> KTable<T::TableKey, u64>
where
    T: GeneralAggregate<K, V>,
    M: Send + Sync + 'static,
{
    target
        .general_aggregate(
            store,
            || Distinct::Exact(Vec::new()),
            move |key, value, mut distinct: Distinct| {
                if let Some(bytes) = member_serde.serialize(&member(key, &value)) {
                    distinct.insert(member_hash(&bytes), EXACT_DISTINCT_LIMIT, HLL_PRECISION);
                }
                distinct
            },
            DistinctSerde,
        )
        .map_values(Distinct::count)
}

impl<K, V> KGroupedStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The `k` members with the highest score per key, best first: each record is a
    /// `member(key, value)` with a `score(key, value)` (`i64`, `u64` or `f64`; a member's
    /// score is the maximum over its records; equal scores rank by the member's bytes
    /// under `member_serde`, smaller first). Exact, with at most `k` members in the state.
    ///
    /// Built on [`aggregate`](Self::aggregate) (same exactly-once effect, costs and
    /// 400 KB limit); the state format is in the [module documentation](self).
    ///
    /// # Panics
    /// When `k` is 0, or the store name is invalid or used twice (at build time).
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{DecimalI64, Json, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Per game, the 2 best players ("player:points" records keyed by game).
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("scores", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .top_k(
    ///         "best-players",
    ///         2,
    ///         |_, v: &String| v.split(':').next().unwrap_or_default().to_owned(),
    ///         |_, v: &String| v.rsplit(':').next().and_then(|p| p.parse::<i64>().ok()).unwrap_or(0),
    ///         Utf8,
    ///     )
    ///     .to_stream()
    ///     .to("podium", Utf8, Json::<Vec<(String, i64)>>::new());
    /// let driver = TestDriver::new(builder.build());
    /// let mut scores = driver.input_topic("scores", Utf8, Utf8);
    /// for v in ["ann:5", "bob:9", "cy:7", "ann:12", "bob:3"] {
    ///     scores.pipe_input("chess".to_owned(), v.to_owned())?;
    /// }
    /// let podium = driver.output_topic("podium", Utf8, Json::<Vec<(String, i64)>>::new());
    /// let last = podium.read_values()?.pop().unwrap();
    /// assert_eq!(last, [("ann".to_owned(), 12), ("bob".to_owned(), 9)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn top_k<M, S>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        score: impl Fn(&K, &V) -> S + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, Vec<(M, S)>>
    where
        M: Clone + Send + Sync + 'static,
        S: Score,
    {
        top_k_on(self, store, k, member, score, member_serde)
    }

    /// The `k` most frequent members per key, most frequent first, with their counts
    /// (ties: the member's bytes, smaller first), by the Space-Saving algorithm with a
    /// capacity of `10 k` members ([`DEFAULT_CAPACITY_FACTOR`]); see
    /// [`top_k_frequent_with_capacity`](Self::top_k_frequent_with_capacity) for the bound.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{Json, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// // The 2 most visited pages per site ("site/page" records).
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("visits", Unit, Utf8)
    ///     .group_by(|_, v: &String| v.split('/').next().unwrap_or_default().to_owned(), Grouped::with(Utf8, Utf8))
    ///     .top_k_frequent("top-pages", 2, |_, v: &String| v.clone(), Utf8)
    ///     .to_stream()
    ///     .to("top-pages", Utf8, Json::<Vec<(String, u64)>>::new());
    /// let driver = TestDriver::new(builder.build());
    /// driver
    ///     .input_topic("visits", Unit, Utf8)
    ///     .pipe_values(["a/x", "a/y", "a/x", "a/z", "a/y", "a/x", "b/q"])?;
    /// let top = driver
    ///     .output_topic("top-pages", Utf8, Json::<Vec<(String, u64)>>::new())
    ///     .read_key_values_to_map()?;
    /// assert_eq!(top["a"], [("a/x".to_owned(), 3), ("a/y".to_owned(), 2)]);
    /// assert_eq!(top["b"], [("b/q".to_owned(), 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn top_k_frequent<M>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        let capacity = k.saturating_mul(DEFAULT_CAPACITY_FACTOR);
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// [`top_k_frequent`](Self::top_k_frequent) with `capacity` monitored members
    /// (`capacity >= k`; the state holds at most `capacity` members with two counters).
    ///
    /// **Exact** while the key has at most `capacity` distinct members. Beyond that,
    /// Space-Saving (Metwally et al., 2005) guarantees, with N the key's records: every
    /// reported count is at least the member's true count and **at most N / capacity
    /// above it**, and every member whose true count exceeds N / capacity is monitored (so
    /// a member that is truly in the top `k` by more than that margin is reported).
    ///
    /// # Panics
    /// When `k` is 0 or `capacity < k`, or the store name is invalid or used twice.
    pub fn top_k_frequent_with_capacity<M>(
        &self,
        store: &str,
        k: usize,
        capacity: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// The number of distinct members per key, `member(key, value)` identified by its
    /// bytes under `member_serde`.
    ///
    /// **Exact** up to [`EXACT_DISTINCT_LIMIT`] (2,048) distinct members: the state is the
    /// sorted set of their 64-bit [`member_hash`]es (8 bytes each). Past it, a HyperLogLog
    /// sketch of precision [`HLL_PRECISION`] (2^14 one-byte registers: 16 KiB), whose
    /// estimate has a relative standard error of `1.04 / sqrt(2^14)` ≈ 0.81% (this module's
    /// tests hold it within 3 standard errors, 2.44%, over random sets of 10^3 to 10^6
    /// members). The state never exceeds 16 KiB + 8 bytes, well under DynamoDB's
    /// 400 KB; note that each write of such an item costs one write unit per KB.
    ///
    /// Both forms are independent of the order of the records, so a retried batch with
    /// other boundaries ends in the same state.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Distinct visitors per page (records: page -> user).
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("views", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .distinct_count("visitors", |_, user: &String| user.clone(), Utf8)
    ///     .to_stream()
    ///     .map_values(|n| n as i64)
    ///     .to("visitors", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut views = driver.input_topic("views", Utf8, Utf8);
    /// for (page, user) in [("/", "ann"), ("/", "bob"), ("/", "ann"), ("/faq", "ann")] {
    ///     views.pipe_input(page.to_owned(), user.to_owned())?;
    /// }
    /// let visitors = driver.output_topic("visitors", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!(visitors["/"], 2);
    /// assert_eq!(visitors["/faq"], 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn distinct_count<M>(
        &self,
        store: &str,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<K, u64>
    where
        M: Send + Sync + 'static,
    {
        distinct_count_on(self, store, member, member_serde)
    }
}

impl<K, V> TimeWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// [`KGroupedStream::top_k`] per key and window.
    pub fn top_k<M, S>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        score: impl Fn(&K, &V) -> S + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, Vec<(M, S)>>
    where
        M: Clone + Send + Sync + 'static,
        S: Score,
    {
        top_k_on(self, store, k, member, score, member_serde)
    }

    /// [`KGroupedStream::top_k_frequent`] per key and window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::{EmitStrategy, TimeWindows};
    /// use lambda_streams::serdes::{Json, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// // The top 2 pages per minute, emitted once per minute when it closes.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("views", Unit, Utf8)
    ///     .group_by(|_, _| "all".to_owned(), Grouped::with(Utf8, Utf8))
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
    ///     .emit_strategy(EmitStrategy::OnWindowClose)
    ///     .top_k_frequent("top-pages", 2, |_, page: &String| page.clone(), Utf8)
    ///     .to_stream()
    ///     .map(|w, top| (w.start.to_string(), top))
    ///     .to("top-pages", Utf8, Json::<Vec<(String, u64)>>::new());
    /// let driver = TestDriver::new(builder.build());
    /// let mut views = driver.input_topic("views", Unit, Utf8);
    /// for (page, at) in [("/a", 1_000), ("/b", 2_000), ("/a", 3_000), ("/c", 4_000), ("/c", 5_000), ("/c", 61_000)] {
    ///     views.pipe_input_with_timestamp((), page.to_owned(), at)?;
    /// }
    /// let top = driver.output_topic("top-pages", Utf8, Json::<Vec<(String, u64)>>::new());
    /// assert_eq!(
    ///     top.read_key_values()?,
    ///     [("0".to_owned(), vec![("/a".to_owned(), 2), ("/c".to_owned(), 2)])]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn top_k_frequent<M>(
        &self,
        store: &str,
        k: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        let capacity = k.saturating_mul(DEFAULT_CAPACITY_FACTOR);
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// [`KGroupedStream::top_k_frequent_with_capacity`] per key and window.
    pub fn top_k_frequent_with_capacity<M>(
        &self,
        store: &str,
        k: usize,
        capacity: usize,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, Vec<(M, u64)>>
    where
        M: Clone + Send + Sync + 'static,
    {
        top_k_frequent_on(self, store, k, capacity, member, member_serde)
    }

    /// [`KGroupedStream::distinct_count`] per key and window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::TimeWindows;
    /// use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// // Distinct users per minute.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("logins", Unit, Utf8)
    ///     .group_by(|_, _| "all".to_owned(), Grouped::with(Utf8, Utf8))
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
    ///     .distinct_count("users-per-minute", |_, user: &String| user.clone(), Utf8)
    ///     .to_stream()
    ///     .map(|w, n| (w.start.to_string(), n as i64))
    ///     .to("users", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut logins = driver.input_topic("logins", Unit, Utf8);
    /// for (user, at) in [("ann", 1_000), ("bob", 2_000), ("ann", 3_000), ("ann", 61_000)] {
    ///     logins.pipe_input_with_timestamp((), user.to_owned(), at)?;
    /// }
    /// let users = driver.output_topic("users", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!(users["0"], 2);
    /// assert_eq!(users["60000"], 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn distinct_count<M>(
        &self,
        store: &str,
        member: impl Fn(&K, &V) -> M + Send + Sync + 'static,
        member_serde: impl Serde<M>,
    ) -> KTable<Windowed<K>, u64>
    where
        M: Send + Sync + 'static,
    {
        distinct_count_on(self, store, member, member_serde)
    }
}
