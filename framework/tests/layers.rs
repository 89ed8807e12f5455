//! The framework's modules form layers that only look down (docs/architecture.md).
//!
//! This test reads every file under `framework/src`, collects the paths it imports or names
//! in code (`use crate::…`, `use super::…`, `crate::x::y` in expressions), maps each to its
//! module's layer, and fails on an import that goes up a layer (naming the file, the line and
//! both layers) and on a cycle between modules. Test code (`#[cfg(test)]` modules, `tests.rs`
//! files) may use anything and is not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first: a module may import its own layer and the layers below.
/// Each entry is a module path prefix (the longest matching prefix wins), its layer, and why
/// it sits there.
const LAYERS: &[(&str, u8, &str)] = &[
    // L0: nothing of ours below.
    (
        "event",
        0,
        "the Lambda Kafka event's decoding and encoding, and the batch response: pure data",
    ),
    (
        "serdes",
        0,
        "Serde and the built-in serdes: bytes to values, nothing else",
    ),
    (
        "wire",
        0,
        "the names of the headers the framework writes: constants every layer shares",
    ),
    (
        "http1",
        0,
        "the framework's HTTP/1.1 client (the lean DynamoDB path and the AWS SDK's): bytes over TCP or rustls",
    ),
    (
        "aws",
        0,
        "the one owner of AWS plumbing (TLS roots, HTTPS client, credentials)",
    ),
    (
        "config_env",
        0,
        "a function's own settings from the environment: the std library only",
    ),
    // L1: contracts and their in-memory implementations.
    ("sink", 1, "OutputRecord, the Sink contract and MemorySink"),
    (
        "state",
        1,
        "the Store contract, its types, MemoryStore and fault injection",
    ),
    (
        "error",
        1,
        "StreamError: wraps the errors of L0 and L1 only",
    ),
    // L2: the engine.
    (
        "topology",
        2,
        "the compiled plan and the per-batch context its processors touch",
    ),
    (
        "runtime",
        2,
        "the executor of a compiled topology, its options and reports",
    ),
    // L3: the DSL.
    ("dsl", 3, "builders that produce a topology"),
    // L4: adapters to the outside.
    (
        "kafka",
        4,
        "the rdkafka producer, its settings, context and MSK IAM",
    ),
    (
        "state::dynamodb",
        4,
        "the DynamoDB store: an adapter on the AWS SDK",
    ),
    ("config", 4, "a function's settings from the environment"),
    (
        "handler",
        4,
        "the transport-agnostic Handler: topology + store + Kafka output",
    ),
    ("lambda", 4, "the Lambda adapter: run and tracing"),
    ("metrics", 4, "CloudWatch EMF documents of a batch's report"),
    ("driver", 4, "the in-memory test driver"),
];

/// What the crate root (`lib.rs`, the facade) re-exports, by the module it comes from.
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("StreamsBuilder", "dsl"),
    ("Topology", "topology"),
    ("StreamError", "error"),
    ("Guarantee", "state"),
    ("BatchOptions", "runtime"),
    ("BatchOutcome", "runtime"),
    ("BatchReport", "runtime"),
    ("ERROR_HEADER", "wire"),
    ("OUTPUT_CHUNK", "runtime"),
    ("PoisonPolicy", "runtime"),
    ("OutputGuarantee", "runtime"),
];

/// Upward paths that are allowed, each with its reason: public re-exports that keep a path
/// users already use (no code of the lower module depends on them).
const ALLOWED: &[(&str, &str, &str)] = &[(
    "sink.rs",
    "crate::kafka::KafkaSink",
    "`lambda_streams::sink::KafkaSink` keeps working (a `pub use` of the public API)",
)];

/// The module path of a file under `src` (`kafka/mod.rs` -> `kafka`).
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_owned();
        if stem != "mod" && stem != "lib" {
            parts.push(stem);
        }
    }
    parts
}

/// The layer entry (prefix, layer) of a module path, by longest prefix.
fn layer_of(path: &[String]) -> Option<(&'static str, u8)> {
    let joined = path.join("::");
    LAYERS
        .iter()
        .filter(|(prefix, _, _)| joined == *prefix || joined.starts_with(&format!("{prefix}::")))
        .max_by_key(|(prefix, _, _)| prefix.len())
        .map(|(prefix, layer, _)| (*prefix, *layer))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a line of code names: each `crate::a::b` and `super::a` (with its `super::`
/// chain), as module paths from the crate root.
fn paths_in(line: &str, module: &[String]) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let bytes: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..].iter().collect();
        let preceded = i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == ':');
        let start = if preceded {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("super::") {
            // `super::super::x` climbs twice.
            let mut base = module.to_vec();
            let mut len = 0;
            while rest[len..].starts_with("super::") {
                base.pop();
                len += "super::".len();
            }
            Some((base, len))
        } else {
            None
        };
        let Some((mut path, len)) = start else {
            i += 1;
            continue;
        };
        // The identifiers after the prefix, up to the first that is not followed by `::`.
        let tail = &rest[len..];
        let mut shown = rest[..len].to_owned();
        let mut chars = tail;
        loop {
            let ident: String = chars.chars().take_while(|c| is_ident(*c)).collect();
            if ident.is_empty() {
                break;
            }
            path.push(ident.clone());
            shown.push_str(&ident);
            chars = &chars[ident.len()..];
            if let Some(next) = chars.strip_prefix("::") {
                shown.push_str("::");
                chars = next;
            } else {
                break;
            }
        }
        found.push((shown.trim_end_matches("::").to_owned(), path));
        i += len.max(1);
    }
    found
}

