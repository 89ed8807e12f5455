//! Event filtering (`FilterCriteria`), as the Lambda Kafka event source does it: a record
//! is delivered when its `value` matches at least one of the filters; a record that matches
//! none is not delivered but done (its offset is committed), as Lambda does.
//!
//! The Kafka event source filters on the `value` key only. The value is decoded as UTF-8
//! JSON when it is JSON; a value that is not JSON (a plain string) is matched as a string;
//! a tombstone (null value) is `null`; a value that is not UTF-8 has no `value` at all (only
//! `{"value": [{"exists": false}]}` matches it).
//!
//! The pattern syntax is the subset of Lambda's filter rule syntax that applies:
//!
//! | rule | pattern |
//! |---|---|
//! | equals (string, number) | `"k": ["a", 1]` (any listed value: OR) |
//! | null | `"k": [null]` |
//! | empty | `"k": [""]` |
//! | equals-ignore-case | `"k": [{"equals-ignore-case": "abc"}]` |
//! | prefix / suffix | `"k": [{"prefix": "ab"}]`, `"k": [{"suffix": ".png"}]` |
//! | anything-but | `"k": [{"anything-but": ["a", "b"]}]` or `[{"anything-but": "a"}]` |
//! | numeric | `"k": [{"numeric": [">", 0, "<=", 5]}]` (`=`, `<`, `<=`, `>`, `>=`) |
//! | exists | `"k": [{"exists": true}]`, `[{"exists": false}]` |
//! | and (several keys) | `{"a": [...], "b": [...]}` |
//! | or (several fields) | `"$or": [{...}, {...}]` |
//!
//! Nested objects in the pattern match nested fields of the value. A field that holds an
//! array matches when one of its elements matches. Every key in a pattern must match (AND);
//! several filters are ORed. A pattern that is not of this syntax is refused with an error
//! naming the filter, as the event source refuses it when the mapping is created.

use serde_json::{Map, Value};

/// The most filters the event source accepts per mapping (its default quota).
pub const MAX_FILTERS: usize = 5;
/// The longest pattern the event source accepts: 4,096 characters.
pub const MAX_PATTERN_CHARS: usize = 4096;

/// The filters of a mapping: a record is delivered if it matches any of them.
#[derive(Debug, Clone, Default)]
pub struct FilterCriteria {
    filters: Vec<Pattern>,
}

/// One filter's pattern, parsed.
#[derive(Debug, Clone)]
struct Pattern {
    /// The pattern's text, to name it in logs.
    text: String,
    /// What the `value` key must match.
    value: Node,
}

/// A pattern over a JSON value.
#[derive(Debug, Clone)]
enum Node {
    /// An object pattern: every key must match (AND), and every `$or` branch list must have
    /// one matching branch.
    Object {
        fields: Vec<(String, Node)>,
        ors: Vec<Vec<Node>>,
    },
    /// A list of rules on a leaf: one must match (OR).
    Rules(Vec<Rule>),
}

#[derive(Debug, Clone)]
enum Rule {
    /// Equal to this string, number or null.
    Equals(Value),
    EqualsIgnoreCase(String),
    Prefix(String),
    Suffix(String),
    /// Not equal to any of these (strings or numbers).
    AnythingBut(Vec<Value>),
    /// Every comparison holds.
    Numeric(Vec<(Cmp, f64)>),
    Exists(bool),
}

#[derive(Debug, Clone, Copy)]
enum Cmp {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl FilterCriteria {
    /// Parses the filters' patterns (each the JSON text of one `Filters[].Pattern`); an
    /// error names the filter and what is wrong with it.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self, String> {
        if patterns.len() > MAX_FILTERS {
            return Err(format!(
                "--filter: {} filters, the event source accepts at most {MAX_FILTERS}",
                patterns.len()
            ));
        }
        let filters = patterns
            .iter()
            .enumerate()
            .map(|(i, text)| {
                Pattern::parse(text.as_ref())
                    .map_err(|why| format!("--filter #{} {:?}: {why}", i + 1, text.as_ref()))
            })
            .collect::<Result<_, _>>()?;
        Ok(FilterCriteria { filters })
    }

