//! `local-runner`: run a lambda-streams function against a real Kafka broker, as the
//! Lambda Kafka event source would.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use lambda_streams::lambda::Handler;
use lambda_streams::state::dynamodb::{
    DynamoStore, create_table, emulator_client, emulator_lean_client,
};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::state::{ItemState, Store};
use lambda_streams::{Guarantee, Topology};
use local_runner::embedded::EmbeddedDynamo;
use local_runner::schema::SchemaValidationConfig;
use local_runner::{
    EventShape, Faults, Http, InProcess, Runner, RunnerConfig, StartingPosition, Transport, admin,
};

#[derive(Parser)]
#[command(
    name = "local-runner",
    version,
    about = "Plays the Lambda Kafka event source against a real broker"
)]
struct Cli {
    /// Kafka bootstrap servers.
    #[arg(
        long,
        global = true,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    bootstrap_servers: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Consume, batch, invoke the function, commit after success.
    Run(Box<RunArgs>),
    /// Create or list topics.
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
    },
    /// Create a DynamoDB state table (on an emulator), as template.yaml's StateTable.
    Tables {
        #[command(subcommand)]
        action: TablesAction,
    },
    /// Produce lines of a file (or stdin) to a topic, one record per line, null keys.
    Produce {
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The file; `-` or absent reads stdin.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Repeat the file this many times.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// Print a store's items as JSON lines, highest values first.
    Query(QueryArgs),
    /// Scaffold a new function: a crate in functions/<NAME> (a filter, a group_by and a
    /// windowed count, with TestDriver tests), its workspace entry and its template.yaml
    /// block. Offline; never overwrites.
    New {
        /// The function's name: a crate name (lowercase letters, digits, '-' or '_').
        name: String,
        /// The crate's directory, inside the workspace (default: functions/<NAME>).
        #[arg(long)]
        path: Option<PathBuf>,
        /// The workspace root (default: the workspace at or above the current directory).
        #[arg(long)]
        workspace: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum TopicsAction {
    /// Create a topic (no error if it exists).
    Create {
        /// Topic name.
        name: String,
        /// Partitions.
        #[arg(long, default_value_t = 1)]
        partitions: i32,
    },
    /// List topics with their partition counts.
    List,
}

#[derive(Subcommand)]
enum TablesAction {
    /// Create a state table (no error if it exists), e.g. for a function run over the
    /// Invoke API (`cargo lambda watch`), whose LAMBDA_STREAMS_TABLE must exist.
    Create {
        /// Table name.
        name: String,
        /// DynamoDB endpoint (an emulator, e.g. dynoxide from `scripts/services`).
        #[arg(long, env = "AWS_ENDPOINT_URL_DYNAMODB")]
        dynamodb_endpoint: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Shape {
    SelfManaged,
    Msk,
}

/// Where an in-process function's state lives.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StateKind {
    /// DynamoDB: the endpoint given (an emulator), or an embedded dynoxide.
    Dynamodb,
    /// A `MemoryStore` in the runner's process: exact under redelivery while the runner
    /// runs, lost when it exits (benchmarks, demos; not what Lambda runs).
    Memory,
}

#[derive(clap::Args)]
struct StateArgs {
    /// DynamoDB table of the function's state (created if missing).
    #[arg(long)]
    table: Option<String>,
    /// DynamoDB endpoint (an emulator); without it, an embedded dynoxide is started.
    #[arg(long, env = "AWS_ENDPOINT_URL_DYNAMODB")]
    dynamodb_endpoint: Option<String>,
    /// Data file of the embedded dynoxide.
    #[arg(long, default_value = ".local/runner/state.db")]
    state_db: PathBuf,
    /// The request path of the in-process function's state writes: `lean` (the store's own
    /// `UpdateItem` client, the default) or `sdk` (the AWS SDK), as
    /// `LAMBDA_STREAMS_DYNAMODB_CLIENT` in Lambda.
    #[arg(long, env = "LAMBDA_STREAMS_DYNAMODB_CLIENT", default_value = "lean", value_parser = ["sdk", "lean"])]
    dynamodb_client: String,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The workspace function to run in-process (a runner built with the default
    /// `examples` feature).
    #[arg(
        long,
        required_unless_present = "function_url",
        conflicts_with = "function_url"
    )]
    function: Option<String>,
    /// Invoke the function over the Lambda Invoke API at this endpoint instead
    /// (e.g. `cargo lambda watch`: http://127.0.0.1:9000).
    #[arg(long, requires = "function_name")]
    function_url: Option<String>,
    /// The function name in the Invoke API's path (with --function-url).
    #[arg(long)]
    function_name: Option<String>,
    /// Topics to consume (default: the in-process topology's source topics).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// Consumer group id (default: lambda-streams-<function>).
    #[arg(long)]
    group_id: Option<String>,
    /// Where a partition the group never committed starts.
    #[arg(long, value_enum, default_value = "trim-horizon")]
    starting_position: Position,
    /// The time for --starting-position at-timestamp, in epoch milliseconds.
    #[arg(long, required_if_eq("starting_position", "at-timestamp"))]
    starting_timestamp: Option<i64>,
    /// Records per batch at most (1..=10000).
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// Batching window in milliseconds (at most 300000).
    #[arg(long, default_value_t = 500)]
    batching_window_ms: u64,
    /// The event's shape.
    #[arg(long, value_enum, default_value = "self-managed")]
    event_source: Shape,
    /// The cluster ARN put in MSK-shaped events.
    #[arg(
        long,
        default_value = "arn:aws:kafka:us-east-1:000000000000:cluster/local/00000000-0000-0000-0000-000000000000-1"
    )]
    msk_arn: String,
    /// Invocations in flight at most: batches of different partitions are invoked at
    /// once, as the event source does, never two of one partition. Default 8: every
    /// partition of a topic of up to 8 in flight, as in Lambda, and a bounded load on
    /// this machine beyond that. 1: one invocation at a time.
    #[arg(long, default_value_t = local_runner::config::DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Exit once the group has consumed everything: no record for --idle-timeout-ms, and
    /// the group's commits at the end of every partition.
    #[arg(long)]
    until_idle: bool,
    /// Exit as soon as the records in the topics when the runner started are done (every
    /// partition it owns committed up to its end offset at the start), without an idle
    /// period; records produced later are not waited for. For benchmarks and batch jobs.
    #[arg(long, conflicts_with = "until_idle")]
    until_caught_up: bool,
    /// Milliseconds without records that count as idle.
    #[arg(long, default_value_t = 1000)]
    idle_timeout_ms: u64,
    /// Retries of a failed record before it is given up on; -1: without limit, as
    /// Lambda (10 with --on-failure-topic).
    #[arg(long, alias = "max-retries", default_value_t = -1, allow_negative_numbers = true)]
    maximum_retry_attempts: i64,
    /// Records older than this are given up on instead of delivered; -1: no limit.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    maximum_record_age_seconds: i64,
    /// On a function error, retry the batch as two halves.
    #[arg(long)]
    bisect_batch_on_function_error: bool,
    /// Ignore partial batch responses (without ReportBatchItemFailures): a normal
    /// return is complete success.
    #[arg(long)]
    ignore_batch_item_failures: bool,
    /// Kafka topic receiving the records given up on, with headers naming their source
    /// and the error (without it they are skipped).
    #[arg(long)]
    on_failure_topic: Option<String>,
    /// A Confluent-compatible schema registry to validate records against, as the event
    /// source's `SchemaRegistryConfig` does (records that fail go to the on-failure topic
    /// with SCHEMA_NOT_FOUND or DESERIALIZATION_ERROR).
    #[arg(long)]
    schema_registry: Option<String>,
    /// With --schema-registry: how validated records are handed over (`EventRecordFormat`):
    /// `source` (bytes without the wire-format prefix) or `json` (the decoded value).
    #[arg(long, default_value = "source", requires = "schema_registry")]
    event_record_format: String,
    /// With --schema-registry: what is validated: `key`, `value` or `key,value`.
    #[arg(long, default_value = "value", requires = "schema_registry")]
    schema_validation: String,
    /// A filter of the event source's FilterCriteria, as the text of its `Pattern` (e.g.
    /// '{"value": {"kind": ["order"]}}'); repeatable, up to 5: a record is delivered when it
    /// matches one of them; the others are committed without being delivered, as Lambda does.
    /// A topology's repartition topics are not filtered (in Lambda they have an event source
    /// mapping of their own).
    #[arg(long = "filter", value_name = "PATTERN")]
    filters: Vec<String>,
    /// Create the topics the in-process topology writes (its `to` topics and repartition
    /// topics) when missing, with as many partitions as its largest source topic; with
    /// --function-url, those of this runner's example function of that --function-name (if
    /// any, configured from the same environment) and the topics given with --output-topic.
    #[arg(long)]
    create_topics: bool,
    /// With --create-topics and --function-url: a topic the function writes (repeatable).
    #[arg(long = "output-topic", requires = "create_topics")]
    output_topics: Vec<String>,
    /// Processing guarantee.
    #[arg(long, env = "LAMBDA_STREAMS_GUARANTEE", default_value = "exactly_once")]
    guarantee: String,
    /// The in-process function's output guarantee: at_least_once or exactly_once
    /// (transactions per source partition; read the outputs with read_committed).
    #[arg(
        long,
        env = "LAMBDA_STREAMS_OUTPUT_GUARANTEE",
        default_value = "at_least_once"
    )]
    output_guarantee: String,
    /// The in-process function's application id: under exactly_once the prefix of its
    /// transactional ids and shadow group (default: the function's name).
    #[arg(long, env = "LAMBDA_STREAMS_APPLICATION_ID")]
    application_id: Option<String>,
    /// The isolation level of the runner's consumer: read_committed (librdkafka's default:
    /// records of aborted or open transactions are not delivered) or read_uncommitted (as
    /// the Java client's default). The in-process function is told which: under
    /// exactly_once output, read_uncommitted makes it read each batch of its repartition
    /// topics again with read_committed.
    #[arg(long, value_parser = ["read_committed", "read_uncommitted"], default_value = "read_committed")]
    isolation_level: String,
    /// Where the function's state lives.
    #[arg(long = "state", value_enum, default_value = "dynamodb")]
    state_kind: StateKind,
    #[command(flatten)]
    state: StateArgs,
    /// Fault: every Nth batch is delivered twice.
    #[arg(long)]
    duplicate_every: Option<u64>,
    /// Fault: every Nth batch is retried after success, as a longer batch.
    #[arg(long)]
    extend_retry_every: Option<u64>,
    /// Fault: the Nth invocation fails before it reaches the function.
    #[arg(long)]
    fail_invocation: Option<u64>,
    /// Fault: after the Nth batch succeeded, abort the runner before its commit.
    #[arg(long)]
    crash_before_commit: Option<u64>,
    /// Fault: the invocation crashes after this many state item writes (once).
    #[arg(long)]
    fail_after_writes: Option<u64>,
    /// Print the N largest items of each store at the end.
    #[arg(long)]
    print_top: Option<usize>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// A librdkafka property of the group consumer, KEY=VALUE (repeatable), over the
    /// runner's own: e.g. group.protocol=consumer (KIP-848, Kafka 4 brokers),
    /// queued.max.messages.kbytes=N, security.protocol=SSL.
    #[arg(long = "consumer-property", value_name = "KEY=VALUE", value_parser = key_value)]
    consumer_properties: Vec<(String, String)>,
    /// Batches' worth of records a partition may have buffered (at least 10,000 records,
    /// at most 24 MB) before it is paused; it is resumed below half of it.
    #[arg(long, default_value_t = local_runner::config::DEFAULT_READ_AHEAD_BATCHES)]
    read_ahead_batches: usize,
}

