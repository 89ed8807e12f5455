//! Shared helpers of the end-to-end tests: where the real services are, unique names,
//! and readers of Kafka topics and DynamoDB state that do not go through the code under
//! test.
//!
//! The tests need a Kafka broker and a DynamoDB emulator (dynoxide) on loopback; start
//! them with `scripts/services up`. `KAFKA_BOOTSTRAP_SERVERS` and
//! `AWS_ENDPOINT_URL_DYNAMODB` point elsewhere.

use std::collections::{BTreeMap, HashMap};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lambda_streams::config_env::env_or;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

/// The broker the tests use.
pub fn bootstrap() -> String {
    env_or("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
}

/// The broker's SASL_PLAINTEXT listener (SCRAM-SHA-512/256), from `scripts/services env`.
pub fn sasl_bootstrap() -> String {
    env_or("KAFKA_SASL_BOOTSTRAP_SERVERS", "127.0.0.1:9094")
}

/// The broker's SSL listener (a certificate of the local CA).
pub fn ssl_bootstrap() -> String {
    env_or("KAFKA_SSL_BOOTSTRAP_SERVERS", "127.0.0.1:9095")
}

/// The broker's SASL_SSL listener (SCRAM over TLS).
pub fn sasl_ssl_bootstrap() -> String {
    env_or("KAFKA_SASL_SSL_BOOTSTRAP_SERVERS", "127.0.0.1:9096")
}

/// The SCRAM user `scripts/services` creates: `(username, password)`.
pub fn scram_credentials() -> (String, String) {
    (
        env_or("KAFKA_SCRAM_USERNAME", "lambda-streams"),
        env_or("KAFKA_SCRAM_PASSWORD", "lambda-streams-secret"),
    )
}

/// The PEM file of the local CA that signed the broker's certificate.
pub fn ssl_ca_location() -> String {
    std::env::var("KAFKA_SSL_CA_LOCATION").unwrap_or_else(|_| {
        let cache = std::env::var("LAMBDA_STREAMS_CACHE").unwrap_or_else(|_| {
            format!(
                "{}/.cache/lambda-streams",
                std::env::var("HOME").unwrap_or_default()
            )
        });
        format!("{cache}/kafka-tls-v1/ca.pem")
    })
}

/// Whether something accepts TCP connections at `address` (host:port) within 2 s.
fn listening(address: &str) -> bool {
    address
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
}

/// Panics with the fix when the broker's secured listeners are not there.
pub fn require_secured_listeners() {
    require_services();
    for address in [sasl_bootstrap(), ssl_bootstrap(), sasl_ssl_bootstrap()] {
        assert!(
            listening(&address),
            "no Kafka listener at {address}: the broker was started without the SASL/SSL listeners; restart it with `scripts/services down kafka; scripts/services up kafka`"
        );
    }
    assert!(
        std::path::Path::new(&ssl_ca_location()).exists(),
        "the local CA {} is missing: `scripts/services up` makes it",
        ssl_ca_location()
    );
}

/// The DynamoDB emulator the tests use.
pub fn dynamo_endpoint() -> String {
    env_or("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000")
}

/// Panics with the fix when a service is not listening.
pub fn require_services() {
    let endpoint = dynamo_endpoint();
    let dynamo = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    for (name, address) in [("Kafka", bootstrap()), ("DynamoDB emulator", dynamo)] {
        let first = address.split(',').next().unwrap_or_default().to_owned();
        let reachable = first
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
        assert!(
            reachable,
            "{name} is not reachable at {first}: start the services with `scripts/services up`"
        );
    }
}

/// A name unique to this test process and call: `<prefix>-<pid>-<time>-<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() % 100_000_000);
    format!(
        "{prefix}-{}-{millis}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Deterministic text: `lines` lines of 1..=8 words from a 40-word vocabulary with
/// mixed case, from a fixed seed (a 64-bit LCG, independent of any library).
pub fn sample_text(lines: usize, seed: u64) -> Vec<String> {
    const WORDS: [&str; 40] = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "Kafka",
        "streams",
        "lambda",
        "state",
        "exactly",
        "once",
        "batch",
        "offset",
        "partition",
        "record",
        "The",
        "FOX",
        "table",
        "window",
        "join",
        "count",
        "key",
        "value",
        "topic",
        "broker",
        "commit",
        "retry",
        "zombie",
        "watermark",
        "version",
        "item",
        "emit",
        "sink",
        "source",
        "event",
        "lag",
        "group",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    (0..lines)
        .map(|_| {
            let n = 1 + next() % 8;
            (0..n)
                .map(|_| WORDS[next() % WORDS.len()])
                .collect::<Vec<_>>()
                .join(if next() % 5 == 0 { "  " } else { " " })
        })
        .collect()
}

/// A deterministic generator (a 64-bit LCG with Knuth's MMIX constants): the same numbers on
/// every machine and run; each call gives the new state's top 31 bits.
pub fn lcg(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    }
}

/// The reference word count: lowercase words split on whitespace, counted.
pub fn reference_counts<'a>(lines: impl IntoIterator<Item = &'a String>) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for line in lines {
        for word in line.split_whitespace() {
            *counts.entry(word.to_lowercase()).or_insert(0) += 1;
        }
    }
    counts
}

