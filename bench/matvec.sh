#!/bin/bash
# bench/matvec.sh - builds and runs bench/bench_matvec.c against the library in
# build/: the decode matvec on 1 GiB of anonymous memory and of a checkpoint
# shard (page cache), beside the measured read bandwidth.
#   bench/matvec.sh [fp8|bf16 [K]]   (K: the row length, 2048 unless given)
set -euo pipefail
cd "$(dirname "$0")/.."
dt=${1:-fp8}
out=build/bench_matvec
gcc -std=c11 -O2 -D_GNU_SOURCE -fopenmp -Isrc -Iinclude bench/bench_matvec.c build/libdsv3.a \
    $(pkg-config --libs jansson libpcre2-8) -lm -o $out
shard=$(ls .cache/bench/16B_8L_$dt/model-00001-of-*.safetensors 2>/dev/null | head -1 || true)
$out "${shard:--}" "$dt" "${2:-2048}"
