//! Stateless filter and map: the server errors of an access log, re-keyed by path.
//!
//! The input topic `access-log` holds one request per record: key the client id, value a
//! line `<method> <path> <status>` (`GET /cart 503`). The topology keeps the requests that
//! failed on the server side (status 500 to 599), drops lines that do not parse, and sends
//! each error to `server-errors` keyed by its path, with value `<status> <client>`.
//!
//! Stateless operators need no state store and no DynamoDB table: each batch runs them
//! inline, record by record. Their output is at least once (a redelivered batch produces its
//! records again); see the crate's guarantees page.
//!
//! ```sh
//! cargo run -p lambda-streams --example filter_map   # prints the errors of a few requests
//! cargo test -p lambda-streams --example filter_map  # the tests below
//! ```

use lambda_streams::driver::TestDriver;
use lambda_streams::serdes::Utf8;
use lambda_streams::{StreamsBuilder, Topology};

/// The input topic: access-log lines keyed by client id.
pub const INPUT: &str = "access-log";
/// The output topic: server errors keyed by path.
pub const OUTPUT: &str = "server-errors";

/// A parsed access-log line: `(path, status)`, or `None` when the line is not
/// `<method> <path> <status>` with a numeric status.
fn parse(line: &str) -> Option<(String, u16)> {
    let mut fields = line.split_whitespace();
    let (_method, path, status) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    Some((path.to_owned(), status.parse().ok()?))
}

/// The topology: `filter` keeps server errors, `map` re-keys them by path.
pub fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(INPUT, Utf8, Utf8)
        .filter(|_client, line| parse(line).is_some_and(|(_, status)| (500..600).contains(&status)))
        .map(|client, line| {
            // The filter above kept only lines that parse.
            let (path, status) = parse(&line).unwrap_or_default();
            (path, format!("{status} {client}"))
        })
        .to(OUTPUT, Utf8, Utf8);
    builder.build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let driver = TestDriver::new(topology());
    let mut log = driver.input_topic(INPUT, Utf8, Utf8);
    for (client, line) in [
        ("c1", "GET /cart 200"),
        ("c2", "POST /pay 503"),
        ("c1", "GET /cart 500"),
        ("c3", "not a request line"),
        ("c2", "GET /pay 404"),
    ] {
        log.pipe_input(client, line)?;
    }
    for (path, error) in driver.output_topic(OUTPUT, Utf8, Utf8).read_key_values()? {
        println!("{path}\t{error}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests of several clients: successes, client errors, server errors at both ends of
    /// the range, and lines that do not parse.
    const REQUESTS: [(&str, &str); 10] = [
        ("c1", "GET /cart 200"),
        ("c2", "POST /pay 503"),
        ("c1", "GET /cart 500"),
        ("c3", "not a request line"),
        ("c2", "GET /pay 404"),
        ("c3", "GET /search 599"),
        ("c4", "GET /search 600"),
        ("c4", "GET /search 499"),
        ("c1", "GET /cart 5xx"),
        ("c5", "DELETE /cart/7 502 extra"),
    ];

    #[test]
    fn keeps_server_errors_keyed_by_path() {
        let driver = TestDriver::new(topology());
        let mut log = driver.input_topic(INPUT, Utf8, Utf8);
        for (client, line) in REQUESTS {
            log.pipe_input(client, line).expect("piped");
        }
        let out = driver
            .output_topic(OUTPUT, Utf8, Utf8)
            .read_key_values()
            .expect("decoded");
        // By hand, in input order: 503 and 500 and 599 are server errors; 600 is not a
        // status class 5, "5xx" is not a number, and the last line has a fourth field.
        let expected = [
            ("/pay", "503 c2"),
            ("/cart", "500 c1"),
            ("/search", "599 c3"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(out, expected);
    }

    #[test]
    fn one_batch_gives_the_same_records_in_the_same_order() {
        let driver =
            TestDriver::new(topology()).with_batching(lambda_streams::driver::Batching::Manual);
        let mut log = driver.input_topic(INPUT, Utf8, Utf8);
        for (client, line) in REQUESTS {
            log.pipe_input(client, line).expect("piped");
        }
        let report = driver.flush().expect("one batch");
        assert_eq!(report.records_in, REQUESTS.len() as u64);
        let out = driver
            .output_topic(OUTPUT, Utf8, Utf8)
            .read_key_values()
            .expect("decoded");
        let paths: Vec<&str> = out.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(paths, ["/pay", "/cart", "/search"]);
    }

    #[test]
    fn a_redelivered_batch_produces_its_records_again() {
        // Stateless output is at least once: the event source may deliver a batch twice.
        let driver = TestDriver::new(topology());
        let mut log = driver.input_topic(INPUT, Utf8, Utf8);
        log.pipe_input("c2", "POST /pay 503").expect("piped");
        driver.redeliver_last_batch().expect("redelivered");
        let out = driver
            .output_topic(OUTPUT, Utf8, Utf8)
            .read_key_values()
            .expect("decoded");
        let once = ("/pay".to_owned(), "503 c2".to_owned());
        assert_eq!(out, [once.clone(), once]);
    }
}
