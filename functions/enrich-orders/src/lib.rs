//! Orders enriched with their customer, on AWS Lambda.
//!
//! Reads customers from a compacted topic (`customers`: key = customer id, value = JSON
//! [`Customer`], a null value deletes the customer) into a table kept in DynamoDB
//! (store `customers`), and orders from `orders` (any key, value = JSON [`Order`]).
//! Each order is joined with its customer's current record (a left join: an order whose
//! customer is unknown goes out with `"customer": null` rather than being dropped) and
//! produced to `enriched-orders`, keyed by order id, as JSON [`EnrichedOrder`].
//!
//! The table lives in DynamoDB, so the orders topic need not be co-partitioned with the
//! customers topic (no repartitioning): a batch of orders reads the customers of its
//! distinct customer ids at once.
//!
//! One function reads both topics (two event source mappings on it, or one with both
//! topics). Environment: `ENRICH_CUSTOMERS_TOPIC`, `ENRICH_ORDERS_TOPIC`,
//! `ENRICH_OUTPUT_TOPIC`, plus the framework's (`LAMBDA_STREAMS_TABLE`, …; see
//! `lambda_streams::lambda`).

use lambda_streams::config_env::env_or;
use lambda_streams::serdes::{Json, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use serde::{Deserialize, Serialize};

/// The name of the state store holding the customers table.
pub const STORE: &str = "customers";

/// A customer, as the customers topic holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Customer {
    /// Display name.
    pub name: String,
    /// Loyalty tier, e.g. `gold`.
    pub tier: String,
}

/// An order, as the orders topic holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    /// The order id (the output key).
    pub order_id: String,
    /// The customer who placed it (the join key).
    pub customer_id: String,
    /// The amount, in cents.
    pub amount_cents: i64,
}

/// An order with its customer's record at the time it was processed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnrichedOrder {
    /// The order.
    #[serde(flatten)]
    pub order: Order,
    /// Its customer; `None` when the customer is not (or no longer) known.
    pub customer: Option<Customer>,
}

/// The topology: `customers` as a table, `orders` joined to it, to `output`.
pub fn topology(customers: &str, orders: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let table = builder.table(customers, Utf8, Json::<Customer>::default(), STORE);
    builder
        .stream(orders, Utf8, Json::<Order>::default())
        .select_key(|_, order: &Order| order.customer_id.clone())
        .left_join(&table, |_, order: Order, customer: Option<Customer>| {
            EnrichedOrder { order, customer }
        })
        .select_key(|_, enriched: &EnrichedOrder| enriched.order.order_id.clone())
        .to(output, Utf8, Json::<EnrichedOrder>::default());
    builder.build()
}

/// The topology with its topics from `ENRICH_CUSTOMERS_TOPIC` (default `customers`),
/// `ENRICH_ORDERS_TOPIC` (`orders`) and `ENRICH_OUTPUT_TOPIC` (`enriched-orders`).
pub fn topology_from_env() -> Topology {
    topology(
        &env_or("ENRICH_CUSTOMERS_TOPIC", "customers"),
        &env_or("ENRICH_ORDERS_TOPIC", "orders"),
        &env_or("ENRICH_OUTPUT_TOPIC", "enriched-orders"),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lambda_streams::driver::TestDriver;
    use lambda_streams::serdes::Nullable;

    fn order(id: &str, customer: &str, cents: i64) -> Order {
        Order {
            order_id: id.into(),
            customer_id: customer.into(),
            amount_cents: cents,
        }
    }

    fn customer(name: &str, tier: &str) -> Customer {
        Customer {
            name: name.into(),
            tier: tier.into(),
        }
    }

    #[test]
    fn orders_carry_their_customer_as_of_their_batch() {
        let driver = TestDriver::new(topology("customers", "orders", "enriched"));
        let mut customers =
            driver.input_topic("customers", Utf8, Nullable(Json::<Customer>::default()));
        let mut orders = driver.input_topic("orders", Utf8, Json::<Order>::default());
        customers
            .pipe_input("c1", Some(customer("Ada", "gold")))
            .unwrap();
        orders.pipe_input("o1", order("o1", "c1", 1200)).unwrap();
        orders.pipe_input("o2", order("o2", "c2", 500)).unwrap(); // unknown customer
        customers
            .pipe_input("c1", Some(customer("Ada", "platinum")))
            .unwrap();
        orders.pipe_input("o3", order("o3", "c1", 99)).unwrap();
        customers.pipe_input("c1", None).unwrap(); // deleted
        orders.pipe_input("o4", order("o4", "c1", 1)).unwrap();
        let out = driver
            .output_topic("enriched", Utf8, Json::<EnrichedOrder>::default())
            .read_key_values()
            .unwrap();
        let expected = vec![
            ("o1", order("o1", "c1", 1200), Some(customer("Ada", "gold"))),
            ("o2", order("o2", "c2", 500), None),
            (
                "o3",
                order("o3", "c1", 99),
                Some(customer("Ada", "platinum")),
            ),
            ("o4", order("o4", "c1", 1), None),
        ];
        let expected: Vec<(String, EnrichedOrder)> = expected
            .into_iter()
            .map(|(k, order, customer)| (k.to_owned(), EnrichedOrder { order, customer }))
            .collect();
        assert_eq!(out, expected);
    }

    #[test]
    fn the_output_is_flat_json() {
        let enriched = EnrichedOrder {
            order: order("o1", "c1", 5),
            customer: Some(customer("Ada", "gold")),
        };
        let json: serde_json::Value = serde_json::to_value(&enriched).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"order_id": "o1", "customer_id": "c1", "amount_cents": 5,
                               "customer": {"name": "Ada", "tier": "gold"}})
        );
    }
}
