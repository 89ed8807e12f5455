//! The headers the framework writes on the records it produces: their names, and the one
//! writer and the one parser of each value ([`SourceHeader`], [`HopHeaders`]), below every
//! producer and reader of them.

use crate::event::encode::decimal;
use crate::event::{Header, TopicPartition};

/// Header naming the source record of an output record: `<topic>:<partition>:<offset>`.
pub const SOURCE_HEADER: &str = "lambda-streams-source";
/// Header carrying the version of the state item a table update comes from (decimal).
pub const VERSION_HEADER: &str = "lambda-streams-version";
/// Header of a record produced to a repartition topic: its rank at every hop it crossed
/// (decimal, from 0, comma-separated, first hop first; one rank after one hop), among the
/// records the record it came from produced there. See [`HopHeaders`].
pub const SEQUENCE_HEADER: &str = "lambda-streams-sequence";

/// Header of a record produced to a repartition topic whose key is null (empty value).
/// Such a record travels with a stand-in key, the [`SOURCE_HEADER`] value of its original
/// source record, so that every copy of it (a retry's, a zombie's) goes to the same
/// partition: with a null key the producer would pick a partition at random per copy, and
/// copies on different partitions are on different watermark channels, each counted once.
/// The reader takes the key as null again.
pub const NULL_KEY_HEADER: &str = "lambda-streams-null-key";

/// Header the batch puts, under exactly-once output, on each output record a record of the
/// event caused: that record's `<topic>:<partition>:<offset>` ([`SourceHeader`]), the
/// partition whose transaction the output goes in. The transactional output reads it and
/// removes it before producing: it never reaches Kafka. (A dead letter needs none: its
/// [`SOURCE_HEADER`] names the event's record.)
pub const TRANSACTION_HEADER: &str = "lambda-streams-transaction";

/// Header of a dead-lettered record carrying the error that sent it there.
pub const ERROR_HEADER: &str = "lambda-streams-error";

/// Header listing the repartition partitions a record crossed before the topic it is in:
/// `<topic>:<partition>` per hop, comma-separated, first hop first. Absent on a record of
/// a first hop.
pub const PATH_HEADER: &str = "lambda-streams-path";

/// The value of the [`SOURCE_HEADER`]: the topic-partition and offset of a source record,
/// written `<topic>:<partition>:<offset>` (topic names cannot hold `:`).
///
/// Every writer of the header (sinks, repartition topics, dead letters) writes it with
/// [`SourceHeader::write`], and every reader parses it with [`SourceHeader::parse`].
///
/// ```
/// use lambda_streams::event::TopicPartition;
/// use lambda_streams::wire::SourceHeader;
///
/// let tp = TopicPartition::new("page-views", 3);
/// let bytes = SourceHeader::write(&tp, 42);
/// assert_eq!(bytes, b"page-views:3:42");
/// assert_eq!(SourceHeader::parse(&bytes), Some(SourceHeader { tp, offset: 42 }));
/// assert_eq!(SourceHeader::parse(b"page-views:3"), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceHeader {
    /// The source record's topic-partition.
    pub tp: TopicPartition,
    /// The source record's offset.
    pub offset: i64,
}

impl SourceHeader {
    /// `<topic>:<partition>:<offset>`, as `format!("{}:{}:{}", ..)` writes it, in one
    /// allocation of the exact size and without the formatting machinery (it is built for
    /// every output record).
    pub fn write(tp: &TopicPartition, offset: i64) -> Vec<u8> {
        let mut partition = [0u8; 20];
        let partition = decimal(i64::from(tp.partition), &mut partition);
        let mut digits = [0u8; 20];
        let offset = decimal(offset, &mut digits);
        let mut out = Vec::with_capacity(tp.topic.len() + partition.len() + offset.len() + 2);
        out.extend_from_slice(tp.topic.as_bytes());
        out.push(b':');
        out.extend_from_slice(partition);
        out.push(b':');
        out.extend_from_slice(offset);
        out
    }

    /// Parses what [`write`](Self::write) writes; `None` for anything else (a missing
    /// part, an empty topic, a number that does not parse).
    pub fn parse(bytes: &[u8]) -> Option<SourceHeader> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut parts = text.rsplitn(3, ':');
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        let topic = parts.next().filter(|t| !t.is_empty())?;
        Some(SourceHeader {
            tp: TopicPartition::new(topic, partition),
            offset,
        })
    }
}

