#!/bin/sh
ANDREA_GEMM=avx512-queue exec /tmp/andrea-q "$@"
