#!/usr/bin/env bash
# bench_decode.sh [BUILD_DIR] [WORK_DIR] - decode time per token on one machine: one rank
# (1 thread and all cores) against 2 and 4 ranks sharing the cores, with the watchdog (the
# default) and with blocking collectives (DSV3_COMM_TIMEOUT=0). Greedy decoding through
# dist_check on a `dsv3 synth` checkpoint of ~0.9 GB (dim 2048, 4 layers, 32 experts, FP8).
# Not part of the test suite: it prints figures.
set -euo pipefail
B=${1:-build-mpi}
W=${2:-$(mktemp -d "${TMPDIR:-/tmp}/dsv3-bench-XXXXXX")}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
mkdir -p "$W"
cat >"$W/cfg.json" <<'JSON'
{"vocab_size": 32768, "dim": 2048, "inter_dim": 8192, "moe_inter_dim": 1024, "n_layers": 4,
 "n_dense_layers": 1, "n_heads": 16, "n_routed_experts": 32, "n_shared_experts": 1,
 "n_activated_experts": 4, "n_expert_groups": 4, "n_limited_groups": 2, "route_scale": 2.5,
 "score_func": "sigmoid", "q_lora_rank": 512, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64, "v_head_dim": 128, "dtype": "fp8", "original_seq_len": 4096,
 "max_seq_len": 4096}
JSON
[ -d "$W/hf" ] || "$B/dsv3" synth --config "$W/cfg.json" --out "$W/hf" --seed 3 >/dev/null
for mp in 1 2 4; do
  [ -d "$W/mp$mp" ] || "$B/dsv3" convert --hf-ckpt-path "$W/hf" --save-path "$W/mp$mp" --n-experts 32 \
    --model-parallel "$mp" >/dev/null
done
P=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
one() {
  echo "1 rank, $1 thread(s):"
  OMP_NUM_THREADS=$1 "$B/tests/dist_check" greedy --config "$W/cfg.json" --prompt $P --steps 65 \
    --out "$W/tok1.txt" --ckpt-path "$W/mp1"
}
many() {
  echo "$1 ranks, DSV3_COMM_TIMEOUT=${2:-60}:"
  env -u OMP_NUM_THREADS DSV3_COMM_TIMEOUT=${2:-60} mpirun --oversubscribe --bind-to none -np "$1" -x DSV3_COMM_TIMEOUT \
    ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} "$B/tests/dist_check" greedy --config "$W/cfg.json" --prompt $P \
    --steps 65 --out "$W/tok$1.txt" --ckpt-path "$W/mp$1"
}
one 1
[ "$cores" -gt 1 ] && one "$cores"
many 2
many 2 0
many 4
many 4 0
