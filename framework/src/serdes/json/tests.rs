//! `Json<T>` against its reference, `serde_json::from_slice`, on generated inputs: every value
//! and every error the same.

use std::collections::BTreeMap;
use std::fmt::Debug;

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::*;
use crate::serdes::Nullable;

/// `Json<T>`'s answer and `serde_json`'s, each as text (`Debug` of the value, which tells
/// `-0.0` from `0.0` and prints every float exactly, or the error message).
fn answers<T: Serialize + DeserializeOwned + Debug + 'static>(bytes: &[u8]) -> (String, String) {
    let ours = match Json::<T>::new().deserialize(Some(bytes)) {
        Ok(value) => format!("Ok({value:?})"),
        Err(e) => format!("Err({})", e.0),
    };
    let reference = match serde_json::from_slice::<T>(bytes) {
        Ok(value) => format!("Ok({value:?})"),
        Err(e) => format!("Err(invalid JSON: {e})"),
    };
    (ours, reference)
}

/// `sonic-rs` alone, as text (for the tests that show a difference the guard must catch).
fn sonic_alone<T: DeserializeOwned + Debug>(bytes: &[u8]) -> String {
    match sonic_rs::from_slice::<T>(bytes) {
        Ok(value) => format!("Ok({value:?})"),
        Err(_) => "Err".to_owned(),
    }
}

/// The goal's struct of six fields (issue 16 goal 4).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Six {
    user_id: String,
    url: String,
    referrer: Option<String>,
    duration_ms: u32,
    scroll_depth: f64,
    ts: i64,
}

