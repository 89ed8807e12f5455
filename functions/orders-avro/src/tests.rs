//! The function on the test driver, with its schemas compiled in: orders encoded by hand
//! (Avro's binary encoding), totals summed by hand.

use std::sync::Arc;

use lambda_streams::driver::TestDriver;
use lambda_streams::serdes::schema::{
    Avro, OfflineSchemas, SchemaId, SchemaType, Side, Subject, WireFormat,
};
use lambda_streams::serdes::{Serde, Utf8};

use super::*;

/// An older producer's schema: no coupon.
const ORDER_V1: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
  {"name":"item","type":"string"},{"name":"qty","type":"long"}]}"#;

fn schemas() -> Arc<dyn SchemaSource> {
    Arc::new(
        OfflineSchemas::new()
            .with(
                SchemaId::Confluent(1),
                Subject::topic("in", Side::Value),
                SchemaType::Avro,
                ORDER_V1,
            )
            .with(
                SchemaId::Confluent(2),
                Subject::topic("in", Side::Value),
                SchemaType::Avro,
                ORDER_SCHEMA,
            )
            .with(
                SchemaId::Confluent(3),
                Subject::topic("out", Side::Value),
                SchemaType::Avro,
                ORDER_TOTAL_SCHEMA,
            ),
    )
}

fn zigzag(v: i64, out: &mut Vec<u8>) {
    let mut u = ((v << 1) ^ (v >> 63)) as u64;
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

/// An order in the Confluent wire format: v1 (id 1) without a coupon, v2 (id 2) with none.
fn order(id: u32, item: &str, qty: i64) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    zigzag(item.len() as i64, &mut out);
    out.extend_from_slice(item.as_bytes());
    zigzag(qty, &mut out);
    if id == 2 {
        out.push(0); // the union's null branch
    }
    out
}

#[test]
fn totals_per_item_and_minute_once_the_minute_closes() {
    let topology =
        topology("in", "out", WireFormat::Confluent, schemas()).expect("the topology builds");
    let driver = TestDriver::new(topology);
    let pipe = |item: &str, id: u32, qty: i64, ts: i64| {
        driver
            .pipe(
                "in",
                0,
                Some(item.as_bytes().to_vec()),
                Some(order(id, item, qty)),
                ts,
            )
            .expect("the order is processed");
    };
    pipe("tea", 1, 2, 1_000);
    pipe("tea", 2, 3, 20_000);
    pipe("jam", 2, 5, 30_000);
    pipe("tea", 1, 1, 65_000); // the next minute
    // Nothing closed yet: [0, 60 s) closes at 70 s.
    assert!(driver.read_output("out").is_empty());
    pipe("jam", 1, 1, 71_000);
    let reader = Avro::<OrderTotal>::new(
        ORDER_TOTAL_SCHEMA,
        schemas(),
        Subject::topic("out", Side::Value),
    )
    .expect("the reader's schema parses");
    let out: Vec<(String, OrderTotal)> = driver
        .read_output("out")
        .into_iter()
        .map(|r| {
            let key = Utf8.deserialize(r.key.as_deref()).expect("a UTF-8 key");
            let value = r.value.expect("a value");
            assert_eq!(&value[..5], &[0, 0, 0, 0, 3], "Confluent header, id 3");
            (
                key,
                reader.deserialize(Some(&value)).expect("an Avro total"),
            )
        })
        .collect();
    let total = |item: &str, orders, qty| OrderTotal {
        item: item.into(),
        window_start: 0,
        window_end: 60_000,
        orders,
        qty,
    };
    let mut out = out;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        out,
        vec![
            ("jam@0".to_owned(), total("jam", 1, 5)),
            ("tea@0".to_owned(), total("tea", 2, 5)),
        ]
    );
}

#[test]
fn an_undecodable_order_fails_naming_record_schema_id_and_subject() {
    let topology =
        topology("in", "out", WireFormat::Confluent, schemas()).expect("the topology builds");
    let driver = TestDriver::new(topology);
    let err = driver
        .pipe(
            "in",
            0,
            Some(b"tea".to_vec()),
            Some(vec![0, 0, 0, 0, 42, 2]),
            0,
        )
        .expect_err("an unknown schema id is refused");
    assert!(
        err.to_string().starts_with(
            "record in-0 offset 0: cannot deserialize the value: schema id 42 (subject in-value): not among the compiled-in schemas"
        ),
        "{err}"
    );
}
