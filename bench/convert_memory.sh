#!/usr/bin/env bash
# convert_memory.sh - peak resident memory of `dsv3 convert` (and optionally
# `dsv3 cast-bf16`) on a multi-GB synthetic checkpoint, next to its size.
#
# The checkpoint is the 16B shape (configs/config_16B.json) cut to 6 layers
# (1 dense + 5 MoE with 64 experts), in FP8: about 3.7 GB. convert streams
# each tensor from the mapping to the output files and drops the source
# pages afterwards, so its peak RSS should stay near one tensor plus the
# write buffers, far below the checkpoint size.
#
# usage: bench/convert_memory.sh [--layers N] [--dtype fp8|bf16] [--with-cast]
#   DSV3_BIN (default build/dsv3), TMPDIR (scratch; everything is removed at exit)
set -euo pipefail
BIN=${DSV3_BIN:-build/dsv3}
LAYERS=6
DTYPE=fp8
CAST=0
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) LAYERS=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --with-cast) CAST=1; shift ;;
    *) echo "usage: $0 [--layers N] [--dtype fp8|bf16] [--with-cast]" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "$BIN not found (build first or set DSV3_BIN)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time (GNU time) is needed for peak RSS" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dsv3-bench-XXXXXX")
trap 'rm -rf "$TMP"' EXIT

cat > "$TMP/config.json" <<JSON
{"vocab_size": 102400, "dim": 2048, "inter_dim": 10944, "moe_inter_dim": 1408, "n_layers": $LAYERS,
 "n_dense_layers": 1, "n_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
 "n_activated_experts": 6, "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64, "v_head_dim": 128, "mscale": 0.707}
JSON

# Peak RSS (KiB) and wall seconds of a command, from GNU time -v.
measure() {
  /usr/bin/time -v "$@" 2> "$TMP/time.txt" >/dev/null || { cat "$TMP/time.txt" >&2; exit 1; }
  RSS_KB=$(awk -F: '/Maximum resident set size/ {gsub(/ /,"",$2); print $2}' "$TMP/time.txt")
  WALL=$(awk '/Elapsed \(wall clock\)/ {print $NF}' "$TMP/time.txt" | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
}

measure "$BIN" synth --config "$TMP/config.json" --out "$TMP/hf" --dtype "$DTYPE" --shard-size-mb 1024
CKPT=$(du -sb "$TMP/hf" | cut -f1)
printf "checkpoint: 16B shape, %s layers, %s: %.2f GB in %s shards\n" "$LAYERS" "$DTYPE" \
  "$(echo "$CKPT / 1000000000" | bc -l)" "$(ls "$TMP/hf"/*.safetensors | wc -l)"
printf "synth:      %6.1f s  %7.1f MB/s  peak RSS %7.1f MB  (%d threads)\n" "$WALL" \
  "$(echo "$CKPT / $WALL / 1000000" | bc -l)" "$(echo "$RSS_KB / 1024" | bc -l)" "$(nproc)"

measure "$BIN" convert --hf-ckpt-path "$TMP/hf" --save-path "$TMP/mp2" --n-experts 64 --model-parallel 2
printf "convert:    %6.1f s  %7.1f MB/s  peak RSS %7.1f MB  = %.2f%% of the checkpoint\n" "$WALL" \
  "$(echo "$CKPT / $WALL / 1000000" | bc -l)" "$(echo "$RSS_KB / 1024" | bc -l)" "$(echo "$RSS_KB * 1024 * 100 / $CKPT" | bc -l)"
rm -rf "$TMP/mp2"

if [ "$CAST" = 1 ] && [ "$DTYPE" = fp8 ]; then
  measure "$BIN" cast-bf16 --input-fp8-hf-path "$TMP/hf" --output-bf16-hf-path "$TMP/bf16"
  printf "cast-bf16:  %6.1f s  %7.1f MB/s  peak RSS %7.1f MB  = %.2f%% of the checkpoint\n" "$WALL" \
    "$(echo "$CKPT / $WALL / 1000000" | bc -l)" "$(echo "$RSS_KB / 1024" | bc -l)" "$(echo "$RSS_KB * 1024 * 100 / $CKPT" | bc -l)"
fi
