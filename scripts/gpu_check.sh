#!/usr/bin/env bash
# gpu_check.sh - on the GPU machine, runs the prebuilt CUDA tests (and, later,
# benchmarks) from a build directory made elsewhere and carried along, and
# prints one table of results. Nothing is compiled here.
#
#   scripts/gpu_check.sh [BUILD_DIR]       (default build-cuda)
#
# Build first, on the development machine:
#   cmake -B build-cuda -DDSV3_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda -j
# GPU_CHECK_SANITIZE=1 also runs test_cuda_ops under compute-sanitizer (memcheck).
# Full logs go to $OUT/ when OUT is set (the device tool's output folder), else /tmp.
# Then bench_cuda_ops prints per-op times at DeepSeek-V3 shapes against the HBM roofline, and
# bench_cuda_sync (where built) the cost of one dependent step: launch boundaries against a
# persistent kernel's grid barriers.
# GPU_CHECK_MODEL=CONFIG (e.g. configs/config_16B.json) also synthesises that model's BF16
# checkpoint on this machine's disk (GPU_CHECK_CKPT, default /tmp/dsv3_ckpt_bf16; ~31 GB
# for 16B, started in the background while the tests run), then runs bench_cuda_model
# (whole-model decode/prefill against the measured ceilings) and scripts/hf_bench.py
# (Hugging Face transformers' DeepseekV3, random BF16 weights, the same shapes).
# GPU_CHECK_PROFILE=1 (with GPU_CHECK_MODEL) first runs bench_cuda_model's BENCH_PROFILE mode
# under Nsight Compute (one eager decode step each: batch 1, batch 1 at depth 4096, batch 8;
# then one prefill of 512 tokens; per-kernel time and DRAM bytes) into $OUT/prof.csv and prints
# scripts/ncu_summary.py's table. GPU_CHECK_PROFILE=decode or =prefill: those steps only.
# GPU_CHECK_NCU_CACHE=none keeps the caches between kernels (ncu flushes them by default, so
# each kernel's activations come from DRAM, unlike in a real step).
# GPU_CHECK_HF=0 skips hf_bench; GPU_CHECK_BF16=0 skips the BF16 checkpoint and its bench
# (with GPU_CHECK_FP8=1: the FP8 figures only). GPU_CHECK_FP8=1 (with GPU_CHECK_MODEL) also
# synthesises the FP8 checkpoint (e4m3 + 128x128 block scales; GPU_CHECK_CKPT_FP8, default
# /tmp/dsv3_ckpt_fp8; in the background, after the BF16 one) and runs bench_cuda_model on it. BENCH_AB="default;attn_tc=0;..." (passed
# through to bench_cuda_model) adds a table of the decode figures for each tuning of the CUDA
# backend (fields of cuda_tuning, src/backend/cuda/cuda_backend.h), measured in the same process.
# A build directory over the device tool's 64 MiB can travel as a copy holding only dsv3 and
# tests/{test_cuda_ops,test_cuda_golden,bench_cuda_ops,bench_cuda_model}.
# Exit status: the number of failing programs (0: all passed).
set -u
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
logdir=${OUT:-/tmp}
mkdir -p "$logdir"
export DSV3_GOLDEN=$PWD/tests/golden DSV3_TESTS=$PWD/tests

if [ ! -d "$build" ]; then
  echo "gpu_check: no build directory '$build' (carry it with the run)" >&2
  exit 2
fi

# The CUDA runtime the binaries were linked against may live elsewhere here.
find_prog() { find "$build" -maxdepth 3 -type f -name "$1" -perm -u+x | head -n1; }
first=$(find_prog test_cuda_ops)
if [ -n "$first" ] && ldd "$first" | grep -q "not found"; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
  done
  export LD_LIBRARY_PATH
  ldd "$first" | grep "not found" >&2 && echo "gpu_check: libraries still missing (above)" >&2
fi

