//! Tests of the built-in aggregators against independent references: brute-force
//! top-K and distinct sets computed here, the C xxHash library's outputs, and the
//! statistical bound of HyperLogLog.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::StreamsBuilder;
use crate::driver::{Batching, TestDriver};
use crate::dsl::Grouped;
use crate::serdes::{DecimalI64, Json, Unit, Utf8};

/// XXH64 reference outputs, from the C library (libxxhash 0.8.1):
/// `XXH64(data, len, seed)` through Python's ctypes.
#[test]
fn xxh64_matches_the_reference_implementation() {
    let long: Vec<u8> = (0..100u8).collect();
    let cases: [(&[u8], u64, u64); 10] = [
        (b"", 0, 0xef46db3751d8e999),
        (b"", 42, 0x98b1582b0977e704),
        (b"a", 0, 0xd24ec4f1a98c6e5b),
        (b"a", 42, 0x88e4fe59adf7b0cc),
        (b"abc", 0, 0x44bc2cf5ad770999),
        (b"abc", 42, 0x13c1d910702770e6),
        (
            b"0123456789abcdef0123456789abcdef0123456789",
            0,
            0xa76190c3acf08a1c,
        ),
        (
            b"0123456789abcdef0123456789abcdef0123456789",
            42,
            0xec3fafab8cf27c18,
        ),
        (&long, 0, 0x6ac1e58032166597),
        (&long, 42, 0x819d2b726001d507),
    ];
    for (data, seed, expected) in cases {
        assert_eq!(
            xxh64(data, seed),
            expected,
            "{} bytes, seed {seed}",
            data.len()
        );
    }
    assert_eq!(member_hash(b"abc"), 0x44bc2cf5ad770999);
}

// --- Top-K by score ------------------------------------------------------------------

/// The exact top-K by brute force: every member's max score, sorted by score descending
/// then bytes ascending.
fn brute_top_k(records: &[(String, i64)], k: usize) -> Vec<(String, i64)> {
    let mut best: BTreeMap<String, i64> = BTreeMap::new();
    for (m, s) in records {
        let e = best.entry(m.clone()).or_insert(*s);
        *e = (*e).max(*s);
    }
    let mut all: Vec<(String, i64)> = best.into_iter().collect();
    all.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
    });
    all.truncate(k);
    all
}

/// Folds `records` as the framework does: batch by batch (`cuts`), the state through its
/// serde between batches.
fn fold_top_k(records: &[(String, i64)], k: usize, cuts: &[usize]) -> Vec<(String, i64)> {
    let serde = TopKSerde::<String, i64> {
        member: Arc::new(Utf8),
        score: PhantomData,
    };
    let mut bytes: Option<Vec<u8>> = None;
    let mut start = 0;
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (records.len() + 1)).collect();
    ends.push(records.len());
    ends.sort_unstable();
    for end in ends {
        let mut state = match &bytes {
            Some(b) => serde.deserialize(Some(b)).unwrap(),
            None => TopK::new(),
        };
        for (m, s) in &records[start..end.max(start)] {
            state.offer(m.clone(), m.as_bytes().to_vec(), *s, k);
        }
        start = end.max(start);
        bytes = serde.serialize(&state);
    }
    let state = serde.deserialize(bytes.as_deref()).unwrap();
    state
        .entries
        .into_iter()
        .map(|e| (e.member, e.score))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn top_k_is_exact(
        records in prop::collection::vec(("[a-h]{1,2}", -20i64..20), 0..200),
        k in 1usize..8,
        cuts in prop::collection::vec(0usize..200, 0..5),
    ) {
        prop_assert_eq!(fold_top_k(&records, k, &cuts), brute_top_k(&records, k));
    }
}

#[test]
fn top_k_f64_ignores_nan_and_orders_totally() {
    let mut top = TopK::<String, f64>::new();
    for (m, s) in [
        ("a", 1.5),
        ("b", f64::NAN),
        ("c", -0.0),
        ("d", 0.0),
        ("a", 0.5),
    ] {
        top.offer(m.to_owned(), m.as_bytes().to_vec(), s, 3);
    }
    let got: Vec<(String, f64)> = top
        .entries
        .into_iter()
        .map(|e| (e.member, e.score))
        .collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0], ("a".to_owned(), 1.5));
    // total order: 0.0 > -0.0
    assert_eq!(got[1].0, "d");
    assert_eq!(got[2].0, "c");
}

// --- Space-Saving ----------------------------------------------------------------------

fn exact_counts(records: &[String]) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for m in records {
        *counts.entry(m.clone()).or_insert(0) += 1;
    }
    counts
}

