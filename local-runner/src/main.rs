//! `local-runner`: run a lambda-streams function against a real Kafka broker, as the
//! Lambda Kafka event source would.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use lambda_streams::Guarantee;
use lambda_streams::lambda::Handler;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table, emulator_client};
use lambda_streams::state::fault::FaultyStore;
use local_runner::embedded::EmbeddedDynamo;
use local_runner::{EventShape, Faults, InProcess, Runner, RunnerConfig, admin, functions};

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
    Run(RunArgs),
    /// Create or list topics.
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
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

#[derive(Clone, Copy, ValueEnum)]
enum Shape {
    SelfManaged,
    Msk,
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
}

#[derive(clap::Args)]
struct RunArgs {
    /// The workspace function to run in-process.
    #[arg(long)]
    function: String,
    /// Topics to consume (default: the topology's source topics).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// Consumer group id (default: lambda-streams-<function>).
    #[arg(long)]
    group_id: Option<String>,
    /// Records per batch at most (1..=10000).
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// Batching window in milliseconds.
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
    /// Exit once the group has consumed everything.
    #[arg(long)]
    until_idle: bool,
    /// Milliseconds without records that count as idle.
    #[arg(long, default_value_t = 1000)]
    idle_timeout_ms: u64,
    /// Give up a batch after this many retries (default: retry forever, as Lambda).
    #[arg(long)]
    max_retries: Option<u32>,
    /// Processing guarantee.
    #[arg(long, env = "LAMBDA_STREAMS_GUARANTEE", default_value = "exactly_once")]
    guarantee: String,
    #[command(flatten)]
    state: StateArgs,
    /// Fault: every Nth batch is delivered twice.
    #[arg(long)]
    duplicate_every: Option<u64>,
    /// Fault: every Nth batch is retried after success, as a longer batch.
    #[arg(long)]
    extend_retry_every: Option<u64>,
    /// Fault: the invocation crashes after this many state item writes (once).
    #[arg(long)]
    fail_after_writes: Option<u64>,
    /// Print the N largest items of each store at the end.
    #[arg(long)]
    print_top: Option<usize>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct QueryArgs {
    /// The store.
    #[arg(long)]
    store: String,
    /// Print at most this many items.
    #[arg(long)]
    top: Option<usize>,
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
        Command::Run(args) => run(&bootstrap, args).await,
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
        Command::Query(args) => {
            let (store, _embedded) =
                open_store(&args.state, "lambda-streams", Guarantee::ExactlyOnce).await?;
            print_items(&store, &args.store, args.top).await
        }
    }
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
    Ok((DynamoStore::new(client, table, guarantee), embedded))
}

async fn run(bootstrap: &str, args: RunArgs) -> Result<(), String> {
    let topology = functions::topology(&args.function).ok_or_else(|| {
        format!(
            "unknown function {:?}; this runner knows: {}",
            args.function,
            functions::NAMES.join(", ")
        )
    })?;
    let guarantee: Guarantee = args.guarantee.parse()?;
    let default_table = format!("lambda-streams-{}", args.function);
    let (dynamo, _embedded) = open_store(&args.state, &default_table, guarantee).await?;
    let store: Arc<dyn Store> = match args.fail_after_writes {
        Some(n) => Arc::new(FaultyStore::fail_once_after(dynamo.clone(), n)),
        None => Arc::new(dynamo.clone()),
    };
    let handler = Arc::new(Handler::with_kafka_output(topology.clone(), store, None));
    eprintln!(
        "[local-runner] topology of {}:\n{}",
        args.function,
        topology.describe()
    );
    let config = RunnerConfig {
        bootstrap_servers: bootstrap.to_owned(),
        group_id: args
            .group_id
            .unwrap_or_else(|| format!("lambda-streams-{}", args.function)),
        topics: if args.topics.is_empty() {
            topology.source_topics()
        } else {
            args.topics
        },
        batch_size: args.batch_size,
        batching_window: Duration::from_millis(args.batching_window_ms),
        shape: match args.event_source {
            Shape::SelfManaged => EventShape::SelfManaged,
            Shape::Msk => EventShape::Msk { arn: args.msk_arn },
        },
        until_idle: args.until_idle,
        idle_timeout: Duration::from_millis(args.idle_timeout_ms),
        max_retries: args.max_retries,
        faults: Faults {
            duplicate_every: args.duplicate_every,
            extend_retry_every: args.extend_retry_every,
        },
        progress: !args.quiet,
        ..RunnerConfig::default()
    };
    let runner = Runner::new(config, Arc::new(InProcess::new(handler)))?;
    let summary = runner.run().await?;
    println!(
        "processed {} records in {} batches ({} invocations, {} failed and retried) in {:.2} s ({:.2} s from the first record): {:.0} records/s",
        summary.records,
        summary.batches,
        summary.invocations,
        summary.failures,
        summary.elapsed.as_secs_f64(),
        summary.active.as_secs_f64(),
        summary.records_per_second()
    );
    if let Some(top) = args.print_top {
        for store in topology.store_names() {
            println!("top {top} of store {store}:");
            print_items(&dynamo, &store, Some(top)).await?;
        }
    }
    Ok(())
}

async fn print_items(store: &DynamoStore, name: &str, top: Option<usize>) -> Result<(), String> {
    let mut items = store.scan(name).await.map_err(|e| e.to_string())?;
    items.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    for (key, value, version) in items.into_iter().take(top.unwrap_or(usize::MAX)) {
        let key = String::from_utf8_lossy(&key);
        println!(
            "{}",
            serde_json::json!({ "key": key, "value": value, "version": version })
        );
    }
    Ok(())
}