echo "== device"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv,noheader 2>&1 | sed 's/^/   /'

results=()
fails=0
model_cfg=${GPU_CHECK_MODEL:-}
[ "${GPU_CHECK_BF16:-1}" = 0 ] && model_cfg=
ckpt=${GPU_CHECK_CKPT:-/tmp/dsv3_ckpt_bf16}
ckpt8=${GPU_CHECK_CKPT_FP8:-/tmp/dsv3_ckpt_fp8}
want8=0
[ -n "${GPU_CHECK_MODEL:-}" ] && [ "${GPU_CHECK_FP8:-0}" = 1 ] && want8=1
synth_pid=
synth() { # dtype dir log: synthesise the checkpoint unless dir holds one
  [ -d "$2" ] && [ -n "$(ls "$2" 2>/dev/null)" ] && return
  local t0=$EPOCHREALTIME
  "$build/dsv3" synth --config "$GPU_CHECK_MODEL" --out "$2" --dtype "$1" >"$3" 2>&1
  echo "synth $1 rc $? in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s" >>"$3"
}
if [ -n "$model_cfg" ] || [ $want8 = 1 ]; then
  df -h "$(dirname "$ckpt")" | sed 's/^/   /'
  # in the background while the tests run: BF16 first (its bench comes first), then FP8
  ( [ -n "$model_cfg" ] && synth bf16 "$ckpt" "$logdir/synth.log"
    [ $want8 = 1 ] && synth fp8 "$ckpt8" "$logdir/synth_fp8.log" ) &
  synth_pid=$!
