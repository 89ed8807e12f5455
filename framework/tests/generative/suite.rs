//! One case (a plan, its inputs, a fault-free and a faulty schedule, checked against the
//! reference) and the run over every enabled family, shared by the in-memory test
//! (`framework/tests/generative.rs`, which lists the families) and the one on DynamoDB
//! (`tests/tests/generative_dynamo.rs`, which includes that file as a module).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use lambda_streams::state::Store;

use super::harness::{self, Fault, run_schedule};
use super::plan::{self, Inputs, Plan, Rng};
use super::reference;
use super::{DEFAULT_FAMILIES, FAMILIES};

/// The base seeds every run uses, plus one random seed per run.
pub const FIXED_SEEDS: &[u64] = &[1, 2, 0x5eed];

/// A store for one case (each case starts from empty state).
pub type NewStore<'a> = &'a dyn Fn() -> Box<dyn Store>;

/// What one case came to.
enum Verdict {
    Passed,
    Refused(String),
    Failed(String),
}

/// Runs one case: generates the plan and inputs from `seed`, builds the topology, and
/// checks one fault-free schedule and one faulty schedule against the reference.
fn run_case(family: &str, seed: u64, new_store: NewStore) -> (Plan, Inputs, Verdict) {
    let mut rng = Rng::new(seed);
    let plan = Plan::generate(family, &mut rng);
    let inputs = Inputs::generate(&plan, &mut rng);
    let built = catch_unwind(AssertUnwindSafe(|| plan.build()));
    let topology = match built {
        Ok(t) => t,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "(no message)".to_owned());
            return (plan, inputs, Verdict::Refused(message));
        }
    };
    let expected = reference::evaluate(&plan, &inputs);
    for (index, faults) in [Fault::None, Fault::Any].into_iter().enumerate() {
        let mut schedule_rng =
            Rng::new(seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(index as u64 + 1)));
        let store = new_store();
        let outcome = run_schedule(
            &topology,
            store.as_ref(),
            &plan,
            &inputs,
            faults,
            &mut schedule_rng,
        );
        let result = outcome
            .and_then(|run| harness::compare(&plan, &expected, &run, faults))
            .and_then(|()| harness::check_window_state(&plan, &inputs, store.as_ref()));
        if let Err(e) = result {
            return (
                plan,
                inputs,
                Verdict::Failed(format!("{faults:?} schedule: {e}")),
            );
        }
    }
    (plan, inputs, Verdict::Passed)
}

fn enabled_families() -> Vec<String> {
    match std::env::var("GENERATIVE_FAMILIES") {
        Ok(v) if v == "all" => FAMILIES.iter().map(|s| (*s).to_owned()).collect(),
        Ok(v) if !v.is_empty() => v.split(',').map(|s| s.trim().to_owned()).collect(),
        _ => DEFAULT_FAMILIES.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// The seed of case `index` of `family` under `base`.
fn case_seed(base: u64, family: &str, index: u64) -> u64 {
    let mut h = base ^ 0xcbf2_9ce4_8422_2325;
    for b in family.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    plan::mix(h ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d))
}

#[derive(Default)]
struct Tally {
    passed: u64,
    refused: u64,
    refusal: Option<String>,
    failed: u64,
    /// The smallest failing case: (plan size, input size, seed, report).
    smallest: Option<(usize, usize, u64, String)>,
}

/// Runs every enabled family: `cases` cases (or `GENERATIVE_CASES`) per family and base
/// seed (`fixed` plus one random seed), each with a store from `new_store`; panics with the
/// smallest failing case of every family that failed.
pub fn run_all(cases: u64, fixed: &[u64], new_store: NewStore) {
    if let Ok(replay) = std::env::var("GENERATIVE_SEED") {
        let (family, seed) = replay
            .split_once(':')
            .expect("GENERATIVE_SEED is <family>:<seed>");
        let seed: u64 = seed.parse().expect("the seed is a decimal u64");
        let (plan, inputs, verdict) = run_case(family, seed, new_store);
        println!("plan: {plan:#?}\ninputs: {inputs:?}");
        match verdict {
            Verdict::Passed => println!("passed"),
            Verdict::Refused(m) => println!("refused by the builder: {m}"),
            Verdict::Failed(m) => panic!("GENERATIVE_SEED={family}:{seed} failed: {m}"),
        }
        return;
    }
    let cases: u64 = std::env::var("GENERATIVE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    // `GENERATIVE_RANDOM_BASE` fixes the random base seed (to repeat a whole run's counts).
    let random_seed = std::env::var("GENERATIVE_RANDOM_BASE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(7)
        });
    println!("generative: random base seed {random_seed}");
    let mut bases: Vec<u64> = fixed.to_vec();
    bases.push(random_seed);
    // The builder's refusals are expected panics: keep them off the test output.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let families = enabled_families();
    // `GENERATIVE_LIST_FAILURES=1`: one line per failing case (its seed and difference).
    let list_failures = std::env::var("GENERATIVE_LIST_FAILURES").is_ok_and(|v| v == "1");
    for family in &families {
        assert!(
            FAMILIES.contains(&family.as_str()),
            "unknown family {family:?}; known: {FAMILIES:?}"
        );
        let tally = tallies.entry(family.clone()).or_default();
        for &base in &bases {
            for index in 0..cases {
                let seed = case_seed(base, family, index);
                let (plan, inputs, verdict) = run_case(family, seed, new_store);
                match verdict {
                    Verdict::Passed => tally.passed += 1,
                    Verdict::Refused(m) => {
                        tally.refused += 1;
                        tally.refusal.get_or_insert(m);
                    }
                    Verdict::Failed(m) => {
                        tally.failed += 1;
                        if list_failures {
                            let first = m.lines().next().unwrap_or_default();
                            println!("GENERATIVE_SEED={family}:{seed} {first}");
                        }
                        let size = (plan.size(), inputs.len());
                        let smaller = tally
                            .smallest
                            .as_ref()
                            .is_none_or(|(p, i, _, _)| size < (*p, *i));
                        if smaller {
                            let report = format!(
                                "GENERATIVE_SEED={family}:{seed}\n{m}\nplan: {plan:#?}\ninputs: {inputs:?}"
                            );
                            tally.smallest = Some((size.0, size.1, seed, report));
                        }
                    }
                }
            }
        }
    }
    std::panic::set_hook(hook);
    let mut failures = Vec::new();
    for (family, t) in &tallies {
        println!(
            "family {family:<34} passed {:>5}  refused {:>5}  failed {:>5}{}",
            t.passed,
            t.refused,
            t.failed,
            t.refusal
                .as_ref()
                .map(|m| format!("  (refusal: {m})"))
                .unwrap_or_default()
        );
        if let Some((_, _, _, report)) = &t.smallest {
            failures.push(format!("family {family}: smallest failing case:\n{report}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} families failed (random base seed {random_seed}):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
