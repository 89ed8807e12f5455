//! A windowed count emitted once per window, when it closes: clicks per user and minute.
//!
//! The input topic `clicks` holds one click per record (key the user id, any value; the
//! record's timestamp is the event time). The topology counts the clicks per user in
//! 1-minute tumbling windows with 10 s of grace, in a state store (DynamoDB in Lambda,
//! memory in the test driver), and produces each window **once, with its final count**
//! ([`EmitStrategy::OnWindowClose`]) to `clicks-per-minute`, keyed `<user>@<window start>`.
//!
//! A window closes when the stream time (the highest record timestamp seen; with several
//! partitions, the lowest over them) reaches its end + grace. A click for a window that has
//! closed is late: dropped and counted in the batch report (`late_records`), never silently.
//! The count is exact under redelivery; a redelivered batch does not close a window twice.
//!
//! ```sh
//! cargo run -p lambda-streams --example windowed_count   # prints the closed windows
//! cargo test -p lambda-streams --example windowed_count  # the tests below
//! ```

use std::time::Duration;

use lambda_streams::driver::TestDriver;
use lambda_streams::dsl::{EmitStrategy, TimeWindows};
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// The input topic: clicks keyed by user.
pub const INPUT: &str = "clicks";
/// The output topic: one count per user and closed window.
pub const OUTPUT: &str = "clicks-per-minute";
/// The state store of the counts.
pub const STORE: &str = "clicks-per-minute";
/// The window size.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How long after its end a window still accepts clicks.
pub const GRACE: Duration = Duration::from_secs(10);

/// The topology: count per user and minute, emitted when the minute closes.
pub fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(INPUT, Utf8, Unit)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(WINDOW).grace(GRACE))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count(STORE)
        .to_stream()
        .map(|window, count| (format!("{}@{}", window.key, window.start), count))
        .to(OUTPUT, Utf8, DecimalI64);
    builder.build()
}

