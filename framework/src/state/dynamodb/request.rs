//! The store's `UpdateItem` requests, built once and sent either way: written straight to
//! DynamoDB's JSON 1.0 body for the [`LeanClient`](super::LeanClient), or turned into the
//! SDK's fluent builder for the SDK path.
//!
//! # Why
//! The SDK's `UpdateItemInputBuilder` keeps a request as `HashMap`s of owned `String`s and
//! `AttributeValue`s, and the lean path then serialized those maps: a dozen allocations and
//! two copies of every name and value per state write, which is what a user pays for in
//! Lambda. An [`Update`] keeps its placeholders as static strings where it can, numbers as
//! integers and blobs borrowed from the write, and the body is written in one buffer.
//!
//! Setting a placeholder twice keeps the last value, as the SDK's maps do.

use std::borrow::Cow;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// An attribute value of a request.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value<'a> {
    /// A string (`S`).
    S(Cow<'a, str>),
    /// A number (`N`).
    N(i64),
    /// A number (`N`) that is never negative (a version).
    U(u64),
    /// A binary (`B`), base64 on the wire.
    B(Cow<'a, [u8]>),
}

impl Value<'_> {
    fn to_sdk(&self) -> AttributeValue {
        match self {
            Value::S(s) => AttributeValue::S(s.as_ref().to_owned()),
            Value::N(n) => AttributeValue::N(n.to_string()),
            Value::U(n) => AttributeValue::N(n.to_string()),
            Value::B(b) => AttributeValue::B(Blob::new(b.as_ref())),
        }
    }
}

/// What a successful write returns (`ReturnValues`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Returned {
    /// `UPDATED_NEW`: the attributes the update set, as they are now.
    UpdatedNew,
    /// `ALL_NEW`: the whole item as it is now.
    AllNew,
    /// `UPDATED_OLD`: the attributes the update set or removed, as they were.
    UpdatedOld,
}

/// One `UpdateItem` of the store (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct Update<'a> {
    table: &'a str,
    pk: Cow<'a, str>,
    sk: i64,
    update_expression: Option<String>,
    condition_expression: Option<Cow<'static, str>>,
    names: Vec<(Cow<'static, str>, Cow<'a, str>)>,
    values: Vec<(Cow<'static, str>, Value<'a>)>,
    returned: Option<Returned>,
    old_on_failure: bool,
    consumed_capacity: bool,
}

/// `prefix` followed by `i` (`#w3`, `:l12`): a static string for the placeholders every
/// write uses (the first [`STATIC_PLACEHOLDERS`] partitions of a write), else formatted.
pub(super) fn placeholder(prefix: &'static str, i: usize) -> Cow<'static, str> {
    const W: [&str; STATIC_PLACEHOLDERS] = ["#w0", "#w1", "#w2", "#w3", "#w4", "#w5", "#w6", "#w7"];
    const F: [&str; STATIC_PLACEHOLDERS] = [":f0", ":f1", ":f2", ":f3", ":f4", ":f5", ":f6", ":f7"];
    const L: [&str; STATIC_PLACEHOLDERS] = [":l0", ":l1", ":l2", ":l3", ":l4", ":l5", ":l6", ":l7"];
    let table = match prefix {
        "#w" => Some(&W),
        ":f" => Some(&F),
        ":l" => Some(&L),
        _ => None,
    };
    match table {
        Some(table) if i < STATIC_PLACEHOLDERS => Cow::Borrowed(table[i]),
        _ => Cow::Owned(format!("{prefix}{i}")),
    }
}

/// The update's part that moves watermark `i` (`#w3 = :l3`): static for the first
/// [`STATIC_PLACEHOLDERS`], else formatted.
pub(super) fn watermark_set(i: usize) -> Cow<'static, str> {
    const SET: [&str; STATIC_PLACEHOLDERS] = [
        "#w0 = :l0",
        "#w1 = :l1",
        "#w2 = :l2",
        "#w3 = :l3",
        "#w4 = :l4",
        "#w5 = :l5",
        "#w6 = :l6",
        "#w7 = :l7",
    ];
    match SET.get(i) {
        Some(set) => Cow::Borrowed(set),
        None => Cow::Owned(format!("#w{i} = :l{i}")),
    }
}