/// A record read back from Kafka.
#[derive(Debug, Clone)]
pub struct Consumed {
    /// Partition.
    pub partition: i32,
    /// Key.
    pub key: Option<Vec<u8>>,
    /// Value.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: HashMap<String, Vec<u8>>,
}

/// Every record of `topic` from the start to its current end, read with a plain
/// assigned consumer (no group).
pub fn read_topic(topic: &str) -> Vec<Consumed> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        ends.insert(p, high);
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .expect("assign");
    }
    consumer.assign(&assignment).expect("assign");
    let mut positions: HashMap<i32, i64> = partitions.iter().map(|&p| (p, 0)).collect();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while partitions.iter().any(|p| positions[p] < ends[p]) {
        assert!(Instant::now() < deadline, "timed out reading {topic}");
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.expect("message");
            positions.insert(message.partition(), message.offset() + 1);
            let headers = message
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default();
            out.push(Consumed {
                partition: message.partition(),
                key: message.key().map(<[u8]>::to_vec),
                value: message.payload().map(<[u8]>::to_vec),
                headers,
            });
        }
    }
    out
}

/// Per key, the value of the record with the highest `lambda-streams-version` header.
pub fn latest_by_version(records: &[Consumed]) -> BTreeMap<String, (u64, String)> {
    let mut latest: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for r in records {
        let key = String::from_utf8(r.key.clone().expect("keyed output")).expect("utf-8 key");
        let version: u64 = std::str::from_utf8(&r.headers["lambda-streams-version"])
            .expect("utf-8 version")
            .parse()
            .expect("numeric version");
        let value = String::from_utf8(r.value.clone().expect("value")).expect("utf-8 value");
        let entry = latest.entry(key).or_insert((0, String::new()));
        if version > entry.0 {
            *entry = (version, value);
        }
    }
    latest
}

/// A DynamoDB client for the emulator, with static dummy credentials.
pub fn dynamo_client() -> aws_sdk_dynamodb::Client {
    lambda_streams::state::dynamodb::emulator_client(&dynamo_endpoint())
}

/// A fresh state table on the emulator (named `unique(prefix)`), and an exactly-once
/// [`DynamoStore`](lambda_streams::state::dynamodb::DynamoStore) on it: the state most
/// end-to-end tests run on. Returns the table's name (for [`table_counts`]) and the store.
pub async fn exactly_once_store(
    prefix: &str,
) -> (String, lambda_streams::state::dynamodb::DynamoStore) {
    use lambda_streams::Guarantee;
    use lambda_streams::state::dynamodb::{DynamoStore, create_table};
    let (table, client) = (unique(prefix), dynamo_client());
    create_table(&client, &table).await.expect("table");
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    (table, store)
}

/// Reads the counts of `store` in `table` straight from DynamoDB (a scan of the raw
/// items: `k` is the key, `v` the count), not through the store under test.
pub async fn table_counts(table: &str, store: &str) -> BTreeMap<String, i64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = dynamo_client();
    let mut counts = BTreeMap::new();
    let mut pages = client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        for item in page.expect("scan").items() {
            let Some(AttributeValue::S(pk)) = item.get("pk") else {
                panic!("item without pk")
            };
            if !pk.starts_with(&format!("{store}#")) {
                continue;
            }
            let Some(AttributeValue::B(key)) = item.get("k") else {
                panic!("item without k")
            };
            let Some(AttributeValue::N(v)) = item.get("v") else {
                panic!("item without v")
            };
            counts.insert(
                String::from_utf8(key.as_ref().to_vec()).expect("utf-8"),
                v.parse().expect("number"),
            );
        }
    }
    counts
}