/// What a record of a repartition topic carries about its way there (design notes, section
/// 4a): its original source record ([`SOURCE_HEADER`]), the repartition partitions it
/// crossed before the topic it is in ([`PATH_HEADER`]), and its rank at every hop
/// ([`SEQUENCE_HEADER`]: among the records one record of the previous hop produced to the
/// next, from 0; comma-separated, first hop first).
///
/// A record after one hop carries `lambda-streams-source: lines:0:7` and
/// `lambda-streams-sequence: 2` (the third record line 7 produced); after a second hop,
/// also `lambda-streams-path: words:1` (the partition of the first hop) and
/// `lambda-streams-sequence: 2,0`.
///
/// ```
/// use lambda_streams::event::{Header, TopicPartition};
/// use lambda_streams::wire::{HopHeaders, SourceHeader};
///
/// let hops = HopHeaders {
///     source: SourceHeader { tp: TopicPartition::new("lines", 0), offset: 7 },
///     path: vec![TopicPartition::new("words", 1)],
///     ranks: vec![2, 0],
/// };
/// let headers: Vec<Header> = hops
///     .write()
///     .into_iter()
///     .map(|(name, value)| Header::new(name, value))
///     .collect();
/// assert_eq!(headers[1].value(), b"2,0");
/// assert_eq!(headers[2].value(), b"words:1");
/// assert_eq!(HopHeaders::parse(&headers), Ok(hops));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopHeaders {
    /// The original source record.
    pub source: SourceHeader,
    /// The repartition partitions crossed before the current topic, first hop first
    /// (empty after one hop).
    pub path: Vec<TopicPartition>,
    /// The record's rank at every hop, the current one last: one more than `path`.
    pub ranks: Vec<u32>,
}

impl HopHeaders {
    /// The headers, as (name, value): source, sequence, and path unless it is empty.
    pub fn write(&self) -> Vec<(String, Vec<u8>)> {
        let mut headers = vec![
            (
                SOURCE_HEADER.to_owned(),
                SourceHeader::write(&self.source.tp, self.source.offset),
            ),
            (
                SEQUENCE_HEADER.to_owned(),
                join(&self.ranks, |r| r.to_string()),
            ),
        ];
        if !self.path.is_empty() {
            let path = join(&self.path, |tp| format!("{}:{}", tp.topic, tp.partition));
            headers.push((PATH_HEADER.to_owned(), path));
        }
        headers
    }

    /// Parses the headers [`write`](Self::write) writes, from a record's headers (the
    /// first of each name counts); the error says which header is missing or malformed.
    pub fn parse(headers: &[Header]) -> Result<HopHeaders, String> {
        Self::parse_by(|name| headers.iter().find(|h| h.name() == name).map(Header::value))
    }

    /// [`parse`](Self::parse) of the headers of a record being produced (name, value).
    pub fn parse_produced(headers: &[(String, Vec<u8>)]) -> Result<HopHeaders, String> {
        Self::parse_by(|name| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_slice())
        })
    }

    /// Parses the headers `find` gives by name.
    fn parse_by<'a>(find: impl Fn(&str) -> Option<&'a [u8]>) -> Result<HopHeaders, String> {
        let source = find(SOURCE_HEADER).ok_or_else(|| {
            format!("a repartition topic's record needs its {SOURCE_HEADER} header")
        })?;
        let source = SourceHeader::parse(source)
            .ok_or_else(|| format!("{SOURCE_HEADER} is not <topic>:<partition>:<offset>"))?;
        let ranks = find(SEQUENCE_HEADER)
            .and_then(|value| split(value, |r| r.parse::<u32>().ok()))
            .ok_or_else(|| format!("no valid {SEQUENCE_HEADER} header (ranks: <n>[,<n>...])"))?;
        let path = match find(PATH_HEADER) {
            None => Vec::new(),
            Some(value) => split(value, |hop| {
                let (topic, partition) = hop.rsplit_once(':')?;
                let partition = partition.parse().ok()?;
                (!topic.is_empty()).then(|| TopicPartition::new(topic, partition))
            })
            .ok_or_else(|| {
                format!("{PATH_HEADER} is not <topic>:<partition>[,<topic>:<partition>...]")
            })?,
        };
        if ranks.len() != path.len() + 1 {
            return Err(format!(
                "{SEQUENCE_HEADER} holds {} ranks for {} hops ({PATH_HEADER} names {})",
                ranks.len(),
                path.len() + 1,
                path.len()
            ));
        }
        Ok(HopHeaders {
            source,
            path,
            ranks,
        })
    }
}

