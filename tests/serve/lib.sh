# lib.sh - shared by the serve tests: start `dsv3 serve` on 127.0.0.1 with a
# free port (the kernel picks it: --port 0) and the trained model, wait until
# /health says ready, and stop it when the test exits. The server also runs
# under `timeout`, so that it stops by itself whatever happens to the test.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${DSV3_BIN:-$ROOT/build/dsv3}
MODEL=$ROOT/models/dsv3-mini
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dsv3-serve.XXXXXX")
SERVER_PIDS=()
# Stops the servers; a sanitizer report in a server's log fails the test.
cleanup() {
  local rc=$? bad=0
  for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${SERVER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  for f in "$WORK"/*.log; do
    [ -f "$f" ] || continue
    if grep -q 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' "$f"; then
      echo "FAIL: sanitizer report in $(basename "$f"):" >&2
      grep -A30 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' "$f" | head -60 >&2
      bad=1
    fi
  done
  rm -rf "$WORK"
  [ "$bad" = 0 ] || exit 1
  exit "$rc"
}
trap cleanup EXIT

FAILS=0
PASSES=0
ok() { PASSES=$((PASSES + 1)); [ -z "${SERVE_TRACE:-}" ] || echo "$SECONDS ok" >&2; }
fail() { FAILS=$((FAILS + 1)); echo "FAIL: $*" >&2; }
check() { # check "description" command...
  [ -z "${SERVE_TRACE:-}" ] || echo "$SECONDS $1" >&2
  local what=$1; shift
  if "$@"; then ok; else fail "$what"; fi
}

# start_server NAME [flags...]: sets URL_<NAME> and PID_<NAME>; the log is $WORK/NAME.log.
start_server() {
  local name=$1; shift
  local log=$WORK/$name.log
  timeout -s TERM "${SERVE_LIFETIME:-280}" "$BIN" serve --ckpt-path "$MODEL" --host 127.0.0.1 --port 0 "$@" 2>"$log" &
  local pid=$!
  SERVER_PIDS+=("$pid")
  local port=""
  for _ in $(seq 1 300); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" 2>/dev/null | head -1 | sed 's/.*://' || true)
    if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then cat "$log" >&2; echo "server $name did not start" >&2; exit 1; fi
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$log" >&2; echo "server $name not ready" >&2; exit 1; }
  printf -v "URL_$name" '%s' "http://127.0.0.1:$port"
  # the server itself, under timeout
  printf -v "PID_$name" '%s' "$(pgrep -P "$pid" | head -1 || echo "$pid")"
}

# post URL PATH JSON [curl flags...]: prints the body; the status goes to $WORK/status.
post() {
  local url=$1 path=$2 body=$3; shift 3
  curl -s -o "$WORK/body" -w '%{http_code}' -H 'Content-Type: application/json' "$@" --data-binary "$body" \
    "$url$path" >"$WORK/status" || true
  cat "$WORK/body"
}
status() { cat "$WORK/status"; }

finish() {
  echo "$PASSES passed, $FAILS failed"
  [ "$FAILS" -eq 0 ]
}
