//! alloc, upload, download and fill, and the conversions to and from BF16: bit-exact, at
//! any offset, leaving the rest of the buffer alone.

use andrea_core::{Backend, View};
use proptest::prelude::*;

use super::{buffer, close, read, read_all, run, Case, Config, OrFail};
use crate::random::Rand;
use crate::reference::{round_bf16, to_f64};
use crate::Tol;

/// A fresh buffer is zero; an upload to a sub-view, a download of a sub-view and a fill
/// of a sub-view touch exactly those elements, bit for bit.
pub fn memory<B: Backend>(be: &B, cfg: &Config) -> Case {
    let case = (
        1..5000usize,
        0.0f64..1.0,
        0.0f64..1.0,
        -1e3f32..1e3,
        any::<u64>(),
    );
    run(cfg, "memory", case, |(len, a, b, value, seed)| {
        let mut r = Rand::new(seed);
        let start = (a * len as f64) as usize % len;
        let count = 1 + (b * (len - start) as f64) as usize % (len - start);
        let buf = be.alloc(len).or_fail("alloc")?;
        close(
            Tol::EXACT,
            "alloc: zero-filled",
            &read_all(be, &buf)?,
            &vec![0.0; len],
        )?;

        // Random bit patterns: every exponent (subnormals included) and sign; no NaN,
        // since NaN payloads need not survive a copy.
        let data: Vec<f32> = (0..count)
            .map(|_| f32::from_bits(r.next_u64() as u32))
            .map(|x| if x.is_finite() { x } else { -0.0 })
            .collect();
        let sub = View::new(&buf, start, [count]);
        be.upload(&data, sub).or_fail("upload")?;
        let mut want = vec![0.0; len];
        want[start..start + count].copy_from_slice(&to_f64(&data));
        close(Tol::EXACT, "upload: buffer", &read_all(be, &buf)?, &want)?;
        close(
            Tol::EXACT,
            "download of a sub-view",
            &read(be, sub)?,
            &to_f64(&data),
        )?;

        let full = buffer(be, &r.vec(len, -1.0, 1.0))?;
        let before = read_all(be, &full)?;
        be.fill(View::new(&full, start, [count]), value)
            .or_fail("fill")?;
        let mut want = to_f64(&before);
        want[start..start + count].fill(value as f64);
        close(Tol::EXACT, "fill", &read_all(be, &full)?, &want)
    })
}

/// `to_bf16` rounds to nearest with ties to even at any offset (checked against bits
/// rounded by hand, [`round_bf16`]), `to_f32` widens exactly, a fresh BF16 buffer is
/// zero, and neither touches an element outside its view. The values: random bit
/// patterns (every exponent, subnormals, infinities) and exact ties of both parities,
/// halfway plus or minus one unit, and values that round past BF16's largest.
pub fn bf16_conversion<B: Backend>(be: &B, cfg: &Config) -> Case {
    let case = (1..3000usize, 0.0f64..1.0, 0.0f64..1.0, any::<u64>());
    run(cfg, "bf16_conversion", case, |(len, a, b, seed)| {
        let mut r = Rand::new(seed);
        let start = (a * len as f64) as usize % len;
        let count = 1 + (b * (len - start) as f64) as usize % (len - start);
        let data: Vec<f32> = (0..count)
            .map(|i| {
                let bits = r.next_u64() as u32;
                let x = match i % 4 {
                    // A tie (lower half exactly 0x8000), one unit either side of it.
                    1 => f32::from_bits((bits & 0xffff_0000) | 0x8000),
                    2 => f32::from_bits((bits & 0xffff_0000) | 0x8001),
                    3 => f32::from_bits((bits & 0xffff_0000) | 0x7fff),
                    _ => f32::from_bits(bits),
                };
                if x.is_nan() {
                    f32::MAX
                } else {
                    x
                }
            })
            .collect();

        let wide = buffer(be, &data)?;
        let narrow = be.alloc_bf16(len).or_fail("alloc_bf16")?;
        be.to_bf16(
            View::whole(&wide).slice(0, [count]),
            View::new(&narrow, start, [count]),
        )
        .or_fail("to_bf16")?;
        // The whole BF16 buffer back, into a poisoned FP32 buffer.
        let back = buffer(be, &r.vec(len, -1.0, 1.0))?;
        be.to_f32(View::whole(&narrow), View::whole(&back))
            .or_fail("to_f32")?;
        let mut want = vec![0.0; len];
        for (w, &x) in want[start..start + count].iter_mut().zip(&data) {
            *w = round_bf16(x) as f64;
        }
        close(
            Tol::EXACT,
            "to_bf16, widened back",
            &read_all(be, &back)?,
            &want,
        )?;

        // `to_f32` into a sub-view leaves the rest of its output alone.
        let out = buffer(be, &r.vec(len, -1.0, 1.0))?;
        let before = read_all(be, &out)?;
        be.to_f32(
            View::new(&narrow, start, [count]),
            View::new(&out, len - count, [count]),
        )
        .or_fail("to_f32 of a sub-view")?;
        let mut want_out = to_f64(&before);
        want_out[len - count..].copy_from_slice(&want[start..start + count]);
        close(
            Tol::EXACT,
            "to_f32 of a sub-view",
            &read_all(be, &out)?,
            &want_out,
        )?;

        // NaN stays NaN (its payload need not survive).
        let nan = buffer(be, &[f32::NAN, -f32::NAN])?;
        let nan_narrow = be.alloc_bf16(2).or_fail("alloc_bf16")?;
        be.to_bf16(View::whole(&nan), View::whole(&nan_narrow))
            .or_fail("to_bf16 of NaN")?;
        be.to_f32(View::whole(&nan_narrow), View::whole(&nan))
            .or_fail("to_f32 of NaN")?;
        let got = read_all(be, &nan)?;
        if !got.iter().all(|x| x.is_nan()) {
            return Err(TestCaseError::fail(format!(
                "to_bf16: NaN became {got:?}, want NaN"
            )));
        }
        Ok(())
    })
}
