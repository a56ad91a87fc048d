#!/bin/bash
# bench/run.sh - the CPU benchmark of docs/performance.md: a 16B-shaped model cut to 8 layers
# (1 dense + 7 MoE), random weights, FP8 and BF16, prefill 512 and decode 32
# (one sequence, and 8 decoding together) at context depths 0 and 4096.
# Checkpoints go to .cache/bench (git-ignored).
#   bench/run.sh [extra dsv3 bench flags, e.g. --json]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DSV3_BIN:-build/dsv3}
CFG=bench/config_16B_8L.json
for dt in fp8 bf16; do
    dir=.cache/bench/16B_8L_$dt
    [ -f "$dir/model.safetensors.index.json" ] || "$BIN" synth --config $CFG --out "$dir" --dtype $dt
    "$BIN" bench --ckpt-path "$dir" --config $CFG -p 512 -n 32 -d 0,4096 --seqs 1,8 -r 3 "$@"
done
