#!/usr/bin/env bash
# serve_openai.sh - the official openai npm client against `dsv3 serve`
# (tests/serve/node/openai_test.mjs). Skipped (77) until `npm ci` has run in
# tests/serve/node (scripts/setup.sh test does it).
source "$(dirname "$0")/lib.sh"
NODE_DIR=$ROOT/tests/serve/node
if [ ! -d "$NODE_DIR/node_modules/openai" ]; then
  echo "skipped: run (cd tests/serve/node && npm ci) first"
  exit 77
fi
PROMPT="Write a few sentences about the sea."
printf '%s\n' "$PROMPT" >"$WORK/prompt.txt"
GREEDY=$("$BIN" generate --ckpt-path "$MODEL" --config "$MODEL/config.json" --input-file "$WORK/prompt.txt" \
  --max-new-tokens 24 --temperature 0 2>/dev/null | sed -n 's/^Completion: //p')
start_server main --parallel 4 --ctx-size 512 --threads 2
SERVE_URL=$URL_main GREEDY=$GREEDY PROMPT=$PROMPT timeout 120 node "$NODE_DIR/openai_test.mjs"
