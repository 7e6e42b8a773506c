//! Bad input for softmax, softmax_backward, the embeddings and the cross-entropy.

use andrea_core::{Backend, View, IGNORE_INDEX};

use super::{filled, Expect};
use crate::suite::{id_buffer, Case, Config};

/// softmax, softmax_backward.
pub fn bad_input_softmax<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_softmax");
    let (xb, ob) = (filled(be, 24)?, filled(be, 24)?);
    let v = |buf, off, d: &[usize]| View::new(buf, off, d);
    let op = &["softmax"];
    // [2 heads, 3 queries, 4 keys]: a causal offset may be 0 or 1.
    let (xv, ov) = (v(&xb, 0, &[2, 3, 4]), v(&ob, 0, &[2, 3, 4]));
    x.ok("softmax", || be.softmax(xv, ov, 0.5, Some(1)));
    x.ok("softmax in place", || be.softmax(xv, xv, 0.5, None));
    x.err(op, "softmax: causal offset 2 + 3 queries > 4 keys", || {
        be.softmax(xv, ov, 0.5, Some(2))
    });
    x.err(op, "softmax: causal offset usize::MAX", || {
        be.softmax(xv, ov, 0.5, Some(usize::MAX))
    });
    x.err(
        op,
        "softmax: causal mask with more queries than keys",
        || be.softmax(v(&xb, 0, &[4, 3]), v(&ob, 0, &[4, 3]), 1.0, Some(0)),
    );
    x.err(op, "softmax: out [2, 4, 3] for x [2, 3, 4]", || {
        be.softmax(xv, v(&ob, 0, &[2, 4, 3]), 0.5, None)
    });
    x.err(op, "softmax: out overlaps x", || {
        be.softmax(v(&xb, 0, &[2, 4]), v(&xb, 4, &[2, 4]), 0.5, None)
    });
    x.err(op, "softmax: scale NaN", || {
        be.softmax(xv, ov, f32::NAN, None)
    });
    x.err(op, "softmax: scale infinite", || {
        be.softmax(xv, ov, f32::INFINITY, None)
    });
    x.err(op, "softmax: zero-sized", || {
        be.softmax(v(&xb, 0, &[3, 0]), v(&ob, 0, &[3, 0]), 1.0, None)
    });
    x.err(op, "softmax: x past the buffer end", || {
        be.softmax(v(&xb, 1, &[2, 3, 4]), ov, 1.0, None)
    });

    let op = &["softmax_backward"];
    let dp = filled(be, 24)?;
    let dpv = v(&dp, 0, &[2, 3, 4]);
    x.ok("softmax_backward", || be.softmax_backward(xv, dpv, ov, 0.5));
    x.ok("softmax_backward in place", || {
        be.softmax_backward(xv, dpv, dpv, 0.5)
    });
    x.err(op, "softmax_backward: dx is probs", || {
        be.softmax_backward(xv, dpv, xv, 0.5)
    });
    x.err(
        op,
        "softmax_backward: dprobs [2, 12] for probs [2, 3, 4]",
        || be.softmax_backward(xv, v(&dp, 0, &[2, 12]), ov, 0.5),
    );
    x.err(op, "softmax_backward: dx overlaps dprobs", || {
        be.softmax_backward(
            v(&xb, 0, &[2, 4]),
            v(&dp, 0, &[2, 4]),
            v(&dp, 2, &[2, 4]),
            0.5,
        )
    });
    x.finish()
}