/// A struct that skips every field but one (the skipped values are `sonic-rs`'s skip path).
#[derive(Debug, Serialize, Deserialize)]
struct OnlyA {
    a: u8,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Strict {
    a: i64,
    b: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Tagged {
    A { x: u64 },
    B { y: f64, s: String },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Untagged {
    U(u64),
    I(i64),
    F(f64),
    S(String),
    L(Vec<Untagged>),
    B(bool),
}

#[derive(Debug, Serialize, Deserialize)]
enum External {
    Unit,
    New(i32),
    Tup(u8, String),
    Rec { k: char },
}

#[derive(Debug, Serialize, Deserialize)]
struct Flat {
    a: u8,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Raw {
    a: u8,
    r: Box<serde_json::value::RawValue>,
}

/// Every target type of the comparison: what users write (structs, options, enums in each
/// representation, maps, `serde_json::Value`, flatten, raw values, numbers of each width).
fn differences(bytes: &[u8]) -> Vec<(&'static str, String, String)> {
    macro_rules! each {
        ($($t:ty),* $(,)?) => {
            vec![$({
                let (ours, reference) = answers::<$t>(bytes);
                (stringify!($t), ours, reference)
            }),*]
        };
    }
    let all = each!(
        Six,
        OnlyA,
        Strict,
        Tagged,
        Untagged,
        External,
        Vec<External>,
        Flat,
        Raw,
        serde_json::Value,
        BTreeMap<String, i64>,
        Vec<f64>,
        Vec<f32>,
        Vec<i128>,
        Vec<u8>,
        Option<Vec<u64>>,
        (i8, String, bool, ()),
        String,
        char,
        f64,
        f32,
        u64,
        i64,
    );
    all.into_iter()
        .filter(|(_, ours, reference)| ours != reference)
        .collect()
}

/// Pieces of JSON at the edges: numbers at the limits of each type and of `f64`, negative
/// zeros, escapes (valid, invalid, surrogates), invalid literals and structure.
const ATOMS: &[&str] = &[
    "0",
    "-0",
    "-0.0",
    "-0e3",
    "-0.000E-2",
    "-0.5",
    "1",
    "-1",
    "01",
    "-01",
    "1.",
    "1.5",
    "-1.5e-3",
    "1e400",
    "-1e400",
    "1e-400",
    "-1e-400",
    "2.5e-324",
    "4.9e-324",
    "2.2250738585072011e-308",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "170141183460469231731687303715884105728",
    "255",
    "256",
    "-129",
    "1.0",
    "1e2",
    "0.1",
    "4.15107455505193131",
    "46712e112",
    "1.000000178813934326171874",
    "3.4028235e38",
    "3.4028236e38",
    "1e39",
    "NaN",
    "Infinity",
    "-",
    "+1",
    ".5",
    "1e",
    "true",
    "false",
    "null",
    "tru",
    "nul",
    "\"\"",
    "\"a\"",
    "\"\\u00e9\"",
    "\"\\ud83d\\ude00\"",
    "\"\\ud83d\"",
    "\"\\ude00\"",
    "\"\\u12\"",
    "\"\\u00eo\"",
    "\"\\uZZZZ\"",
    "\"\\\\u00eo\"",
    "\"\\x\"",
    "\"\\/\"",
    "\"\\\"\"",
    "\"\t\"",
    "\"\u{7f}\"",
    "\"é\"",
    "\"😀\"",
    "\"ab\"",
    "\"A\"",
    "\"Unit\"",
    "\"New\"",
    "\"B\"",
    "\"2025-01-05 -0\"",
    "[]",
    "{}",
    "[1,]",
    "{\"a\":1,}",
    "[,1]",
    "[1 2]",
    "{\"a\" 1}",
    "{1:2}",
];

/// Field names of the target types, some escaped.
const KEYS: &[&str] = &[
    "userId",
    "url",
    "referrer",
    "durationMs",
    "scrollDepth",
    "ts",
    "a",
    "b",
    "r",
    "k",
    "x",
    "y",
    "s",
    "type",
    "extra",
    "user\\u0049d",
    "Unit",
    "New",
    "Tup",
    "Rec",
];

/// A generated document: nested arrays and objects of [`ATOMS`] under [`KEYS`] (duplicates
/// included), JSON whitespace at random.
fn document() -> impl Strategy<Value = String> {
    let atom = proptest::sample::select(ATOMS).prop_map(str::to_owned);
    atom.prop_recursive(4, 32, 6, |inner| {
        let space = proptest::sample::select(&["", "", " ", "\n\t", "\r\n "][..]);
        prop_oneof![
            proptest::collection::vec((inner.clone(), space.clone()), 0..5).prop_map(|items| {
                let items: Vec<_> = items.into_iter().map(|(v, s)| format!("{s}{v}")).collect();
                format!("[{}]", items.join(","))
            }),
            proptest::collection::vec((proptest::sample::select(KEYS), inner, space), 0..7)
                .prop_map(|fields| {
                    let fields: Vec<_> = fields
                        .into_iter()
                        .map(|(k, v, s)| format!("\"{k}\"{s}:{s}{v}"))
                        .collect();
                    format!("{{{}}}", fields.join(","))
                }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// On generated documents, and on each with one byte replaced and a tail cut (trailing
    /// garbage, truncation, invalid UTF-8), `Json<T>` answers as `serde_json` does for every
    /// target type.
    #[test]
    fn generated_documents_read_as_serde_json_reads(
        doc in document(),
        flip in proptest::option::of((any::<proptest::sample::Index>(), any::<u8>())),
        cut in 0usize..3,
        garbage in proptest::sample::select(&["", "", "", " ", "x", " 1", "}", "\u{c}"][..]),
    ) {
        let mut bytes = format!("{doc}{garbage}").into_bytes();
        if let Some((at, byte)) = flip {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        bytes.truncate(bytes.len() - cut.min(bytes.len()));
        let differ = differences(&bytes);
        prop_assert!(differ.is_empty(), "{:?}: {differ:?}", String::from_utf8_lossy(&bytes));
    }
}

/// Every atom alone, in an array, and in a skipped field at depths 1 to 3.
#[test]
fn atoms_read_as_serde_json_reads() {
    for atom in ATOMS {
        for doc in [
            atom.to_string(),
            format!("[{atom}]"),
            format!("{{\"extra\":{atom},\"a\":1}}"),
            format!("{{\"extra\":[1,{{\"k\":[{atom}]}}],\"a\":1}}"),
            format!(
                "{{\"userId\":\"u\",\"extra\":{atom},\"url\":\"/\",\"referrer\":null,\"durationMs\":1,\"scrollDepth\":0.5,\"ts\":1}}"
            ),
        ] {
            let differ = differences(doc.as_bytes());
            assert!(differ.is_empty(), "{doc}: {differ:?}");
        }
    }
}

/// The differences between `sonic-rs` alone and `serde_json` that the guard exists for: each
/// is real (so the assertion that `Json` agrees with `serde_json` could fail), and `Json`
/// answers as `serde_json` does.
#[test]
fn each_known_difference_of_sonic_rs_is_read_by_serde_json() {
    let deep = |n: usize| format!("{{\"a\":1,\"extra\":{}{}}}", "[".repeat(n), "]".repeat(n));
    let cases: Vec<(String, Three)> = vec![
        ("-0".into(), |b| three::<f64>(b)),
        ("[1,-0.0]".into(), |b| three::<Vec<f64>>(b)),
        ("{\"x\": -0e5}".into(), |b| three::<serde_json::Value>(b)),
        ("[-0.000E-2]".into(), |b| three::<Untagged>(b)),
        (deep(130), |b| three::<serde_json::Value>(b)),
        (deep(128), |b| three::<Flat>(b)),
        ("{\"extra\":\"\\u00eo\",\"a\":1}".into(), |b| {
            three::<OnlyA>(b)
        }),
        ("{\"extra\":[{\"k\":\"\\uZZZZ\"}],\"a\":1}".into(), |b| {
            three::<OnlyA>(b)
        }),
    ];
    for (doc, check) in cases {
        let (ours, reference, sonic) = check(doc.as_bytes());
        assert_ne!(
            sonic, reference,
            "{doc}: sonic-rs alone agrees now; update the module docs"
        );
        assert_eq!(ours, reference, "{doc}");
    }
    // And what stays with sonic-rs: no false alarm on a UUID, a date, a negative non-zero,
    // an escaped backslash before a `u`.
    for doc in [
        r#"{"id":"0f3c-0a1b-00","day":"2025-01-05","x":-0.25,"y":-0.0001e-3,"z":1}"#,
        r#"["\u00e9\\u"]"#,
    ] {
        assert!(sonic_rs_reads_as_serde_json(doc.as_bytes()), "{doc}");
    }
    assert!(!sonic_rs_reads_as_serde_json(b"[-0]"));
}

/// A reader of [`three`] answers for one target type.
type Three = fn(&[u8]) -> (String, String, String);

/// `Json<T>`'s, `serde_json`'s and `sonic-rs`'s answers.
fn three<T: Serialize + DeserializeOwned + Debug + 'static>(
    bytes: &[u8],
) -> (String, String, String) {
    let (ours, reference) = answers::<T>(bytes);
    (ours, reference, sonic_alone::<T>(bytes))
}

/// A deterministic generator (proptest's ChaCha, fixed seed) for the number and scan tests.
struct Gen(proptest::test_runner::TestRng);

impl Gen {
    fn new() -> Self {
        Gen(proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }
}

/// A random JSON number: up to 40 digits (some up to 800), a point anywhere, an exponent
/// from -360 to 360 (subnormals, overflow), a sign.
fn number(g: &mut Gen) -> String {
    let mut text = String::new();
    if g.below(2) == 0 {
        text.push('-');
    }
    let digits = if g.below(20) == 0 {
        1 + g.below(800)
    } else {
        1 + g.below(40)
    };
    let point = g.below(digits + 1);
    for i in 0..digits {
        let digit = if i == 0 && digits > 1 {
            1 + g.below(9)
        } else {
            g.below(10)
        };
        text.push(char::from(b'0' + digit as u8));
        if i + 1 == point && i + 1 < digits {
            text.push('.');
        }
    }
    if g.below(2) == 0 {
        text.push_str(&format!("e{}", g.below(721) as i64 - 360));
    }
    text
}

/// Numbers: `Json<f64>`, `Json<f32>` and `Json<Value>` give `serde_json`'s value, bit for bit,
/// and `serde_json` (with `float_roundtrip`) gives the correctly rounded `f64`, as Rust's own
/// `str::parse` does (the independent reference). 20,000 random numbers, plus the `f32`
/// halfway points where reading through `f64` rounds twice.
#[test]
fn numbers_read_as_serde_json_reads_correctly_rounded() {
    let mut g = Gen::new();
    let mut texts: Vec<String> = (0..20_000).map(|_| number(&mut g)).collect();
    // Just below and above the midpoint between 1 + 2^-23 and 1 + 2^-22.
    texts.push("1.000000178813934326171874".into());
    texts.push("1.000000178813934326171876".into());
    for text in &texts {
        for differ in [
            answers::<f64>(text.as_bytes()),
            answers::<f32>(text.as_bytes()),
            answers::<serde_json::Value>(text.as_bytes()),
        ] {
            assert_eq!(differ.0, differ.1, "{text}");
        }
        if let (Ok(ours), Ok(std)) = (serde_json::from_str::<f64>(text), text.parse::<f64>()) {
            assert_eq!(
                ours.to_bits(),
                std.to_bits(),
                "{text}: serde_json is not correctly rounded"
            );
        }
    }
}

/// The one-pass [`scan`] counts and flags exactly what a naive look finds, at every length
/// up to three blocks (the vector body, the zero-padded tail, the pair across a block's end).
#[test]
fn scan_finds_what_a_naive_look_finds() {
    let mut g = Gen::new();
    let alphabet = b"[{\\-0a\" ";
    for len in 0..3 * LANES + 2 {
        for _ in 0..50 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[g.below(alphabet.len() as u64) as usize])
                .collect();
            let naive = Scan {
                opens: bytes.iter().filter(|&&b| b == b'[' || b == b'{').count(),
                backslash: bytes.contains(&b'\\'),
                minus_zero: bytes.windows(2).any(|w| w == b"-0"),
            };
            assert_eq!(scan(&bytes), naive, "{:?}", String::from_utf8_lossy(&bytes));
        }
    }
}

#[test]
fn nesting_counts_brackets_outside_strings() {
    assert!(nesting_reaches(b"[[[]]]", 3));
    assert!(!nesting_reaches(b"[[],[]]", 3));
    assert!(!nesting_reaches(br#"["[[[", "\"[[["]"#, 2));
    assert!(nesting_reaches(br#"[{"a\\":[]}]"#, 3));
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Order {
    id: u32,
    items: Vec<String>,
    note: Option<String>,
}

#[test]
fn json_round_trips_and_reports_bad_input() {
    let serde = Json::<Order>::new();
    let order = Order {
        id: 3,
        items: vec!["tea".into()],
        note: None,
    };
    let bytes = br#"{"id":3,"items":["tea"],"note":null}"#;
    assert_eq!(serde.serialize(&order), Some(bytes.to_vec()));
    assert_eq!(serde.deserialize(Some(bytes)).unwrap(), order);
    let err = serde.deserialize(Some(b"{\"id\":")).unwrap_err();
    assert_eq!(
        err.0,
        "invalid JSON: EOF while parsing a value at line 1 column 6"
    );
    let err = serde
        .deserialize(Some(br#"{"id":"x","items":[]}"#))
        .unwrap_err();
    assert!(
        err.0
            .starts_with("invalid JSON: invalid type: string \"x\", expected u32")
    );
    assert!(serde.deserialize(None).unwrap_err().0.contains("null"));
    assert_eq!(
        Nullable(Json::<Order>::new()).deserialize(None).unwrap(),
        None
    );
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct View {
    user_id: String,
    url: String,
    referrer: Option<String>,
    duration_ms: u32,
    scroll_depth: f32,
    ts: i64,
    tags: Vec<String>,
}

proptest! {
    /// `Json` gives what serde_json alone gives, on valid values and on every corruption of
    /// one: the same value, or the same error.
    #[test]
    fn json_reads_what_serde_json_reads(
        user in "\\PC{0,12}",
        url in "[a-z/\"\\\\\u{0}-\u{1f}é😀]{0,16}",
        referrer in proptest::option::of("[a-z]{0,4}"),
        duration_ms in any::<u32>(),
        scroll_depth in any::<f32>().prop_filter("finite", |f| f.is_finite()),
        ts in any::<i64>(),
        tags in proptest::collection::vec("[a-z]{0,3}", 0..3),
        cut in 0usize..200,
        flip in proptest::option::of((0usize..200, any::<u8>())),
    ) {
        let view = View { user_id: user, url, referrer, duration_ms, scroll_depth, ts, tags };
        let mut bytes = serde_json::to_vec(&view).unwrap();
        let reference = |b: &[u8]| {
            serde_json::from_slice::<View>(b).map_err(|e| format!("invalid JSON: {e}"))
        };
        let ours = |b: &[u8]| Json::<View>::new().deserialize(Some(b)).map_err(|e| e.0);
        prop_assert_eq!(ours(&bytes), reference(&bytes));
        prop_assert_eq!(ours(&bytes).unwrap(), view);
        if let Some((at, byte)) = flip {
            let at = at % bytes.len();
            bytes[at] = byte;
        }
        bytes.truncate(bytes.len().saturating_sub(cut % 4 * (cut % 3)));
        prop_assert_eq!(ours(&bytes), reference(&bytes));
    }
}

/// [`View`] read as a borrowed view: `&str` (refuses escaped text) and `Cow<str>` (borrows
/// plain text, owns escaped text) fields.
#[derive(Debug, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ViewRef<'a> {
    user_id: &'a str,
    #[serde(borrow)]
    url: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    referrer: Option<std::borrow::Cow<'a, str>>,
    duration_ms: u32,
    scroll_depth: f32,
    ts: i64,
    #[serde(borrow)]
    tags: Vec<std::borrow::Cow<'a, str>>,
}

/// `from_slice` into a borrowed type, and `serde_json`'s own answer, as text.
fn borrowed_answers(bytes: &[u8]) -> (Result<String, String>, Result<String, String>) {
    let ours = from_slice::<ViewRef<'_>>(bytes)
        .map(|v| format!("{v:?}"))
        .map_err(|e| e.0);
    let reference = serde_json::from_slice::<ViewRef<'_>>(bytes)
        .map(|v| format!("{v:?}"))
        .map_err(|e| format!("invalid JSON: {e}"));
    (ours, reference)
}

proptest! {
    /// `from_slice` into a type that borrows gives what `serde_json` alone gives, on valid
    /// values (escaped text among them) and on every corruption of one; where nothing is
    /// escaped, the value is the owned one's, field for field.
    #[test]
    fn from_slice_borrows_what_serde_json_borrows(
        user in "[a-z\"\\\\é]{0,12}",
        url in "[a-z/\"\\\\\u{0}-\u{1f}é😀]{0,16}",
        referrer in proptest::option::of("[a-z]{0,4}"),
        duration_ms in any::<u32>(),
        scroll_depth in any::<f32>().prop_filter("finite", |f| f.is_finite()),
        ts in any::<i64>(),
        tags in proptest::collection::vec("[a-z\n]{0,3}", 0..3),
        cut in 0usize..200,
        flip in proptest::option::of((0usize..200, any::<u8>())),
    ) {
        let view = View { user_id: user, url, referrer, duration_ms, scroll_depth, ts, tags };
        let mut bytes = serde_json::to_vec(&view).unwrap();
        let (ours, reference) = borrowed_answers(&bytes);
        prop_assert_eq!(&ours, &reference);
        if !view.user_id.contains(['"', '\\']) {
            let read = from_slice::<ViewRef<'_>>(&bytes).unwrap();
            prop_assert_eq!(read.user_id, view.user_id.as_str());
            prop_assert_eq!(read.url.as_ref(), view.url.as_str());
            prop_assert_eq!(read.referrer.as_deref(), view.referrer.as_deref());
            prop_assert_eq!(
                (read.duration_ms, read.scroll_depth, read.ts),
                (view.duration_ms, view.scroll_depth, view.ts)
            );
            let tags: Vec<&str> = read.tags.iter().map(AsRef::as_ref).collect();
            prop_assert_eq!(tags, view.tags.iter().map(String::as_str).collect::<Vec<_>>());
        }
        if let Some((at, byte)) = flip {
            let at = at % bytes.len();
            bytes[at] = byte;
        }
        bytes.truncate(bytes.len().saturating_sub(cut % 4 * (cut % 3)));
        let (ours, reference) = borrowed_answers(&bytes);
        prop_assert_eq!(ours, reference);
    }
}

/// A `ReadWith` over `from_slice`: the function's value, its error, a null refused by name,
/// and values written by the write serde.
#[test]
fn read_with_reads_by_its_function_and_writes_by_its_serde() {
    use crate::serdes::{ReadWith, Utf8};
    let urls = ReadWith::new(
        |bytes: &[u8]| {
            let view: ViewRef<'_> = from_slice(bytes)?;
            Ok((view.duration_ms >= 30_000).then(|| view.url.into_owned()))
        },
        Nullable(Utf8),
    );
    let base = r#"{"userId":"u","url":"/a\/b","referrer":null,"durationMs":30000,"scrollDepth":0.5,"ts":-1,"tags":[]}"#;
    assert_eq!(
        urls.deserialize(Some(base.as_bytes())),
        Ok(Some("/a/b".to_owned()))
    );
    let short = base.replace("30000", "29999");
    assert_eq!(urls.deserialize(Some(short.as_bytes())), Ok(None));
    let escaped_user = base.replace("\"u\"", "\"\\n\"");
    assert_eq!(
        urls.deserialize(Some(escaped_user.as_bytes()))
            .map_err(|e| e.0),
        Err(format!(
            "invalid JSON: {}",
            serde_json::from_str::<ViewRef<'_>>(&escaped_user).unwrap_err()
        ))
    );
    assert_eq!(
        urls.deserialize(None).unwrap_err().0,
        "ReadWith serde got a null (use Nullable to accept nulls)"
    );
    assert_eq!(urls.serialize(&Some("/x".to_owned())), Some(b"/x".to_vec()));
    assert_eq!(urls.try_serialize_owned(None), Ok(None));
    assert!(urls.nulls().is_none(), "a value read is never a Kafka null");
}

#[test]
fn json_reads_what_serde_json_reads_at_the_edges() {
    let ours = |b: &[u8]| Json::<View>::new().deserialize(Some(b)).map_err(|e| e.0);
    let reference =
        |b: &[u8]| serde_json::from_slice::<View>(b).map_err(|e| format!("invalid JSON: {e}"));
    let base = r#"{"userId":"u","url":"/","referrer":null,"durationMs":1,"scrollDepth":0.5,"ts":-1,"tags":[]}"#;
    for case in [
        base.to_owned(),
        base.replace("\"u\"", "\"\\ud83d\\ude00\""),
        base.replace("\"u\"", "\"\\ud83d\""),
        base.replace("0.5", "1e400"),
        base.replace("0.5", "2.5e-46"),
        base.replace(":1,", ":4294967296,"),
        base.replace("-1", "-9223372036854775809"),
        base.replace("\"ts\"", "\"ts\":1,\"ts\""),
        base.replace("{", "{\"extra\":{\"a\":[1,{}]},"),
        format!("{base} "),
        format!("{base}x"),
        format!(" \n{base}"),
        base.replace("\"u\"", "\"\u{7f}\""),
    ] {
        assert_eq!(ours(case.as_bytes()), reference(case.as_bytes()), "{case}");
    }
    let control = base.replace("\"u\"", "\"\u{1}\"").into_bytes();
    assert_eq!(ours(&control), reference(&control));
    let mut latin1 = base.as_bytes().to_vec();
    latin1[11] = 0xe9;
    assert_eq!(ours(&latin1), reference(&latin1));
}

#[test]
fn json_encoding_failure_is_an_error_not_a_null() {
    use std::collections::HashMap;
    // JSON object keys must be strings: a map keyed by a tuple cannot be encoded.
    let serde = Json::<HashMap<(u8, u8), u8>>::new();
    let value = HashMap::from([((1, 2), 3)]);
    assert_eq!(serde.serialize(&value), None);
    assert!(
        serde
            .try_serialize(&value)
            .unwrap_err()
            .0
            .starts_with("cannot encode as JSON: key must be a string")
    );
    assert_eq!(
        crate::serdes::Utf8.try_serialize(&"a".to_owned()).unwrap(),
        Some(b"a".to_vec())
    );
}
