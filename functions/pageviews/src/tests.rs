//! The pageviews topology in the test driver, against outputs computed by hand.

use lambda_streams::driver::TestDriver;
use lambda_streams::serdes::{Json, Unit, Utf8};

use super::*;

fn view(user: &str, page: &str) -> PageView {
    PageView {
        user: user.to_owned(),
        page: page.to_owned(),
    }
}

#[test]
fn windows_emit_once_when_they_close_and_late_views_are_dropped() {
    let topics = Topics::default();
    let driver = TestDriver::new(topology(&topics));
    let mut input = driver.input_topic(&topics.input, Unit, Json::<PageView>::new());
    let views = driver.output_topic(&topics.views, Utf8, Json::<PageViews>::new());
    let top = driver.output_topic(&topics.top, Utf8, Json::<TopPages>::new());
    let unique = driver.output_topic(&topics.unique, Utf8, Json::<UniqueUsers>::new());

    // Window [0, 60 s): /home 3 (ann, bob, cy), /about 1 (ann), /pricing 1 (ann).
    for (user, page, at) in [
        ("ann", "/home", 1_000),
        ("bob", "/home", 2_000),
        ("ann", "/about", 3_000),
        ("cy", "/home", 30_000),
        ("ann", "/pricing", 59_999),
        // Window [60 s, 120 s).
        ("bob", "/home", 61_000),
        ("dan", "/about", 69_999),
    ] {
        input
            .pipe_input_with_timestamp((), view(user, page), at)
            .unwrap();
    }
    // Stream time 69,999 < end 60,000 + grace 10,000: nothing has closed.
    assert!(views.is_empty() && top.is_empty() && unique.is_empty());

    // Stream time 70,000 closes [0, 60 s), and only it.
    input
        .pipe_input_with_timestamp((), view("eve", "/home"), 70_000)
        .unwrap();
    let page = |page: &str, start: i64, n: u64| {
        (
            format!("{page}@{start}"),
            PageViews {
                page: page.to_owned(),
                window_start: start,
                window_end: start + 60_000,
                views: n,
            },
        )
    };
    let mut closed = views.read_key_values().unwrap();
    closed.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        closed,
        [
            page("/about", 0, 1),
            page("/home", 0, 3),
            page("/pricing", 0, 1)
        ]
    );
    let counts = |pages: &[(&str, u64)]| -> Vec<PageCount> {
        pages
            .iter()
            .map(|(p, n)| PageCount {
                page: (*p).to_owned(),
                views: *n,
            })
            .collect()
    };
    assert_eq!(
        top.read_key_values().unwrap(),
        [(
            "0".to_owned(),
            TopPages {
                window_start: 0,
                window_end: 60_000,
                // Ties (1 view each) by page name.
                pages: counts(&[("/home", 3), ("/about", 1), ("/pricing", 1)]),
            }
        )]
    );
    assert_eq!(
        unique.read_key_values().unwrap(),
        [(
            "0".to_owned(),
            UniqueUsers {
                window_start: 0,
                window_end: 60_000,
                users: 3,
            }
        )]
    );

    // A view for the closed window: late, dropped, counted (once per store).
    input
        .pipe_input_with_timestamp((), view("zed", "/home"), 50_000)
        .unwrap();
    assert_eq!(driver.last_report().unwrap().late_records, 3);
    assert!(views.is_empty() && top.is_empty() && unique.is_empty());

    // Stream time 130,000 closes [60 s, 120 s): /home 2 (bob, eve), /about 1 (dan).
    input
        .pipe_input_with_timestamp((), view("ann", "/faq"), 130_000)
        .unwrap();
    let mut closed = views.read_key_values().unwrap();
    closed.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        closed,
        [page("/about", 60_000, 1), page("/home", 60_000, 2)]
    );
    assert_eq!(
        top.read_values().unwrap(),
        [TopPages {
            window_start: 60_000,
            window_end: 120_000,
            pages: counts(&[("/home", 2), ("/about", 1)]),
        }]
    );
    assert_eq!(
        unique.read_values().unwrap(),
        [UniqueUsers {
            window_start: 60_000,
            window_end: 120_000,
            users: 3,
        }]
    );
    // [120 s, 180 s) is still open.
    assert!(views.is_empty() && top.is_empty() && unique.is_empty());
}

#[test]
fn unknown_fields_are_ignored_and_topics_have_defaults() {
    let v: PageView = lambda_streams::serdes::Serde::deserialize(
        &Json::<PageView>::new(),
        Some(br#"{"user":"u","page":"/p","referrer":"x","ms":3}"#),
    )
    .unwrap();
    assert_eq!(v, view("u", "/p"));
    let t = Topics::default();
    assert_eq!(
        (
            t.input.as_str(),
            t.views.as_str(),
            t.top.as_str(),
            t.unique.as_str()
        ),
        (
            "page-views",
            "page-views-per-minute",
            "top-pages-per-minute",
            "unique-users-per-minute"
        )
    );
}

#[test]
fn windows_emitted_on_close_need_no_repartition_topic() {
    // Each window is emitted once, with its final version: direct re-keying suffices
    // (docs/state.md, "Direct or repartition"), so the function consumes its input topic only.
    let topology = topology(&Topics::default());
    assert!(topology.repartition_topics().is_empty());
    assert_eq!(topology.source_topics(), ["page-views"]);
}