/// A TCP proxy in front of a service, that can be taken down and brought back: a real
/// network fault (connections refused and cut), for outage tests.
pub struct Proxy {
    /// The proxy's loopback port.
    pub port: u16,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<tokio::sync::Notify>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port forwarding to `target` (`host:port`).
    pub async fn start(target: &str) -> Proxy {
        use std::sync::atomic::AtomicBool;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let down = std::sync::Arc::new(AtomicBool::new(false));
        let cut = std::sync::Arc::new(tokio::sync::Notify::new());
        let (target, down2, cut2) = (target.to_owned(), down.clone(), cut.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if down2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let (target, cut, down) = (target.clone(), cut2.clone(), down2.clone());
                tokio::spawn(async move {
                    // Registered before the connect, so that a cut while it connects is not
                    // missed (`notify_waiters` wakes only the waiters registered by then);
                    // a cut before the registration is seen by the `down` check after it.
                    let cut = cut.notified();
                    tokio::pin!(cut);
                    cut.as_mut().enable();
                    let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    if down.load(Ordering::SeqCst) {
                        return;
                    }
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut => {}
                    }
                });
            }
        });
        Proxy { port, down, cut }
    }

    /// Refuses new connections and cuts the open ones.
    pub fn set_down(&self) {
        self.switch()();
    }

    /// A function that takes the proxy down (as [`set_down`](Self::set_down)), to be
    /// called from elsewhere (a store's write hook, say).
    pub fn switch(&self) -> impl Fn() + Send + Sync + 'static {
        let (down, cut) = (self.down.clone(), self.cut.clone());
        move || {
            down.store(true, Ordering::SeqCst);
            cut.notify_waiters();
        }
    }

    /// Accepts connections again.
    pub fn set_up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

/// The workspace root.
pub fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The environment a function needs to reach the DynamoDB emulator without looking for
/// real credentials, as `KEY=VALUE` lines.
pub fn emulator_env() -> Vec<String> {
    vec![
        format!("AWS_ENDPOINT_URL_DYNAMODB={}", dynamo_endpoint()),
        "AWS_ACCESS_KEY_ID=test".to_owned(),
        "AWS_SECRET_ACCESS_KEY=test".to_owned(),
        "AWS_REGION=us-east-1".to_owned(),
        "AWS_EC2_METADATA_DISABLED=true".to_owned(),
    ]
}

/// `cargo lambda watch` serving a function of `functions/` on the Lambda runtime API and
/// the Invoke API (`127.0.0.1:<port>`). Stopped on drop with `Child::kill`: never with a
/// process-group kill (procps-ng 4.0.2's `kill -TERM -<pgid>` misparses the negative pid
/// and signals every process, `kill(-1)`); the function exits once its runtime API is gone.
pub struct LambdaWatch(std::process::Child);

/// A loopback port no process listens on now, for a server a test starts (so that two
/// checkouts running their tests at once never talk to each other's server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

impl LambdaWatch {
    /// Starts `cargo lambda watch -p <function>` on `port` with `env` (`KEY=VALUE`) and
    /// waits (up to 10 minutes: the first start compiles the function) until it listens.
    /// The port must be free (see [`free_port`]): a server already on it would answer in
    /// the function's place.
    pub fn start(function: &str, port: u16, env: &[String]) -> LambdaWatch {
        Self::start_in(&workspace(), function, port, env)
    }

    /// [`start`](Self::start) in the workspace at `dir` (a copy of this one, say).
    pub fn start_in(
        dir: &std::path::Path,
        function: &str,
        port: u16,
        env: &[String],
    ) -> LambdaWatch {
        use std::process::{Command, Stdio};
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} is already served by another process: cargo lambda watch cannot use it"
        );
        let mut command = Command::new("cargo");
        command
            .args([
                "lambda",
                "watch",
                "--invoke-address",
                "127.0.0.1",
                "--ignore-changes",
            ])
            .args(["--invoke-port", &port.to_string(), "-p", function])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for var in env {
            command.args(["--env-var", var]);
        }
        // A copy of the workspace builds into this one's target directory.
        if std::env::var_os("CARGO_TARGET_DIR").is_none() {
            command.env("CARGO_TARGET_DIR", workspace().join("target"));
        }
        let mut watch = LambdaWatch(
            command
                .spawn()
                .expect("cargo lambda watch starts (is cargo-lambda installed? scripts/tools)"),
        );
        let deadline = Instant::now() + Duration::from_secs(600);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            // `cargo lambda` that is not installed is cargo's "no such command": it exits.
            if let Ok(Some(status)) = watch.0.try_wait() {
                panic!(
                    "cargo lambda watch exited ({status}) before listening on {port}: is \
                     cargo-lambda on PATH? (scripts/tools installs it; PATH=\"$(scripts/tools path):$PATH\")"
                );
            }
            assert!(
                Instant::now() < deadline,
                "cargo lambda watch did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        // `cargo lambda watch` compiles the function on its first invocation; on a loaded
        // machine that can outlast an invocation. Warm it up with an event of no records
        // until it answers, so that the test's own invocations find it running.
        while !invoke_empty(port, function) {
            assert!(
                Instant::now() < deadline,
                "{function} under cargo lambda watch on {port} did not answer an empty event"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        watch
    }
}

/// Invokes `function` through the Invoke API on `port` with an event of no records;
/// whether it answered HTTP 200 without a function error.
fn invoke_empty(port: u16, function: &str) -> bool {
    use std::io::{Read, Write};
    let body = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"{}","records":{{}}}}"#,
        bootstrap()
    );
    let request = format!(
        "POST /2015-03-31/functions/{function}/invocations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(600)));
    let mut response = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut response).is_ok()
        && response.starts_with("HTTP/1.1 200")
        && !response
            .to_ascii_lowercase()
            .contains("x-amz-function-error")
}

