#!/usr/bin/env bash
# dist_test.sh MODE - tensor parallelism over MPI, on one machine (oversubscribed).
#
#   comm           the collectives (sizes 1 to 12 MB, every root), dist_agree,
#                  dist_check_same, dist_broadcast_untimed on 2, 3 and 4 ranks; polled
#                  (the watchdog) and blocking (DSV3_COMM_TIMEOUT=0) forms
#   logits_golden  the golden tiny checkpoint (tests/golden/tiny_hf): FP8 at mp 1/2 and its
#                  BF16 cast at mp 1/2/4 (FP8 block scales of the tiny model do not split 4
#                  ways); dsv3 logits over 2 and 4 ranks equals 1 rank (prefill and stepwise,
#                  absorb and naive) and the reference's own logits (absorb/s40/stepwise)
#   logits_synth   two `dsv3 synth` checkpoints shaped so that every split is exercised at
#                  mp 1/2/4: FP8 with q_lora, sigmoid grouped routing, YaRN; BF16 without
#                  q_lora (wq), softmax routing, no YaRN
#   greedy         greedy decoding gives the same tokens on 1, 2 and 4 ranks
#   load_errors    a missing shard, shards for another world size, a corrupt shard and
#                  configs that differ between ranks: every rank stops, non-zero, within
#                  30 s, with a message naming the cause
#   kill_rank      kill -9 of one rank mid-run: every rank is gone, non-zero, within 30 s
#   hang_timeout   a stopped (hung) rank: the others' watchdog (DSV3_COMM_TIMEOUT=3) ends
#                  the job within 30 s with a message naming the timeout
#
# Environment (set by ctest): DSV3_BIN, DIST_CHECK, DSV3_GOLDEN, MPIEXEC.
set -uo pipefail
mode=${1:?usage: dist_test.sh MODE}
BIN=${DSV3_BIN:-build-mpi/dsv3}
CHECK=${DIST_CHECK:-build-mpi/tests/dist_check}
G=${DSV3_GOLDEN:-tests/golden}
MPIRUN=${MPIEXEC:-mpirun}
[ -n "$MPIRUN" ] || MPIRUN=mpirun
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1
W=$(mktemp -d "${TMPDIR:-/tmp}/dsv3-dist-XXXXXX")
trap 'rm -rf "$W"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { echo "+ $*" >&2; "$@" || { fail "command failed: $*"; return 1; }; }
MPI=("$MPIRUN" --oversubscribe)
mpi() { local np=$1; shift; "${MPI[@]}" -np "$np" "$@"; }
finish() {
  if [ "$failures" -gt 0 ]; then echo "dist_test $mode: $failures failure(s)"; exit 1; fi
  echo "dist_test $mode: passed"; exit 0
}

# the s40 sequence of the golden data, as 1,2,3
S40=$(grep -o '"s40": *\[[^]]*\]' "$G/sequences.json" | sed 's/.*\[//; s/\]//; s/ //g')
PROMPT=726,369,390,393,802,339,774,780

convert() { # HF_DIR OUT_DIR N_EXPERTS MP
  "$BIN" convert --hf-ckpt-path "$1" --save-path "$2" --n-experts "$3" --model-parallel "$4" >/dev/null ||
    fail "convert $1 --model-parallel $4"
}

# logits NP CKPT CONFIG OUT [flags...]: dsv3 logits over NP ranks (1 = no mpirun)
logits() {
  local np=$1 ck=$2 cfg=$3 out=$4; shift 4
  local cmd=("$BIN" logits --ckpt-path "$ck" --config "$cfg" --tokens "$S40" --all --out "$out" "$@")
  if [ "$np" -eq 1 ]; then run "${cmd[@]}"; else run mpi "$np" "${cmd[@]}"; fi
}

cmp() { run "$CHECK" cmp "$@"; }