fn brute_top_frequent(records: &[String], k: usize) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = exact_counts(records).into_iter().collect();
    all.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
    });
    all.truncate(k);
    all
}

fn space_saving(records: &[String], capacity: usize) -> SpaceSaving<String> {
    let serde = SpaceSavingSerde::<String> {
        member: Arc::new(Utf8),
    };
    let mut state = SpaceSaving::new();
    for (i, m) in records.iter().enumerate() {
        state.offer(m.clone(), m.as_bytes().to_vec(), capacity);
        if i % 17 == 0 {
            state = serde
                .deserialize(serde.serialize(&state).as_deref())
                .unwrap();
        }
    }
    state
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// With at most `capacity` distinct members, the top-k is exact.
    #[test]
    fn space_saving_is_exact_when_the_members_fit(
        records in prop::collection::vec("[a-j]", 0..300),
        k in 1usize..5,
    ) {
        let state = space_saving(&records, 10);
        let top: Vec<(String, u64)> = state.top(k).into_iter()
            .map(|c| (c.entry.member.clone(), c.entry.score)).collect();
        prop_assert_eq!(top, brute_top_frequent(&records, k));
        prop_assert!(state.counters.iter().all(|c| c.error == 0));
    }

    /// Beyond the capacity: every count overestimates by at most N / capacity, never
    /// underestimates, `count - error` is a lower bound, and every member more frequent
    /// than N / capacity is monitored.
    #[test]
    fn space_saving_stays_within_its_bound(
        // A skewed stream over up to 60 members: small ids are frequent.
        raw in prop::collection::vec((0u32..60, 0u32..60), 1..600),
        capacity in 1usize..20,
    ) {
        let records: Vec<String> =
            raw.iter().map(|(a, b)| format!("m{}", a.min(b))).collect();
        let state = space_saving(&records, capacity);
        let truth = exact_counts(&records);
        let n = records.len() as u64;
        prop_assert_eq!(state.total, n);
        prop_assert!(state.counters.len() <= capacity);
        let bound = n / capacity as u64;
        for c in &state.counters {
            let f = truth[&c.entry.member];
            prop_assert!(c.entry.score >= f, "{} counted {} < true {}", c.entry.member, c.entry.score, f);
            prop_assert!(c.entry.score - f <= bound, "{} over by {} > N/c = {}", c.entry.member, c.entry.score - f, bound);
            prop_assert!(c.entry.score - c.error <= f);
        }
        for (m, f) in &truth {
            if *f > bound {
                prop_assert!(state.counters.iter().any(|c| &c.entry.member == m), "{} ({} > {}) not monitored", m, f, bound);
            }
        }
    }
}

// --- Distinct count ---------------------------------------------------------------------

#[test]
fn distinct_count_is_exact_up_to_the_limit() {
    let mut rng = StdRng::seed_from_u64(1);
    for size in [0usize, 1, 2, 100, 1000, EXACT_DISTINCT_LIMIT] {
        let universe: Vec<String> = (0..size).map(|i| format!("user-{i}")).collect();
        let mut distinct = Distinct::Exact(Vec::new());
        let mut seen = BTreeSet::new();
        // Every member at least once, many several times, in random order.
        let mut stream = universe.clone();
        for _ in 0..size * 2 {
            stream.push(
                universe[rng.random_range(0..size.max(1)).min(size.saturating_sub(1))].clone(),
            );
        }
        if size == 0 {
            stream.clear();
        }
        for m in &stream {
            distinct.insert(
                member_hash(m.as_bytes()),
                EXACT_DISTINCT_LIMIT,
                HLL_PRECISION,
            );
            seen.insert(m.clone());
        }
        assert!(matches!(distinct, Distinct::Exact(_)), "size {size}");
        assert_eq!(distinct.count(), seen.len() as u64, "size {size}");
        let round = DistinctSerde
            .deserialize(DistinctSerde.serialize(&distinct).as_deref())
            .unwrap();
        assert_eq!(round, distinct);
    }
    // One more member: the sketch.
    let mut distinct = Distinct::Exact(Vec::new());
    for i in 0..=EXACT_DISTINCT_LIMIT {
        distinct.insert(
            member_hash(format!("user-{i}").as_bytes()),
            EXACT_DISTINCT_LIMIT,
            HLL_PRECISION,
        );
    }
    assert!(matches!(distinct, Distinct::Sketch(_)));
    let bytes = DistinctSerde.serialize(&distinct).unwrap();
    assert_eq!(
        bytes.len(),
        2 + 1 + 1 + (1 << HLL_PRECISION),
        "16 KiB + 4 bytes"
    );
    let exact_max = DistinctSerde
        .serialize(&Distinct::Exact((0..EXACT_DISTINCT_LIMIT as u64).collect()))
        .unwrap();
    assert_eq!(exact_max.len(), 2 + 1 + 4 + 8 * EXACT_DISTINCT_LIMIT);
}

