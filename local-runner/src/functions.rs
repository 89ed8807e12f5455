//! The functions of this workspace that the runner can run in-process, by name.

use lambda_streams::Topology;

/// The names `--function` accepts.
pub const NAMES: &[&str] = &[
    "wordcount",
    "enrich-orders",
    "pageviews",
    "bench-stateless",
    "bench-count",
];

/// The topology of the workspace function `name` (configured from the environment,
/// as in Lambda).
pub fn topology(name: &str) -> Option<Topology> {
    match name {
        "wordcount" => Some(wordcount::topology_from_env()),
        "enrich-orders" => Some(enrich_orders::topology_from_env()),
        "pageviews" => Some(pageviews::topology_from_env()),
        // The end-to-end benchmark's pipelines (bench/e2e; topics from BENCH_INPUT_TOPIC
        // and BENCH_OUTPUT_TOPIC).
        "bench-stateless" => Some(bench_topologies::stateless_from_env()),
        "bench-count" => Some(bench_topologies::count_from_env()),
        _ => None,
    }
}