/// embedding, embedding_backward.
pub fn bad_input_embedding<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_embedding");
    // B 2, T 3, C 4, V 5, T_ctx 4.
    let ids = id_buffer(be, &[0, 1, 4, 2, 3, 0])?;
    let bad_ids = id_buffer(be, &[0, 1, 5, 2, 3, 0])?;
    let (wte, wpe, out) = (filled(be, 20)?, filled(be, 16)?, filled(be, 24)?);
    let v = |buf, off, d: &[usize]| View::new(buf, off, d);
    let (iv, ev, pv, ov) = (
        View::new(&ids, 0, [6]),
        v(&wte, 0, &[5, 4]),
        v(&wpe, 0, &[4, 4]),
        v(&out, 0, &[2, 3, 4]),
    );
    let op = &["embedding"];
    x.ok("embedding", || be.embedding(iv, ev, pv, ov, 1));
    x.err(op, "embedding: id 5 with a vocabulary of 5", || {
        be.embedding(View::new(&bad_ids, 0, [6]), ev, pv, ov, 0)
    });
    x.err(op, "embedding: positions 2..5 with a context of 4", || {
        be.embedding(iv, ev, pv, ov, 2)
    });
    x.err(op, "embedding: position offset usize::MAX", || {
        be.embedding(iv, ev, pv, ov, usize::MAX)
    });
    x.err(op, "embedding: out of rank 2", || {
        be.embedding(iv, ev, pv, v(&out, 0, &[6, 4]), 0)
    });
    x.err(op, "embedding: wte with 5 channels for 4", || {
        be.embedding(iv, v(&wte, 0, &[4, 5]), pv, ov, 0)
    });
    x.err(op, "embedding: 5 ids for B·T = 6", || {
        be.embedding(View::new(&ids, 0, [5]), ev, pv, ov, 0)
    });
    x.err(op, "embedding: ids past the buffer end", || {
        be.embedding(View::new(&ids, 1, [6]), ev, pv, ov, 0)
    });
    let shared = filled(be, 44)?;
    let overlapping = (v(&shared, 0, &[5, 4]), v(&shared, 10, &[2, 3, 4]));
    x.ok("embedding, wte and out in one buffer", || {
        be.embedding(iv, ev, pv, v(&shared, 20, &[2, 3, 4]), 0)
    });
    x.err(op, "embedding: out overlaps wte", || {
        be.embedding(iv, overlapping.0, pv, overlapping.1, 0)
    });
    x.err(op, "embedding: zero channels", || {
        be.embedding(
            iv,
            v(&wte, 0, &[5, 0]),
            v(&wpe, 0, &[4, 0]),
            v(&out, 0, &[2, 3, 0]),
            0,
        )
    });

    let op = &["embedding_backward"];
    let (dwte, dwpe) = (filled(be, 20)?, filled(be, 16)?);
    let (dev, dpv) = (v(&dwte, 0, &[5, 4]), v(&dwpe, 0, &[4, 4]));
    x.ok("embedding_backward", || {
        be.embedding_backward(iv, ov, dev, dpv)
    });
    x.err(
        op,
        "embedding_backward: id 5 with a vocabulary of 5",
        || be.embedding_backward(View::new(&bad_ids, 0, [6]), ov, dev, dpv),
    );
    x.err(op, "embedding_backward: dwte with 3 channels for 4", || {
        be.embedding_backward(iv, ov, v(&dwte, 0, &[5, 3]), dpv)
    });
    x.err(op, "embedding_backward: dwte overlaps dout", || {
        be.embedding_backward(iv, ov, v(&out, 4, &[5, 4]), dpv)
    });
    x.err(op, "embedding_backward: dwpe overlaps dwte", || {
        be.embedding_backward(iv, ov, dev, v(&dwte, 4, &[4, 4]))
    });
    x.err(op, "embedding_backward: context 2 < T = 3", || {
        be.embedding_backward(iv, ov, dev, v(&dwpe, 0, &[2, 4]))
    });
    x.finish()
}

/// softmax_cross_entropy.
pub fn bad_input_loss<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_loss");
    // N 3 rows of Vp 5, vocab 4.
    let targets = id_buffer(be, &[0, IGNORE_INDEX, 3])?;
    let bad = id_buffer(be, &[0, 4, 3])?;
    let (zb, lb, db) = (filled(be, 16)?, filled(be, 4)?, filled(be, 16)?);
    let v = |buf, off, d: &[usize]| View::new(buf, off, d);
    let (zv, tv, lv, dv) = (
        v(&zb, 0, &[3, 5]),
        View::new(&targets, 0, [3]),
        v(&lb, 0, &[3]),
        v(&db, 0, &[3, 5]),
    );
    let op = &["softmax_cross_entropy"];
    let ce = |z, t, vocab, l, d| be.softmax_cross_entropy(z, t, vocab, l, d, 1.0);
    x.ok("softmax_cross_entropy", || ce(zv, tv, 4, lv, Some(dv)));
    x.ok("softmax_cross_entropy, gradient over the logits", || {
        ce(zv, tv, 4, lv, Some(zv))
    });
    x.err(op, "softmax_cross_entropy: target 4 with vocab 4", || {
        ce(zv, View::new(&bad, 0, [3]), 4, lv, None)
    });
    x.err(op, "softmax_cross_entropy: vocab 0", || {
        ce(zv, tv, 0, lv, None)
    });
    x.err(op, "softmax_cross_entropy: vocab 6 > 5 columns", || {
        ce(zv, tv, 6, lv, None)
    });
    x.err(op, "softmax_cross_entropy: 2 targets for 3 rows", || {
        ce(zv, View::new(&targets, 0, [2]), 4, lv, None)
    });
    x.err(op, "softmax_cross_entropy: losses of 4 for 3 rows", || {
        ce(zv, tv, 4, v(&lb, 0, &[4]), None)
    });
    x.err(op, "softmax_cross_entropy: losses overlap logits", || {
        ce(zv, tv, 4, v(&zb, 13, &[3]), None)
    });
    x.err(op, "softmax_cross_entropy: dlogits overlap logits", || {
        ce(zv, tv, 4, lv, Some(v(&zb, 1, &[3, 5])))
    });
    x.err(op, "softmax_cross_entropy: dlogits overlap losses", || {
        ce(zv, tv, 4, v(&db, 0, &[3]), Some(dv))
    });
    x.err(op, "softmax_cross_entropy: dlogits [5, 3]", || {
        ce(zv, tv, 4, lv, Some(v(&db, 0, &[5, 3])))
    });
    x.err(
        op,
        "softmax_cross_entropy: logits past the buffer end",
        || ce(v(&zb, 2, &[3, 5]), tv, 4, lv, None),
    );
    x.finish()
}
