#!/bin/bash
# bench/sampler.sh - builds and runs bench/bench_sampler.c against the library in
# build/: the sampler's cost per token at DeepSeek-V3's vocabulary.
#   bench/sampler.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/bench_sampler
gcc -std=c11 -O2 -D_GNU_SOURCE -fopenmp -Wall -Wextra -Werror -Isrc -Iinclude bench/bench_sampler.c \
    build/libdsv3.a $(pkg-config --libs jansson libpcre2-8) -lm -o $out
$out "$@"
