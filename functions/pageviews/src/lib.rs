//! Page-view analytics per minute, on AWS Lambda.
//!
//! Reads page-view JSON records (`{"user": "...", "page": "...", ...}`; other fields are
//! ignored, the record's Kafka timestamp is the event time) and, per 1-minute tumbling
//! window with 10 s of grace, **once per window when it closes**
//! ([`EmitStrategy::OnWindowClose`]), produces:
//!
//! | topic (default) | key | value (JSON) |
//! |---|---|---|
//! | `page-views-per-minute` | `<page>@<window start>` | [`PageViews`]: the page's views in the window |
//! | `top-pages-per-minute` | `<window start>` | [`TopPages`]: the 5 most viewed pages |
//! | `unique-users-per-minute` | `<window start>` | [`UniqueUsers`]: the distinct users |
//!
//! Window starts and ends are epoch milliseconds. A window closes when the low watermark
//! (the lowest stream time over the input's partitions) passes its end plus the grace;
//! declare the input's partition count in `LAMBDA_STREAMS_SOURCE_PARTITIONS`
//! (`page-views:<n>`) so that a partition not heard from yet holds windows open too. A
//! view for a closed window is late: dropped and counted.
//!
//! Exactness: the views per page are exact counts. The top pages come from Space-Saving
//! with [`TOP_CAPACITY`] monitored pages per window: exact while a window has at most that
//! many distinct pages, otherwise each count is at most N / capacity too high (N: the
//! window's views). The distinct users are exact up to 2,048 per window, then a
//! HyperLogLog estimate (0.81% standard error). See `lambda_streams::dsl::aggregators`.
//!
//! Environment: `PAGEVIEWS_INPUT_TOPIC` (default `page-views`), `PAGEVIEWS_VIEWS_TOPIC`
//! (`page-views-per-minute`), `PAGEVIEWS_TOP_TOPIC` (`top-pages-per-minute`),
//! `PAGEVIEWS_UNIQUE_TOPIC` (`unique-users-per-minute`), plus the framework's
//! (`LAMBDA_STREAMS_TABLE`, `LAMBDA_STREAMS_SOURCE_PARTITIONS`, …; see
//! `lambda_streams::lambda`).

use std::time::Duration;

use lambda_streams::config_env::env_or;
use lambda_streams::dsl::{EmitStrategy, Grouped, TimeWindowedKStream, TimeWindows};
use lambda_streams::serdes::{Json, Unit, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use serde::{Deserialize, Serialize};

/// The store of the views per page and window.
pub const VIEWS_STORE: &str = "pageviews-views-per-page";
/// The store of the top pages per window.
pub const TOP_STORE: &str = "pageviews-top-pages";
/// The store of the distinct users per window.
pub const UNIQUE_STORE: &str = "pageviews-unique-users";
/// How many pages [`TopPages`] lists.
pub const TOP_K: usize = 5;
/// The pages the top-pages summary monitors per window (Space-Saving's capacity).
pub const TOP_CAPACITY: usize = 100;
/// The window size.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How long after its end a window still accepts views.
pub const GRACE: Duration = Duration::from_secs(10);

/// One page view, as read from the input topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageView {
    /// Who viewed the page.
    pub user: String,
    /// The page viewed.
    pub page: String,
}

/// A page's views in one window (topic `page-views-per-minute`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageViews {
    /// The page.
    pub page: String,
    /// The window start, epoch ms (inclusive).
    pub window_start: i64,
    /// The window end, epoch ms (exclusive).
    pub window_end: i64,
    /// The page's views in the window.
    pub views: u64,
}

/// A page and its views, an entry of [`TopPages`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageCount {
    /// The page.
    pub page: String,
    /// Its views in the window.
    pub views: u64,
}

/// The most viewed pages of one window, most viewed first, ties by page name (topic
/// `top-pages-per-minute`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopPages {
    /// The window start, epoch ms (inclusive).
    pub window_start: i64,
    /// The window end, epoch ms (exclusive).
    pub window_end: i64,
    /// At most [`TOP_K`] pages.
    pub pages: Vec<PageCount>,
}