impl Drop for LambdaWatch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A topic of its own (a unique name from `name`) with `partitions` partitions on the broker.
pub async fn new_topic(name: &str, partitions: i32) -> String {
    let topic = unique(name);
    local_runner::admin::create_topic(&bootstrap(), &topic, partitions)
        .await
        .expect("topic");
    topic
}

/// Produces `lines` to `topic`, line i to partition i mod `partitions` (so each partition
/// holds every `partitions`-th line, in order).
pub async fn produce_across_partitions(topic: &str, lines: &[String], partitions: i32) {
    for p in 0..partitions {
        let part: Vec<String> = lines
            .iter()
            .skip(p as usize)
            .step_by(partitions as usize)
            .cloned()
            .collect();
        local_runner::admin::produce_lines(&bootstrap(), topic, part, Some(p))
            .await
            .expect("produce");
    }
}

/// Produces keyed records (`None`: a tombstone) to `topic`, in order, to `partition`
/// (or by key when `None`).
pub async fn produce_keyed(
    topic: &str,
    records: &[(String, Option<String>)],
    partition: Option<i32>,
) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (key, value) in records {
        let mut record = FutureRecord::<String, String>::to(topic).key(key);
        if let Some(value) = value {
            record = record.payload(value);
        }
        if let Some(p) = partition {
            record = record.partition(p);
        }
        producer
            .send(record, Duration::from_secs(10))
            .await
            .expect("produced");
    }
}

/// Produces `(partition, key, timestamp)` records to `topic`, in order, each with its key as
/// its value (idempotent).
pub async fn produce_timed(topic: &str, records: &[(i32, String, i64)]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (partition, key, timestamp) in records {
        let record = FutureRecord::<String, String>::to(topic)
            .key(key)
            .payload(key)
            .partition(*partition)
            .timestamp(*timestamp);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .expect("produced");
    }
}

/// The `local-runner` binary running `wordcount` from `input` to `output` in `group`, with
/// its state in `table` on the emulator (batches of 20, a 20 ms window, no progress line).
/// Built by `cargo run`, which execs the binary: `Child::kill` reaches the runner itself.
pub fn runner_process(
    input: &str,
    output: &str,
    table: &str,
    group: &str,
) -> std::process::Command {
    let mut command = std::process::Command::new("cargo");
    command
        .args([
            "run",
            "--quiet",
            "-p",
            "lambda-streams-local-runner",
            "--",
            "run",
            "--function",
            "wordcount",
        ])
        .args([
            "--group-id",
            group,
            "--table",
            table,
            "--dynamodb-endpoint",
            &dynamo_endpoint(),
        ])
        .args([
            "--batch-size",
            "20",
            "--batching-window-ms",
            "20",
            "--quiet",
        ])
        .args(["--bootstrap-servers", &bootstrap()])
        .env("WORDCOUNT_INPUT_TOPIC", input)
        .env("WORDCOUNT_OUTPUT_TOPIC", output)
        .env("WORDCOUNT_REKEYING", "direct")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(std::process::Stdio::null());
    command
}

/// A group's committed offset per partition (`None`: nothing committed).
pub type Commits = BTreeMap<i32, Option<i64>>;