/// `KEY=VALUE`.
fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("{s:?}: expected KEY=VALUE")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Position {
    TrimHorizon,
    Latest,
    AtTimestamp,
}

#[derive(clap::Args)]
struct QueryArgs {
    /// The store.
    #[arg(long)]
    store: String,
    /// Print at most this many items.
    #[arg(long)]
    top: Option<usize>,
    /// Print only this key (UTF-8), or `null` when it has no item.
    #[arg(long, conflicts_with = "top")]
    key: Option<String>,
    /// With `--key`, of a windowed store: the windows starting at or after this time
    /// (epoch ms), one JSON line each.
    #[arg(long, requires = "key")]
    from: Option<i64>,
    /// With `--key`, of a windowed store: the windows starting at or before this time
    /// (epoch ms).
    #[arg(long, requires = "key")]
    to: Option<i64>,
    #[command(flatten)]
    state: StateArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    lambda_streams::lambda::init_tracing();
    let cli = Cli::parse();
    match dispatch(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cli: Cli) -> Result<(), String> {
    let bootstrap = cli.bootstrap_servers;
    match cli.command {
        Command::Run(args) => run(&bootstrap, *args).await,
        Command::Topics {
            action: TopicsAction::Create { name, partitions },
        } => {
            let created = admin::create_topic(&bootstrap, &name, partitions).await?;
            println!("{name}: {}", if created { "created" } else { "exists" });
            Ok(())
        }
        Command::Topics {
            action: TopicsAction::List,
        } => {
            for (name, partitions) in admin::list_topics(&bootstrap)? {
                println!("{name}\t{partitions}");
            }
            Ok(())
        }
        Command::Tables {
            action:
                TablesAction::Create {
                    name,
                    dynamodb_endpoint,
                },
        } => {
            create_table(&emulator_client(&dynamodb_endpoint), &name)
                .await
                .map_err(|e| format!("DynamoDB at {dynamodb_endpoint}: {e}"))?;
            println!("{name}: ready");
            Ok(())
        }
        Command::Produce {
            topic,
            file,
            repeat,
        } => {
            let text = match file.filter(|f| f.as_os_str() != "-") {
                Some(path) => std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
                None => std::io::read_to_string(std::io::stdin())
                    .map_err(|e| format!("cannot read stdin: {e}"))?,
            };
            let lines: Vec<String> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned)
                .collect();
            let all = std::iter::repeat_n(lines, repeat).flatten();
            let count = admin::produce_lines(&bootstrap, &topic, all, None).await?;
            println!("produced {count} records to {topic}");
            Ok(())
        }
        Command::New {
            name,
            path,
            workspace,
        } => new_function(&name, path.as_deref(), workspace.as_deref()),
        Command::Query(args) => {
            let (store, _embedded) =
                open_store(&args.state, "lambda-streams", Guarantee::ExactlyOnce).await?;
            match (args.key, args.from.is_some() || args.to.is_some()) {
                (Some(key), true) => {
                    let (from, to) = (args.from.unwrap_or(i64::MIN), args.to.unwrap_or(i64::MAX));
                    print_windows(&store, &args.store, &key, from, to).await
                }
                (Some(key), false) => print_key(&store, &args.store, &key).await,
                (None, _) => print_items(&store, &args.store, args.top).await,
            }
        }
    }
}

