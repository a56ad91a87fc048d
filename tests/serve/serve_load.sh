#!/usr/bin/env bash
# serve_load.sh - a bounded loopback load test of `dsv3 serve`
# (tests/serve/node/load.mjs: concurrent clients, 10% disconnecting
# mid-stream, 5% malformed; every request answered or closed, no slot or
# memory leak). ctest runs a small version; the full one:
#   SERVE_LOAD_REQUESTS=400 SERVE_LOAD_CLIENTS=16 tests/serve/serve_load.sh
# Needs node (no npm packages); skipped (77) without it. Under ASan
# (DSV3_BIN=build-asan/dsv3) the quarantine of freed memory is turned off so
# that RSS measures what the server holds.
source "$(dirname "$0")/lib.sh"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:quarantine_size_mb=0:thread_local_quarantine_size_kb=0
command -v node >/dev/null || { echo "skipped: node not found"; exit 77; }
N=${SERVE_LOAD_REQUESTS:-80}
C=${SERVE_LOAD_CLIENTS:-16}
SERVE_LIFETIME=${SERVE_LOAD_LIFETIME:-280} start_server load --parallel 8 --ctx-size 256 --threads 2 --queue 64
timeout "${SERVE_LOAD_LIFETIME:-280}" node "$ROOT/tests/serve/node/load.mjs" "$URL_load" "$PID_load" "$N" "$C"