/// The offsets `group` has committed on `topic`'s partitions `0..partitions`.
pub fn committed(group: &str, topic: &str, partitions: i32) -> Commits {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let offsets = local_runner::admin::with_coordinator(|| {
        consumer.committed_offsets(list.clone(), Duration::from_secs(10))
    })
    .expect("committed offsets");
    (0..partitions)
        .map(|p| {
            let offset = offsets
                .find_partition(topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            (p, offset)
        })
        .collect()
}

/// The offsets `group` has committed on `topic`'s partitions `0..partitions`, summed
/// (a partition without a commit counts 0).
pub fn committed_total(group: &str, topic: &str, partitions: i32) -> i64 {
    committed(group, topic, partitions)
        .values()
        .map(|o| o.unwrap_or(0))
        .sum()
}

/// Per key, the decimal count of the record with the highest version in `topic`.
pub fn emitted_counts(topic: &str) -> BTreeMap<String, i64> {
    latest_by_version(&read_topic(topic))
        .into_iter()
        .map(|(k, (_, v))| (k, v.parse().expect("a decimal count")))
        .collect()
}

/// An HTTP/1.1 proxy in front of the DynamoDB emulator that answers some requests itself
/// with DynamoDB's throttling error (`ProvisionedThroughputExceededException`, HTTP 400),
/// as DynamoDB does when a partition is over its throughput: the emulator has no
/// throughput limits, so throttling is injected here, on the real wire protocol.
pub struct ThrottlingProxy {
    /// The proxy's loopback port.
    pub port: u16,
    throttled: std::sync::Arc<std::sync::atomic::AtomicU64>,
    operations: Operations,
}

/// Requests seen by a [`ThrottlingProxy`], per DynamoDB operation (`UpdateItem`, `Query`, ...).
type Operations = std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>>;

impl ThrottlingProxy {
    /// Starts a proxy to `target` (`host:port`); `throttle(n)` decides whether the n-th
    /// request (from 0) is refused.
    pub async fn start(
        target: &str,
        throttle: impl Fn(u64) -> bool + Send + Sync + 'static,
    ) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::AtomicU64;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let throttled = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let operations = Operations::default();
        let throttle = Arc::new(throttle);
        let (target, counted, seen) = (target.to_owned(), throttled.clone(), operations.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, throttle, requests, counted, seen) = (
                    target.clone(),
                    throttle.clone(),
                    requests.clone(),
                    counted.clone(),
                    seen.clone(),
                );
                tokio::spawn(async move {
                    let _ =
                        serve_throttling(client, &target, &*throttle, &requests, &counted, &seen)
                            .await;
                });
            }
        });
        ThrottlingProxy {
            port,
            throttled,
            operations,
        }
    }

    /// How many requests the proxy refused.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::SeqCst)
    }

    /// How many requests the proxy received so far (refused ones included), per DynamoDB
    /// operation, from each request's `X-Amz-Target` header (`UpdateItem`, `GetItem`, ...).
    pub fn operations(&self) -> BTreeMap<String, u64> {
        self.operations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The DynamoDB operation an HTTP request names in its `X-Amz-Target` header
/// (`DynamoDB_20120810.UpdateItem` → `UpdateItem`).
fn operation_of(request: &[u8]) -> Option<String> {
    let head = String::from_utf8_lossy(request);
    head.lines()
        .take_while(|line| !line.is_empty())
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim().eq_ignore_ascii_case("x-amz-target").then(|| {
                value
                    .trim()
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
        })
}

/// Reads one HTTP/1.1 message (head and `Content-Length` body) from `stream`; `None` at
/// the end of the stream.
async fn read_http_message(
    stream: &mut tokio::io::BufReader<tokio::net::TcpStream>,
) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut message = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = Vec::new();
        if stream.read_until(b'\n', &mut line).await? == 0 {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
        if let Some(value) = text.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        assert!(
            !text.starts_with("transfer-encoding: chunked"),
            "the throttling proxy handles Content-Length bodies only"
        );
        message.extend_from_slice(&line);
        if line == b"\r\n" {
            break;
        }
    }
    let start = message.len();
    message.resize(start + length, 0);
    stream.read_exact(&mut message[start..]).await?;
    Ok(Some(message))
}

async fn serve_throttling(
    client: tokio::net::TcpStream,
    target: &str,
    throttle: &(dyn Fn(u64) -> bool + Send + Sync),
    requests: &std::sync::atomic::AtomicU64,
    throttled: &std::sync::atomic::AtomicU64,
    operations: &Operations,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut client = tokio::io::BufReader::new(client);
    let mut upstream: Option<tokio::io::BufReader<tokio::net::TcpStream>> = None;
    while let Some(request) = read_http_message(&mut client).await? {
        if let Some(operation) = operation_of(&request) {
            *operations
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(operation)
                .or_insert(0) += 1;
        }
        if throttle(requests.fetch_add(1, Ordering::SeqCst)) {
            throttled.fetch_add(1, Ordering::SeqCst);
            let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded."}"#;
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\nx-amzn-RequestId: throttled\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            client.get_mut().write_all(response.as_bytes()).await?;
            continue;
        }
        if upstream.is_none() {
            upstream = Some(tokio::io::BufReader::new(
                tokio::net::TcpStream::connect(target).await?,
            ));
        }
        let server = upstream.as_mut().expect("connected");
        server.get_mut().write_all(&request).await?;
        match read_http_message(server).await? {
            Some(response) => client.get_mut().write_all(&response).await?,
            None => return Ok(()),
        }
    }
    Ok(())
}

