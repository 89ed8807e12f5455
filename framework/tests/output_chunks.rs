//! A batch whose records emit many outputs sends them in bounded chunks while it goes on
//! (`OUTPUT_CHUNK`), so its memory does not grow with the outputs of the whole event: every
//! output is sent exactly once, in order, and a poison record's outputs are not.

use std::sync::Mutex;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::Utf8;
use lambda_streams::sink::{OutputRecord, Sink, SinkError};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchOptions, OUTPUT_CHUNK, PoisonPolicy, StreamsBuilder, Topology};

/// Words per input line: a record emits this many outputs.
const WORDS: usize = 3_000;

/// Remembers each send separately.
#[derive(Default)]
struct ChunkSink {
    sends: Mutex<Vec<Vec<OutputRecord>>>,
}

#[async_trait]
impl Sink for ChunkSink {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        self.sends.lock().expect("not poisoned").push(records);
        Ok(())
    }
}

/// `lines` → one output per word → `words`; the line "poison" panics.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("lines", Utf8, Utf8)
        .flat_map_values(|line: String| {
            assert!(line != "poison", "a poison line");
            line.split(' ').map(str::to_owned).collect::<Vec<_>>()
        })
        .to("words", Utf8, Utf8);
    builder.build()
}

fn line(index: usize) -> String {
    (0..WORDS)
        .map(|w| format!("r{index}w{w}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An event of `lines` on partition 0, offsets 0.. in order.
fn event(lines: &[String]) -> KafkaEvent {
    let records: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(offset, line)| {
            format!(
                r#"{{"topic":"lines","partition":0,"offset":{offset},"timestamp":{offset},"timestampType":"CREATE_TIME","key":"{}","value":"{}","headers":[]}}"#,
                STANDARD.encode("k"),
                STANDARD.encode(line)
            )
        })
        .collect();
    let json = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{"lines-0":[{}]}}}}"#,
        records.join(",")
    );
    KafkaEvent::decode(json.as_bytes()).expect("a valid event")
}

fn values(records: &[OutputRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().expect("a value")).expect("UTF-8"))
        .collect()
}

#[tokio::test]
async fn outputs_go_out_in_bounded_chunks_once_each_in_order() {
    // Enough records for several chunks.
    let count = 3 * OUTPUT_CHUNK / WORDS + 2;
    let lines: Vec<String> = (0..count).map(line).collect();
    let (store, sink) = (MemoryStore::new(), ChunkSink::default());
    let report = topology()
        .process(&event(&lines), &store, &sink)
        .await
        .expect("the batch succeeds");

    let sends = sink.sends.into_inner().expect("not poisoned");
    assert!(sends.len() >= 3, "{} sends", sends.len());
    for send in &sends {
        assert!(
            send.len() <= OUTPUT_CHUNK + WORDS,
            "a send of {}",
            send.len()
        );
    }
    // The reference: every word of every line, in input order.
    let expected: Vec<String> = lines
        .iter()
        .flat_map(|l| l.split(' ').map(str::to_owned))
        .collect();
    let sent: Vec<OutputRecord> = sends.into_iter().flatten().collect();
    assert_eq!(values(&sent), expected);
    assert_eq!(report.records_out, expected.len() as u64);
    assert_eq!(report.records_in, count as u64);
}

#[tokio::test]
async fn a_poison_record_after_a_chunk_emits_nothing() {
    // The poison line comes after the first chunk has gone out.
    let mut lines: Vec<String> = (0..OUTPUT_CHUNK / WORDS + 3).map(line).collect();
    let poison_at = OUTPUT_CHUNK / WORDS + 1;
    lines[poison_at] = "poison".to_owned();
    let (store, sink) = (MemoryStore::new(), ChunkSink::default());
    let options = BatchOptions {
        poison: PoisonPolicy::Skip,
        ..BatchOptions::default()
    };
    let outcome = topology()
        .process_with(&event(&lines), &store, &sink, &options)
        .await
        .expect("the batch succeeds without the poison record");

    let sends = sink.sends.into_inner().expect("not poisoned");
    assert!(sends.len() >= 2, "{} sends", sends.len());
    let expected: Vec<String> = lines
        .iter()
        .filter(|l| *l != "poison")
        .flat_map(|l| l.split(' ').map(str::to_owned))
        .collect();
    let sent: Vec<OutputRecord> = sends.into_iter().flatten().collect();
    assert_eq!(values(&sent), expected);
    assert_eq!(outcome.report.poison_records, 1);
}
