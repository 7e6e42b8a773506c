#!/bin/sh
# Same binary (main at the fused-attention commit), attention by ANDREA_ATTENTION_PRODUCTS,
# sgemm (the blocked path, the previous default) and fused alternating, three rounds each.
A=${ANDREA:-target/release/andrea}
for round in 1 2 3; do
  for p in sgemm fused; do
    echo "\$ ANDREA_ATTENTION_PRODUCTS=$p andrea bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile"
    ANDREA_ATTENTION_PRODUCTS=$p $A bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1
  done
done
for round in 1 2 3; do
  for p in sgemm fused; do
    echo "\$ ANDREA_ATTENTION_PRODUCTS=$p andrea bench train --config configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 4 --warmup 1 --profile"
    ANDREA_ATTENTION_PRODUCTS=$p $A bench train --config configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 4 --warmup 1 --profile 2>&1
  done
done