struct Edge {
    file: String,
    line: usize,
    shown: String,
    from: (&'static str, u8),
    to: (&'static str, u8),
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// Every import edge between layer entries of the framework's non-test code.
fn edges(src: &Path) -> Vec<Edge> {
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut out = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src").to_path_buf();
        let name = relative.to_string_lossy().replace('\\', "/");
        if name == "lib.rs" || name.ends_with("/tests.rs") || name == "tests.rs" {
            continue; // the facade; test code
        }
        let module = module_of(&relative);
        let Some(from) = layer_of(&module) else {
            panic!(
                "{name}: module {} is in no layer of LAYERS",
                module.join("::")
            );
        };
        let text = std::fs::read_to_string(&file).expect("a source file");
        for (number, line) in text.lines().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break; // the file's test module
            }
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let code = code.split(" //").next().unwrap_or(code);
            for (shown, mut path) in paths_in(code, &module) {
                if path.len() == 1 || path.is_empty() {
                    // A root item (`crate::StreamsBuilder`): the module it comes from.
                    let item = path.first().cloned().unwrap_or_default();
                    if let Some((_, m)) = ROOT_ITEMS.iter().find(|(i, _)| *i == item) {
                        path = vec![(*m).to_owned()];
                    }
                }
                let Some(to) = layer_of(&path) else {
                    panic!(
                        "{name}:{}: `{shown}` names no module of LAYERS (add it, or ROOT_ITEMS)",
                        number + 1
                    );
                };
                if to.0 != from.0 {
                    out.push(Edge {
                        file: name.clone(),
                        line: number + 1,
                        shown,
                        from,
                        to,
                    });
                }
            }
        }
    }
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_import_looks_down() {
    let upward: Vec<String> = edges(&src())
        .into_iter()
        .filter(|e| e.to.1 > e.from.1)
        .filter(|e| {
            !ALLOWED
                .iter()
                .any(|(file, path, _)| *file == e.file && *path == e.shown)
        })
        .map(|e| {
            format!(
                "{}:{}: `{}` goes up: {} (L{}) imports {} (L{})",
                e.file, e.line, e.shown, e.from.0, e.from.1, e.to.0, e.to.1
            )
        })
        .collect();
    assert!(
        upward.is_empty(),
        "imports that go up a layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_cycle_between_modules() {
    let mut graph: BTreeMap<&str, BTreeMap<&str, String>> = BTreeMap::new();
    for e in edges(&src()) {
        let allowed = ALLOWED
            .iter()
            .any(|(file, path, _)| *file == e.file && *path == e.shown);
        if !allowed {
            graph
                .entry(e.from.0)
                .or_default()
                .entry(e.to.0)
                .or_insert_with(|| format!("{}:{} `{}`", e.file, e.line, e.shown));
        }
    }
    // Depth-first search; a back edge closes a cycle.
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, BTreeMap<&'a str, String>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut cycle: Vec<&str> = stack[at..].to_vec();
            cycle.push(node);
            return Some(
                cycle
                    .windows(2)
                    .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[w[0]][w[1]]))
                    .collect(),
            );
        }
        if !done.insert(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            panic!("a cycle between modules:\n{}", cycle.join("\n"));
        }
    }
}

#[test]
fn the_reader_sees_imports() {
    // The parser itself, on lines whose imports are known.
    let module = vec!["dsl".to_owned(), "stream".to_owned()];
    let paths = paths_in(
        "use super::rekey::{Grouped, X}; crate::state::Store;",
        &module,
    );
    let shown: Vec<&str> = paths.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(shown, ["super::rekey", "crate::state::Store"]);
    assert_eq!(paths[0].1, ["dsl", "rekey"]);
    assert_eq!(
        layer_of(&["state".into(), "dynamodb".into(), "item".into()]),
        Some(("state::dynamodb", 4))
    );
    assert_eq!(
        layer_of(&["state".into(), "memory".into()]),
        Some(("state", 1))
    );
    // And it finds edges at all: the runtime uses the topology.
    assert!(
        edges(&src())
            .iter()
            .any(|e| e.from.0 == "runtime" && e.to.0 == "topology")
    );
}
