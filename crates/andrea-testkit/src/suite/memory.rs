//! alloc, upload, download and fill: bit-exact, at any offset, leaving the rest of the
//! buffer alone.

use andrea_core::{Backend, View};
use proptest::prelude::*;

use super::{buffer, close, read, read_all, run, Case, Config, OrFail};
use crate::random::Rand;
use crate::reference::to_f64;
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
