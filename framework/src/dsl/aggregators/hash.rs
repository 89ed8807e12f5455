//! The stable hash members are counted by: xxHash64.

pub(super) const P1: u64 = 0x9E37_79B1_85EB_CA87;
pub(super) const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
pub(super) const P3: u64 = 0x1656_67B1_9E37_79F9;
pub(super) const P4: u64 = 0x85EB_CA77_C2B2_AE63;
pub(super) const P5: u64 = 0x27D4_EB2F_1656_67C5;

pub(super) fn xxh_round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

pub(super) fn xxh_merge(acc: u64, value: u64) -> u64 {
    (acc ^ xxh_round(0, value))
        .wrapping_mul(P1)
        .wrapping_add(P4)
}

pub(super) fn read_u64_le(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(buf)
}

/// XXH64 of `data` with `seed` (Yann Collet's xxHash, 64-bit, as specified in
/// `xxhash_spec.md` of the xxHash project).
pub fn xxh64(data: &[u8], seed: u64) -> u64 {
    let len = data.len() as u64;
    let mut rest = data;
    let mut h = if rest.len() >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        while rest.len() >= 32 {
            for (i, lane) in v.iter_mut().enumerate() {
                *lane = xxh_round(*lane, read_u64_le(&rest[i * 8..]));
            }
            rest = &rest[32..];
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = xxh_merge(h, lane);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len);
    while rest.len() >= 8 {
        h ^= xxh_round(0, read_u64_le(rest));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        let mut buf = [0u8; 4];
        buf.copy_from_slice(&rest[..4]);
        h ^= u64::from(u32::from_le_bytes(buf)).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = &rest[4..];
    }
    for &byte in rest {
        h ^= u64::from(byte).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^= h >> 32;
    h
}

/// The hash [`distinct_count`](KGroupedStream::distinct_count) keeps of a member: XXH64
/// with seed 0 of the member's bytes under its serde. Fixed forever (state is persisted):
/// a change would need a new state format version.
///
/// ```
/// use lambda_streams::dsl::aggregators::member_hash;
///
/// // The reference values of XXH64 (seed 0).
/// assert_eq!(member_hash(b""), 0xEF46_DB37_51D8_E999);
/// assert_eq!(member_hash(b"abc"), 0x44BC_2CF5_AD77_0999);
/// ```
pub fn member_hash(bytes: &[u8]) -> u64 {
    xxh64(bytes, 0)
}
