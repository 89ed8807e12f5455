//! Top-K: the three best players per game, by their best score.
//!
//! The topic `scores` holds one result per record: key the game, value JSON
//! `{"player": "...", "points": N}`. The topology keeps, per game, the 3 players with the
//! highest score (a player's score is their best result; ties rank by name), exactly, in
//! one state item per game, and after each batch produces the game's podium to `podiums`
//! (key the game, value a JSON list of `[player, points]`, best first).
//!
//! `top_k` is built on the general `aggregate`: the item holds at most `k` entries, each
//! batch folds its records onto it and writes it once, and a redelivered record adds
//! nothing. For the most *frequent* members instead, see `top_k_frequent`.
//!
//! ```sh
//! cargo run -p lambda-streams --example top_k   # prints each game's last podium
//! cargo test -p lambda-streams --example top_k  # the tests below
//! ```

use lambda_streams::driver::TestDriver;
use lambda_streams::serdes::{Json, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use serde::{Deserialize, Serialize};

/// The input topic: results keyed by game.
pub const INPUT: &str = "scores";
/// The output topic: each game's podium after every batch that changed it.
pub const OUTPUT: &str = "podiums";
/// The state store of the podiums.
pub const STORE: &str = "podiums";
/// How many players a podium holds.
pub const K: usize = 3;

/// One result, as the input topic holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Score {
    /// Who played.
    pub player: String,
    /// What they scored.
    pub points: i64,
}

/// A podium: `(player, best points)`, best first.
pub type Podium = Vec<(String, i64)>;

/// The topology: per game, the `K` best players.
pub fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(INPUT, Utf8, Json::<Score>::new())
        .group_by_key(Utf8)
        .top_k(
            STORE,
            K,
            |_game, score: &Score| score.player.clone(),
            |_game, score: &Score| score.points,
            Utf8,
        )
        .to_stream()
        .to(OUTPUT, Utf8, Json::<Podium>::new());
    builder.build()
}

/// A few results `(game, player, points)` in arrival order.
pub const RESULTS: [(&str, &str, i64); 9] = [
    ("chess", "ann", 5),
    ("chess", "bob", 9),
    ("go", "cy", 4),
    ("chess", "cy", 7),
    ("chess", "ann", 12),
    ("chess", "bob", 3),
    ("chess", "dee", 7),
    ("go", "ann", 4),
    ("chess", "eve", 1),
];

fn score(player: &str, points: i64) -> Score {
    Score {
        player: player.to_owned(),
        points,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let driver = TestDriver::new(topology());
    let mut scores = driver.input_topic(INPUT, Utf8, Json::<Score>::new());
    for (game, player, points) in RESULTS {
        scores.pipe_input(game, score(player, points))?;
    }
    let podiums = driver.output_topic(OUTPUT, Utf8, Json::<Podium>::new());
    for (game, podium) in podiums.read_key_values_to_map()? {
        println!("{game}\t{podium:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use lambda_streams::driver::Batching;

    use super::*;

    /// The reference, by brute force: every player's best points per game, sorted by
    /// points (highest first) then name, the first `K`.
    fn reference(results: &[(&str, &str, i64)]) -> BTreeMap<String, Podium> {
        let mut best: HashMap<&str, HashMap<&str, i64>> = HashMap::new();
        for (game, player, points) in results {
            let entry = best
                .entry(game)
                .or_default()
                .entry(player)
                .or_insert(*points);
            *entry = (*entry).max(*points);
        }
        best.into_iter()
            .map(|(game, players)| {
                let mut ranked: Podium = players
                    .into_iter()
                    .map(|(player, points)| (player.to_owned(), points))
                    .collect();
                ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                ranked.truncate(K);
                (game.to_owned(), ranked)
            })
            .collect()
    }

    fn podiums(driver: &TestDriver) -> BTreeMap<String, Podium> {
        driver
            .output_topic(OUTPUT, Utf8, Json::<Podium>::new())
            .read_key_values_to_map()
            .expect("decoded")
    }

    #[test]
    fn the_last_podium_of_each_game_is_its_top_three() {
        let expected = reference(&RESULTS);
        // By hand, too: chess bests are ann 12, bob 9, cy 7, dee 7, eve 1 (cy before dee
        // on a tie); go has cy 4 and ann 4 (ann first on the tie).
        let by_hand: BTreeMap<String, Podium> = [
            ("chess", vec![("ann", 12), ("bob", 9), ("cy", 7)]),
            ("go", vec![("ann", 4), ("cy", 4)]),
        ]
        .into_iter()
        .map(|(game, podium)| {
            let podium = podium.into_iter().map(|(p, n)| (p.to_owned(), n)).collect();
            (game.to_owned(), podium)
        })
        .collect();
        assert_eq!(expected, by_hand);

        let driver = TestDriver::new(topology());
        let mut scores = driver.input_topic(INPUT, Utf8, Json::<Score>::new());
        for (game, player, points) in RESULTS {
            scores
                .pipe_input(game, score(player, points))
                .expect("piped");
        }
        assert_eq!(podiums(&driver), expected);
    }

    #[test]
    fn batches_of_any_size_and_redeliveries_give_the_same_podiums() {
        let expected = reference(&RESULTS);
        for size in 1..=RESULTS.len() {
            let driver = TestDriver::new(topology()).with_batching(Batching::Size(size));
            let mut scores = driver.input_topic(INPUT, Utf8, Json::<Score>::new());
            for (game, player, points) in RESULTS {
                scores
                    .pipe_input(game, score(player, points))
                    .expect("piped");
                // Every batch delivered twice: the second delivery adds nothing.
                if driver.pending() == 0 {
                    driver.redeliver_last_batch().expect("redelivered");
                }
            }
            driver.flush().expect("the rest");
            driver.redeliver_last_batch().expect("redelivered");
            assert_eq!(podiums(&driver), expected, "batches of {size}");
        }
    }

    #[test]
    fn a_lower_score_does_not_replace_a_players_best() {
        let results = [("go", "ann", 10), ("go", "ann", 2), ("go", "bob", 5)];
        let driver = TestDriver::new(topology());
        let mut scores = driver.input_topic(INPUT, Utf8, Json::<Score>::new());
        for (game, player, points) in results {
            scores
                .pipe_input(game, score(player, points))
                .expect("piped");
        }
        let last = podiums(&driver);
        assert_eq!(last, reference(&results));
        assert_eq!(last["go"], [("ann".to_owned(), 10), ("bob".to_owned(), 5)]);
    }
}