/// The condition that watermark `i` is below the batch's first offset of its partition
/// (`(attribute_not_exists(#w3) OR #w3 < :f3)`): static for the first
/// [`STATIC_PLACEHOLDERS`], else formatted.
pub(super) fn watermark_condition(i: usize) -> Cow<'static, str> {
    const CONDITION: [&str; STATIC_PLACEHOLDERS] = [
        "(attribute_not_exists(#w0) OR #w0 < :f0)",
        "(attribute_not_exists(#w1) OR #w1 < :f1)",
        "(attribute_not_exists(#w2) OR #w2 < :f2)",
        "(attribute_not_exists(#w3) OR #w3 < :f3)",
        "(attribute_not_exists(#w4) OR #w4 < :f4)",
        "(attribute_not_exists(#w5) OR #w5 < :f5)",
        "(attribute_not_exists(#w6) OR #w6 < :f6)",
        "(attribute_not_exists(#w7) OR #w7 < :f7)",
    ];
    match CONDITION.get(i) {
        Some(condition) => Cow::Borrowed(condition),
        None => Cow::Owned(format!("(attribute_not_exists(#w{i}) OR #w{i} < :f{i})")),
    }
}

/// How many indexed placeholders per prefix [`placeholder`] has as static strings.
const STATIC_PLACEHOLDERS: usize = 8;

impl<'a> Update<'a> {
    /// An update of the item (`pk`, `sk`) of `table`.
    pub(super) fn new(table: &'a str, pk: impl Into<Cow<'a, str>>, sk: i64) -> Self {
        Update {
            table,
            pk: pk.into(),
            sk,
            update_expression: None,
            condition_expression: None,
            names: Vec::with_capacity(8),
            values: Vec::with_capacity(8),
            returned: None,
            old_on_failure: false,
            consumed_capacity: false,
        }
    }

    /// Sets the update expression.
    pub(super) fn update_expression(mut self, expression: impl Into<String>) -> Self {
        self.update_expression = Some(expression.into());
        self
    }

    /// Sets the condition expression.
    pub(super) fn condition_expression(mut self, expression: impl Into<Cow<'static, str>>) -> Self {
        self.condition_expression = Some(expression.into());
        self
    }

    /// Names attribute `name` by `placeholder` (`#v` → `v`).
    pub(super) fn name(
        mut self,
        placeholder: impl Into<Cow<'static, str>>,
        name: impl Into<Cow<'a, str>>,
    ) -> Self {
        let (placeholder, name) = (placeholder.into(), name.into());
        match self.names.iter_mut().find(|(p, _)| *p == placeholder) {
            Some(entry) => entry.1 = name,
            None => self.names.push((placeholder, name)),
        }
        self
    }

    /// Gives `placeholder` (`:d`) the value `value`.
    pub(super) fn value(
        mut self,
        placeholder: impl Into<Cow<'static, str>>,
        value: Value<'a>,
    ) -> Self {
        let placeholder = placeholder.into();
        match self.values.iter_mut().find(|(p, _)| *p == placeholder) {
            Some(entry) => entry.1 = value,
            None => self.values.push((placeholder, value)),
        }
        self
    }

    /// Asks for the item's attributes after a successful write.
    pub(super) fn returned(mut self, returned: Returned) -> Self {
        self.returned = Some(returned);
        self
    }

    /// Asks for the item as it is when the condition fails (`ALL_OLD`).
    pub(super) fn old_on_failure(mut self) -> Self {
        self.old_on_failure = true;
        self
    }

    /// Asks for the write units consumed (`TOTAL`).
    pub(super) fn consumed_capacity(mut self) -> Self {
        self.consumed_capacity = true;
        self
    }

    /// The same request as the SDK's fluent builder on `client`.
    pub(super) fn to_sdk(&self, client: &Client) -> UpdateItemFluentBuilder {
        let mut request = client
            .update_item()
            .table_name(self.table)
            .key("pk", AttributeValue::S(self.pk.as_ref().to_owned()))
            .key("sk", AttributeValue::N(self.sk.to_string()))
            .set_update_expression(self.update_expression.clone())
            .set_condition_expression(self.condition_expression.as_ref().map(|c| c.to_string()));
        for (placeholder, name) in &self.names {
            request = request.expression_attribute_names(placeholder.as_ref(), name.as_ref());
        }
        for (placeholder, value) in &self.values {
            request = request.expression_attribute_values(placeholder.as_ref(), value.to_sdk());
        }
        if let Some(returned) = self.returned {
            request = request.return_values(match returned {
                Returned::UpdatedNew => ReturnValue::UpdatedNew,
                Returned::AllNew => ReturnValue::AllNew,
                Returned::UpdatedOld => ReturnValue::UpdatedOld,
            });
        }
        if self.old_on_failure {
            request = request.return_values_on_condition_check_failure(
                ReturnValuesOnConditionCheckFailure::AllOld,
            );
        }
        if self.consumed_capacity {
            request = request.return_consumed_capacity(ReturnConsumedCapacity::Total);
        }
        request
    }