/// `local-runner new`: scaffolds the function and says what to do next.
fn new_function(
    name: &str,
    path: Option<&std::path::Path>,
    workspace: Option<&std::path::Path>,
) -> Result<(), String> {
    use local_runner::scaffold;
    let workspace = match workspace {
        Some(dir) => dir.to_path_buf(),
        None => {
            let cwd = std::env::current_dir()
                .and_then(|d| d.canonicalize())
                .map_err(|e| format!("cannot read the current directory: {e}"))?;
            scaffold::find_workspace(&cwd)?
        }
    };
    let workspace = workspace
        .canonicalize()
        .map_err(|e| format!("{}: {e}", workspace.display()))?;
    let path = path.map(|p| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()
                .and_then(|d| d.canonicalize())
                .map_or_else(|_| p.to_path_buf(), |cwd| cwd.join(p))
        }
    });
    let path = path.map(|p| {
        p.strip_prefix(&workspace)
            .map_or_else(|_| p.clone(), std::path::Path::to_path_buf)
    });
    let done = scaffold::scaffold(&workspace, name, path.as_deref())?;
    for file in &done.files {
        println!("wrote {}", file.display());
    }
    println!(
        "\nnext:\n  cargo test -p {name}\n  (README.md, \"Your own function in five steps\": run it locally, build it, deploy it)"
    );
    Ok(())
}

