//! The split-KV ("flash-decoding") attention forward of generation (kernels/attention_decode.cu):
//! when it runs, how many key chunks, and the workspace the partials take.
//!
//! It runs for at most [`DECODE_MAX_ROWS`] query rows and head sizes up to 128, whatever
//! the precision (FP32 arithmetic: the kernels are bound by reading the KV cache), when
//! the keys split into at least two chunks; [`DecodeAttention::Off`]
//! (`ANDREA_CUDA_DECODE=off`) keeps the row-tiled forwards of [`super::attention`]. The
//! workspace is the same whichever is chosen ([`workspace_len`]), so switching never
//! changes buffer sizes.

use super::{grid, int, Launch};
use andrea_core::check::AttentionDims;
use andrea_core::{AttentionShape, Error, Result};

/// Whether generation's few-row attention runs the split-KV kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DecodeAttention {
    /// Split the keys into chunks where that gives at least two ([`decode`]).
    #[default]
    Split,
    /// Always the row-tiled forwards (SIMT or tensor cores, as the precision says).
    Off,
}

impl DecodeAttention {
    /// `split` or `off` (the values of `ANDREA_CUDA_DECODE`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "split" | "" => Ok(Self::Split),
            "off" => Ok(Self::Off),
            other => Err(Error::invalid(
                "ANDREA_CUDA_DECODE",
                format!("`{other}` is not one of split, off"),
            )),
        }
    }
}

/// The most query rows the split kernels take (generation steps one to a few tokens).
pub const DECODE_MAX_ROWS: usize = 4;
/// The largest head size (the kernels spread an output row over 32 lanes × 4).
pub const DECODE_MAX_HEAD_DIM: usize = 128;
/// Keys per tile; a chunk is a whole number of tiles.
pub const DECODE_TILE: usize = 32;
/// Chunks (one warp each) per block.
pub const DECODE_WARPS: usize = 4;
/// Warps per SM the split aims at, for enough loads in flight to keep HBM busy: 8 of an
/// H200's 64 warp slots an SM, 1056 warps on 132 SMs; at a few KiB of K/V loads in
/// flight each that is ~2-4 MB, about HBM's bandwidth × latency (4.3 TB/s × ~0.6 µs ≈
/// 2.6 MB). An estimate: `gpu_check decode` on a GPU decides.
pub const DECODE_WARPS_PER_SM: usize = 8;

/// The chunk count [`decode_chunks`] aims at before rounding: enough warps for
/// [`DECODE_WARPS_PER_SM`] on `sms` SMs over `bh = B·H` heads, at most one chunk per tile
/// of `tk` keys. Never below what `decode_chunks` returns, and non-decreasing in `tk`, so
/// it sizes the workspace of every shorter cache too.
pub fn max_chunks(tk: usize, bh: usize, sms: usize) -> usize {
    let wanted = (DECODE_WARPS_PER_SM * sms.max(1)).div_ceil(bh.max(1));
    wanted.min(tk.div_ceil(DECODE_TILE)).max(1)
}

/// `(keys per chunk, chunks)` for `tk` keys: the chunk is [`max_chunks`]'s share of the
/// keys rounded up to whole tiles, so the last chunk may be shorter.
pub fn decode_chunks(tk: usize, bh: usize, sms: usize) -> (usize, usize) {
    let n = max_chunks(tk, bh, sms);
    let chunk = tk.div_ceil(n).div_ceil(DECODE_TILE).max(1) * DECODE_TILE;
    (chunk, tk.div_ceil(chunk).max(1))
}

/// Whether the shape is one the split kernels may take (few rows, head size <= 128).
fn eligible(q_len: usize, head_dim: usize) -> bool {
    (1..=DECODE_MAX_ROWS).contains(&q_len) && (1..=DECODE_MAX_HEAD_DIM).contains(&head_dim)
}

/// Floats of the attention workspace on `sms` SMs: the row log-sum-exps, then, where the
/// split kernels may run, the partials `(m, l, o[D])` of every row and chunk (at
/// [`max_chunks`], whether or not the split is switched on).
pub fn workspace_len(s: AttentionShape, sms: usize) -> usize {
    let rows = s.lse_len();
    if !eligible(s.q_len, s.head_dim) {
        return rows;
    }
    let n = max_chunks(s.k_len, s.batch * s.heads, sms);
    if n < 2 {
        return rows;
    }
    rows + rows * n * (s.head_dim + 2)
}

/// The two launches of a split forward and where their data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    /// Keys per chunk (a multiple of [`DECODE_TILE`]).
    pub chunk: usize,
    pub chunks: usize,
    /// `attention_decode_split`: grid (ceil(chunks / 4), H, B), block 128.
    pub split: Launch,
    /// `attention_decode_combine`: grid (ceil(B·H·Tq / 4)), block 128.
    pub combine: Launch,
    /// Workspace offsets (floats) of the `(m, l)` pairs and of the partial outputs.
    pub ml_offset: usize,
    pub o_offset: usize,
}

