//! Encoding: writes the exact Lambda event shape straight into a byte buffer.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{EventSource, Header, KafkaEvent, Record, SchemaMetadata};

pub(super) fn to_json(event: &KafkaEvent) -> Vec<u8> {
    let mut out = Vec::with_capacity(estimate_len(event));
    out.extend_from_slice(b"{\"eventSource\":");
    match &event.source {
        EventSource::Msk { arn } => {
            out.extend_from_slice(b"\"aws:kafka\",\"eventSourceArn\":");
            push_str(&mut out, arn);
        }
        EventSource::SelfManaged => out.extend_from_slice(b"\"SelfManagedKafka\""),
    }
    out.extend_from_slice(b",\"bootstrapServers\":");
    push_str(&mut out, &event.bootstrap_servers);
    out.extend_from_slice(b",\"records\":{");
    for (i, partition) in event.partitions.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(&mut out, &partition.tp.to_string());
        out.extend_from_slice(b":[");
        // The topic is the same for every record of the list: escape it once.
        let mut topic = Vec::with_capacity(partition.tp.topic.len() + 2);
        push_str(&mut topic, &partition.tp.topic);
        for (j, record) in partition.records.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            push_record(&mut out, &topic, partition.tp.partition, record);
        }
        out.push(b']');
    }
    out.extend_from_slice(b"}}");
    out
}

/// A capacity that holds the whole output in the common case (base64 is 4/3 of the bytes).
fn estimate_len(event: &KafkaEvent) -> usize {
    let records = event.partitions.iter().flat_map(|p| {
        p.records
            .iter()
            .map(move |r| p.tp.topic.len() + record_payload(r) * 4 / 3 + 192)
    });
    256 + records.sum::<usize>()
}

fn record_payload(r: &Record) -> usize {
    let bytes = |b: Option<&[u8]>| b.map_or(0, <[u8]>::len);
    let headers: usize = r
        .headers
        .iter()
        .map(|h| h.name.len() + 8 + h.value.len() * 4)
        .sum();
    bytes(r.key()) + bytes(r.value()) + headers
}

fn push_record(out: &mut Vec<u8>, quoted_topic: &[u8], partition: i32, r: &Record) {
    out.extend_from_slice(b"{\"topic\":");
    out.extend_from_slice(quoted_topic);
    out.extend_from_slice(b",\"partition\":");
    push_int(out, i64::from(partition));
    out.extend_from_slice(b",\"offset\":");
    push_int(out, r.offset);
    out.extend_from_slice(b",\"timestamp\":");
    push_int(out, r.timestamp);
    out.extend_from_slice(b",\"timestampType\":\"");
    out.extend_from_slice(r.timestamp_type.as_str().as_bytes());
    out.extend_from_slice(b"\",\"key\":");
    push_bytes(out, r.key.as_deref());
    out.extend_from_slice(b",\"value\":");
    push_bytes(out, r.value.as_deref());
    out.extend_from_slice(b",\"headers\":");
    push_headers(out, &r.headers);
    if let Some(m) = &r.key_schema_metadata {
        out.extend_from_slice(b",\"keySchemaMetadata\":");
        push_schema_metadata(out, m);
    }
    if let Some(m) = &r.value_schema_metadata {
        out.extend_from_slice(b",\"valueSchemaMetadata\":");
        push_schema_metadata(out, m);
    }
    out.push(b'}');
}

/// `[{"name":[signed bytes...]},...]`, one object per header, as the ESM writes them.
fn push_headers(out: &mut Vec<u8>, headers: &[Header]) {
    out.push(b'[');
    for (i, header) in headers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        push_str(out, &header.name);
        out.extend_from_slice(b":[");
        for (j, &byte) in header.value.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            // Java bytes are signed: 0xEF is written -17.
            push_int(out, i64::from(byte as i8));
        }
        out.extend_from_slice(b"]}");
    }
    out.push(b']');
}

fn push_schema_metadata(out: &mut Vec<u8>, m: &SchemaMetadata) {
    out.push(b'{');
    let mut first = true;
    for (name, value) in [("dataFormat", &m.data_format), ("schemaId", &m.schema_id)] {
        if let Some(value) = value {
            if !first {
                out.push(b',');
            }
            first = false;
            push_str(out, name);
            out.push(b':');
            push_str(out, value);
        }
    }
    out.push(b'}');
}

/// A base64 string, or `null`.
fn push_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    let Some(bytes) = bytes else {
        out.extend_from_slice(b"null");
        return;
    };
    out.push(b'"');
    let start = out.len();
    // `encoded_len` is `None` only for inputs near `usize::MAX` bytes, which cannot exist.
    let len = base64::encoded_len(bytes.len(), true).unwrap_or(0);
    out.resize(start + len, 0);
    if STANDARD.encode_slice(bytes, &mut out[start..]).is_err() {
        out.truncate(start);
        out.extend_from_slice(STANDARD.encode(bytes).as_bytes());
    }
    out.push(b'"');
}

/// A JSON string literal with the escapes JSON requires.
fn push_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// A decimal integer, without going through `fmt`.
fn push_int(out: &mut Vec<u8>, n: i64) {
    let mut buf = [0u8; 20];
    out.extend_from_slice(decimal(n, &mut buf));
}

/// The decimal digits of `n` (with a `-` if negative), written at the end of `buf`
/// (20 bytes hold `i64::MIN`).
pub(crate) fn decimal(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut pos = buf.len();
    let mut rest = n.unsigned_abs();
    loop {
        pos -= 1;
        buf[pos] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        pos -= 1;
        buf[pos] = b'-';
    }
    &buf[pos..]
}

#[cfg(test)]
mod tests {
    use super::{push_int, push_str};

    fn int(n: i64) -> String {
        let mut out = Vec::new();
        push_int(&mut out, n);
        String::from_utf8(out).unwrap_or_default()
    }

    fn string(s: &str) -> String {
        let mut out = Vec::new();
        push_str(&mut out, s);
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn integers_are_written_exactly() {
        assert_eq!(int(0), "0");
        assert_eq!(int(-17), "-17");
        assert_eq!(int(9_007_199_254_740_993), "9007199254740993");
        assert_eq!(int(i64::MAX), "9223372036854775807");
        assert_eq!(int(i64::MIN), "-9223372036854775808");
    }

    #[test]
    fn strings_are_escaped_as_json_requires() {
        assert_eq!(string("plain-topic"), r#""plain-topic""#);
        assert_eq!(string("a\"b\\c\nd\te\u{1}é"), r#""a\"b\\c\nd\te\u0001é""#);
    }
}