/// Opens the DynamoDB store: the given endpoint, or an embedded dynoxide.
async fn open_store(
    state: &StateArgs,
    default_table: &str,
    guarantee: Guarantee,
) -> Result<(DynamoStore, Option<EmbeddedDynamo>), String> {
    let (endpoint, embedded) = match state
        .dynamodb_endpoint
        .as_ref()
        .filter(|e| !e.trim().is_empty())
    {
        Some(endpoint) => (endpoint.clone(), None),
        None => {
            let embedded = EmbeddedDynamo::start(&state.state_db).await?;
            (embedded.endpoint().to_owned(), Some(embedded))
        }
    };
    let client = emulator_client(&endpoint);
    let table = state
        .table
        .clone()
        .unwrap_or_else(|| default_table.to_owned());
    create_table(&client, &table)
        .await
        .map_err(|e| format!("DynamoDB at {endpoint}: {e}"))?;
    let store = DynamoStore::new(client, table, guarantee);
    let store = if state.dynamodb_client == "lean" {
        store.with_lean_client(
            emulator_lean_client(&endpoint).map_err(|e| format!("--dynamodb-client lean: {e}"))?,
        )
    } else {
        store
    };
    Ok((store, embedded))
}

/// Creates the `topics` that do not exist yet, with as many partitions as the largest of
/// the `sources` (as Kafka Streams creates its internal topics); `what` names them in the
/// log line.
async fn create_missing_topics(
    bootstrap: &str,
    sources: &[String],
    topics: &[String],
    what: &str,
) -> Result<(), String> {
    if topics.is_empty() {
        return Ok(());
    }
    let existing: HashMap<String, usize> = admin::list_topics(bootstrap)?.into_iter().collect();
    let partitions = sources
        .iter()
        .filter(|t| !topics.contains(t))
        .filter_map(|t| existing.get(t).copied())
        .max()
        .map_or(1, |n| i32::try_from(n).unwrap_or(i32::MAX));
    for topic in topics.iter().filter(|t| !existing.contains_key(*t)) {
        admin::create_topic(bootstrap, topic, partitions).await?;
        eprintln!("[local-runner] created {what} topic {topic} ({partitions} partitions)");
    }
    Ok(())
}