/// The split forward for these dims on `sms` SMs, or `None` where it does not apply
/// (more than [`DECODE_MAX_ROWS`] rows, a head size over 128, or a single chunk).
pub fn decode(d: &AttentionDims, sms: usize) -> Result<Option<DecodePlan>> {
    const OP: &str = "attention_forward";
    if !eligible(d.q_len, d.head_dim) {
        return Ok(None);
    }
    let bh = d.batch * d.heads;
    let (chunk, chunks) = decode_chunks(d.k_len, bh, sms);
    if chunks < 2 {
        return Ok(None);
    }
    int(OP, "key positions", d.k_len)?;
    let rows = bh * d.q_len;
    int(OP, "query rows", rows)?;
    let block = [32 * DECODE_WARPS as u32, 1, 1];
    Ok(Some(DecodePlan {
        chunk,
        chunks,
        split: Launch {
            kernel: "attention_decode_split",
            grid: grid(OP, chunks.div_ceil(DECODE_WARPS), d.heads, d.batch)?,
            block,
            smem: 0,
        },
        combine: Launch {
            kernel: "attention_decode_combine",
            grid: grid(OP, rows.div_ceil(DECODE_WARPS), 1, 1)?,
            block,
            smem: 0,
        },
        ml_offset: rows,
        o_offset: rows + 2 * rows * chunks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(b: usize, h: usize, tq: usize, tk: usize, d: usize) -> AttentionDims {
        AttentionDims {
            batch: b,
            heads: h,
            head_dim: d,
            q_len: tq,
            k_len: tk,
        }
    }

    #[test]
    fn h200_decode_shapes() {
        // Batch 1, 12 heads, 1024 keys: 32 chunks of one tile, 384 warps on 132 SMs.
        let p = decode(&dims(1, 12, 1, 1024, 64), 132).unwrap().unwrap();
        assert_eq!((p.chunk, p.chunks), (32, 32));
        assert_eq!(p.split.grid, [8, 12, 1]);
        assert_eq!(p.combine.grid, [3, 1, 1]);
        // Batch 16: 6 chunks of 192 keys (the last one 64), 1152 warps.
        let p = decode(&dims(16, 12, 1, 1024, 64), 132).unwrap().unwrap();
        assert_eq!((p.chunk, p.chunks), (192, 6));
        assert_eq!(p.split.grid, [2, 12, 16]);
        assert_eq!(p.combine.grid, [48, 1, 1]);
        assert_eq!(p.ml_offset, 192);
        assert_eq!(p.o_offset, 192 + 2 * 192 * 6);
        // Enough heads to fill the GPU alone, or too few keys: no split.
        assert!(decode(&dims(128, 12, 1, 1024, 64), 132).unwrap().is_none());
        assert!(decode(&dims(1, 12, 1, 32, 64), 132).unwrap().is_none());
        // Prefill rows and large head sizes keep the row-tiled kernels.
        assert!(decode(&dims(1, 12, 5, 1024, 64), 132).unwrap().is_none());
        assert!(decode(&dims(1, 12, 4, 1024, 64), 132).unwrap().is_some());
        assert!(decode(&dims(1, 1, 1, 1024, 129), 132).unwrap().is_none());
    }

    #[test]
    fn chunks_cover_the_keys_and_the_workspace_fits_every_shorter_cache() {
        for sms in [1, 2, 132] {
            for bh in [1, 2, 12, 192, 2000] {
                let mut prev = 0;
                for tk in 1..=700 {
                    let (chunk, n) = decode_chunks(tk, bh, sms);
                    assert_eq!(chunk % DECODE_TILE, 0);
                    // Every chunk has keys: the last starts before tk.
                    assert!((n - 1) * chunk < tk && n * chunk >= tk, "{tk} {bh} {sms}");
                    let bound = max_chunks(tk, bh, sms);
                    assert!(n <= bound);
                    assert!(bound >= prev, "max_chunks must not decrease with tk");
                    prev = bound;
                    let s = AttentionShape {
                        batch: 1,
                        heads: bh,
                        head_dim: 64,
                        q_len: 1,
                        k_len: tk,
                    };
                    let d = dims(1, bh, 1, tk, 64);
                    if let Some(p) = decode(&d, sms).unwrap() {
                        let used = p.o_offset + bh * p.chunks * 64;
                        assert!(used <= workspace_len(s, sms), "{tk} {bh} {sms}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_emulator_splits_short_caches() {
        // One SM (the emulator): 8 warps wanted, so a 70-key cache of one head splits
        // into 3 chunks of 32, the last of 6 keys.
        let p = decode(&dims(1, 1, 1, 70, 32), 1).unwrap().unwrap();
        assert_eq!((p.chunk, p.chunks), (32, 3));
        let p = decode(&dims(1, 2, 3, 200, 64), 1).unwrap().unwrap();
        assert_eq!((p.chunk, p.chunks), (64, 4));
    }

    #[test]
    fn parse() {
        assert_eq!(DecodeAttention::parse("off").unwrap(), DecodeAttention::Off);
        assert_eq!(
            DecodeAttention::parse("split").unwrap(),
            DecodeAttention::Split
        );
        assert!(DecodeAttention::parse("on").is_err())
    }
}