    /// Whether there is no filter (every record is delivered).
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Whether a record with this value (`None`: a tombstone) is delivered.
    pub fn matches(&self, value: Option<&[u8]>) -> bool {
        if self.filters.is_empty() {
            return true;
        }
        let value = match value {
            None => Some(Value::Null),
            Some(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => Some(
                    serde_json::from_str::<Value>(text)
                        .unwrap_or_else(|_| Value::String(text.to_owned())),
                ),
                Err(_) => None,
            },
        };
        self.filters.iter().any(|f| f.value.matches(value.as_ref()))
    }

    /// The patterns' texts.
    pub fn patterns(&self) -> impl Iterator<Item = &str> {
        self.filters.iter().map(|f| f.text.as_str())
    }
}

impl Pattern {
    fn parse(text: &str) -> Result<Self, String> {
        if text.chars().count() > MAX_PATTERN_CHARS {
            return Err(format!("longer than {MAX_PATTERN_CHARS} characters"));
        }
        let json: Value =
            serde_json::from_str(text).map_err(|e| format!("not a JSON pattern: {e}"))?;
        let Value::Object(top) = json else {
            return Err("a pattern is a JSON object".into());
        };
        if let Some(other) = top.keys().find(|k| k.as_str() != "value") {
            return Err(format!(
                "key {other:?}: Kafka event sources filter on \"value\" only"
            ));
        }
        let value = top
            .get("value")
            .ok_or("the pattern names no \"value\" (Kafka event sources filter on it)")?;
        Ok(Pattern {
            text: text.to_owned(),
            value: Node::parse(value, "value")?,
        })
    }
}

impl Node {
    fn parse(json: &Value, path: &str) -> Result<Node, String> {
        match json {
            Value::Object(map) => Node::object(map, path),
            Value::Array(rules) => {
                if rules.is_empty() {
                    return Err(format!("{path}: an empty rule list matches nothing"));
                }
                rules
                    .iter()
                    .map(|r| Rule::parse(r, path))
                    .collect::<Result<_, _>>()
                    .map(Node::Rules)
            }
            _ => Err(format!(
                "{path}: expected an object or a list of rules, found {json}"
            )),
        }
    }

    fn object(map: &Map<String, Value>, path: &str) -> Result<Node, String> {
        let mut fields = Vec::new();
        let mut ors = Vec::new();
        for (key, sub) in map {
            let here = format!("{path}.{key}");
            if key == "$or" {
                let Value::Array(branches) = sub else {
                    return Err(format!("{here}: expected a list of patterns"));
                };
                if branches.len() < 2 {
                    return Err(format!("{here}: needs at least two patterns"));
                }
                let branches = branches
                    .iter()
                    .map(|b| match b {
                        Value::Object(m) => Node::object(m, &here),
                        _ => Err(format!("{here}: each branch is an object pattern")),
                    })
                    .collect::<Result<_, _>>()?;
                ors.push(branches);
            } else {
                fields.push((key.clone(), Node::parse(sub, &here)?));
            }
        }
        if fields.is_empty() && ors.is_empty() {
            return Err(format!("{path}: an empty pattern object"));
        }
        Ok(Node::Object { fields, ors })
    }

    /// Whether `value` (`None`: absent) matches.
    fn matches(&self, value: Option<&Value>) -> bool {
        match self {
            Node::Rules(rules) => rules.iter().any(|r| r.matches(value)),
            Node::Object { fields, ors } => {
                // A field holding an array of objects matches if one element matches.
                if let Some(Value::Array(items)) = value {
                    return items.iter().any(|item| self.matches(Some(item)));
                }
                let object = value.and_then(Value::as_object);
                fields.iter().all(|(key, node)| {
                    let field = object.and_then(|o| o.get(key));
                    node.matches(field)
                }) && ors
                    .iter()
                    .all(|branches| branches.iter().any(|b| b.matches(value)))
            }
        }
    }
}