/// The topics to create before the run: a topology's repartition topics always (the
/// function consumes them), and with `--create-topics` the topics it writes and the
/// `--output-topic`s. Over HTTP the runner knows the topology when it has an example
/// function of that name (configured from the same environment variables).
async fn create_topics(
    bootstrap: &str,
    args: &RunArgs,
    topology: Option<&Topology>,
    sources: &[String],
) -> Result<(), String> {
    if let Some(topology) = topology {
        create_missing_topics(
            bootstrap,
            &topology.source_topics(),
            &topology.repartition_topics(),
            "repartition",
        )
        .await?;
    }
    if !args.create_topics {
        return Ok(());
    }
    let mut outputs: Vec<String> = args.output_topics.clone();
    if let Some(topology) = topology {
        let internal = topology.repartition_topics();
        outputs.extend(
            topology
                .sink_topics()
                .into_iter()
                .filter(|t| !internal.contains(t)),
        );
    }
    outputs.retain(|t| !sources.contains(t));
    outputs.sort();
    outputs.dedup();
    create_missing_topics(bootstrap, sources, &outputs, "output").await
}

/// The topology of the workspace's example function `name`, to run in-process.
#[cfg(feature = "examples")]
fn example_topology(name: &str) -> Result<Topology, String> {
    local_runner::functions::topology(name)
}

/// Built without the example functions, the runner runs none in-process: the error says
/// how to run the function instead.
#[cfg(not(feature = "examples"))]
fn example_topology(name: &str) -> Result<Topology, String> {
    Err(format!(
        "--function {name}: this local-runner was built without the example functions (cargo feature \
         `examples`); serve the function with `cargo lambda watch` and run it with \
         --function-url http://127.0.0.1:9000 --function-name {name} --topic TOPIC, or build the \
         runner with its default features"
    ))
}