    /// The request's body in DynamoDB's JSON 1.0 protocol.
    pub(super) fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body_estimate());
        out.extend_from_slice(b"{\"TableName\":");
        string(&mut out, self.table);
        out.extend_from_slice(b",\"Key\":{\"pk\":{\"S\":");
        string(&mut out, &self.pk);
        out.extend_from_slice(b"},\"sk\":{\"N\":\"");
        decimal(&mut out, self.sk.unsigned_abs(), self.sk < 0);
        out.extend_from_slice(b"\"}}");
        if let Some(expression) = &self.update_expression {
            out.extend_from_slice(b",\"UpdateExpression\":");
            string(&mut out, expression);
        }
        if let Some(expression) = &self.condition_expression {
            out.extend_from_slice(b",\"ConditionExpression\":");
            string(&mut out, expression);
        }
        if !self.names.is_empty() {
            out.extend_from_slice(b",\"ExpressionAttributeNames\":{");
            for (i, (placeholder, name)) in self.names.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(&mut out, placeholder);
                out.push(b':');
                string(&mut out, name);
            }
            out.push(b'}');
        }
        if !self.values.is_empty() {
            out.extend_from_slice(b",\"ExpressionAttributeValues\":{");
            for (i, (placeholder, value)) in self.values.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(&mut out, placeholder);
                out.push(b':');
                match value {
                    Value::S(s) => {
                        out.extend_from_slice(b"{\"S\":");
                        string(&mut out, s);
                    }
                    Value::N(n) => {
                        out.extend_from_slice(b"{\"N\":\"");
                        decimal(&mut out, n.unsigned_abs(), *n < 0);
                        out.push(b'"');
                    }
                    Value::U(n) => {
                        out.extend_from_slice(b"{\"N\":\"");
                        decimal(&mut out, *n, false);
                        out.push(b'"');
                    }
                    Value::B(b) => {
                        out.extend_from_slice(b"{\"B\":\"");
                        let start = out.len();
                        out.resize(start + base64::encoded_len(b.len(), true).unwrap_or(0), 0);
                        let written = STANDARD.encode_slice(b, &mut out[start..]).unwrap_or(0);
                        out.truncate(start + written);
                        out.push(b'"');
                    }
                }
                out.push(b'}');
            }
            out.push(b'}');
        }
        if let Some(returned) = self.returned {
            out.extend_from_slice(match returned {
                Returned::UpdatedNew => b",\"ReturnValues\":\"UPDATED_NEW\"".as_slice(),
                Returned::AllNew => b",\"ReturnValues\":\"ALL_NEW\"".as_slice(),
                Returned::UpdatedOld => b",\"ReturnValues\":\"UPDATED_OLD\"".as_slice(),
            });
        }
        if self.old_on_failure {
            out.extend_from_slice(b",\"ReturnValuesOnConditionCheckFailure\":\"ALL_OLD\"");
        }
        if self.consumed_capacity {
            out.extend_from_slice(b",\"ReturnConsumedCapacity\":\"TOTAL\"");
        }
        out.push(b'}');
        out
    }

    /// About the body's length (a little more when nothing needs escaping), so that it is
    /// written without growing its buffer.
    fn body_estimate(&self) -> usize {
        let text = |s: &str| s.len() + 3;
        let values: usize = self
            .values
            .iter()
            .map(|(p, v)| {
                text(p)
                    + 12
                    + match v {
                        Value::S(s) => text(s),
                        Value::N(_) | Value::U(_) => 22,
                        Value::B(b) => b.len().div_ceil(3) * 4 + 2,
                    }
            })
            .sum();
        let names: usize = self.names.iter().map(|(p, n)| text(p) + text(n)).sum();
        200 + self.table.len()
            + self.pk.len()
            + self.update_expression.as_deref().map_or(0, text)
            + self.condition_expression.as_deref().map_or(0, text)
            + names
            + values
    }
}

