#!/usr/bin/env bash
# nccl_single.sh BUILD_DIR - the NCCL path on one GPU, one rank (a build with
# -DDSV3_CUDA=ON -DDSV3_MPI=ON and NCCL: BUILD_DIR/tests/nccl_check exists).
#
#   comm     nccl_check comm alone and under mpirun -np 1: NCCL start-up (unique id
#            over the host communicator), all_reduce / all_gather / broadcast on
#            device buffers queued on the backend's stream, host and mixed buffers
#   hang     a device all-reduce that never completes (DSV3_NCCL_FAULT_HANG=1) with
#            DSV3_COMM_TIMEOUT=2: the watchdog aborts NCCL and the job ends, exit 1,
#            within 20 s, naming the timeout
#   logits   the golden tiny checkpoint (FP8, mp1): `mpirun -np 1 dsv3 logits --device
#            cuda` equals the single-process CUDA logits (prefill and stepwise) and
#            DeepSeek's reference logits (absorb/s40/stepwise)
#
# With one rank the model itself makes no collective call (forward.c skips them at
# world size 1): its NCCL all-reduces run only with 2 or more GPUs.
# Prints PASS/FAIL lines; exits 0 when all pass (or "skipped: no GPU"), else 1.
set -uo pipefail
B=${1:?usage: nccl_single.sh BUILD_DIR}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
G=${DSV3_GOLDEN:-$ROOT/tests/golden}
CFG=$ROOT/configs/config_tiny.json
BIN=$B/dsv3
CHECK=$B/tests/nccl_check
DC=$B/tests/dist_check
MPIRUN=${MPIEXEC:-mpirun}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "skipped: no GPU"
  exit 0
fi
for f in "$BIN" "$CHECK" "$DC"; do
  [ -x "$f" ] || { echo "FAIL: $f missing (configure with -DDSV3_CUDA=ON -DDSV3_MPI=ON where NCCL is installed)"; exit 1; }
done
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
W=$(mktemp -d "${TMPDIR:-/tmp}/dsv3-nccl-XXXXXX")
trap 'rm -rf "$W"' EXIT
failures=0
MPI=("$MPIRUN" --bind-to none -np 1 -x NCCL_DEBUG)

pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# check LABEL CMD...: PASS when CMD exits 0 within 300 s; its output on failure
check() {
  local label=$1; shift
  if timeout -k 5 300 "$@" >"$W/out.txt" 2>&1; then pass "$label"; else fail "$label (exit $?)"; tail -30 "$W/out.txt"; fi
}

nvidia-smi -L | head -1
check "nccl_check comm, one process" "$CHECK" comm
check "nccl_check comm, mpirun -np 1" "${MPI[@]}" "$CHECK" comm

# the watchdog, on a collective made to look hung
t0=$SECONDS
DSV3_COMM_TIMEOUT=2 DSV3_NCCL_FAULT_HANG=1 timeout -k 5 60 \
  "${MPI[@]}" -x DSV3_COMM_TIMEOUT -x DSV3_NCCL_FAULT_HANG "$CHECK" hang >"$W/hang.txt" 2>&1
rc=$? dt=$((SECONDS - t0))
echo "hang: exit $rc after ${dt}s: $(grep -m1 -o 'NCCL .*' "$W/hang.txt" | head -c 300)"
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$dt" -le 20 ] &&
  grep -q "did not complete within 2 s" "$W/hang.txt"; then
  pass "hung collective: watchdog ends the job in ${dt}s"
else
  fail "hung collective (exit $rc after ${dt}s)"; tail -30 "$W/hang.txt"
fi

# logits of the golden checkpoint: mpirun + NCCL build vs one process, vs the reference
S40=$(grep -o '"s40": *\[[^]]*\]' "$G/sequences.json" | sed 's/.*\[//; s/\]//; s/ //g')
if ! "$BIN" convert --hf-ckpt-path "$G/tiny_hf" --save-path "$W/mp1" --n-experts 16 --model-parallel 1 >/dev/null; then
  fail "convert tiny_hf"
else
  for mode in prefill stepwise; do
    flags=(--all)
    [ "$mode" = stepwise ] && flags+=(--stepwise)
    lg=(logits --device cuda --ckpt-path "$W/mp1" --config "$CFG" --tokens "$S40" "${flags[@]}")
    check "dsv3 logits --device cuda ($mode), one process" "$BIN" "${lg[@]}" --out "$W/single_$mode.st"
    check "dsv3 logits --device cuda ($mode), mpirun -np 1" "${MPI[@]}" "$BIN" "${lg[@]}" --out "$W/mpi_$mode.st"
    check "logits ($mode): mpirun -np 1 equals one process" "$DC" cmp "$W/mpi_$mode.st" logits "$W/single_$mode.st" logits
    if cmp -s "$W/mpi_$mode.st" "$W/single_$mode.st"; then echo "note: $mode logits identical bytes"; fi
  done
  check "logits (stepwise, mpirun -np 1) equal DeepSeek's reference" \
    "$DC" cmp "$W/mpi_stepwise.st" logits "$G/ref_logits.safetensors" absorb/s40/stepwise
fi

if [ "$failures" -gt 0 ]; then echo "nccl_single: $failures failure(s)"; exit 1; fi
echo "nccl_single: all passed"
exit 0