/// A few clicks `(user, timestamp ms)`, in arrival order: two minutes of clicks, one late
/// click, and a last click at 130 s that moves the stream time past the second minute's
/// close (120 s + 10 s).
pub const CLICKS: [(&str, i64); 9] = [
    ("ann", 1_000),
    ("bob", 20_000),
    ("ann", 59_999),
    ("ann", 60_000),
    ("bob", 65_000),
    ("ann", 69_000), // stream time 69 s: [0, 60 s) is still open (grace until 70 s)
    ("bob", 71_000), // stream time 71 s: [0, 60 s) closes
    ("bob", 30_000), // late: its window closed at 70 s
    ("ann", 130_000),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let driver = TestDriver::new(topology());
    let mut clicks = driver.input_topic(INPUT, Utf8, Unit);
    let mut late = 0;
    for (user, at) in CLICKS {
        clicks.pipe_input_with_timestamp(user, (), at)?;
        late += driver.last_report().map_or(0, |r| r.late_records);
    }
    for (window, count) in driver
        .output_topic(OUTPUT, Utf8, DecimalI64)
        .read_key_values()?
    {
        println!("{window}\t{count}");
    }
    println!("late clicks dropped: {late}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lambda_streams::driver::Batching;

    use super::*;

    const SIZE: i64 = 60_000;
    const GRACE_MS: i64 = 10_000;

    /// The reference, record at a time by the definition: the stream time is the highest
    /// timestamp so far (the record's own included); a click counts in `[s, s + 60 s)`,
    /// `s = t - t mod 60 s`, unless the stream time has reached `s + 70 s` (late). Returns
    /// the windows the final stream time has closed, with their counts, and the late clicks.
    fn reference(clicks: &[(&str, i64)]) -> (BTreeMap<String, i64>, u64) {
        let (mut counts, mut late, mut stream_time) = (BTreeMap::new(), 0, i64::MIN);
        for (user, at) in clicks {
            stream_time = stream_time.max(*at);
            let start = at - at.rem_euclid(SIZE);
            if start + SIZE + GRACE_MS <= stream_time {
                late += 1;
            } else {
                *counts.entry((start, user.to_string())).or_insert(0) += 1;
            }
        }
        let closed = counts
            .into_iter()
            .filter(|((start, _), _)| start + SIZE + GRACE_MS <= stream_time)
            .map(|((start, user), n)| (format!("{user}@{start}"), n))
            .collect();
        (closed, late)
    }

    fn run(driver: &TestDriver) -> (Vec<(String, i64)>, u64) {
        let mut clicks = driver.input_topic(INPUT, Utf8, Unit);
        let mut late = 0;
        for (user, at) in CLICKS {
            clicks
                .pipe_input_with_timestamp(user, (), at)
                .expect("piped");
            late += driver.last_report().map_or(0, |r| r.late_records);
        }
        let emitted = driver
            .output_topic(OUTPUT, Utf8, DecimalI64)
            .read_key_values()
            .expect("decoded");
        (emitted, late)
    }

    #[test]
    fn each_closed_window_once_with_its_final_count() {
        let (expected, expected_late) = reference(&CLICKS);
        // By hand, too: [0, 60 s) holds ann at 1 s and 59.999 s, bob at 20 s (bob's 30 s
        // click came after the close); [60 s, 120 s) holds ann at 60 s and 69 s, bob at
        // 65 s and 71 s; [120 s, 180 s) is still open at stream time 130 s.
        let by_hand: BTreeMap<String, i64> = [
            ("ann@0", 2),
            ("bob@0", 1),
            ("ann@60000", 2),
            ("bob@60000", 2),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
        assert_eq!(expected, by_hand);
        assert_eq!(expected_late, 1);

        let driver = TestDriver::new(topology());
        let (emitted, late) = run(&driver);
        let once: BTreeMap<String, i64> = emitted.iter().cloned().collect();
        assert_eq!(once.len(), emitted.len(), "each window once: {emitted:?}");
        assert_eq!(once, expected);
        assert_eq!(late, expected_late);
    }

    #[test]
    fn nothing_is_emitted_before_the_window_closes() {
        let driver = TestDriver::new(topology());
        let mut clicks = driver.input_topic(INPUT, Utf8, Unit);
        let output = driver.output_topic(OUTPUT, Utf8, DecimalI64);
        clicks
            .pipe_input_with_timestamp("ann", (), 1_000)
            .expect("piped");
        // 69.999 s: end (60 s) + grace (10 s) not reached yet.
        clicks
            .pipe_input_with_timestamp("bob", (), 69_999)
            .expect("piped");
        assert!(output.is_empty());
        clicks
            .pipe_input_with_timestamp("bob", (), 70_000)
            .expect("piped");
        assert_eq!(
            output.read_key_values().expect("decoded"),
            [("ann@0".to_owned(), 1)]
        );
    }

    #[test]
    fn a_redelivered_batch_neither_counts_nor_closes_twice() {
        // Every click in one batch, delivered twice (as the event source may after a
        // rebalance): the windows it closed are not emitted again, the counts unchanged.
        let driver = TestDriver::new(topology()).with_batching(Batching::Manual);
        let mut clicks = driver.input_topic(INPUT, Utf8, Unit);
        for (user, at) in CLICKS {
            clicks
                .pipe_input_with_timestamp(user, (), at)
                .expect("piped");
        }
        driver.flush().expect("the batch");
        let store_before = driver.store(STORE);
        driver.redeliver_last_batch().expect("redelivered");
        assert_eq!(driver.store(STORE), store_before, "the state is unchanged");

        let emitted = driver
            .output_topic(OUTPUT, Utf8, DecimalI64)
            .read_key_values()
            .expect("decoded");
        let once: BTreeMap<String, i64> = emitted.iter().cloned().collect();
        assert_eq!(once.len(), emitted.len(), "each window once: {emitted:?}");
        // Lateness is judged against the partition's stream time at each record, not at
        // the end of the batch: one batch gives the record-at-a-time reference.
        assert_eq!(once, reference(&CLICKS).0);
    }
}
