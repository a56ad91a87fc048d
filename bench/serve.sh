#!/bin/bash
# bench/serve.sh - `dsv3 serve`'s own overhead: aggregate greedy decode of B
# concurrent requests (default 8) against B sequences decoded in lockstep in
# one process through the API (bench/bench_serve.c, as `dsv3 generate` runs a
# batch), and the time to first token of a short prompt on an idle server
# against the same in process. Loopback only; the server stops at the end.
#   bench/serve.sh [CKPT=models/dsv3-mini] [B=8] [TOKENS=128] [THREADS=0] [DEVICE=auto]
# Server decode rate: B requests of TOKENS tokens and B of 1 token (eos
# ignored), timed by the client: B*(TOKENS-1) / (T_TOKENS - T_1), so that the
# prompts and the HTTP round trips cancel out. TTFT: a non-streamed request of
# max_tokens 1 (request, prompt, first token, reply), median of 7. Each side
# is measured REPS times (default 3) and the best is kept: on a shared
# machine the slowest runs measure the neighbours.
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:-models/dsv3-mini}
B=${2:-8}
N=${3:-128}
THREADS=${4:-0}
DEVICE=${5:-auto}
REPS=${REPS:-3}
BIN=${DSV3_BIN:-build/dsv3}
# OpenMP threads sleep rather than spin between passes: on a shared machine
# spinning makes both sides slower and noisier (override by exporting it).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
PROMPT="Tell me about the city."
out=build/bench_serve
gcc -std=c11 -O2 -D_GNU_SOURCE -fopenmp -Wall -Wextra -Werror -Iinclude bench/bench_serve.c \
    build/libdsv3.a $(pkg-config --libs jansson libpcre2-8) -lm -o $out
tflag=(); [ "$THREADS" = 0 ] || tflag=(--threads "$THREADS")
echo "== in process (the API, as the CLI runs), best of $REPS"
for _ in $(seq "$REPS"); do $out "$CKPT" "$PROMPT" "$B" "$N" "$THREADS" "$DEVICE"; done >build/bench_serve.txt
cli_tps=$(awk '/^decode_tokens_per_s/{print $2}' build/bench_serve.txt | sort -g | tail -1)
cli_ttft=$(awk '/^ttft_ms/{print $2}' build/bench_serve.txt | sort -g | head -1)
printf 'decode_tokens_per_s %.1f (batch %d)\nttft_ms %.2f\n' "$cli_tps" "$B" "$cli_ttft"

log=$(mktemp)
timeout 600 "$BIN" serve --ckpt-path "$CKPT" --port 0 --parallel "$B" --ctx-size 512 --device "$DEVICE" "${tflag[@]}" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 600); do
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | sed 's/.*://' || true)
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.1
done
U=http://127.0.0.1:$port/v1/chat/completions
body() { printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"temperature":0,"ignore_eos":true}' "$PROMPT" "$1"; }
# B concurrent requests of $1 tokens: wall seconds
wave() {
  local t0 t1 pids=()
  t0=$(date +%s.%N)
  for _ in $(seq "$B"); do curl -s -o /dev/null -d "$(body "$1")" "$U" & pids+=($!); done
  wait "${pids[@]}"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
wave 4 >/dev/null # warm-up
srv_tps=0 ttft=1e9
for _ in $(seq "$REPS"); do
  t1=$(wave 1); tn=$(wave "$N")
  tps=$(echo "$B * ($N - 1) / ($tn - $t1)" | bc -l)
  srv_tps=$(printf '%s\n%s\n' "$srv_tps" "$tps" | sort -g | tail -1)
  t=$(for _ in 1 2 3 4 5 6 7; do
    curl -s -o /dev/null -w '%{time_total}\n' -d "$(body 1)" "$U"; sleep 0.05
  done | sort -n | sed -n 4p)
  ttft=$(printf '%s\n%s\n' "$ttft" "$t" | sort -g | head -1)
done
echo "== dsv3 serve ($B concurrent requests), best of $REPS"
printf 'decode_tokens_per_s %.1f (%.0f%% of in-process)\n' "$srv_tps" "$(echo "100 * $srv_tps / $cli_tps" | bc -l)"
printf 'ttft_ms %.2f (in-process %.2f)\n' "$(echo "$ttft * 1000" | bc -l)" "$cli_ttft"