/// The event of a batch of a generated log: per `(partition, lo, hi)`, the records at offsets
/// `lo..hi` of `topic`'s partition, each with timestamp `base_time + offset`, no key, and the
/// value `value(partition, offset)`.
pub fn log_event(
    topic: &str,
    base_time: i64,
    batch: &[(usize, usize, usize)],
    value: impl Fn(usize, usize) -> Vec<u8>,
) -> lambda_streams::event::KafkaEvent {
    use lambda_streams::event::{
        EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
    };
    let partitions = batch
        .iter()
        .map(|&(p, lo, hi)| PartitionRecords {
            tp: TopicPartition::new(topic, p as i32),
            records: (lo..hi)
                .map(|o| Record {
                    offset: o as i64,
                    timestamp: base_time + o as i64,
                    timestamp_type: TimestampType::CreateTime,
                    key: None,
                    value: Some(value(p, o).into()),
                    headers: Vec::new(),
                    key_schema_metadata: None,
                    value_schema_metadata: None,
                })
                .collect(),
        })
        .collect();
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions,
    }
}

/// The broker's MSK IAM listener (SASL_SSL, OAUTHBEARER with MSK IAM tokens checked by the
/// SigV4 validator of `scripts/kafka/msk-iam`), from `scripts/services env`.
pub fn iam_bootstrap() -> String {
    env_or("KAFKA_IAM_BOOTSTRAP_SERVERS", "127.0.0.1:9097")
}

/// The AWS credentials the MSK IAM listener accepts (a local test key pair, with a session
/// token like a Lambda role's temporary credentials) and the region tokens are signed for.
#[derive(Debug, Clone)]
pub struct IamTestCredentials {
    /// `AWS_ACCESS_KEY_ID`: the principal the broker sees.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN`.
    pub session_token: String,
    /// `AWS_REGION`.
    pub region: String,
}

/// The key pair `scripts/services` configures on the MSK IAM listener.
pub fn iam_credentials() -> IamTestCredentials {
    let var =
        |name: &str, default: &str| env_or(&format!("LAMBDA_STREAMS_TEST_IAM_{name}"), default);
    IamTestCredentials {
        access_key_id: var("ACCESS_KEY_ID", "ASIALAMBDASTREAMSTEST"),
        secret_access_key: var(
            "SECRET_ACCESS_KEY",
            "lambda-streams/msk-iam+local-test-secret",
        ),
        session_token: var(
            "SESSION_TOKEN",
            "IQoJlambda-streams/local+test-session=token",
        ),
        region: var("REGION", "us-east-1"),
    }
}

/// Panics with the fix when the broker's MSK IAM listener is not there.
pub fn require_iam_listener() {
    require_secured_listeners();
    let address = iam_bootstrap();
    assert!(
        listening(&address),
        "no Kafka listener at {address}: the broker was started without the MSK IAM listener; restart it with `scripts/services down kafka; scripts/services up kafka`"
    );
}

/// Runs `handler` in process through the local runner over `topics` (group `group`, at
/// most `batch_size` records a batch) until idle, under the redeliveries the exactly-once
/// tests share: every third batch delivered twice, every fourth retried with longer
/// boundaries. Panics if the run fails or outlasts `limit`.
pub async fn run_with_redeliveries(
    handler: lambda_streams::lambda::Handler,
    topics: Vec<String>,
    group: &str,
    batch_size: usize,
    limit: Duration,
) {
    use local_runner::{Faults, InProcess, Runner, RunnerConfig};
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique(group),
        topics,
        batch_size,
        batching_window: Duration::from_millis(50),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(10),
        faults: Faults {
            duplicate_every: Some(3),
            extend_retry_every: Some(4),
            ..Faults::default()
        },
        ..RunnerConfig::default()
    };
    let transport = std::sync::Arc::new(InProcess::new(std::sync::Arc::new(handler)));
    let runner = Runner::new(config, transport).expect("runner");
    tokio::time::timeout(limit, runner.run())
        .await
        .expect("the runner finished in time")
        .expect("the runner succeeded");
}

/// The broker install's libraries (the Java consumer's classpath).
pub fn kafka_libs() -> std::path::PathBuf {
    let cache = std::env::var("LAMBDA_STREAMS_CACHE").map_or_else(
        |_| {
            std::path::PathBuf::from(std::env::var("HOME").expect("HOME"))
                .join(".cache/lambda-streams")
        },
        std::path::PathBuf::from,
    );
    let mut installs: Vec<_> = std::fs::read_dir(&cache)
        .expect("the services' cache")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("kafka-4"))
                && p.join("libs").is_dir()
        })
        .collect();
    installs.sort();
    installs
        .pop()
        .expect("a Kafka install (scripts/services up)")
        .join("libs")
}