# parallel_vs_single PREFIX CONFIG MPS...: logits at every mp equal mp 1's, in four settings
parallel_vs_single() {
  local p=$1 cfg=$2; shift 2
  local settings=("prefill:" "stepwise:--stepwise" "naive:--attn-impl naive" "naive_step:--attn-impl naive --stepwise")
  for s in "${settings[@]}"; do
    local tag=${s%%:*} flags
    read -r -a flags <<<"${s#*:}"
    logits 1 "$W/${p}_mp1" "$cfg" "$W/${p}_1_$tag.st" "${flags[@]}"
    for mp in "$@"; do
      logits "$mp" "$W/${p}_mp$mp" "$cfg" "$W/${p}_${mp}_$tag.st" "${flags[@]}"
      cmp "$W/${p}_${mp}_$tag.st" logits "$W/${p}_1_$tag.st" logits
    done
  done
}

synth_configs() {
  # FP8: every column/row split of a block-scaled weight is a multiple of 128 at mp 4
  cat >"$W/cfg_a.json" <<'EOF'
{"vocab_size": 2048, "dim": 256, "inter_dim": 1024, "moe_inter_dim": 256, "n_layers": 3,
 "n_dense_layers": 1, "n_heads": 8, "n_routed_experts": 16, "n_shared_experts": 2,
 "n_activated_experts": 4, "n_expert_groups": 4, "n_limited_groups": 2, "route_scale": 2.5,
 "score_func": "sigmoid", "q_lora_rank": 128, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
 "qk_rope_head_dim": 64, "v_head_dim": 64, "dtype": "fp8", "original_seq_len": 128,
 "max_seq_len": 512, "rope_factor": 40, "mscale": 1.0}
EOF
  cat >"$W/cfg_b.json" <<'EOF'
{"vocab_size": 1536, "dim": 192, "inter_dim": 384, "moe_inter_dim": 96, "n_layers": 3,
 "n_dense_layers": 1, "n_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1,
 "n_activated_experts": 2, "n_expert_groups": 1, "n_limited_groups": 1, "route_scale": 1.0,
 "score_func": "softmax", "q_lora_rank": 0, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
 "qk_rope_head_dim": 16, "v_head_dim": 32, "dtype": "bf16", "original_seq_len": 4096,
 "max_seq_len": 256}
EOF
}

make_synth() { # NAME CONFIG N_EXPERTS SEED MPS...
  local name=$1 cfg=$2 ne=$3 seed=$4; shift 4
  "$BIN" synth --config "$cfg" --out "$W/${name}_hf" --seed "$seed" >/dev/null || fail "synth $cfg"
  for mp in "$@"; do convert "$W/${name}_hf" "$W/${name}_mp$mp" "$ne" "$mp"; done
}

# expect_stop LABEL PATTERN CMD...: CMD must exit non-zero within 30 s, printing PATTERN
expect_stop() {
  local label=$1 pat=$2; shift 2
  local t0=$SECONDS
  timeout -k 5 60 "$@" >"$W/out.txt" 2>&1
  local rc=$? dt=$((SECONDS - t0))
  echo "$label: exit $rc after ${dt}s: $(grep -m1 -o "dsv3 .*" "$W/out.txt" | head -c 300)"
  [ "$rc" -ne 0 ] || fail "$label: exit status 0"
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "$label: still running after 60 s"
  [ "$dt" -le 30 ] || fail "$label: took ${dt}s"
  grep -q -- "$pat" "$W/out.txt" || { fail "$label: no message matching '$pat'"; cat "$W/out.txt" >&2; }
}

# long_run NP CKPT CONFIG: starts a long greedy run in the background; sets RUN_PID once decoding
long_run() {
  local np=$1 ck=$2 cfg=$3
  rm -rf "$W/pids" "$W/ready" && mkdir -p "$W/pids"
  export DSV3_COMM_TIMEOUT=${DSV3_COMM_TIMEOUT:-60}
  mpi "$np" -x DSV3_COMM_TIMEOUT "$CHECK" greedy --ckpt-path "$ck" --config "$cfg" --prompt "$PROMPT" \
    --steps 32 --repeat 1000000 --pid-dir "$W/pids" --ready "$W/ready" >"$W/run.txt" 2>&1 &
  RUN_PID=$!
  for _ in $(seq 600); do [ -f "$W/ready" ] && return 0; sleep 0.1; done
  fail "long run did not start decoding within 60 s"; cat "$W/run.txt" >&2
  kill -9 "$RUN_PID" 2>/dev/null
  return 1
}

