//! The functions of this workspace that the runner can run in-process, by name.

use lambda_streams::Topology;

/// The names `--function` accepts.
pub const NAMES: &[&str] = &[
    "wordcount",
    "enrich-orders",
    "pageviews",
    "orders-avro",
    "bench-stateless",
    "bench-count",
];

/// The topology of the workspace function `name` (configured from the environment,
/// as in Lambda).
///
/// # Errors
/// An unknown name, or a function's setting it rejects (named).
pub fn topology(name: &str) -> Result<Topology, String> {
    let topology = match name {
        "wordcount" => wordcount::topology_from_env()?,
        "enrich-orders" => enrich_orders::topology_from_env(),
        "pageviews" => pageviews::topology_from_env(),
        "orders-avro" => orders_avro::topology_from_env()?,
        // The end-to-end benchmark's pipelines (bench/e2e.py; topics from BENCH_INPUT_TOPIC
        // and BENCH_OUTPUT_TOPIC).
        "bench-stateless" => bench_topologies::stateless_from_env(),
        "bench-count" => bench_topologies::count_from_env(),
        _ => {
            return Err(format!(
                "unknown function {name:?}; this runner knows: {} (or invoke any function with --function-url)",
                NAMES.join(", ")
            ));
        }
    };
    Ok(topology)
}
