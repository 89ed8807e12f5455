//! Decoding: a fast path for well-formed events of the usual shape ([`fast`]), and the full
//! path: one `serde_json` pass with hand-written visitors that build the final types.
//!
//! The fast path gives up (`None`) on anything unusual or wrong; the full path then decides,
//! so every error comes from it.
//!
//! The visitors share a [`Ctx`] that tracks where the parser is (partition key, record index,
//! offset, field). When anything fails, the error `serde_json` returns is paired with that
//! context, and with the precise [`DecodeErrorKind`] the visitor recorded, to make a
//! [`DecodeError`] that names the place.

pub(crate) mod fast;
mod record;

use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::error::Category;

use super::{DecodeError, DecodeErrorKind, EventSource, KafkaEvent, PartitionRecords, Record};
use super::{TopicPartition, error};
use record::RecordSeed;

/// Where the parser is, and the precise reason of a failure the visitors detected.
#[derive(Default)]
struct Ctx {
    key: Option<String>,
    tp: Option<TopicPartition>,
    index: Option<usize>,
    offset: Option<i64>,
    field: Option<&'static str>,
    kind: Option<DecodeErrorKind>,
}

impl Ctx {
    /// Records `kind` as the reason and returns the error that aborts parsing.
    fn fail<E: de::Error>(&mut self, kind: DecodeErrorKind) -> E {
        let err = E::custom(&kind);
        self.kind = Some(kind);
        err
    }

    fn into_error(self, err: &serde_json::Error) -> DecodeError {
        let line_column = (err.line() > 0).then(|| (err.line(), err.column()));
        let kind = self.kind.unwrap_or_else(|| {
            // serde_json's Display appends " at line L column C"; we report it separately.
            let text = err.to_string();
            let suffix = format!(" at line {} column {}", err.line(), err.column());
            let message = text.strip_suffix(&suffix).unwrap_or(&text).to_owned();
            match err.classify() {
                Category::Syntax | Category::Eof => DecodeErrorKind::Syntax(message),
                Category::Data | Category::Io => DecodeErrorKind::Invalid(message),
            }
        });
        DecodeError::new(error::Details {
            kind,
            key: self.key,
            index: self.index,
            tp: self.tp,
            offset: self.offset,
            field: self.field,
            line_column,
        })
    }

    /// Leaves the `records` map: later errors are not in a partition.
    fn leave_records(&mut self) {
        self.key = None;
        self.tp = None;
        self.index = None;
        self.offset = None;
        self.field = None;
    }
}

pub(super) fn decode(json: &[u8], threads: usize) -> Result<KafkaEvent, DecodeError> {
    match fast::decode(json, threads) {
        Some(event) => Ok(event),
        None => decode_full(json),
    }
}

/// The most threads the framework runs on one batch's work, whatever the cores: the
/// decoder's split of a large event and the read-ahead of its records.
pub(crate) const MAX_THREADS: usize = 4;

/// How many threads decode a large event: [`cpus`], at most [`MAX_THREADS`].
pub(super) fn threads() -> usize {
    cpus().clamp(1, MAX_THREADS)
}

/// Lambda's CPU share in whole vCPUs: one per 1,769 MB of memory (Lambda allocates CPU in
/// proportion to memory; 1,769 MB is one vCPU-second of credits per second), whatever the
/// vCPUs the function sees (2 up to 3,008 MB).
const LAMBDA_MB_PER_VCPU: u64 = 1_769;

/// The CPUs the process has to work in parallel, read once: the cores available
/// (`std::thread::available_parallelism`), and in Lambda (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`
/// set) no more than its whole vCPUs of CPU share, so that a function under 3,538 MB runs
/// one thread: a second would split the same share and add its own work.
pub(crate) fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        let memory = std::env::var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE").ok();
        cpus_of(
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            memory.as_deref(),
        )
    })
}

/// [`cpus`] of `cores` and a Lambda memory size in MB (`None`: not in Lambda; a value that
/// is not a number of MB is not a limit).
pub(crate) fn cpus_of(cores: usize, lambda_memory_mb: Option<&str>) -> usize {
    let share = lambda_memory_mb
        .and_then(|mb| mb.trim().parse::<u64>().ok())
        .map_or(usize::MAX, |mb| {
            usize::try_from(mb / LAMBDA_MB_PER_VCPU).unwrap_or(usize::MAX)
        });
    cores.min(share).max(1)
}

/// The full path: `serde_json` with hand-written visitors; decides every error.
pub(super) fn decode_full(json: &[u8]) -> Result<KafkaEvent, DecodeError> {
    let mut ctx = Ctx::default();
    let mut de = serde_json::Deserializer::from_slice(json);
    let result = EventSeed { ctx: &mut ctx }
        .deserialize(&mut de)
        .and_then(|event| de.end().map(|()| event));
    result.map_err(|err| ctx.into_error(&err))
}

/// Top-level field names; anything else is ignored.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum EventField {
    EventSource,
    EventSourceArn,
    BootstrapServers,
    Records,
    /// Refused when `Queue` (share groups).
    ConsumptionMode,
    #[serde(other)]
    Other,
}

/// `eventSource`, before the ARN is attached.
enum SourceKind {
    Msk,
    SelfManaged,
}

