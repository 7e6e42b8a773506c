#!/bin/sh
ANDREA_GEMM=gemm exec /tmp/andrea-q "$@"
