#!/bin/bash
# bench/gemm.sh - builds and runs bench/bench_gemm.c against the library in
# build/: the prefill products of the 16B shapes beside the FMA peak measured
# in the same run.
#   bench/gemm.sh [fp8|bf16 [TOKENS [REPS [CASES]]]]   (threads: OMP_NUM_THREADS)
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/bench_gemm
gcc -std=c11 -O2 -D_GNU_SOURCE -fopenmp -Wall -Wextra -Werror -Isrc -Iinclude bench/bench_gemm.c \
    build/libdsv3.a $(pkg-config --libs jansson libpcre2-8) -lm -o $out
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} $out "$@"
