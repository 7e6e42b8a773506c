#!/bin/sh
ANDREA_SIMD=avx2 exec /tmp/andrea-dec-new "$@"
