//! The tensor-core and asynchronous-copy wrappers of `kernels/common.cuh` (mma.sync
//! bf16 / tf32, ldmatrix, cp.async, cvt), run by the self-test kernels of
//! `kernels/tc_selftest.cu` against a plain per-element computation here; and every
//! fault those kernels can plant (two lanes' fragments swapped, a wrong ldmatrix row, a
//! missing cp_async_wait, an off-by-one zero-fill mask) caught, as are the misuses the
//! emulator must refuse (a misaligned or non-shared ldmatrix address, a cp.async copy
//! never committed, a wait with no commit, a thread exiting with copies in flight).
//!
//! On the CPU emulator these pin the emulator's instruction models to the PTX ISA's
//! per-lane layouts (which the wrappers' comments state); on a GPU the same tests check
//! the wrappers' inline PTX.
//!
//! mma tolerance: the reference sums the rounded operands' products exactly (f64); the
//! hardware accumulates them in FP32 in an unspecified order, each of the K additions
//! (and that of C) within 2⁻²⁴ relative of its partial sum, so
//! `|d - ref| <= (K + 1)·2⁻²⁴·(Σ_k |a_k·b_k| + |c|) + 1e-30`, an abs + rel·|terms| bound;
//! a wrongly placed or wrongly rounded operand is off by ≥ 2⁻⁹·|a·b| for some term,
//! far outside it.

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// The tests, which need the `cuda` feature.
#[cfg(feature = "cuda")]
mod tests {
    use crate::common;

    use andrea_cuda::{CudaBackend, Precision, RawArg};
    use common::{buf, cuda, data, read};

    const U24: f64 = 1.0 / 16_777_216.0;

    fn backend(name: &str) -> Option<CudaBackend> {
        cuda(name, Precision::FP32)
    }

    /// Nearest, ties to even (cvt.rn.bf16x2.f32).
    fn bf16(x: f32) -> f32 {
        let u = x.to_bits();
        let r = u.wrapping_add(0x7fff + ((u >> 16) & 1));
        f32::from_bits(r & 0xffff_0000)
    }

    /// Nearest, ties away (cvt.rna.tf32.f32).
    fn tf32_rna(x: f32) -> f32 {
        f32::from_bits(x.to_bits().wrapping_add(0x1000) & !0x1fff)
    }

    /// What the tensor core reads from a b32 that was not converted: its low 13 bits dropped.
    fn tf32_trunc(x: f32) -> f32 {
        f32::from_bits(x.to_bits() & !0x1fff)
    }

    /// `d = a·b + c` for `a: [16, k]`, `b: [k, 8]`, operands through `round`; the worst
    /// `|d - ref| / bound` over the 128 outputs.
    fn mma_error(
        a: &[f32],
        b: &[f32],
        c: &[f32],
        d: &[f32],
        k: usize,
        round: fn(f32) -> f32,
    ) -> f64 {
        let mut worst = 0.0f64;
        for r in 0..16 {
            for n in 0..8 {
                let (mut s, mut mag) = (c[r * 8 + n] as f64, (c[r * 8 + n] as f64).abs());
                for kk in 0..k {
                    let p = round(a[r * k + kk]) as f64 * round(b[kk * 8 + n]) as f64;
                    s += p;
                    mag += p.abs();
                }
                let bound = (k as f64 + 1.0) * U24 * mag + 1e-30;
                let e = (d[r * 8 + n] as f64 - s).abs() / bound;
                worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
            }
        }
        worst
    }

    fn run_mma(
        be: &CudaBackend,
        bf16_op: bool,
        convert: i32,
        fault: i32,
        threads: u32,
    ) -> (f64, bool) {
        let k = if bf16_op { 16 } else { 8 };
        let (a, b, c) = (
            data(11, 16 * k, -1.0, 1.0),
            data(12, k * 8, -1.0, 1.0),
            data(13, 128, -1.0, 1.0),
        );
        let (ab, bb, cb, db) = (buf(be, &a), buf(be, &b), buf(be, &c), buf(be, &[0.0; 128]));
        let mut args = vec![
            RawArg::Buf(&ab, 0),
            RawArg::Buf(&bb, 0),
            RawArg::Buf(&cb, 0),
            RawArg::Buf(&db, 0),
        ];
        if !bf16_op {
            args.push(RawArg::Int(convert));
        }
        args.push(RawArg::Int(fault));
        let name = if bf16_op {
            "tc_selftest_mma_bf16"
        } else {
            "tc_selftest_mma_tf32"
        };
        if be
            .launch_raw(name, [1, 1, 1], [threads, 1, 1], &args)
            .is_err()
        {
            return (f64::INFINITY, false);
        }
        let d = read(be, &db);
        let round = match (bf16_op, convert) {
            (true, _) => bf16,
            (false, 1) => tf32_rna,
            _ => tf32_trunc,
        };
        (mma_error(&a, &b, &c, &d, k, round), true)
    }