async fn run(bootstrap: &str, args: RunArgs) -> Result<(), String> {
    // Settings first: a bad filter is refused before anything is started or created.
    let filter = local_runner::filter::FilterCriteria::parse(&args.filters)?;
    let (transport, topology, name, _embedded): (Arc<dyn Transport>, _, _, _) =
        match (&args.function, &args.function_url, &args.function_name) {
            (Some(function), _, _) => {
                let topology = example_topology(function)?;
                let guarantee: Guarantee = args.guarantee.parse()?;
                // The store's own setting, as in Lambda: the aggregate cache
                // (LAMBDA_STREAMS_STATE_CACHE_BYTES; the handler reads the others below).
                let settings =
                    lambda_streams::lambda::Config::from_env().map_err(|e| e.to_string())?;
                let (stores, embedded) = match args.state_kind {
                    StateKind::Dynamodb => {
                        let default_table = format!("lambda-streams-{function}");
                        let (mut dynamo, embedded) =
                            open_store(&args.state, &default_table, guarantee).await?;
                        if let Some(bytes) = settings.state_cache_bytes {
                            dynamo = dynamo.with_cache_bytes(bytes);
                        }
                        (Stores::Dynamo(dynamo), embedded)
                    }
                    StateKind::Memory => (Stores::Memory(Arc::new(MemoryStore::new())), None),
                };
                let inner: Arc<dyn Store> = match &stores {
                    Stores::Dynamo(dynamo) => Arc::new(dynamo.clone()),
                    Stores::Memory(memory) => Arc::clone(memory) as Arc<dyn Store>,
                };
                let store: Arc<dyn Store> = match args.fail_after_writes {
                    Some(n) => Arc::new(FaultyStore::fail_once_after(inner, n)),
                    None => inner,
                };
                // The function's own settings (LAMBDA_STREAMS_*), wired as in Lambda.
                let mut config = settings;
                config.batch.output = args
                    .output_guarantee
                    .parse()
                    .map_err(|e| format!("--output-guarantee: {e}"))?;
                if let Some(id) = &args.application_id {
                    lambda_streams::kafka::check_application_id(id)
                        .map_err(|why| format!("--application-id {id:?}: {why}"))?;
                    config.application_id = Some(id.clone());
                }
                if config.application_id.is_none() {
                    config.application_id = Some(function.clone());
                }
                // The consumer's isolation level: the flag, or a --consumer-property over it.
                let isolation = args
                    .consumer_properties
                    .iter()
                    .rev()
                    .find(|(key, _)| key == "isolation.level")
                    .map_or(args.isolation_level.as_str(), |(_, v)| v.as_str());
                config.event_read_committed = isolation == "read_committed";
                let handler = Handler::try_from_config(topology.clone(), store, &config)
                    .map_err(|e| e.to_string())?;
                let transport = Arc::new(InProcess::new(Arc::new(handler)));
                eprintln!(
                    "[local-runner] topology of {function}:\n{}",
                    topology.describe()
                );
                (
                    transport,
                    Some((topology, stores)),
                    function.clone(),
                    embedded,
                )
            }
            (None, Some(url), Some(name)) => {
                let http = Http::new(url, name)?;
                eprintln!("[local-runner] invoking {}", http.url());
                (Arc::new(http), None, name.clone(), None)
            }
            _ => {
                return Err(
                    "give --function NAME, or --function-url URL --function-name NAME".into(),
                );
            }
        };
    let topics = match (&topology, args.topics.is_empty()) {
        (_, false) => args.topics.clone(),
        (Some((topology, _)), true) => topology.source_topics(),
        (None, true) => return Err("--topic is required with --function-url".into()),
    };
    // Over HTTP, the example function of that name (if this runner has it) tells which
    // topics the function writes.
    let http_topology = match (&topology, args.create_topics || !args.filters.is_empty()) {
        (None, true) => example_topology(&name).ok(),
        _ => None,
    };
    if let Some(known) = &http_topology {
        let missing: Vec<String> = known
            .repartition_topics()
            .into_iter()
            .filter(|t| !topics.contains(t))
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "[local-runner] note: {name} also consumes its repartition topics {missing:?}: give them with --topic"
            );
        }
    }
    create_topics(
        bootstrap,
        &args,
        topology
            .as_ref()
            .map(|(t, _)| t)
            .or(http_topology.as_ref().filter(|_| args.create_topics)),
        &topics,
    )
    .await?;
    let config = RunnerConfig {
        bootstrap_servers: bootstrap.to_owned(),
        group_id: args
            .group_id
            .clone()
            .unwrap_or_else(|| format!("lambda-streams-{name}")),
        topics,
        starting_position: match (args.starting_position, args.starting_timestamp) {
            (Position::TrimHorizon, _) => StartingPosition::TrimHorizon,
            (Position::Latest, _) => StartingPosition::Latest,
            (Position::AtTimestamp, Some(ms)) => StartingPosition::AtTimestamp(ms),
            (Position::AtTimestamp, None) => {
                return Err(
                    "--starting-position at-timestamp needs --starting-timestamp MS".into(),
                );
            }
        },
        batch_size: args.batch_size,
        batching_window: Duration::from_millis(args.batching_window_ms),
        shape: match args.event_source {
            Shape::SelfManaged => EventShape::SelfManaged,
            Shape::Msk => EventShape::Msk { arn: args.msk_arn },
        },
        maximum_retry_attempts: unlimited_or(
            "--maximum-retry-attempts",
            args.maximum_retry_attempts,
        )?
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        maximum_record_age: unlimited_or(
            "--maximum-record-age-seconds",
            args.maximum_record_age_seconds,
        )?
        .map(Duration::from_secs),
        bisect_batch_on_function_error: args.bisect_batch_on_function_error,
        report_batch_item_failures: !args.ignore_batch_item_failures,
        on_failure_topic: args.on_failure_topic,
        schema_validation: match args.schema_registry {
            Some(registry_url) => {
                let (key, value) = SchemaValidationConfig::sides(&args.schema_validation)?;
                Some(SchemaValidationConfig {
                    registry_url,
                    format: args.event_record_format.parse()?,
                    key,
                    value,
                })
            }
            None => None,
        },
        filter,
        unfiltered_topics: topology
            .as_ref()
            .map(|(t, _)| t)
            .or(http_topology.as_ref())
            .map(Topology::repartition_topics)
            .unwrap_or_default(),
        until_idle: args.until_idle,
        until_caught_up: args.until_caught_up,
        read_ahead_batches: args.read_ahead_batches,
        consumer_properties: {
            let mut properties = vec![("isolation.level".to_owned(), args.isolation_level.clone())];
            properties.extend(args.consumer_properties);
            properties
        },
        concurrency: args.concurrency,
        idle_timeout: Duration::from_millis(args.idle_timeout_ms),
        faults: Faults {
            duplicate_every: args.duplicate_every,
            extend_retry_every: args.extend_retry_every,
            fail_invocation: args.fail_invocation,
            crash_before_commit: args.crash_before_commit,
        },
        progress: !args.quiet,
        ..RunnerConfig::default()
    };
    let runner = Runner::new(config, transport)?;
    let summary = runner.run().await?;
    println!(
        "processed {} records in {} batches ({} invocations, at most {} in flight, {} failed and retried, {} records given up, {} filtered out) in {:.2} s ({:.2} s from the first record): {:.0} records/s",
        summary.records,
        summary.batches,
        summary.invocations,
        summary.peak_in_flight,
        summary.failures,
        summary.given_up,
        summary.filtered,
        summary.elapsed.as_secs_f64(),
        summary.active.as_secs_f64(),
        summary.records_per_second()
    );
    let secs = |d: Option<Duration>| {
        d.map_or_else(|| "-".to_owned(), |d| format!("{:.2}", d.as_secs_f64()))
    };
    println!(
        "timeline: partitions assigned after {} s, first record after {} s, stopped {} s after the last batch",
        secs(summary.to_assignment),
        secs(summary.to_first_record),
        secs(summary.stop_after_last_batch)
    );
    let ms = |q: f64| {
        summary.invocation_time_quantile(q).map_or_else(
            || "-".to_owned(),
            |d| format!("{:.1}", d.as_secs_f64() * 1000.0),
        )
    };
    println!(
        "invocation time per batch: p50 {} ms, p99 {} ms, max {} ms over {} successful invocations",
        ms(0.5),
        ms(0.99),
        ms(1.0),
        summary.invocation_times.len()
    );
    if summary.revocations > 0 {
        println!(
            "rebalances revoked {} partitions from this runner ({} buffered records dropped, for their new owner to read again)",
            summary.revocations, summary.dropped
        );
    }
    if let (Some(top), Some((topology, stores))) = (args.print_top, &topology) {
        for store in topology.store_names() {
            println!("top {top} of store {store}:");
            match stores {
                Stores::Dynamo(dynamo) => print_items(dynamo, &store, Some(top)).await?,
                Stores::Memory(memory) => print_sorted(
                    memory
                        .items(&store)
                        .into_iter()
                        .map(|(key, value, version)| (key, None, ItemState::number(value, version)))
                        .collect(),
                    Some(top),
                ),
            }
        }
    }
    Ok(())
}