/// `items` written with `write`, comma-separated.
fn join<T>(items: &[T], write: impl Fn(&T) -> String) -> Vec<u8> {
    items
        .iter()
        .map(write)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

/// The comma-separated parts of `value`, each read with `read`; `None` if one does not read.
fn split<T>(value: &[u8], read: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
    std::str::from_utf8(value)
        .ok()?
        .split(',')
        .map(read)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{HopHeaders, SourceHeader};
    use crate::event::{Header, TopicPartition};

    #[test]
    fn the_source_header_is_what_format_writes_and_parses_back() {
        let tps = [
            TopicPartition::new("page-views", 0),
            TopicPartition::new("a-b:c", i32::MAX),
            TopicPartition::new("t", i32::MIN),
        ];
        let offsets = [0, 1, 9, 10, 4_200_000, -1, i64::MAX, i64::MIN, -4_200_017];
        for tp in &tps {
            for offset in offsets {
                let bytes = SourceHeader::write(tp, offset);
                assert_eq!(
                    bytes,
                    format!("{}:{}:{}", tp.topic, tp.partition, offset).into_bytes()
                );
                let parsed = SourceHeader::parse(&bytes).expect("parses");
                assert_eq!((parsed.tp, parsed.offset), (tp.clone(), offset));
            }
        }
        // An empty topic writes, but is not a source.
        assert_eq!(
            SourceHeader::write(&TopicPartition::new("", -1), 3),
            b":-1:3"
        );
        for bad in [&b""[..], b":0:1", b"t:0", b"t:x:1", b"t:0:1.5", b"\xff:0:1"] {
            assert_eq!(SourceHeader::parse(bad), None, "{bad:?}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<Header> {
        pairs
            .iter()
            .map(|(n, v)| Header::new(*n, v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn hop_headers_round_trip_and_bad_ones_are_named() {
        let hops = HopHeaders {
            source: SourceHeader {
                tp: TopicPartition::new("in", 2),
                offset: 41,
            },
            path: vec![TopicPartition::new("a", 0), TopicPartition::new("b-x", 11)],
            ranks: vec![3, 0, 7],
        };
        let written: Vec<Header> = hops
            .write()
            .into_iter()
            .map(|(n, v)| Header::new(n, v))
            .collect();
        assert_eq!(
            written,
            headers(&[
                ("lambda-streams-source", "in:2:41"),
                ("lambda-streams-sequence", "3,0,7"),
                ("lambda-streams-path", "a:0,b-x:11"),
            ])
        );
        assert_eq!(HopHeaders::parse(&written), Ok(hops));
        // A first hop's record, as one hop has always written it.
        let first = headers(&[
            ("lambda-streams-source", "in:0:5"),
            ("lambda-streams-sequence", "2"),
        ]);
        let parsed = HopHeaders::parse(&first).expect("parses");
        assert_eq!((parsed.path.len(), parsed.ranks), (0, vec![2]));
        let bad: [&[(&str, &str)]; 6] = [
            &[("lambda-streams-sequence", "0")],
            &[
                ("lambda-streams-source", "in:0"),
                ("lambda-streams-sequence", "0"),
            ],
            &[("lambda-streams-source", "in:0:1")],
            &[
                ("lambda-streams-source", "in:0:1"),
                ("lambda-streams-sequence", "-1"),
            ],
            &[
                ("lambda-streams-source", "in:0:1"),
                ("lambda-streams-sequence", "0,1"),
            ],
            &[
                ("lambda-streams-source", "in:0:1"),
                ("lambda-streams-sequence", "0,1"),
                ("lambda-streams-path", "a"),
            ],
        ];
        for pairs in bad {
            let error = HopHeaders::parse(&headers(pairs)).expect_err("refused");
            assert!(error.contains("lambda-streams-"), "{pairs:?}: {error}");
        }
    }
}