fi
run_prog() { # label name [wrapper...] [-- args...]
  local label=$1 name=$2; shift 2
  local pre=() post=() seen=0 a
  for a in "$@"; do
    if [ $seen = 0 ] && [ "$a" = "--" ]; then seen=1
    elif [ $seen = 1 ]; then post+=("$a")
    else pre+=("$a"); fi
  done
  local bin; bin=$(find_prog "$name")
  if [ -z "$bin" ]; then
    results+=("$(printf '%-26s %-8s %s' "$label" MISSING "not in $build")")
    fails=$((fails + 1))
    return
  fi
  echo "== $label"
  local log=$logdir/$label.log t0=$EPOCHREALTIME rc
  ${pre[@]+"${pre[@]}"} "$bin" ${post[@]+"${post[@]}"} >"$log" 2>&1
  rc=$?
  local secs; secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  cat "$log"
  local status=PASS
  [ $rc -ne 0 ] && { status="FAIL($rc)"; fails=$((fails + 1)); }
  grep -q "skipped: no GPU" "$log" && status=SKIPPED
  results+=("$(printf '%-26s %-8s %6s s  %s' "$label" "$status" "$secs" \
    "$(grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed|ERROR SUMMARY' "$log" | tail -n1)")")
}

run_prog test_cuda_ops test_cuda_ops
run_prog test_cuda_golden test_cuda_golden
# the same with every scratch buffer filled with NaN bytes: no reader relies on what it did
# not write (the backend leaves scratch unfilled by default)
run_prog test_cuda_golden.nan_scratch test_cuda_golden -- nan-scratch
# every contiguous pass of 16+ tokens in the expanded attention form (by default only where it
# counts fewer multiply-adds: s200 and s40 from position 0)
run_prog test_cuda_golden.expanded test_cuda_golden -- expanded
# every decode step of 1..8 tokens in mla_attend's long form (by default only one token past
# position 1024, which the golden sequences never reach)
run_prog test_cuda_golden.attend_long test_cuda_golden -- attend-long
run_prog bench_cuda_ops bench_cuda_ops
# what one dependent step of a chain costs: a kernel boundary (plain, PDL) against a grid
# barrier (optional: a copied build may leave it out)
[ -n "$(find_prog bench_cuda_sync)" ] && run_prog bench_cuda_sync bench_cuda_sync
[ -n "$synth_pid" ] && wait "$synth_pid"
if [ -n "$model_cfg" ]; then
  echo "== synth"; cat "$logdir/synth.log" 2>/dev/null; du -sh "$ckpt"
  bin=$(find_prog bench_cuda_model)
  prof=${GPU_CHECK_PROFILE:-0}
  if [ "$prof" != 0 ]; then
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -n1)
    echo "== ncu profile ($ncu)"
    t0=$EPOCHREALTIME
    BENCH_PROFILE=$prof timeout 300 "$ncu" --profile-from-start off --clock-control none \
      --cache-control "${GPU_CHECK_NCU_CACHE:-all}" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
      --csv --page raw --print-units base --log-file "$logdir/prof.csv" "$bin" "$ckpt" "$model_cfg" 2>&1 | tail -n 5
    echo "ncu rc ${PIPESTATUS[0]} in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s"
    python3 scripts/ncu_summary.py "$logdir/prof.csv" "$prof" 2>&1 | tee "$logdir/prof_summary.txt"
  fi
  echo "== bench_cuda_model ($model_cfg)"
  "$bin" "$ckpt" "$model_cfg" 2>&1 | tee "$logdir/bench_cuda_model.log"
  rc=${PIPESTATUS[0]}
  results+=("$(printf '%-26s %-8s' bench_cuda_model "$([ "$rc" = 0 ] && echo PASS || echo "FAIL($rc)")")")
  [ "$rc" = 0 ] || fails=$((fails + 1))
  [ "${GPU_CHECK_HF:-1}" = 0 ] && model_cfg=
fi
if [ -n "$model_cfg" ]; then
  echo "== hf_bench ($model_cfg)"
  PYTHONUNBUFFERED=1 python3 scripts/hf_bench.py "$model_cfg" 2>&1 | grep -v Warning | tee "$logdir/hf_bench.log"
  rc=${PIPESTATUS[0]}
  results+=("$(printf '%-26s %-8s' hf_bench "$([ "$rc" = 0 ] && echo PASS || echo "FAIL($rc)")")")
fi
if [ $want8 = 1 ]; then
  echo "== synth fp8"; cat "$logdir/synth_fp8.log" 2>/dev/null
  echo "== bench_cuda_model FP8 ($GPU_CHECK_MODEL)"
  "$(find_prog bench_cuda_model)" "$ckpt8" "$GPU_CHECK_MODEL" 2>&1 | tee "$logdir/bench_cuda_model_fp8.log"
  rc=${PIPESTATUS[0]}
  results+=("$(printf '%-26s %-8s' bench_cuda_model.fp8 "$([ "$rc" = 0 ] && echo PASS || echo "FAIL($rc)")")")
  [ "$rc" = 0 ] || fails=$((fails + 1))
  echo "== dsv3 bench --device cuda, FP8, long prompts and deep caches"
  "$build/dsv3" bench --ckpt-path "$ckpt8" --config "$GPU_CHECK_MODEL" --device cuda -p 512,4096 -n 32 -d 0,4096 \
    -r 3 2>&1 | tee "$logdir/dsv3_bench_fp8.log"
  rc=${PIPESTATUS[0]}
  results+=("$(printf '%-26s %-8s' dsv3_bench.fp8 "$([ "$rc" = 0 ] && echo PASS || echo "FAIL($rc)")")")
  [ "$rc" = 0 ] || fails=$((fails + 1))
fi
if [ "${GPU_CHECK_SANITIZE:-0}" = 1 ]; then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
  if [ -n "$cs" ]; then
    run_prog test_cuda_ops.memcheck test_cuda_ops "$cs" --tool memcheck --error-exitcode 99
  else
    results+=("$(printf '%-26s %-8s %s' test_cuda_ops.memcheck MISSING "no compute-sanitizer")")
  fi
fi

echo "== summary ($build)"
printf '%s\n' "${results[@]}"
exit $fails