# alive PID: the process exists and is not a zombie (an exited rank whose new parent has not reaped it)
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# wait_all LABEL T0 NP: mpirun and every rank must be gone within 30 s of T0, mpirun non-zero
wait_all() {
  local label=$1 t0=$2 np=$3 rc=0 gone=0
  for _ in $(seq 300); do
    if ! kill -0 "$RUN_PID" 2>/dev/null; then gone=1; break; fi
    sleep 0.1
  done
  if [ "$gone" -eq 0 ]; then fail "$label: mpirun still running after 30 s"; kill -9 "$RUN_PID"; fi
  wait "$RUN_PID"; rc=$?
  local dt; dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
  for r in $(seq 0 $((np - 1))); do
    local pid; pid=$(cat "$W/pids/rank$r.pid")
    while alive "$pid" && awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{exit !(b - a < 30)}'; do sleep 0.1; done
    if alive "$pid"; then fail "$label: rank $r (pid $pid) still alive"; kill -9 "$pid"; fi
  done
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
  echo "$label: mpirun exit $rc, all $np ranks gone ${dt}s after the fault"
  [ "$rc" -ne 0 ] || fail "$label: mpirun exit status 0"
}

case "$mode" in
comm)
  for np in 2 3 4; do run mpi "$np" "$CHECK" comm; done
  DSV3_COMM_TIMEOUT=0 run mpi 2 -x DSV3_COMM_TIMEOUT "$CHECK" comm
  ;;
logits_golden)
  convert "$G/tiny_hf" "$W/fp8_mp1" 16 1
  convert "$G/tiny_hf" "$W/fp8_mp2" 16 2
  run "$BIN" cast-bf16 --input-fp8-hf-path "$G/tiny_hf" --output-bf16-hf-path "$W/bf16_hf" >/dev/null
  for mp in 1 2 4; do convert "$W/bf16_hf" "$W/bf16_mp$mp" 16 "$mp"; done
  parallel_vs_single fp8 "$G/config_tiny.json" 2
  parallel_vs_single bf16 "$G/config_tiny.json" 2 4
  # against DeepSeek's reference: s40 one token at a time (absorb, bf16 GEMM path)
  for np in 1 2; do cmp "$W/fp8_${np}_stepwise.st" logits "$G/ref_logits.safetensors" absorb/s40/stepwise; done
  cmp "$W/fp8_2_naive_step.st" logits "$G/ref_logits.safetensors" naive/s40/stepwise
  ;;
logits_synth)
  synth_configs
  make_synth syna "$W/cfg_a.json" 16 7 1 2 4
  make_synth synb "$W/cfg_b.json" 8 11 1 2 4
  parallel_vs_single syna "$W/cfg_a.json" 2 4
  parallel_vs_single synb "$W/cfg_b.json" 2 4
  ;;
greedy)
  synth_configs
  make_synth syna "$W/cfg_a.json" 16 7 1 2 4
  convert "$G/tiny_hf" "$W/tiny_mp1" 16 1
  convert "$G/tiny_hf" "$W/tiny_mp2" 16 2
  for set in "syna:$W/cfg_a.json:1 2 4" "tiny:$G/config_tiny.json:1 2"; do
    IFS=: read -r name cfg mps <<<"$set"
    for mp in $mps; do
      g=("$CHECK" greedy --ckpt-path "$W/${name}_mp$mp" --config "$cfg" --prompt "$PROMPT" --steps 24
         --out "$W/${name}_tok$mp.txt")
      if [ "$mp" -eq 1 ]; then run "${g[@]}"; else run mpi "$mp" "${g[@]}"; fi
      echo "$name mp$mp: $(cat "$W/${name}_tok$mp.txt" 2>/dev/null)"
      if ! diff -q "$W/${name}_tok1.txt" "$W/${name}_tok$mp.txt" >/dev/null; then
        fail "$name: greedy tokens of $mp ranks differ from 1 rank"
      fi
    done
  done
  ;;
