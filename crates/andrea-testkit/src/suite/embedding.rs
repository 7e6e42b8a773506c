//! embedding and embedding_backward: `B·T` token ids (with repeats: small vocabularies)
//! over `wte: [V, C]`, `wpe: [T_ctx, C]` in [-1, 1], at any valid position offset.

use andrea_core::{Backend, View};
use proptest::prelude::*;

use super::linalg::poison;
use super::{
    buffer, close, id_buffer, read_all, run, size, size_or_big, to_f64, view, Case, Config, OrFail,
};
use crate::random::Rand;
use crate::{reference, tol};

#[derive(Debug, Clone)]
struct EmbCase {
    b: usize,
    t: usize,
    c: usize,
    vocab: usize,
    context: usize,
    pos_offset: usize,
    offset: usize,
    seed: u64,
}

fn emb_case(max_vocab: usize) -> impl Strategy<Value = EmbCase> {
    let dims = (size(4), size(16), size_or_big(64, 800), size(max_vocab));
    (dims, 0..5usize, 0.0f64..1.0, 0..3usize, any::<u64>()).prop_map(
        |((b, t, c, vocab), extra, frac, offset, seed)| {
            let pos_offset = ((frac * (extra + 1) as f64) as usize).min(extra);
            EmbCase {
                b,
                t,
                c,
                vocab,
                context: t + extra,
                pos_offset,
                offset,
                seed,
            }
        },
    )
}

/// `out[b, t] = wte[ids[b, t]] + wpe[pos_offset + t]`.
pub fn embedding<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "embedding", emb_case(60), |cs| {
        let mut r = Rand::new(cs.seed);
        let (n, c, off) = (cs.b * cs.t, cs.c, cs.offset);
        let ids: Vec<u32> = (0..n + off).map(|_| r.below(cs.vocab) as u32).collect();
        let wte = r.vec(cs.vocab * c + off, -1.0, 1.0);
        let wpe = r.vec(cs.context * c + off, -1.0, 1.0);
        let out = poison(&mut r, n * c + 2 * off);
        let (wte_buf, wpe_buf, o_buf) = (buffer(be, &wte)?, buffer(be, &wpe)?, buffer(be, &out)?);
        let id_buf = id_buffer(be, &ids)?;
        be.embedding(
            View::new(&id_buf, off, [n]),
            view(&wte_buf, off, &[cs.vocab, c]),
            view(&wpe_buf, off, &[cs.context, c]),
            view(&o_buf, off, &[cs.b, cs.t, c]),
            cs.pos_offset,
        )
        .or_fail("embedding")?;

        let mut want = to_f64(&out);
        let (e64, p64) = (to_f64(&wte[off..]), to_f64(&wpe[off..]));
        let o = &mut want[off..off + n * c];
        reference::embedding(o, &ids[off..], &e64, &p64, cs.b, cs.t, c, cs.pos_offset);
        close(
            tol::one_rounding(),
            "embedding: out",
            &read_all(be, &o_buf)?,
            &want,
        )
    })
}

/// `dwte[ids[n]] += dout[n]`, `dwpe[t] += Σ_b dout[b, t]`, with many repeated ids.
pub fn embedding_backward<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "embedding_backward", emb_case(8), |cs| {
        let mut r = Rand::new(cs.seed);
        let (n, c, off) = (cs.b * cs.t, cs.c, cs.offset);
        let ids: Vec<u32> = (0..n + off).map(|_| r.below(cs.vocab) as u32).collect();
        let dout = r.vec(n * c + off, -1.0, 1.0);
        let dwte = r.vec(cs.vocab * c + 2 * off, -1.0, 1.0);
        let dwpe = r.vec(cs.context * c + 2 * off, -1.0, 1.0);
        let (d_buf, e_buf, p_buf) = (buffer(be, &dout)?, buffer(be, &dwte)?, buffer(be, &dwpe)?);
        let id_buf = id_buffer(be, &ids)?;
        be.embedding_backward(
            View::new(&id_buf, off, [n]),
            view(&d_buf, off, &[cs.b, cs.t, c]),
            view(&e_buf, off, &[cs.vocab, c]),
            view(&p_buf, off, &[cs.context, c]),
        )
        .or_fail("embedding_backward")?;

        let (mut want_e, mut want_p) = (to_f64(&dwte), to_f64(&dwpe));
        reference::embedding_backward(
            &mut want_e[off..off + cs.vocab * c],
            &mut want_p[off..off + cs.context * c],
            &to_f64(&dout[off..]),
            &ids[off..],
            cs.b,
            cs.t,
            c,
        );
        let t = tol::embedding_backward(n);
        close(
            t,
            "embedding_backward: dwte",
            &read_all(be, &e_buf)?,
            &want_e,
        )?;
        close(
            t,
            "embedding_backward: dwpe",
            &read_all(be, &p_buf)?,
            &want_p,
        )
    })
}