    #[test]
    fn mma_bf16_m16n8k16_matches_the_per_element_product() {
        let Some(be) = backend("mma_bf16") else {
            return;
        };
        let (e, ok) = run_mma(&be, true, 1, 0, 32);
        assert!(ok && e <= 1.0, "bf16 mma: |d - ref| / bound = {e:.3}");
        let (e, _) = run_mma(&be, true, 1, 1, 32);
        assert!(
            e > 1.0,
            "planted fault (lanes 0 and 1 swap fragments) not caught: {e:.3}"
        );
        let (_, ok) = run_mma(&be, true, 1, 0, 16);
        assert!(!ok, "an mma in a warp of 16 threads must fail the launch");
    }

    #[test]
    fn mma_tf32_m16n8k8_matches_the_per_element_product() {
        let Some(be) = backend("mma_tf32") else {
            return;
        };
        let (e, ok) = run_mma(&be, false, 1, 0, 32);
        assert!(ok && e <= 1.0, "tf32 mma (cvt.rna operands): {e:.3}");
        // Raw FP32 bits: the low 13 mantissa bits are ignored (truncation), not rounded.
        let (e, ok) = run_mma(&be, false, 0, 0, 32);
        assert!(ok && e <= 1.0, "tf32 mma (unconverted operands): {e:.3}");
        let (e, _) = run_mma(&be, false, 1, 1, 32);
        assert!(
            e > 1.0,
            "planted fault (lanes 5 and 6 swap A) not caught: {e:.3}"
        );
    }

    /// The b16 value of element (r, c) of matrix m in the self-test's input.
    fn ldm_value(m: usize, r: usize, c: usize) -> u32 {
        (1000 + 64 * m + 8 * r + c) as u32
    }

    /// 0: the registers match the layout; `Err` when the launch failed.
    fn run_ldmatrix(
        be: &CudaBackend,
        count: i32,
        trans: bool,
        fault: i32,
    ) -> Result<usize, String> {
        let src: Vec<f32> = (0..256)
            .map(|e| ldm_value(e / 64, (e / 8) % 8, e % 8) as f32)
            .collect();
        let (sb, ob) = (buf(be, &src), buf(be, &[0.0; 128]));
        be.launch_raw(
            "tc_selftest_ldmatrix",
            [1, 1, 1],
            [32, 1, 1],
            &[
                RawArg::Buf(&sb, 0),
                RawArg::Buf(&ob, 0),
                RawArg::Int(count),
                RawArg::Int(trans as i32),
                RawArg::Int(fault),
            ],
        )
        .map_err(|e| e.to_string())?;
        let out: Vec<u32> = read(be, &ob).iter().map(|x| x.to_bits()).collect();
        let mut wrong = 0;
        for l in 0..32 {
            for i in 0..4 {
                let want = if i >= count as usize {
                    0
                } else {
                    let (g, t) = (l / 4, l % 4);
                    let (lo, hi) = if trans {
                        (ldm_value(i, 2 * t, g), ldm_value(i, 2 * t + 1, g))
                    } else {
                        (ldm_value(i, g, 2 * t), ldm_value(i, g, 2 * t + 1))
                    };
                    lo | (hi << 16)
                };
                if out[l * 4 + i] != want {
                    wrong += 1;
                }
            }
        }
        Ok(wrong)
    }

    #[test]
    fn ldmatrix_delivers_the_documented_fragments() {
        let Some(be) = backend("ldmatrix") else {
            return;
        };
        for count in [2, 4] {
            for trans in [false, true] {
                let what = format!("ldmatrix x{count}{}", if trans { ".trans" } else { "" });
                assert_eq!(run_ldmatrix(&be, count, trans, 0), Ok(0), "{what}");
                let planted = run_ldmatrix(&be, count, trans, 1);
                assert!(
                    matches!(planted, Ok(w) if w > 0),
                    "{what}: planted fault (lane 3 passes the wrong row) not caught: {planted:?}"
                );
            }
        }
        for (fault, what) in [(2, "misaligned row address"), (3, "global-memory address")] {
            let r = run_ldmatrix(&be, 4, false, fault);
            assert!(
                matches!(&r, Err(e) if e.contains("tc_selftest_ldmatrix")),
                "an ldmatrix with a {what} must fail the launch, naming the kernel: {r:?}"
            );
        }
    }

    /// The three snapshots of the self-test's shared buffer, or the launch's error.
    fn run_cp_async(be: &CudaBackend, n: usize, fault: i32) -> Result<Vec<f32>, String> {
        let src: Vec<f32> = (0..160).map(|i| (i + 1) as f32).collect();
        let (sb, ob) = (buf(be, &src), buf(be, &[0.0; 480]));
        be.launch_raw(
            "tc_selftest_cp_async",
            [1, 1, 1],
            [32, 1, 1],
            &[
                RawArg::Buf(&sb, 0),
                RawArg::Buf(&ob, 0),
                RawArg::Int(n as i32),
                RawArg::Int(fault),
            ],
        )
        .map_err(|e| e.to_string())?;
        Ok(read(be, &ob))
    }