/// Writes `n` (negative when `negative`) in decimal, without the formatting machinery.
pub(super) fn decimal(out: &mut Vec<u8>, mut n: u64, negative: bool) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if negative {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// Writes `s` as a JSON string: quotes, backslashes and control characters escaped.
fn string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let needs_escape = |b: &u8| *b < 0x20 || *b == b'"' || *b == b'\\';
    out.push(b'"');
    // Names, placeholders and expressions hold no escapes: checked without stopping early
    // (the compiler vectorizes it), then copied whole.
    let clean = !s
        .as_bytes()
        .iter()
        .fold(false, |dirty, b| dirty | needs_escape(b));
    if clean {
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    let mut rest = s.as_bytes();
    while let Some(at) = rest.iter().position(needs_escape) {
        out.extend_from_slice(&rest[..at]);
        let b = rest[at];
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Update<'static> {
        Update::new("state", "counts#Zm94", 0)
            .update_expression("ADD #v :d, #ver :one SET #k = :k")
            .condition_expression("attribute_not_exists(#w0) OR #w0 < :f0")
            .name("#v", "v")
            .name(placeholder("#w", 0), "w:events-0")
            .value(":d", Value::N(-3))
            .value(":read", Value::U(u64::MAX))
            .value(":k", Value::B(Cow::Borrowed(b"fox\"\n")))
            .value(":cq", Value::S(Cow::Borrowed("counts")))
            .returned(Returned::UpdatedNew)
            .old_on_failure()
            .consumed_capacity()
    }

    #[test]
    fn the_body_is_dynamodbs_json_protocol() {
        let body: serde_json::Value = serde_json::from_slice(&sample().body()).unwrap();
        let expected = serde_json::json!({
            "TableName": "state",
            "Key": {"pk": {"S": "counts#Zm94"}, "sk": {"N": "0"}},
            "UpdateExpression": "ADD #v :d, #ver :one SET #k = :k",
            "ConditionExpression": "attribute_not_exists(#w0) OR #w0 < :f0",
            "ExpressionAttributeNames": {"#v": "v", "#w0": "w:events-0"},
            "ExpressionAttributeValues": {
                ":d": {"N": "-3"}, ":read": {"N": "18446744073709551615"}, ":k": {"B": "Zm94Igo="}, ":cq": {"S": "counts"}
            },
            "ReturnValues": "UPDATED_NEW",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            "ReturnConsumedCapacity": "TOTAL",
        });
        assert_eq!(body, expected);
        let bare: serde_json::Value =
            serde_json::from_slice(&Update::new("t", "p", -1).body()).unwrap();
        assert_eq!(
            bare,
            serde_json::json!({"TableName": "t", "Key": {"pk": {"S": "p"}, "sk": {"N": "-1"}}})
        );
    }

    #[test]
    fn strings_are_escaped_and_the_last_value_of_a_placeholder_wins() {
        let odd = "q\"b\\n\nt\tc\u{1}\u{1f}é😀";
        let update = Update::new("t", odd, i64::MIN)
            .name("#a", "first")
            .name("#a", odd)
            .value(":v", Value::N(1))
            .value(":v", Value::S(Cow::Borrowed(odd)))
            .value(":e", Value::B(Cow::Borrowed(b"")));
        let body: serde_json::Value = serde_json::from_slice(&update.body()).unwrap();
        assert_eq!(body["Key"]["pk"]["S"], odd);
        assert_eq!(body["Key"]["sk"]["N"], i64::MIN.to_string());
        assert_eq!(
            body["ExpressionAttributeNames"],
            serde_json::json!({"#a": odd})
        );
        assert_eq!(
            body["ExpressionAttributeValues"],
            serde_json::json!({":v": {"S": odd}, ":e": {"B": ""}})
        );
    }

    #[test]
    fn the_sdk_builder_holds_the_same_request() {
        let client = Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
        );
        let input = sample().to_sdk(&client);
        let input = input.as_input();
        assert_eq!(input.get_table_name().as_deref(), Some("state"));
        assert_eq!(
            input.get_key().as_ref().unwrap()["pk"],
            AttributeValue::S("counts#Zm94".into())
        );
        assert_eq!(
            input.get_key().as_ref().unwrap()["sk"],
            AttributeValue::N("0".into())
        );
        let names = input.get_expression_attribute_names().as_ref().unwrap();
        assert_eq!(names["#w0"], "w:events-0");
        let values = input.get_expression_attribute_values().as_ref().unwrap();
        assert_eq!(values[":d"], AttributeValue::N("-3".into()));
        assert_eq!(
            values[":k"],
            AttributeValue::B(Blob::new(b"fox\"\n".to_vec()))
        );
        assert_eq!(values[":cq"], AttributeValue::S("counts".into()));
        assert_eq!(input.get_return_values(), &Some(ReturnValue::UpdatedNew));
        assert_eq!(
            input.get_return_values_on_condition_check_failure(),
            &Some(ReturnValuesOnConditionCheckFailure::AllOld)
        );
        assert_eq!(
            input.get_return_consumed_capacity(),
            &Some(ReturnConsumedCapacity::Total)
        );
    }

    #[test]
    fn watermark_expressions_are_the_formatted_ones() {
        for i in 0..12 {
            assert_eq!(watermark_set(i), format!("#w{i} = :l{i}"));
            assert_eq!(
                watermark_condition(i),
                format!("(attribute_not_exists(#w{i}) OR #w{i} < :f{i})")
            );
        }
    }

    #[test]
    fn placeholders_beyond_the_static_ones_are_formatted() {
        assert_eq!(placeholder("#w", 7), "#w7");
        assert!(matches!(placeholder("#w", 7), Cow::Borrowed(_)));
        assert_eq!(placeholder(":l", 8), ":l8");
        assert_eq!(placeholder(":f", 49), ":f49");
        assert_eq!(placeholder(":x", 0), ":x0");
    }
}