impl Rule {
    fn parse(json: &Value, path: &str) -> Result<Rule, String> {
        match json {
            Value::String(_) | Value::Number(_) | Value::Null => Ok(Rule::Equals(json.clone())),
            Value::Bool(_) => Err(format!(
                "{path}: a boolean is not a rule (match true/false with a nested field, or use exists)"
            )),
            Value::Array(_) => Err(format!("{path}: a rule cannot be a list")),
            Value::Object(map) => {
                let mut entries = map.iter();
                let (Some((op, arg)), None) = (entries.next(), entries.next()) else {
                    return Err(format!("{path}: a rule object has exactly one operator"));
                };
                let text = |arg: &Value| {
                    arg.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("{path}: {op:?} takes a string, found {arg}"))
                };
                match op.as_str() {
                    "equals-ignore-case" => Ok(Rule::EqualsIgnoreCase(text(arg)?)),
                    "prefix" => Ok(Rule::Prefix(text(arg)?)),
                    "suffix" => Ok(Rule::Suffix(text(arg)?)),
                    "exists" => arg.as_bool().map(Rule::Exists).ok_or_else(|| {
                        format!("{path}: \"exists\" takes true or false, found {arg}")
                    }),
                    "anything-but" => {
                        let values = match arg {
                            Value::Array(values) => values.clone(),
                            other => vec![other.clone()],
                        };
                        if values.is_empty()
                            || values.iter().any(|v| !(v.is_string() || v.is_number()))
                        {
                            return Err(format!(
                                "{path}: \"anything-but\" takes a string, a number or a list of them"
                            ));
                        }
                        Ok(Rule::AnythingBut(values))
                    }
                    "numeric" => Rule::numeric(arg, path),
                    other => Err(format!(
                        "{path}: unknown operator {other:?} (equals-ignore-case, prefix, suffix, anything-but, numeric, exists)"
                    )),
                }
            }
        }
    }

    fn numeric(arg: &Value, path: &str) -> Result<Rule, String> {
        let bad = || {
            format!(
                "{path}: \"numeric\" takes [op, number] or [op, number, op, number], found {arg}"
            )
        };
        let Value::Array(items) = arg else {
            return Err(bad());
        };
        if items.is_empty() || items.len() % 2 != 0 || items.len() > 4 {
            return Err(bad());
        }
        let mut comparisons = Vec::new();
        for pair in items.chunks(2) {
            let cmp = match pair[0].as_str() {
                Some("=") => Cmp::Eq,
                Some("<") => Cmp::Lt,
                Some("<=") => Cmp::Le,
                Some(">") => Cmp::Gt,
                Some(">=") => Cmp::Ge,
                _ => return Err(bad()),
            };
            let n = pair[1].as_f64().ok_or_else(bad)?;
            comparisons.push((cmp, n));
        }
        if comparisons.len() == 2 && comparisons.iter().any(|(c, _)| matches!(c, Cmp::Eq)) {
            return Err(format!("{path}: \"=\" cannot be part of a range"));
        }
        Ok(Rule::Numeric(comparisons))
    }

    /// Whether `value` (`None`: absent) satisfies the rule. On an array, any element.
    fn matches(&self, value: Option<&Value>) -> bool {
        if let Rule::Exists(want) = self {
            return value.is_some() == *want;
        }
        match value {
            None => false,
            Some(Value::Array(items)) => items.iter().any(|v| self.matches_leaf(v)),
            Some(v) => self.matches_leaf(v),
        }
    }

    fn matches_leaf(&self, value: &Value) -> bool {
        match self {
            Rule::Equals(want) => same(want, value),
            Rule::EqualsIgnoreCase(want) => value
                .as_str()
                .is_some_and(|s| s.to_lowercase() == want.to_lowercase()),
            Rule::Prefix(p) => value.as_str().is_some_and(|s| s.starts_with(p.as_str())),
            Rule::Suffix(p) => value.as_str().is_some_and(|s| s.ends_with(p.as_str())),
            Rule::AnythingBut(values) => {
                (value.is_string() || value.is_number()) && !values.iter().any(|v| same(v, value))
            }
            Rule::Numeric(comparisons) => value.as_f64().is_some_and(|n| {
                comparisons.iter().all(|&(cmp, bound)| match cmp {
                    Cmp::Eq => n == bound,
                    Cmp::Lt => n < bound,
                    Cmp::Le => n <= bound,
                    Cmp::Gt => n > bound,
                    Cmp::Ge => n >= bound,
                })
            }),
            // A present value exists (an absent one is decided in `matches`).
            Rule::Exists(want) => *want,
        }
    }
}

