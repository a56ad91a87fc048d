#!/bin/bash
# bench/serve.sh - `dsv3 serve`'s own overhead: B concurrent streams' aggregate
# decode rate against B sequences decoded in lockstep in one process through
# the API (as the CLI decodes a batch), and the time to first token of a short
# prompt on the idle server against the same work in process, with the
# loopback round trip of GET /health as the floor no server avoids. Both sides
# run in one program (bench/bench_serve.c), in alternating rounds, so that
# each ratio compares the same minute of a shared machine; every round is
# printed, then the medians. Loopback only; the server stops at the end.
#   bench/serve.sh [CKPT=models/dsv3-mini] [B=8] [TOKENS=256] [THREADS=0] [DEVICE=auto] [ROUNDS=5]
# DSV3_BIN (default build/dsv3) is the server; bench_serve is built against
# the libdsv3.a next to it (a CUDA build's too). Extra server flags:
# SERVE_FLAGS. BUILD_ONLY=1 builds bench_serve and stops; where there is no
# libdsv3.a beside DSV3_BIN, or no compiler or development files (the GPU
# machine), a bench_serve beside DSV3_BIN is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:-models/dsv3-mini}
B=${2:-8}
N=${3:-256}
THREADS=${4:-0}
DEVICE=${5:-auto}
ROUNDS=${6:-5}
BIN=${DSV3_BIN:-build/dsv3}
BUILD=$(dirname "$BIN")
# OpenMP threads sleep rather than spin between passes: on a shared machine
# spinning makes both sides slower and noisier (override by exporting it).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
out=$BUILD/bench_serve
if [ -f "$BUILD/libdsv3.a" ] && command -v gcc >/dev/null && pkg-config --exists jansson libpcre2-8 2>/dev/null; then
  cuda=()
  if nm "$BUILD/libdsv3.a" 2>/dev/null | grep ' U cudaMalloc' >/dev/null; then # (no -q: nm must not die of SIGPIPE)
    cuda=(-L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart -lcublas -lcublasLt -lstdc++)
  fi
  gcc -std=c11 -O2 -D_GNU_SOURCE -fopenmp -Wall -Wextra -Werror -Iinclude bench/bench_serve.c \
      "$BUILD/libdsv3.a" $(pkg-config --libs jansson libpcre2-8) "${cuda[@]}" -lm -o "$out"
elif [ ! -x "$out" ]; then
  echo "serve.sh: cannot build $out here (gcc, jansson and pcre2 development files) and none was carried" >&2
  exit 1
fi
[ -z "${BUILD_ONLY:-}" ] || exit 0
tflag=(); [ "$THREADS" = 0 ] || tflag=(--threads "$THREADS")
log=$(mktemp)
"$BIN" serve --ckpt-path "$CKPT" --port 0 --parallel "$B" --ctx-size 512 --device "$DEVICE" "${tflag[@]}" \
  ${SERVE_FLAGS:-} 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
# GET /health through bash alone (the GPU machine may have no curl)
healthy() { (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && head -1 <&3 | grep -q ' 200') 2>/dev/null; }
port=
for _ in $(seq 3000); do
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | sed 's/.*://' || true)
  [ -n "$port" ] && healthy "$port" && break
  kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
grep 'ready:' "$log"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
"$out" "$CKPT" "$port" "$pid" "$B" "$N" "$ROUNDS" "$THREADS" "$DEVICE"