/// A record as Kafka's Java consumer read it (see [`kafka_read_all`]).
#[derive(Debug, Clone)]
pub struct Read {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its `lambda-streams-source` header.
    pub source: String,
    /// Its `lambda-streams-version` header (aggregate updates only).
    pub version: Option<u64>,
    /// Its key, as UTF-8 text (`null`: none).
    pub key: String,
    /// Its value, as UTF-8 text (`null`: a tombstone).
    pub value: String,
}

/// How long [`kafka_read_all`] may take, in ms: with `read_committed`, waiting for the open
/// transactions to end, then reading to the end.
pub const READ_TIMEOUT_MS: &str = "120000";

/// The compiled `tests/fixtures/kafka/ReadAll.java`, compiled once per source (in the
/// services' cache, next to the Kafka install whose client it uses).
fn read_all_classes() -> &'static std::path::Path {
    static CLASSES: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    CLASSES.get_or_init(|| {
        const SOURCE: &str = include_str!("../fixtures/kafka/ReadAll.java");
        let libs = kafka_libs();
        let install = libs.parent().expect("the Kafka install");
        let hash = SOURCE.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let dir = install.join(format!("read-all-{hash:016x}"));
        if dir.join("ReadAll.class").is_file() {
            return dir;
        }
        // Compiled in a directory of this process's, then moved into place: test binaries
        // running at once may compile it together.
        let work = install.join(format!("read-all-{hash:016x}.tmp.{}", std::process::id()));
        std::fs::create_dir_all(&work).expect("a work directory");
        let source = work.join("ReadAll.java");
        std::fs::write(&source, SOURCE).expect("the reader's source");
        let out = std::process::Command::new("javac")
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg("-d")
            .arg(&work)
            .arg(&source)
            .output()
            .expect("javac runs");
        assert!(
            out.status.success(),
            "javac ReadAll.java: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::fs::rename(&work, &dir).is_err() {
            // Another process moved its copy in first.
            let _ = std::fs::remove_dir_all(&work);
        }
        dir
    })
}

/// Every record of `topic` as Kafka's own Java consumer (an independent reader, not our
/// code; `tests/fixtures/kafka/ReadAll.java`) reads it with `isolation_level`
/// (`read_committed` or `read_uncommitted`), from the beginning to the end known before the
/// read: with `read_committed`, once no transaction is open on the topic (a transaction
/// still open at [`READ_TIMEOUT_MS`] is named on stderr, and the read stops at it). No idle
/// timeout decides that a read is complete, so a loaded machine cannot cut it short.
pub fn kafka_read_all(topic: &str, isolation_level: &str) -> Vec<Read> {
    let classpath = format!(
        "{}:{}/*",
        read_all_classes().display(),
        kafka_libs().display()
    );
    let out = std::process::Command::new("java")
        .args(["-cp", &classpath, "ReadAll", &bootstrap(), topic])
        .args([isolation_level, READ_TIMEOUT_MS])
        .output()
        .expect("java runs the reader");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the read of {topic} ({isolation_level}) did not reach its end: {stderr}"
    );
    if stderr.contains("still open") {
        eprintln!("the read of {topic} ({isolation_level}): {stderr}");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // A record is `Partition:<p>\tOffset:<o>\t<headers>\t<key>\t<value>`.
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(5, '\t');
            let partition = fields.next()?.strip_prefix("Partition:")?.parse().ok()?;
            let offset = fields.next()?.strip_prefix("Offset:")?.parse().ok()?;
            let headers = fields.next()?;
            let key = fields.next()?.to_owned();
            let value = fields.next().unwrap_or("").to_owned();
            let header = |name: &str| {
                headers
                    .split("|#|")
                    .find_map(|h| h.strip_prefix(name)?.strip_prefix(':'))
            };
            Some(Read {
                partition,
                offset,
                source: header("lambda-streams-source").unwrap_or("").to_owned(),
                version: header("lambda-streams-version").and_then(|v| v.parse().ok()),
                key,
                value,
            })
        })
        .collect()
}

/// Runs `handler` in process under the local runner on `topics` (consumer group `group`),
/// as the event source would, until the topics are idle: batches of at most `batch_size`
/// gathered for 100 ms, 10 ms between retries, with `faults`. Fails the test when the run
/// takes over 180 s or the runner fails.
pub async fn run_in_process(
    handler: lambda_streams::lambda::Handler,
    group: String,
    topics: Vec<String>,
    batch_size: usize,
    faults: local_runner::Faults,
) -> local_runner::RunSummary {
    let config = local_runner::RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: group,
        topics,
        batch_size,
        batching_window: Duration::from_millis(100),
        until_idle: true,
        idle_timeout: Duration::from_millis(800),
        retry_backoff: Duration::from_millis(10),
        faults,
        ..local_runner::RunnerConfig::default()
    };
    let runner = local_runner::Runner::new(
        config,
        std::sync::Arc::new(local_runner::InProcess::new(std::sync::Arc::new(handler))),
    )
    .expect("runner");
    tokio::time::timeout(Duration::from_secs(180), runner.run())
        .await
        .expect("the runner finished in time")
        .expect("the runner succeeded")
}

