//! Every op's signature, once: [`crate::for_each_op!`], from which the decorators
//! ([`crate::timed::Timed`], `andrea_testkit::compare::Compare`) and the test backends
//! that wrap a backend implement the op traits.

/// Calls `$callback!` with every op of the ten op-family traits, by family, each with its
/// full signature less `&self`:
///
/// ```text
/// MemoryOps {
///     fn name() -> String;
///     fn alloc(len: usize) -> Result<Self::Buffer>;
///     ...
/// }
/// LinalgOps { ... }
/// ...
/// ```
///
/// so that a type wrapping a backend (a decorator, a backend with a planted fault)
/// implements every op from one list: its macro matches
/// `$($family:ident { $(fn $op:ident $args:tt -> $ret:ty;)* })*`, writes
/// `impl $family for Wrapper { .. }` (with `MemoryOps`'s three buffer types), and turns each
/// op into a method, typically by forwarding `$args` (`($($arg:ident: $ty:ty),*)`) to the
/// wrapped backend. An op the wrapper treats specially gets an arm of its own ahead of
/// the forwarding one, matched by the op's name (`(@op gelu $($sig:tt)*) => { .. }`);
/// an arm that expands to nothing keeps the trait's default. The `&self` receiver is the
/// caller's to write (a receiver and the `self` in the body must come from the same macro).
///
/// The traits are the specification and hold the docs; this is the only other place an
/// op's signature is written. The signatures name the types of [`crate::prelude`] and
/// [`crate::Result`], which the calling module imports. The method-level `where Self: ..`
/// bounds of the fused ops are left out: a wrapper of a whole [`crate::Backend`] meets them.
/// A new op goes into its trait and here, in the trait's order.
#[macro_export]
macro_rules! for_each_op {
    ($callback:ident) => {
        $callback! {
            MemoryOps {
                fn name() -> String;
                fn alloc(len: usize) -> Result<Self::Buffer>;
                fn alloc_ids(len: usize) -> Result<Self::IdBuffer>;
                fn alloc_bf16(len: usize) -> Result<Self::Bf16Buffer>;
                fn upload(src: &[f32], dst: Tensor<'_, Self>) -> Result<()>;
                fn download(src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()>;
                fn upload_ids(src: &[u32], dst: Ids<'_, Self>) -> Result<()>;
                fn synchronize() -> Result<()>;
                fn device_region(t: Tensor<'_, Self>) -> Result<Option<DeviceRegion>>;
                fn with_host_elements(
                    t: Tensor<'_, Self>,
                    f: &mut dyn FnMut(&mut [f32])
                ) -> Result<bool>;
                fn fill(dst: Tensor<'_, Self>, value: f32) -> Result<()>;
                fn copy(src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()>;
                fn to_bf16(src: Tensor<'_, Self>, dst: Bf16Tensor<'_, Self>) -> Result<()>;
                fn to_f32(src: Bf16Tensor<'_, Self>, dst: Tensor<'_, Self>) -> Result<()>;
                fn keep_bf16_weights(weights: Tensor<'_, Self>) -> Result<()>;
            }
            LinalgOps {
                fn matmul(
                    a: Mat<'_, Self>,
                    b: Mat<'_, Self>,
                    bias: Option<Tensor<'_, Self>>,
                    c: Mat<'_, Self>
                ) -> Result<()>;
                fn matmul_add(
                    a: Mat<'_, Self>,
                    b: Mat<'_, Self>,
                    bias: Option<Tensor<'_, Self>>,
                    c: Mat<'_, Self>
                ) -> Result<()>;
                fn matmul_scratch_len(m: usize, k: usize, n: usize) -> usize;
                fn bias_backward(dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()>;
                fn linear_gelu(
                    x: Mat<'_, Self>,
                    w: Mat<'_, Self>,
                    bias: Tensor<'_, Self>,
                    pre: Tensor<'_, Self>,
                    out: Tensor<'_, Self>
                ) -> Result<()>;
                fn matmul_gelu_backward(
                    dy: Mat<'_, Self>,
                    w: Mat<'_, Self>,
                    pre: Tensor<'_, Self>,
                    dpre: Tensor<'_, Self>
                ) -> Result<()>;
                fn mlp_forward(
                    x: Tensor<'_, Self>,
                    fc: LinearOf<'_, Self>,
                    pre: Tensor<'_, Self>,
                    act: Tensor<'_, Self>,
                    proj: LinearOf<'_, Self>,
                    out: Tensor<'_, Self>
                ) -> Result<()>;
            }
            ElementwiseOps {
                fn add(
                    a: Tensor<'_, Self>,
                    b: Tensor<'_, Self>,
                    out: Tensor<'_, Self>
                ) -> Result<()>;
                fn scale(x: Tensor<'_, Self>, alpha: f32) -> Result<()>;
                fn gelu(x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()>;
                fn gelu_backward(
                    x: Tensor<'_, Self>,
                    dout: Tensor<'_, Self>,
                    dx: Tensor<'_, Self>
                ) -> Result<()>;
            }
            LayerNormOps {
                fn layernorm(
                    x: Tensor<'_, Self>,
                    gamma: Tensor<'_, Self>,
                    beta: Tensor<'_, Self>,
                    out: Tensor<'_, Self>,
                    mean: Tensor<'_, Self>,
                    rstd: Tensor<'_, Self>,
                    eps: f32
                ) -> Result<()>;
                fn layernorm_backward(
                    x: Tensor<'_, Self>,
                    gamma: Tensor<'_, Self>,
                    mean: Tensor<'_, Self>,
                    rstd: Tensor<'_, Self>,
                    dout: Tensor<'_, Self>,
                    dx: Tensor<'_, Self>,
                    dgamma: Tensor<'_, Self>,
                    dbeta: Tensor<'_, Self>
                ) -> Result<()>;
                fn residual_layernorm(
                    a: Tensor<'_, Self>,
                    b: Tensor<'_, Self>,
                    residual: Tensor<'_, Self>,
                    gamma: Tensor<'_, Self>,
                    beta: Tensor<'_, Self>,
                    out: Tensor<'_, Self>,
                    mean: Tensor<'_, Self>,
                    rstd: Tensor<'_, Self>,
                    eps: f32
                ) -> Result<()>;
            }
            SoftmaxOps {
                fn softmax(
                    x: Tensor<'_, Self>,
                    out: Tensor<'_, Self>,
                    scale: f32,
                    causal_offset: Option<usize>
                ) -> Result<()>;
                fn softmax_backward(
                    probs: Tensor<'_, Self>,
                    dprobs: Tensor<'_, Self>,
                    dx: Tensor<'_, Self>,
                    scale: f32
                ) -> Result<()>;
            }
            EmbeddingOps {
                fn embedding(
                    ids: Ids<'_, Self>,
                    wte: Tensor<'_, Self>,
                    wpe: Tensor<'_, Self>,
                    out: Tensor<'_, Self>,
                    pos_offset: usize
                ) -> Result<()>;
                fn embedding_backward(
                    ids: Ids<'_, Self>,
                    dout: Tensor<'_, Self>,
                    dwte: Tensor<'_, Self>,
                    dwpe: Tensor<'_, Self>
                ) -> Result<()>;
            }
            LossOps {
                fn softmax_cross_entropy(
                    logits: Tensor<'_, Self>,
                    targets: Ids<'_, Self>,
                    vocab: usize,
                    losses: Tensor<'_, Self>,
                    dlogits: Option<Tensor<'_, Self>>,
                    grad_scale: f32
                ) -> Result<()>;
            }
            OptimOps {
                fn sum_squares(x: Tensor<'_, Self>) -> Result<f64>;
                fn adamw(
                    param: Tensor<'_, Self>,
                    grad: Tensor<'_, Self>,
                    m: Tensor<'_, Self>,
                    v: Tensor<'_, Self>,
                    step: &AdamWStep
                ) -> Result<()>;
                fn clip_scale(
                    grad: Tensor<'_, Self>,
                    mean: f64,
                    max_norm: Option<f32>,
                    guard: Option<Tensor<'_, Self>>,
                    out: Tensor<'_, Self>
                ) -> Result<()>;
                fn adamw_scaled(
                    param: Tensor<'_, Self>,
                    grad: Tensor<'_, Self>,
                    m: Tensor<'_, Self>,
                    v: Tensor<'_, Self>,
                    step: &AdamWStep,
                    scale: Tensor<'_, Self>
                ) -> Result<()>;
            }
            AttentionOps {
                fn attention_workspace_len(shape: AttentionShape) -> usize;
                fn kv_heads_apart() -> bool;
                fn attention_backward_scratch_len(shape: AttentionShape) -> usize;
                fn attention_forward(
                    q: HeadsOf<'_, Self>,
                    k: HeadsOf<'_, Self>,
                    v: HeadsOf<'_, Self>,
                    out: HeadsOf<'_, Self>,
                    workspace: Tensor<'_, Self>,
                    pos_offset: usize
                ) -> Result<()>;
                fn attention_backward(
                    q: HeadsOf<'_, Self>,
                    k: HeadsOf<'_, Self>,
                    v: HeadsOf<'_, Self>,
                    out: HeadsOf<'_, Self>,
                    dout: HeadsOf<'_, Self>,
                    dq: HeadsOf<'_, Self>,
                    dk: HeadsOf<'_, Self>,
                    dv: HeadsOf<'_, Self>,
                    workspace: Tensor<'_, Self>,
                    scratch: Tensor<'_, Self>
                ) -> Result<()>;
                fn decode_attention(
                    x: Tensor<'_, Self>,
                    qkv_w: LinearOf<'_, Self>,
                    qkv: Tensor<'_, Self>,
                    keys: HeadsOf<'_, Self>,
                    values: HeadsOf<'_, Self>,
                    atty: Tensor<'_, Self>,
                    workspace: Tensor<'_, Self>,
                    proj: LinearOf<'_, Self>,
                    out: Tensor<'_, Self>
                ) -> Result<()>;
            }
            DecodeOps {
                fn decode_blocks(blocks: &[DecodeBlockOf<'_, Self>], eps: f32) -> Result<()>;
            }
        }
    };
}

/// The list against the traits: every method of each op-family trait, in the trait's
/// order, and nothing else. (A wrapper built from the list fails to compile where a
/// signature differs or a required op is missing; an op with a default that the list
/// lacked would compile, and every wrapper would silently run that default instead of its
/// backend's op.)
#[cfg(test)]
mod tests {
    const TRAITS: &[(&str, &str)] = &[
        ("MemoryOps", include_str!("memory.rs")),
        ("LinalgOps", include_str!("linalg.rs")),
        ("ElementwiseOps", include_str!("elementwise.rs")),
        ("LayerNormOps", include_str!("layernorm.rs")),
        ("SoftmaxOps", include_str!("softmax.rs")),
        ("EmbeddingOps", include_str!("embedding.rs")),
        ("LossOps", include_str!("loss.rs")),
        ("OptimOps", include_str!("optim.rs")),
        ("AttentionOps", include_str!("attention.rs")),
        ("DecodeOps", include_str!("decode.rs")),
    ];

    /// The text from the line holding `open` to the `}` that closes it (the first line
    /// at that line's indent that starts with `}`).
    fn block<'a>(src: &'a str, open: &str) -> &'a str {
        let start = src.find(open).unwrap_or_else(|| panic!("no `{open}`"));
        let line_start = src[..start].rfind('\n').map_or(0, |i| i + 1);
        let close = format!("\n{}}}", &src[line_start..start]);
        let end = src[start..]
            .find(&close)
            .unwrap_or_else(|| panic!("`{open}` is not closed"));
        &src[start..start + end]
    }

    /// The names of the `fn`s that open a line.
    fn fns(block: &str) -> Vec<&str> {
        block
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("fn "))
            .map(|rest| rest.split(['(', '<']).next().unwrap_or(rest))
            .collect()
    }

    #[test]
    fn the_list_has_every_op_of_every_trait_in_order() {
        let src = include_str!("list.rs");
        let list = &src[src.find("$callback! {").expect("the list")..];
        let families: Vec<&str> = TRAITS.iter().map(|&(family, _)| family).collect();
        let listed: Vec<&str> = list
            .lines()
            .filter_map(|l| l.trim().strip_suffix(" {"))
            .filter(|w| w.ends_with("Ops"))
            .collect();
        assert_eq!(listed, families, "the list's families");
        for &(family, src) in TRAITS {
            let want = fns(block(src, &format!("pub trait {family}")));
            assert!(!want.is_empty(), "{family}: no methods found");
            let got = fns(block(list, &format!("{family} {{")));
            assert_eq!(got, want, "{family}: the op list differs from the trait");
        }
    }
}