    /// What the snapshots must hold: nothing landed before a wait, group 0 after
    /// `cp_async_wait<1>`, both after `cp_async_wait<0>`; zeros past `n`.
    fn cp_async_expected(n: usize) -> Vec<f32> {
        let landed = |e: usize| if e < n { (e + 1) as f32 } else { 0.0 };
        let mut v = vec![-1.0; 160];
        v.extend((0..160).map(|e| if e < 128 { landed(e) } else { -1.0 }));
        v.extend((0..160).map(landed));
        v
    }

    #[test]
    fn cp_async_lands_at_the_wait_with_zero_fill() {
        let Some(be) = backend("cp_async") else {
            return;
        };
        // n = 126: thread 31's 16-byte copy is half zero-fill and group 1 all zero-fill;
        // n = 141: group 0 whole, group 1 partly.
        for n in [126, 141] {
            assert_eq!(
                run_cp_async(&be, n, 0).as_deref(),
                Ok(&cp_async_expected(n)[..]),
                "n = {n}"
            );
        }
        for (fault, what) in [(1, "a missing cp_async_wait"), (2, "an off-by-one mask")] {
            let r = run_cp_async(&be, 126, fault);
            assert!(
                r.as_deref() != Ok(&cp_async_expected(126)[..]),
                "planted fault ({what}) not caught"
            );
        }
        for (fault, what) in [
            (3, "a copy never committed"),
            (4, "a wait with no commit before it"),
            (5, "a thread exiting with a copy in flight"),
            (6, "a wait while a copy is not committed"),
        ] {
            let r = run_cp_async(&be, 126, fault);
            assert!(
                matches!(&r, Err(e) if e.contains("tc_selftest_cp_async")),
                "{what} must fail the launch, naming the kernel: {r:?}"
            );
        }
    }

    /// cvt.rna.tf32 (ties away from zero) and cvt.rn.bf16x2 (ties to even, `lo` in the low
    /// half, NaN canonical) on exact ties, near-ties, NaN and infinities, against the bits
    /// computed here; truncating instead (the planted fault) fails.
    #[test]
    fn conversions_round_as_documented() {
        let Some(be) = backend("cvt") else {
            return;
        };
        let x: Vec<f32> = [
            0x3f80_1000u32, // tf32 tie (low 13 bits = 0x1000): away -> 0x3f80_2000
            0x3f80_3000,    // tf32 tie, odd kept bit: away again
            0x3f80_0fff,    // just below the tie: down
            0x3f80_8000,    // bf16 tie, even kept bit: stays 0x3f80
            0x3f81_8000,    // bf16 tie, odd kept bit: up to 0x3f82
            0x3f80_8001,    // above the tie: up
            0x7fc0_0001,    // NaN
            0x7f80_0000,    // +inf
            0x7f7f_ffff,    // largest finite: rounds to inf in bf16, to inf in tf32 (away)
        ]
        .iter()
        .map(|&u| f32::from_bits(u))
        .collect();
        let n = x.len();
        let run = |fault: i32| -> Vec<u32> {
            let (xb, ob) = (buf(&be, &x), buf(&be, &vec![0.0; 2 * n]));
            be.launch_raw(
                "tc_selftest_cvt",
                [1, 1, 1],
                [32, 1, 1],
                &[
                    RawArg::Buf(&xb, 0),
                    RawArg::Buf(&ob, 0),
                    RawArg::Int(n as i32),
                    RawArg::Int(fault),
                ],
            )
            .expect("launch");
            read(&be, &ob).iter().map(|v| v.to_bits()).collect()
        };
        let bf16_bits = |v: f32| -> u32 {
            if v.is_nan() {
                0x7fff
            } else {
                bf16(v).to_bits() >> 16
            }
        };
        let want: Vec<u32> = x
            .iter()
            .flat_map(|&v| {
                let t = if v.is_nan() {
                    v.to_bits()
                } else {
                    tf32_rna(v).to_bits()
                };
                [t, bf16_bits(v) | (bf16_bits(-v) << 16)]
            })
            .collect();
        let got = run(0);
        for i in 0..n {
            let tf = got[2 * i];
            if x[i].is_nan() {
                assert!(f32::from_bits(tf).is_nan(), "tf32 of NaN: {tf:#x}");
            } else {
                assert_eq!(tf, want[2 * i], "tf32 of {:#x}", x[i].to_bits());
            }
            assert_eq!(
                got[2 * i + 1],
                want[2 * i + 1],
                "bf16x2 of {:#x}",
                x[i].to_bits()
            );
        }
        assert_eq!(want[0], 0x3f80_2000);
        assert_eq!(want[7] & 0xffff, 0x3f80);
        assert_eq!(want[9] & 0xffff, 0x3f82);
        assert_ne!(run(1), got, "planted fault (truncation) not caught");
    }
}