/// Equality of a pattern's value and an event's: strings exactly, numbers by value
/// (`1` equals `1.0`), null with null.
fn same(want: &Value, value: &Value) -> bool {
    match (want, value) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, value: &str) -> bool {
        FilterCriteria::parse(&[pattern])
            .expect("valid")
            .matches(Some(value.as_bytes()))
    }

    // Expected results worked out by hand from AWS's filter rule syntax (the Lambda
    // developer guide, "Filter rule syntax", and the Kafka filtering page's example).

    #[test]
    fn the_kafka_pages_example_matches_device_ids_beginning_with_ab() {
        let p = r#"{ "value" : { "device_ID" : [ { "prefix": "AB" } ] } }"#;
        let record = r#"{"device_ID": "AB1234", "session": {"start_time": "x", "duration": 162}}"#;
        assert!(m(p, record));
        assert!(!m(p, r#"{"device_ID": "CD1234"}"#));
        assert!(!m(p, r#"{"session": {"duration": 162}}"#));
    }

    #[test]
    fn each_rule_of_the_syntax() {
        let v = r#"{"name": "Alice", "city": "Seattle", "n": 100, "tag": null, "last": "",
                    "file": "a.png", "tags": ["x", "y"], "nested": {"deep": 5}}"#;
        // equals, and OR within a list
        assert!(m(r#"{"value": {"name": ["Alice"]}}"#, v));
        assert!(m(r#"{"value": {"name": ["Bob", "Alice"]}}"#, v));
        assert!(!m(r#"{"value": {"name": ["alice"]}}"#, v));
        // null and empty
        assert!(m(r#"{"value": {"tag": [null]}}"#, v));
        assert!(!m(r#"{"value": {"name": [null]}}"#, v));
        assert!(m(r#"{"value": {"last": [""]}}"#, v));
        // equals-ignore-case
        assert!(m(
            r#"{"value": {"name": [{"equals-ignore-case": "aLiCe"}]}}"#,
            v
        ));
        // prefix, suffix
        assert!(m(r#"{"value": {"city": [{"prefix": "Sea"}]}}"#, v));
        assert!(!m(r#"{"value": {"city": [{"prefix": "sea"}]}}"#, v));
        assert!(m(r#"{"value": {"file": [{"suffix": ".png"}]}}"#, v));
        // anything-but
        assert!(m(
            r#"{"value": {"city": [{"anything-but": ["Portland"]}]}}"#,
            v
        ));
        assert!(!m(
            r#"{"value": {"city": [{"anything-but": ["Seattle", "Portland"]}]}}"#,
            v
        ));
        assert!(!m(
            r#"{"value": {"city": [{"anything-but": "Seattle"}]}}"#,
            v
        ));
        // numeric: equals (100 = 100.0), ranges
        assert!(m(r#"{"value": {"n": [{"numeric": ["=", 100.0]}]}}"#, v));
        assert!(m(r#"{"value": {"n": [100]}}"#, v));
        assert!(m(
            r#"{"value": {"n": [{"numeric": [">", 10, "<=", 100]}]}}"#,
            v
        ));
        assert!(!m(
            r#"{"value": {"n": [{"numeric": [">", 10, "<", 100]}]}}"#,
            v
        ));
        assert!(!m(r#"{"value": {"name": [{"numeric": [">", 0]}]}}"#, v));
        // exists
        assert!(m(r#"{"value": {"name": [{"exists": true}]}}"#, v));
        assert!(!m(r#"{"value": {"missing": [{"exists": true}]}}"#, v));
        assert!(m(r#"{"value": {"missing": [{"exists": false}]}}"#, v));
        assert!(!m(r#"{"value": {"name": [{"exists": false}]}}"#, v));
        // a null field exists
        assert!(m(r#"{"value": {"tag": [{"exists": true}]}}"#, v));
        // arrays: one element matching is enough
        assert!(m(r#"{"value": {"tags": ["y"]}}"#, v));
        assert!(!m(r#"{"value": {"tags": ["z"]}}"#, v));
        // nested fields
        assert!(m(
            r#"{"value": {"nested": {"deep": [{"numeric": [">=", 5]}]}}}"#,
            v
        ));
        // AND across keys
        assert!(m(
            r#"{"value": {"name": ["Alice"], "city": ["Seattle"]}}"#,
            v
        ));
        assert!(!m(
            r#"{"value": {"name": ["Alice"], "city": ["Portland"]}}"#,
            v
        ));
        // $or across fields
        assert!(m(
            r#"{"value": {"$or": [{"name": ["Bob"]}, {"city": ["Seattle"]}]}}"#,
            v
        ));
        assert!(!m(
            r#"{"value": {"$or": [{"name": ["Bob"]}, {"city": ["Portland"]}]}}"#,
            v
        ));
    }

    #[test]
    fn several_filters_are_ored() {
        let f = FilterCriteria::parse(&[
            r#"{"value": {"kind": ["a"]}}"#,
            r#"{"value": {"kind": ["b"]}}"#,
        ])
        .expect("valid");
        assert!(f.matches(Some(br#"{"kind": "a"}"#)));
        assert!(f.matches(Some(br#"{"kind": "b"}"#)));
        assert!(!f.matches(Some(br#"{"kind": "c"}"#)));
    }

    #[test]
    fn plain_strings_tombstones_and_binary_values() {
        // A value that is not JSON is matched as a string.
        assert!(m(
            r#"{"value": [{"prefix": "Hello"}]}"#,
            "Hello, this is a test."
        ));
        assert!(m(
            r#"{"value": ["Hello, this is a test."]}"#,
            "Hello, this is a test."
        ));
        assert!(!m(
            r#"{"value": {"device_ID": [{"exists": true}]}}"#,
            "Hello"
        ));
        // A JSON string value is that string.
        assert!(m(r#"{"value": ["hi"]}"#, r#""hi""#));
        // A tombstone is null.
        let f = FilterCriteria::parse(&[r#"{"value": [null]}"#]).expect("valid");
        assert!(f.matches(None));
        assert!(!f.matches(Some(b"x")));
        // Bytes that are not UTF-8: no value at all.
        let absent = FilterCriteria::parse(&[r#"{"value": [{"exists": false}]}"#]).expect("valid");
        assert!(absent.matches(Some(&[0xff, 0xfe])));
        assert!(!absent.matches(Some(b"text")));
        let prefix = FilterCriteria::parse(&[r#"{"value": [{"prefix": ""}]}"#]).expect("valid");
        assert!(!prefix.matches(Some(&[0xff, 0xfe])));
    }

    #[test]
    fn no_filter_delivers_everything() {
        let f = FilterCriteria::parse::<&str>(&[]).expect("valid");
        assert!(f.is_empty());
        assert!(f.matches(Some(&[0xff])));
        assert!(f.matches(None));
    }

    #[test]
    fn patterns_outside_the_syntax_are_refused_with_the_filter_named() {
        for (pattern, why) in [
            ("not json", "not a JSON pattern"),
            (r#"{"key": {"a": ["b"]}}"#, "\"value\" only"),
            (r#"{"value": {"a": []}}"#, "empty rule list"),
            (
                r#"{"value": {"a": [{"wildcard": "x*"}]}}"#,
                "unknown operator",
            ),
            (r#"{"value": {"a": [{"numeric": [">", "x"]}]}}"#, "numeric"),
            (
                r#"{"value": {"a": [{"numeric": ["=", 1, "<", 2]}]}}"#,
                "range",
            ),
            (r#"{"value": {"a": [true]}}"#, "boolean"),
            (r#"{"value": {"a": "b"}}"#, "expected an object or a list"),
            (r#"{"value": {"$or": [{"a": ["b"]}]}}"#, "at least two"),
            (r#"{"value": {"a": [{"prefix": 1}]}}"#, "takes a string"),
            (r#"{"value": {"a": [{"exists": "yes"}]}}"#, "true or false"),
        ] {
            let err = FilterCriteria::parse(&[pattern]).expect_err("refused");
            assert!(err.contains("--filter #1"), "{err}");
            assert!(err.contains(why), "{pattern}: {err}");
        }
        let six = vec![r#"{"value": ["a"]}"#; 6];
        assert!(
            FilterCriteria::parse(&six)
                .expect_err("refused")
                .contains("at most 5")
        );
    }
}