/// The distinct users of one window (topic `unique-users-per-minute`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UniqueUsers {
    /// The window start, epoch ms (inclusive).
    pub window_start: i64,
    /// The window end, epoch ms (exclusive).
    pub window_end: i64,
    /// How many distinct users viewed a page in the window.
    pub users: u64,
}

/// The topics of the function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    /// Page views in.
    pub input: String,
    /// [`PageViews`] out.
    pub views: String,
    /// [`TopPages`] out.
    pub top: String,
    /// [`UniqueUsers`] out.
    pub unique: String,
}

impl Default for Topics {
    fn default() -> Self {
        Topics {
            input: "page-views".to_owned(),
            views: "page-views-per-minute".to_owned(),
            top: "top-pages-per-minute".to_owned(),
            unique: "unique-users-per-minute".to_owned(),
        }
    }
}

/// 1-minute tumbling windows with 10 s of grace, emitted when they close.
fn per_minute<K, V>(grouped: lambda_streams::dsl::KGroupedStream<K, V>) -> TimeWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    grouped
        .windowed_by(TimeWindows::of_size(WINDOW).grace(GRACE))
        .emit_strategy(EmitStrategy::OnWindowClose)
}

/// The pageviews topology on `topics`.
pub fn topology(topics: &Topics) -> Topology {
    let builder = StreamsBuilder::new();
    let views = builder.stream(&topics.input, Unit, Json::<PageView>::new());

    per_minute(views.group_by(
        |_, v: &PageView| v.page.clone(),
        Grouped::with(Utf8, Json::<PageView>::new()),
    ))
    .count(VIEWS_STORE)
    .to_stream()
    .map(|w, n| {
        let value = PageViews {
            page: w.key.clone(),
            window_start: w.start,
            window_end: w.end,
            views: u64::try_from(n).unwrap_or(0),
        };
        (format!("{}@{}", w.key, w.start), value)
    })
    .to(&topics.views, Utf8, Json::<PageViews>::new());

    // One item per window for all pages (and one for all users): every partition
    // writes it, once per batch.
    let all = || {
        views.group_by(
            |_, _| "all".to_owned(),
            Grouped::with(Utf8, Json::<PageView>::new()),
        )
    };
    per_minute(all())
        .top_k_frequent_with_capacity(
            TOP_STORE,
            TOP_K,
            TOP_CAPACITY,
            |_, v: &PageView| v.page.clone(),
            Utf8,
        )
        .to_stream()
        .map(|w, top| {
            let value = TopPages {
                window_start: w.start,
                window_end: w.end,
                pages: top
                    .into_iter()
                    .map(|(page, views)| PageCount { page, views })
                    .collect(),
            };
            (w.start.to_string(), value)
        })
        .to(&topics.top, Utf8, Json::<TopPages>::new());

    per_minute(all())
        .distinct_count(UNIQUE_STORE, |_, v: &PageView| v.user.clone(), Utf8)
        .to_stream()
        .map(|w, users| {
            let value = UniqueUsers {
                window_start: w.start,
                window_end: w.end,
                users,
            };
            (w.start.to_string(), value)
        })
        .to(&topics.unique, Utf8, Json::<UniqueUsers>::new());
    builder.build()
}

/// The topics from `PAGEVIEWS_INPUT_TOPIC`, `PAGEVIEWS_VIEWS_TOPIC`, `PAGEVIEWS_TOP_TOPIC`
/// and `PAGEVIEWS_UNIQUE_TOPIC` (an unset or empty variable keeps the default).
pub fn topics_from_env() -> Topics {
    let d = Topics::default();
    Topics {
        input: env_or("PAGEVIEWS_INPUT_TOPIC", d.input),
        views: env_or("PAGEVIEWS_VIEWS_TOPIC", d.views),
        top: env_or("PAGEVIEWS_TOP_TOPIC", d.top),
        unique: env_or("PAGEVIEWS_UNIQUE_TOPIC", d.unique),
    }
}

/// The topology with its topics from the environment ([`topics_from_env`]).
pub fn topology_from_env() -> Topology {
    topology(&topics_from_env())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