load_errors)
  synth_configs
  make_synth syna "$W/cfg_a.json" 16 7 1 2 4
  make_synth other "$W/cfg_a.json" 16 8 2
  lg=(logits --config "$W/cfg_a.json" --tokens "$PROMPT" --out "$W/x.st" --ckpt-path)
  expect_stop "mp2 shards, 4 ranks" "converted for 2 ranks" "${MPI[@]}" -np 4 "$BIN" "${lg[@]}" "$W/syna_mp2"
  expect_stop "mp4 shards, 2 ranks" "converted for 4 ranks" "${MPI[@]}" -np 2 "$BIN" "${lg[@]}" "$W/syna_mp4"
  expect_stop "mp1 checkpoint, 2 ranks" "converted for 1 rank" "${MPI[@]}" -np 2 "$BIN" "${lg[@]}" "$W/syna_mp1"
  cp -r "$W/syna_mp4" "$W/gap_mp4" && rm "$W/gap_mp4/model2-mp4.safetensors"
  expect_stop "missing shard" "rank 2: .*no model2-mp4.safetensors" "${MPI[@]}" -np 4 "$BIN" "${lg[@]}" "$W/gap_mp4"
  cp -r "$W/syna_mp2" "$W/swap_mp2" && cp "$W/other_mp2/model0-mp2.safetensors" "$W/swap_mp2/model1-mp2.safetensors"
  expect_stop "shard of another rank" "rank 1: .*model1-mp2.safetensors: checkpoint has no tensor" \
    "${MPI[@]}" -np 2 "$BIN" "${lg[@]}" "$W/swap_mp2"
  cp -r "$W/syna_mp2" "$W/renamed_mp2" && cp "$W/syna_mp4/model0-mp4.safetensors" "$W/renamed_mp2/model0-mp2.safetensors"
  expect_stop "shard renamed from mp4" "rank 0: .*model0-mp2.safetensors: tensor .* has shape" \
    "${MPI[@]}" -np 2 "$BIN" "${lg[@]}" "$W/renamed_mp2"
  sed 's/"route_scale": 2.5/"route_scale": 2.0/' "$W/cfg_a.json" >"$W/cfg_a2.json"
  expect_stop "configs differ" "the model config differs from rank 0" \
    "${MPI[@]}" -np 1 "$BIN" "${lg[@]}" "$W/other_mp2" : \
    -np 1 "$BIN" logits --config "$W/cfg_a2.json" --tokens "$PROMPT" --out "$W/x.st" --ckpt-path "$W/other_mp2"
  expect_stop "bad DSV3_COMM_TIMEOUT" "DSV3_COMM_TIMEOUT" \
    env DSV3_COMM_TIMEOUT=soon "${MPI[@]}" -np 2 -x DSV3_COMM_TIMEOUT "$BIN" "${lg[@]}" "$W/other_mp2"
  ;;
kill_rank)
  synth_configs
  make_synth syna "$W/cfg_a.json" 16 7 2 4
  for set in "2 1" "2 0" "4 2"; do
    read -r np victim <<<"$set"
    long_run "$np" "$W/syna_mp$np" "$W/cfg_a.json" || continue
    t0=$(date +%s.%N)
    kill -9 "$(cat "$W/pids/rank$victim.pid")"
    wait_all "kill -9 rank $victim of $np" "$t0" "$np"
  done
  ;;
hang_timeout)
  synth_configs
  make_synth syna "$W/cfg_a.json" 16 7 2
  export DSV3_COMM_TIMEOUT=3
  if long_run 2 "$W/syna_mp2" "$W/cfg_a.json"; then
    t0=$(date +%s.%N)
    victim=$(cat "$W/pids/rank1.pid")
    kill -STOP "$victim"
    wait_all "SIGSTOP rank 1 of 2" "$t0" 2
    kill -9 "$victim" 2>/dev/null
    grep -q "did not complete within 3 s" "$W/run.txt" || { fail "no watchdog message"; cat "$W/run.txt" >&2; }
    grep -m1 "dsv3 " "$W/run.txt"
  fi
  ;;
*)
  echo "dist_test.sh: unknown mode $mode" >&2
  exit 2
  ;;
esac
finish