/// `-1` (the event source's "no limit") as `None`; other negatives are an error naming
/// the option.
fn unlimited_or(option: &str, value: i64) -> Result<Option<u64>, String> {
    match value {
        -1 => Ok(None),
        v if v < 0 => Err(format!("{option} {v}: expected -1 (no limit) or a count")),
        v => Ok(Some(v as u64)),
    }
}

/// One key's item as JSON (`null` when it does not exist); a general aggregate's value is
/// printed as its stored text when it is UTF-8 (JSON serdes), else as hex.
/// An item's state as JSON: `{"key", "window"?, "value", "version"}`; a general
/// aggregate's bytes as JSON when they are JSON, else as text or hex.
fn item_json(key: &str, window: Option<i64>, state: &ItemState) -> serde_json::Value {
    let value = match &state.aggregate {
        None => serde_json::json!(state.value),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => serde_json::from_str(text).unwrap_or_else(|_| serde_json::json!(text)),
            Err(_) => serde_json::json!(lambda_streams::state::printable_key(bytes)),
        },
    };
    let mut json = serde_json::json!({ "key": key, "value": value, "version": state.version });
    if let Some(start) = window {
        json["window_start"] = serde_json::json!(start);
    }
    json
}

async fn print_key(store: &DynamoStore, name: &str, key: &str) -> Result<(), String> {
    let item = store
        .get(name, key.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let json = match item {
        None => serde_json::Value::Null,
        Some(state) => item_json(key, None, &state),
    };
    println!("{json}");
    Ok(())
}

async fn print_windows(
    store: &DynamoStore,
    name: &str,
    key: &str,
    from: i64,
    to: i64,
) -> Result<(), String> {
    let windows = store
        .windows(name, key.as_bytes(), from, to)
        .await
        .map_err(|e| e.to_string())?;
    for (start, state) in windows {
        println!("{}", item_json(key, Some(start), &state));
    }
    Ok(())
}

/// The store an in-process function runs with.
enum Stores {
    Dynamo(DynamoStore),
    Memory(Arc<MemoryStore>),
}

async fn print_items(store: &DynamoStore, name: &str, top: Option<usize>) -> Result<(), String> {
    let items = store.scan(name).await.map_err(|e| e.to_string())?;
    print_sorted(
        items
            .into_iter()
            .map(|item| (item.key, item.window, item.state))
            .collect(),
        top,
    );
    Ok(())
}

/// Prints `(key, window, state)` items as JSON lines, highest values first.
fn print_sorted(mut items: Vec<(Vec<u8>, Option<i64>, ItemState)>, top: Option<usize>) {
    items.sort_by(|a, b| {
        b.2.value
            .cmp(&a.2.value)
            .then_with(|| (&a.0, a.1).cmp(&(&b.0, b.1)))
    });
    for (key, window, state) in items.into_iter().take(top.unwrap_or(usize::MAX)) {
        let key = String::from_utf8_lossy(&key);
        println!("{}", item_json(&key, window, &state));
    }
}