/// HyperLogLog's relative error on random sets of 10^3 to 10^6 distinct members stays
/// within 3 standard errors (1.04 / sqrt(2^14) each); the observed errors are printed.
#[test]
fn hyperloglog_is_within_three_standard_errors() {
    let se = 1.04 / f64::from(1u32 << HLL_PRECISION).sqrt();
    let mut worst: f64 = 0.0;
    let mut sum_sq = 0.0;
    let mut runs = 0;
    for (seed, size) in [
        1_000u64, 3_000, 10_000, 30_000, 50_000, 100_000, 300_000, 1_000_000,
    ]
    .into_iter()
    .flat_map(|size| (0..3u64).map(move |s| (s, size)))
    {
        let mut rng = StdRng::seed_from_u64(seed * 7919 + size);
        let salt: u64 = rng.random();
        // Through the Distinct state from the first member: exact, then the sketch.
        let mut distinct = Distinct::Exact(Vec::new());
        for i in 0..size {
            let member = format!("{salt:x}-{i}");
            distinct.insert(
                member_hash(member.as_bytes()),
                EXACT_DISTINCT_LIMIT,
                HLL_PRECISION,
            );
            if rng.random_bool(0.3) {
                // a repeated member changes nothing
                distinct.insert(
                    member_hash(member.as_bytes()),
                    EXACT_DISTINCT_LIMIT,
                    HLL_PRECISION,
                );
            }
        }
        let estimate = match &distinct {
            Distinct::Sketch(s) => s.estimate(),
            Distinct::Exact(set) => set.len() as f64,
        };
        // The sketch alone (no exact phase) for the sizes below the limit.
        let mut sketch = HyperLogLog::new(HLL_PRECISION);
        for i in 0..size {
            sketch.insert(member_hash(format!("{salt:x}-{i}").as_bytes()));
        }
        for (what, est) in [("distinct", estimate), ("sketch", sketch.estimate())] {
            let error = (est - size as f64) / size as f64;
            eprintln!(
                "hll {what} n={size} seed={seed}: estimate {est:.0}, relative error {:+.3}%",
                error * 100.0
            );
            assert!(
                error.abs() < 3.0 * se,
                "{what} n={size} seed={seed}: error {error} >= 3 SE ({se})"
            );
            worst = worst.max(error.abs());
            sum_sq += error * error;
            runs += 1;
        }
    }
    eprintln!(
        "hll: {runs} estimates, worst |error| {:.3}%, rms {:.3}% (standard error {:.3}%)",
        worst * 100.0,
        (sum_sq / f64::from(runs)).sqrt() * 100.0,
        se * 100.0
    );
}

#[test]
fn hyperloglog_is_exact_on_tiny_sets_and_order_independent() {
    let mut sketch = HyperLogLog::new(HLL_PRECISION);
    assert_eq!(sketch.estimate().round(), 0.0);
    for i in 0..10 {
        sketch.insert(member_hash(format!("m{i}").as_bytes()));
    }
    assert_eq!(sketch.estimate().round(), 10.0);
    let mut reversed = HyperLogLog::new(HLL_PRECISION);
    for i in (0..10).rev() {
        reversed.insert(member_hash(format!("m{i}").as_bytes()));
    }
    assert_eq!(sketch, reversed);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// The distinct state of a set does not depend on the order nor on repetitions (so
    /// a retried batch with other boundaries ends in the same state).
    #[test]
    fn distinct_state_is_independent_of_order(
        members in prop::collection::vec(0u32..3000, 0..3000),
        seed in any::<u64>(),
    ) {
        let fold = |ms: &[u32]| {
            let mut d = Distinct::Exact(Vec::new());
            for m in ms {
                d.insert(member_hash(&m.to_be_bytes()), EXACT_DISTINCT_LIMIT, HLL_PRECISION);
            }
            d
        };
        let mut shuffled = members.clone();
        let mut rng = StdRng::seed_from_u64(seed);
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.random_range(0..=i));
        }
        let a = fold(&members);
        prop_assert_eq!(&a, &fold(&shuffled));
        let truth = members.iter().collect::<BTreeSet<_>>().len();
        if truth <= EXACT_DISTINCT_LIMIT {
            prop_assert_eq!(a.count(), truth as u64);
        }
    }
}