/// Runs the ignored test `child` of this test binary in a process of its own with `env`
/// set (the tests of a binary share one environment) and `SSL_CERT_DIR` removed; fails the
/// test unless it passed.
pub fn run_child_test(child: &str, env: &[(&str, String)]) {
    let mut command = std::process::Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args([child, "--exact", "--ignored", "--nocapture"])
        .env_remove("SSL_CERT_DIR");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("the test binary starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The DynamoDB store without an outbox: under exactly-once output it re-derives each
/// touched item's updates from its current state (what a batch did before the outbox), in
/// the transaction of the write's first record. The control of the tests that a crashed
/// batch retried longer emits every update once (`eos_output`, `eos_session_updates`).
pub struct NoOutbox(pub lambda_streams::state::dynamodb::DynamoStore);

#[async_trait::async_trait]
impl lambda_streams::state::Store for NoOutbox {
    async fn apply(
        &self,
        write: lambda_streams::state::ItemWrite<'_>,
    ) -> Result<
        (
            lambda_streams::state::ItemState,
            lambda_streams::state::WriteStats,
        ),
        lambda_streams::state::StateError,
    > {
        self.0.apply(write).await
    }
    async fn apply_outboxed(
        &self,
        write: lambda_streams::state::ItemWrite<'_>,
        outbox: &lambda_streams::state::outbox::Outbox<'_>,
    ) -> Result<
        (
            lambda_streams::state::ItemState,
            Vec<lambda_streams::state::outbox::Emission>,
            lambda_streams::state::WriteStats,
        ),
        lambda_streams::state::StateError,
    > {
        use lambda_streams::state::outbox::{Emission, Entry};
        let origin = outbox.entry_origin(write.contributions);
        let (state, stats) = self.0.apply(write).await?;
        let emissions = origin
            .map(|(tp, offset)| Emission {
                tp,
                entry: Entry {
                    offset,
                    state: state.clone(),
                    time: outbox.time,
                    dead_letter: None,
                },
            })
            .into_iter()
            .collect();
        Ok((state, emissions, stats))
    }
    async fn get(
        &self,
        store: &str,
        key: &[u8],
    ) -> Result<Option<lambda_streams::state::ItemState>, lambda_streams::state::StateError> {
        self.0.get(store, key).await
    }
    async fn get_many(
        &self,
        store: &str,
        keys: &[Vec<u8>],
    ) -> Result<
        std::collections::HashMap<Vec<u8>, lambda_streams::state::ItemState>,
        lambda_streams::state::StateError,
    > {
        self.0.get_many(store, keys).await
    }
    async fn windows(
        &self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, lambda_streams::state::ItemState)>, lambda_streams::state::StateError>
    {
        self.0.windows(store, key, from, to).await
    }
    async fn clock(
        &self,
    ) -> Result<lambda_streams::state::Clock, lambda_streams::state::StateError> {
        self.0.clock().await
    }
    async fn advance_stream_times(
        &self,
        advances: &[lambda_streams::state::ClockAdvance],
        now_ms: i64,
    ) -> Result<(), lambda_streams::state::StateError> {
        self.0.advance_stream_times(advances, now_ms).await
    }
    async fn closed_windows(
        &self,
        store: &str,
        up_to: i64,
    ) -> Result<Vec<lambda_streams::state::ClosedWindow>, lambda_streams::state::StateError> {
        self.0.closed_windows(store, up_to).await
    }
    async fn mark_closed(
        &self,
        store: &str,
        windows: &[lambda_streams::state::ClosedWindow],
        up_to: i64,
    ) -> Result<lambda_streams::state::WriteStats, lambda_streams::state::StateError> {
        self.0.mark_closed(store, windows, up_to).await
    }
    async fn closing_items(
        &self,
        store: &str,
        up_to: i64,
    ) -> Result<Vec<lambda_streams::state::ClosingItem>, lambda_streams::state::StateError> {
        self.0.closing_items(store, up_to).await
    }
    async fn close_item(
        &self,
        store: &str,
        item: &lambda_streams::state::ClosingItem,
        aggregate: &[u8],
        close_at: Option<i64>,
    ) -> Result<
        (
            Option<lambda_streams::state::ItemState>,
            lambda_streams::state::WriteStats,
        ),
        lambda_streams::state::StateError,
    > {
        self.0.close_item(store, item, aggregate, close_at).await
    }
}
