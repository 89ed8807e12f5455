//! Enrichment: a stream joined with a table (orders with their customer's name).
//!
//! The topic `customers` is read as a table (key the customer id, value the name; a null
//! value deletes the customer), kept in a state store (DynamoDB in Lambda). The topic
//! `orders` holds orders keyed by order id, value `<customer id> <amount in cents>`. Each
//! order is re-keyed by its customer, left-joined with the customer's current name (an
//! order of an unknown customer goes on with `?`), and produced to `orders-with-names`
//! keyed by order id, value `<order id> <amount> <name>`.
//!
//! The table lives in DynamoDB, so the orders need no co-partitioning with the customers
//! (no repartition topic): a batch reads the names of its distinct customer ids at once,
//! after the batch's own writes to the table. The table is exact under redelivery; the
//! joined records are produced at least once.
//!
//! ```sh
//! cargo run -p lambda-streams --example enrichment_join   # prints the enriched orders
//! cargo test -p lambda-streams --example enrichment_join  # the tests below
//! ```

use lambda_streams::driver::TestDriver;
use lambda_streams::serdes::{Nullable, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// The table's topic: customer id → name (null: deleted).
pub const CUSTOMERS: &str = "customers";
/// The stream's topic: order id → `<customer id> <amount in cents>`.
pub const ORDERS: &str = "orders";
/// The output topic: order id → `<order id> <amount> <name>`.
pub const OUTPUT: &str = "orders-with-names";
/// The state store of the customers table.
pub const STORE: &str = "customer-names";

/// An order's customer id and amount, or `None` when the value is not
/// `<customer id> <amount>`.
fn parse_order(value: &str) -> Option<(String, i64)> {
    let (customer, amount) = value.split_once(' ')?;
    Some((customer.to_owned(), amount.trim().parse().ok()?))
}

/// The topology: `customers` as a table, `orders` re-keyed by customer and left-joined.
pub fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let names = builder.table(CUSTOMERS, Utf8, Utf8, STORE);
    builder
        .stream(ORDERS, Utf8, Utf8)
        .filter(|_, value| parse_order(value).is_some())
        // Keep the order id in the value: the join is keyed by customer.
        .map(|order_id, value| {
            let (customer, amount) = parse_order(&value).unwrap_or_default();
            (customer, format!("{order_id} {amount}"))
        })
        .left_join(&names, |_customer, order: String, name: Option<String>| {
            format!("{order} {}", name.as_deref().unwrap_or("?"))
        })
        .select_key(|_customer, enriched: &String| {
            enriched.split(' ').next().unwrap_or_default().to_owned()
        })
        .to(OUTPUT, Utf8, Utf8);
    builder.build()
}

/// One input record: a customer update (`None` deletes) or an order.
#[derive(Debug, Clone, Copy)]
pub enum Input {
    /// A record of the customers topic.
    Customer(&'static str, Option<&'static str>),
    /// A record of the orders topic: order id, value.
    Order(&'static str, &'static str),
}

/// A few records in arrival order.
pub const INPUTS: [Input; 8] = [
    Input::Customer("c1", Some("Ada")),
    Input::Order("o1", "c1 1200"),
    Input::Order("o2", "c2 500"), // no customer c2 yet
    Input::Customer("c2", Some("Grace")),
    Input::Customer("c1", Some("Ada Lovelace")),
    Input::Order("o3", "c1 99"),
    Input::Customer("c1", None), // c1 deleted
    Input::Order("o4", "c1 1"),
];

/// Pipes `inputs` into the driver, each record a batch of its own (the driver's default).
fn pipe(driver: &TestDriver, inputs: &[Input]) -> Result<(), lambda_streams::StreamError> {
    let mut customers = driver.input_topic(CUSTOMERS, Utf8, Nullable(Utf8));
    let mut orders = driver.input_topic(ORDERS, Utf8, Utf8);
    for input in inputs {
        match *input {
            Input::Customer(id, name) => customers.pipe_input(id, name.map(str::to_owned))?,
            Input::Order(id, value) => orders.pipe_input(id, value)?,
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let driver = TestDriver::new(topology());
    pipe(&driver, &INPUTS)?;
    for (order_id, enriched) in driver.output_topic(OUTPUT, Utf8, Utf8).read_key_values()? {
        println!("{order_id}\t{enriched}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The reference, record at a time: a map of the customers' latest names (a null
    /// deletes), and each well-formed order joined with the map as it is at the order.
    fn reference(inputs: &[Input]) -> Vec<(String, String)> {
        let mut names: HashMap<&str, &str> = HashMap::new();
        let mut out = Vec::new();
        for input in inputs {
            match *input {
                Input::Customer(id, Some(name)) => {
                    names.insert(id, name);
                }
                Input::Customer(id, None) => {
                    names.remove(id);
                }
                Input::Order(id, value) => {
                    let mut fields = value.split(' ');
                    let (Some(customer), Some(amount)) = (fields.next(), fields.next()) else {
                        continue;
                    };
                    let Ok(amount) = amount.parse::<i64>() else {
                        continue;
                    };
                    let name = names.get(customer).copied().unwrap_or("?");
                    out.push((id.to_owned(), format!("{id} {amount} {name}")));
                }
            }
        }
        out
    }

    #[test]
    fn each_order_carries_its_customer_as_of_the_order() {
        let driver = TestDriver::new(topology());
        pipe(&driver, &INPUTS).expect("piped");
        let out = driver
            .output_topic(OUTPUT, Utf8, Utf8)
            .read_key_values()
            .expect("decoded");
        let expected = reference(&INPUTS);
        // By hand, too: o1 sees Ada, o2 nobody (c2 came later), o3 the renamed c1, o4 the
        // deleted c1.
        let by_hand = [
            ("o1", "o1 1200 Ada"),
            ("o2", "o2 500 ?"),
            ("o3", "o3 99 Ada Lovelace"),
            ("o4", "o4 1 ?"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(expected, by_hand);
        assert_eq!(out, expected);
    }

    #[test]
    fn malformed_orders_are_filtered_out() {
        let inputs = [
            Input::Customer("c1", Some("Ada")),
            Input::Order("o1", "c1"),
            Input::Order("o2", "c1 lots"),
            Input::Order("o3", "c1 7"),
        ];
        let driver = TestDriver::new(topology());
        pipe(&driver, &inputs).expect("piped");
        let out = driver
            .output_topic(OUTPUT, Utf8, Utf8)
            .read_key_values()
            .expect("decoded");
        assert_eq!(out, reference(&inputs));
        assert_eq!(out, [("o3".to_owned(), "o3 7 Ada".to_owned())]);
    }

    #[test]
    fn the_table_is_exact_under_redelivery() {
        let driver = TestDriver::new(topology());
        pipe(&driver, &INPUTS[..5]).expect("piped");
        // The last batch (c1 renamed) delivered again: the table item is unchanged.
        let before = driver.store(STORE);
        driver.redeliver_last_batch().expect("redelivered");
        assert_eq!(driver.store(STORE), before);
        // Two customers in the table, c1 written twice, c2 once: versions 2 and 1.
        let versions: Vec<u64> = before.iter().map(|(_, _, version)| *version).collect();
        assert_eq!(versions, [2, 1]);
    }
}
