//! Top-K by score (exact).

use super::*;

/// A member with its bytes (identity and tie-break) and a score or count.
#[derive(Debug, Clone)]
pub(super) struct Entry<M, S> {
    pub(super) member: M,
    pub(super) bytes: Vec<u8>,
    pub(super) score: S,
}

/// Whether `(score, bytes)` ranks before `(other, other_bytes)`: a higher score first,
/// then the smaller bytes.
pub(super) fn ranks_before<S: Score>(
    score: &S,
    bytes: &[u8],
    other: &S,
    other_bytes: &[u8],
) -> bool {
    match score.compare(other) {
        Ordering::Greater => true,
        Ordering::Less => false,
        Ordering::Equal => bytes < other_bytes,
    }
}

/// The state of [`top_k`](KGroupedStream::top_k): at most `k` members, best first.
///
/// Exact with `k` entries: a member's score (the max over its records) only grows, so a
/// member that ranks below `k` others can only come back with a record whose score beats
/// the `k`-th, which is then its score.
#[derive(Debug, Clone)]
pub(super) struct TopK<M, S> {
    pub(super) entries: Vec<Entry<M, S>>,
}

impl<M, S: Score> TopK<M, S> {
    pub(super) fn new() -> Self {
        TopK {
            entries: Vec::new(),
        }
    }

    pub(super) fn offer(&mut self, member: M, bytes: Vec<u8>, score: S, k: usize) {
        if !score.is_valid() {
            return;
        }
        if let Some(i) = self.entries.iter().position(|e| e.bytes == bytes) {
            if score.compare(&self.entries[i].score) != Ordering::Greater {
                return;
            }
            self.entries.remove(i);
        } else if self.entries.len() >= k {
            match self.entries.get(k.saturating_sub(1)) {
                Some(last) if ranks_before(&score, &bytes, &last.score, &last.bytes) => {}
                _ => return,
            }
        }
        let at = self
            .entries
            .iter()
            .position(|e| ranks_before(&score, &bytes, &e.score, &e.bytes))
            .unwrap_or(self.entries.len());
        self.entries.insert(
            at,
            Entry {
                member,
                bytes,
                score,
            },
        );
        self.entries.truncate(k);
    }
}

pub(super) struct TopKSerde<M, S> {
    pub(super) member: Arc<dyn Serde<M>>,
    pub(super) score: PhantomData<fn() -> S>,
}

impl<M: 'static, S: Score> Serde<TopK<M, S>> for TopKSerde<M, S> {
    fn serialize(&self, value: &TopK<M, S>) -> Option<Vec<u8>> {
        let mut out = header(KIND_TOP_K);
        put_u32(&mut out, value.entries.len());
        for e in &value.entries {
            put_member(&mut out, &e.bytes);
            out.extend_from_slice(&e.score.to_be_bytes());
        }
        Some(out)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<TopK<M, S>, SerdeError> {
        let mut r = Reader::new(data, KIND_TOP_K, "top-k")?;
        let n = r.u32()?;
        let mut entries = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let (member, bytes) = r.member(&*self.member)?;
            let score = S::from_be_bytes(r.bytes8()?);
            entries.push(Entry {
                member,
                bytes,
                score,
            });
        }
        r.finish()?;
        Ok(TopK { entries })
    }
}
