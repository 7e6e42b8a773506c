#!/bin/bash
# usage: fk.sh binary threads [only]  -> gemm_kernels, gemm crate, CPU clock, tiny shapes (shape, median GFLOP/s per CPU-second, best)
bin=$1; th=$2; only=${3:-fwd_qkv,fwd_attn_proj,fwd_fc,bwd_dx_qkv,bwd_dx_attn_proj,fwd_lm_head}
echo "== $bin threads $th load $(cat /proc/loadavg)"
echo "\$ $bin --model tiny --threads $th --rounds 21 --clock cpu --kernels gemm --only $only"
$bin --model tiny --threads $th --rounds 21 --clock cpu --kernels gemm --only $only | sed -E 's/.*"shape": "([^"]*)".*"gflops": ([^,]*),.*"best_gflops": ([^,]*),.*/\1 \2 best \3/'
