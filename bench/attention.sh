#!/bin/bash
# bench/attention.sh - builds and runs bench/bench_attention.c against the
# library in build/: decode attention over a long context beside the FMA peak
# and the read bandwidth measured in the same run.
#   bench/attention.sh [CTX [REPS]]
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/bench_attention
gcc -std=c11 -O2 -D_GNU_SOURCE -fopenmp -Wall -Wextra -Werror -Isrc -Iinclude bench/bench_attention.c \
    build/libdsv3.a $(pkg-config --libs jansson libpcre2-8) -lm -o $out
$out "$@"