struct EventSeed<'c> {
    ctx: &'c mut Ctx,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = KafkaEvent;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<KafkaEvent, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = KafkaEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kafka event object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KafkaEvent, A::Error> {
        let ctx = self.ctx;
        let mut source = None;
        let mut arn: Option<Option<String>> = None;
        let mut bootstrap_servers = None;
        let mut partitions = None;
        while let Some(field) = map.next_key::<EventField>()? {
            match field {
                EventField::EventSource => {
                    once(ctx, source.is_some(), "eventSource")?;
                    source = Some(map.next_value_seed(SourceSeed { ctx: &mut *ctx })?);
                }
                EventField::EventSourceArn => {
                    once(ctx, arn.is_some(), "eventSourceArn")?;
                    arn = Some(map.next_value()?);
                }
                EventField::BootstrapServers => {
                    once(ctx, bootstrap_servers.is_some(), "bootstrapServers")?;
                    bootstrap_servers = Some(map.next_value::<String>()?);
                }
                EventField::Records => {
                    once(ctx, partitions.is_some(), "records")?;
                    partitions = Some(map.next_value_seed(RecordsSeed { ctx: &mut *ctx })?);
                    ctx.leave_records();
                }
                EventField::ConsumptionMode => {
                    ctx.field = Some("consumptionMode");
                    let mode: Option<String> = map.next_value()?;
                    if mode.is_some_and(|m| m.eq_ignore_ascii_case("queue")) {
                        return Err(ctx.fail(DecodeErrorKind::QueueMode(
                            "the event's consumptionMode is Queue",
                        )));
                    }
                }
                EventField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            ctx.field = None;
        }
        let source = match source.ok_or_else(|| missing(ctx, "eventSource"))? {
            SourceKind::SelfManaged => EventSource::SelfManaged,
            SourceKind::Msk => match arn.flatten() {
                Some(arn) => EventSource::Msk { arn },
                None => {
                    ctx.field = Some("eventSourceArn");
                    return Err(ctx.fail(DecodeErrorKind::MissingEventSourceArn));
                }
            },
        };
        Ok(KafkaEvent {
            source,
            bootstrap_servers: bootstrap_servers.ok_or_else(|| missing(ctx, "bootstrapServers"))?,
            partitions: partitions.ok_or_else(|| missing(ctx, "records"))?,
        })
    }
}

/// Enters `field`, failing if it was already seen in this object.
fn once<E: de::Error>(ctx: &mut Ctx, seen: bool, field: &'static str) -> Result<(), E> {
    ctx.field = Some(field);
    if seen {
        return Err(ctx.fail(DecodeErrorKind::DuplicateField(field)));
    }
    Ok(())
}

fn missing<E: de::Error>(ctx: &mut Ctx, field: &'static str) -> E {
    ctx.field = None;
    ctx.fail(DecodeErrorKind::MissingField(field))
}

/// `eventSource`: `aws:kafka` or `SelfManagedKafka`.
struct SourceSeed<'c> {
    ctx: &'c mut Ctx,
}

impl<'de> DeserializeSeed<'de> for SourceSeed<'_> {
    type Value = SourceKind;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<SourceKind, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for SourceSeed<'_> {
    type Value = SourceKind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"aws:kafka\" or \"SelfManagedKafka\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<SourceKind, E> {
        match v {
            "aws:kafka" => Ok(SourceKind::Msk),
            "SelfManagedKafka" => Ok(SourceKind::SelfManaged),
            other => Err(self
                .ctx
                .fail(DecodeErrorKind::UnknownEventSource(other.to_owned()))),
        }
    }
}

/// The `records` map: `"<topic>-<partition>"` -> list of records, kept in JSON order.
struct RecordsSeed<'c> {
    ctx: &'c mut Ctx,
}

impl<'de> DeserializeSeed<'de> for RecordsSeed<'_> {
    type Value = Vec<PartitionRecords>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RecordsSeed<'_> {
    type Value = Vec<PartitionRecords>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map from \"<topic>-<partition>\" to lists of records")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let ctx = self.ctx;
        let mut partitions = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            ctx.field = None;
            let Some(tp) = TopicPartition::from_key(&key) else {
                ctx.key = Some(key.clone());
                return Err(ctx.fail(DecodeErrorKind::BadPartitionKey(key)));
            };
            ctx.key = Some(key);
            ctx.tp = Some(tp.clone());
            let records = map.next_value_seed(RecordListSeed {
                ctx: &mut *ctx,
                tp: &tp,
            })?;
            partitions.push(PartitionRecords { tp, records });
        }
        let mut seen = HashSet::with_capacity(partitions.len());
        for p in &partitions {
            if !seen.insert(&p.tp) {
                let key = p.tp.to_string();
                ctx.key = Some(key.clone());
                ctx.tp = Some(p.tp.clone());
                ctx.index = None;
                ctx.offset = None;
                return Err(ctx.fail(DecodeErrorKind::DuplicatePartitionKey(key)));
            }
        }
        Ok(partitions)
    }
}

/// The list of records under one key: checks that offsets strictly increase.
struct RecordListSeed<'c> {
    ctx: &'c mut Ctx,
    tp: &'c TopicPartition,
}

impl<'de> DeserializeSeed<'de> for RecordListSeed<'_> {
    type Value = Vec<Record>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Record>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RecordListSeed<'_> {
    type Value = Vec<Record>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of records")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Record>, A::Error> {
        let ctx = self.ctx;
        let mut records: Vec<Record> = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        loop {
            ctx.index = Some(records.len());
            ctx.offset = None;
            ctx.field = None;
            let seed = RecordSeed {
                ctx: &mut *ctx,
                tp: self.tp,
            };
            let Some(record) = seq.next_element_seed(seed)? else {
                break;
            };
            if let Some(previous) = records.last()
                && record.offset <= previous.offset
            {
                let kind = DecodeErrorKind::OffsetOutOfOrder {
                    previous: previous.offset,
                    offset: record.offset,
                };
                return Err(ctx.fail(kind));
            }
            records.push(record);
        }
        ctx.index = None;
        ctx.offset = None;
        Ok(records)
    }
}