// --- State format -------------------------------------------------------------------------

#[test]
fn states_carry_their_version_and_kind() {
    let top = TopKSerde::<String, i64> {
        member: Arc::new(Utf8),
        score: PhantomData,
    };
    let mut state = TopK::new();
    state.offer("x".to_owned(), b"x".to_vec(), 7, 3);
    let bytes = top.serialize(&state).unwrap();
    assert_eq!(
        bytes,
        [
            1, b'T', 0, 0, 0, 1, 0, 0, 0, 1, b'x', 0, 0, 0, 0, 0, 0, 0, 7
        ]
    );
    let mut future = bytes.clone();
    future[0] = 2;
    assert_eq!(
        top.deserialize(Some(&future)).unwrap_err().0,
        "top-k state: unknown format version 2 (this release reads 1)"
    );
    let distinct = DistinctSerde.serialize(&Distinct::Exact(vec![5])).unwrap();
    assert!(
        top.deserialize(Some(&distinct))
            .unwrap_err()
            .0
            .contains("kind 'D', expected 'T'")
    );
    assert!(
        top.deserialize(Some(&bytes[..bytes.len() - 1]))
            .unwrap_err()
            .0
            .contains("truncated")
    );
    assert!(
        DistinctSerde
            .deserialize(Some(&[
                1, b'D', 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 3
            ]))
            .is_err(),
        "hashes out of order"
    );
}

// --- Through the topology -----------------------------------------------------------------

/// All three aggregators through the test driver, in batches of 7 records, each batch
/// delivered twice: the outputs equal brute-force references.
#[test]
fn the_aggregators_through_the_driver_equal_the_references_despite_redeliveries() {
    let builder = StreamsBuilder::new();
    let grouped = builder.stream("plays", Utf8, Utf8).group_by_key(Utf8);
    let member = |_: &String, v: &String| v.split(':').next().unwrap_or_default().to_owned();
    let score = |_: &String, v: &String| {
        v.rsplit(':')
            .next()
            .and_then(|s| s.parse::<i64>().ok())
            .unwrap_or(0)
    };
    grouped
        .top_k("best", 3, member, score, Utf8)
        .to_stream()
        .to("best", Utf8, Json::<Vec<(String, i64)>>::new());
    grouped
        .top_k_frequent("frequent", 2, member, Utf8)
        .to_stream()
        .to("frequent", Utf8, Json::<Vec<(String, u64)>>::new());
    grouped
        .distinct_count("distinct", member, Utf8)
        .to_stream()
        .map_values(|n| n as i64)
        .to("distinct", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build()).with_batching(Batching::Size(7));
    let mut rng = StdRng::seed_from_u64(9);
    let mut records: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    let mut input = driver.input_topic("plays", Utf8, Utf8);
    for i in 0..300 {
        let key = format!("g{}", rng.random_range(0..3));
        let m = format!("p{}", rng.random_range(0..12));
        let s: i64 = rng.random_range(0..1000);
        input.pipe_input(key.clone(), format!("{m}:{s}")).unwrap();
        records.entry(key).or_default().push((m, s));
        if i % 7 == 6 {
            driver.redeliver_last_batch().unwrap();
        }
    }
    driver.flush().unwrap();
    let best = driver
        .output_topic("best", Utf8, Json::<Vec<(String, i64)>>::new())
        .read_key_values_to_map()
        .unwrap();
    let frequent = driver
        .output_topic("frequent", Utf8, Json::<Vec<(String, u64)>>::new())
        .read_key_values_to_map()
        .unwrap();
    let distinct = driver
        .output_topic("distinct", Utf8, DecimalI64)
        .read_key_values_to_map()
        .unwrap();
    assert_eq!(best.len(), 3);
    for (key, recs) in &records {
        assert_eq!(best[key], brute_top_k(recs, 3), "{key}");
        let members: Vec<String> = recs.iter().map(|(m, _)| m.clone()).collect();
        // 12 members fit the capacity (20): exact.
        assert_eq!(frequent[key], brute_top_frequent(&members, 2), "{key}");
        assert_eq!(
            distinct[key],
            members.iter().collect::<BTreeSet<_>>().len() as i64,
            "{key}"
        );
    }
}

#[test]
#[should_panic(expected = "k must be at least 1")]
fn top_k_of_zero_is_a_build_error() {
    let builder = StreamsBuilder::new();
    builder
        .stream("s", Unit, Utf8)
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .top_k("t", 0, |_, v: &String| v.clone(), |_, _| 1i64, Utf8);
}
