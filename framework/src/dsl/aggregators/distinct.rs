//! Distinct count (exact set, then HyperLogLog).

use super::*;

/// A HyperLogLog sketch of `2^p` registers, with Ertl's improved raw estimator (O. Ertl,
/// "New cardinality estimation algorithms for HyperLogLog sketches", 2017, algorithm 6):
/// unbiased from 0 to beyond 10^9 without empirical bias tables, relative standard error
/// about `1.04 / sqrt(2^p)`.
///
/// A hash's top `p` bits choose the register; the register keeps the maximum over its
/// hashes of `1 +` the number of leading zeros of the remaining `q = 64 - p` bits
/// (`q + 1` when they are all zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HyperLogLog {
    pub(super) p: u8,
    pub(super) registers: Vec<u8>,
}

impl HyperLogLog {
    pub(super) fn new(p: u8) -> Self {
        HyperLogLog {
            p,
            registers: vec![0; 1 << p],
        }
    }

    pub(super) fn insert(&mut self, hash: u64) {
        let p = u32::from(self.p);
        let index = (hash >> (64 - p)) as usize;
        let rest = hash << p;
        let q = 64 - p;
        let rank = if rest == 0 {
            q + 1
        } else {
            rest.leading_zeros() + 1
        };
        let rank = rank as u8;
        if self.registers[index] < rank {
            self.registers[index] = rank;
        }
    }

    pub(super) fn estimate(&self) -> f64 {
        let m = self.registers.len() as f64;
        let q = 64 - usize::from(self.p);
        let mut histogram = vec![0u64; q + 2];
        for &r in &self.registers {
            histogram[usize::from(r).min(q + 1)] += 1;
        }
        let mut z = m * tau(1.0 - histogram[q + 1] as f64 / m);
        for k in (1..=q).rev() {
            z = 0.5 * (z + histogram[k] as f64);
        }
        z += m * sigma(histogram[0] as f64 / m);
        let alpha_inf = 0.5 / std::f64::consts::LN_2;
        alpha_inf * m * m / z
    }
}

/// Ertl's σ(x) = x + Σ_{k≥1} x^(2^k) 2^(k-1).
pub(super) fn sigma(x: f64) -> f64 {
    if x >= 1.0 {
        return f64::INFINITY;
    }
    let (mut x, mut y, mut z) = (x, 1.0, x);
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if z == before {
            return z;
        }
    }
}

/// Ertl's τ(x) = (1 - x - Σ_{k≥1} (1 - x^(2^-k))^2 2^-k) / 3.
pub(super) fn tau(x: f64) -> f64 {
    if x <= 0.0 || x >= 1.0 {
        return 0.0;
    }
    let (mut x, mut y, mut z) = (x, 1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == before {
            return z / 3.0;
        }
    }
}

/// The state of [`distinct_count`](KGroupedStream::distinct_count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Distinct {
    /// The distinct member hashes, ascending: exact (up to 64-bit hash collisions:
    /// probability below `n^2 / 2^65`, under 1.2e-13 for n = 2,048).
    Exact(Vec<u64>),
    /// Past [`EXACT_DISTINCT_LIMIT`] members.
    Sketch(HyperLogLog),
}

impl Distinct {
    pub(super) fn insert(&mut self, hash: u64, limit: usize, precision: u8) {
        match self {
            Distinct::Exact(set) => {
                if let Err(at) = set.binary_search(&hash) {
                    set.insert(at, hash);
                    if set.len() > limit {
                        let mut sketch = HyperLogLog::new(precision);
                        set.iter().for_each(|&h| sketch.insert(h));
                        *self = Distinct::Sketch(sketch);
                    }
                }
            }
            Distinct::Sketch(sketch) => sketch.insert(hash),
        }
    }

    pub(super) fn count(&self) -> u64 {
        match self {
            Distinct::Exact(set) => set.len() as u64,
            Distinct::Sketch(sketch) => sketch.estimate().round() as u64,
        }
    }
}

pub(super) struct DistinctSerde;

impl Serde<Distinct> for DistinctSerde {
    fn serialize(&self, value: &Distinct) -> Option<Vec<u8>> {
        let mut out = header(KIND_DISTINCT);
        match value {
            Distinct::Exact(set) => {
                out.push(0);
                put_u32(&mut out, set.len());
                for h in set {
                    out.extend_from_slice(&h.to_be_bytes());
                }
            }
            Distinct::Sketch(sketch) => {
                out.push(1);
                out.push(sketch.p);
                out.extend_from_slice(&sketch.registers);
            }
        }
        Some(out)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Distinct, SerdeError> {
        let mut r = Reader::new(data, KIND_DISTINCT, "distinct-count")?;
        let state = match r.u8()? {
            0 => {
                let n = r.u32()?;
                let mut set = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    set.push(r.u64()?);
                }
                if !set.is_sorted_by(|a, b| a < b) {
                    return Err(SerdeError(
                        "distinct-count state: hashes not ascending".to_owned(),
                    ));
                }
                Distinct::Exact(set)
            }
            1 => {
                let p = r.u8()?;
                if !(4..=18).contains(&p) {
                    return Err(SerdeError(format!(
                        "distinct-count state: precision {p} out of 4..=18"
                    )));
                }
                let registers = r.take(1 << p)?.to_vec();
                Distinct::Sketch(HyperLogLog { p, registers })
            }
            mode => {
                return Err(SerdeError(format!(
                    "distinct-count state: unknown mode {mode}"
                )));
            }
        };
        r.finish()?;
        Ok(state)
    }
}
