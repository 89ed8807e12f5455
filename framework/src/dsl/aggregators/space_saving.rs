//! Top-K by frequency (Space-Saving).

use super::*;

/// A monitored member of [`SpaceSaving`]: its count (an upper bound of its true
/// frequency) and the error (how much of the count may not be its own).
#[derive(Debug, Clone)]
pub(super) struct Counter<M> {
    pub(super) entry: Entry<M, u64>,
    pub(super) error: u64,
}

/// The Space-Saving summary (Metwally, Agrawal, El Abbadi: "Efficient computation of
/// frequent and top-k elements in data streams", ICDT 2005) with `capacity` counters.
///
/// A monitored member's count `c` and error `e` bound its true frequency `f`:
/// `c - e <= f <= c`, and `e <= min count <= N / capacity` (N: records counted). Every
/// member with `f > N / capacity` is monitored. With at most `capacity` distinct members
/// nothing is ever evicted: every count is exact.
#[derive(Debug, Clone)]
pub(super) struct SpaceSaving<M> {
    pub(super) counters: Vec<Counter<M>>,
    pub(super) total: u64,
}

impl<M> SpaceSaving<M> {
    pub(super) fn new() -> Self {
        SpaceSaving {
            counters: Vec::new(),
            total: 0,
        }
    }

    pub(super) fn offer(&mut self, member: M, bytes: Vec<u8>, capacity: usize) {
        self.total += 1;
        if let Some(c) = self.counters.iter_mut().find(|c| c.entry.bytes == bytes) {
            c.entry.score += 1;
            return;
        }
        let fresh = |score, error| Counter {
            entry: Entry {
                member,
                bytes,
                score,
            },
            error,
        };
        if self.counters.len() < capacity.max(1) {
            self.counters.push(fresh(1, 0));
            return;
        }
        // Evict the member with the smallest count (of those, the largest bytes: a
        // deterministic choice, so every process folds the same records to the same state).
        let min = self
            .counters
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| {
                a.entry
                    .score
                    .cmp(&b.entry.score)
                    .then_with(|| b.entry.bytes.cmp(&a.entry.bytes))
            })
            .map(|(i, _)| i);
        if let Some(i) = min {
            let floor = self.counters[i].entry.score;
            self.counters[i] = fresh(floor + 1, floor);
        }
    }

    /// The `k` members with the highest counts, highest first (ties: smaller bytes first).
    pub(super) fn top(&self, k: usize) -> Vec<&Counter<M>> {
        let mut sorted: Vec<&Counter<M>> = self.counters.iter().collect();
        sorted.sort_by(|a, b| {
            b.entry
                .score
                .cmp(&a.entry.score)
                .then_with(|| a.entry.bytes.cmp(&b.entry.bytes))
        });
        sorted.truncate(k);
        sorted
    }
}

pub(super) struct SpaceSavingSerde<M> {
    pub(super) member: Arc<dyn Serde<M>>,
}

impl<M: 'static> Serde<SpaceSaving<M>> for SpaceSavingSerde<M> {
    fn serialize(&self, value: &SpaceSaving<M>) -> Option<Vec<u8>> {
        let mut out = header(KIND_SPACE_SAVING);
        out.extend_from_slice(&value.total.to_be_bytes());
        put_u32(&mut out, value.counters.len());
        for c in &value.counters {
            put_member(&mut out, &c.entry.bytes);
            out.extend_from_slice(&c.entry.score.to_be_bytes());
            out.extend_from_slice(&c.error.to_be_bytes());
        }
        Some(out)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<SpaceSaving<M>, SerdeError> {
        let mut r = Reader::new(data, KIND_SPACE_SAVING, "space-saving")?;
        let total = r.u64()?;
        let n = r.u32()?;
        let mut counters = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let (member, bytes) = r.member(&*self.member)?;
            let (score, error) = (r.u64()?, r.u64()?);
            counters.push(Counter {
                entry: Entry {
                    member,
                    bytes,
                    score,
                },
                error,
            });
        }
        r.finish()?;
        Ok(SpaceSaving { counters, total })
    }
}
