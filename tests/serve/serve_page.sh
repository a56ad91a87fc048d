#!/usr/bin/env bash
# serve_page.sh - the chat page in headless Chromium (tests/serve/node/page_test.mjs).
# Skipped (77) without Debian's chromium or without `npm ci` in tests/serve/node.
# SERVE_SHOTS=DIR keeps the screenshots.
source "$(dirname "$0")/lib.sh"
NODE_DIR=$ROOT/tests/serve/node
CHROMIUM=${CHROMIUM:-$(command -v chromium || true)}
if [ -z "$CHROMIUM" ] || [ ! -d "$NODE_DIR/node_modules/playwright-core" ]; then
  echo "skipped: needs chromium (Debian) and (cd tests/serve/node && npm ci)"
  exit 77
fi
start_server page --parallel 2 --ctx-size 2048 --threads 2
shots=${SERVE_SHOTS:-$WORK}
mkdir -p "$shots"
CHROMIUM=$CHROMIUM timeout 120 node "$NODE_DIR/page_test.mjs" "$URL_page" "$shots"
