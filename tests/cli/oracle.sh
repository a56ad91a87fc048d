#!/usr/bin/env bash
# oracle.sh NODE_DIR PACKAGE COMMAND...: runs COMMAND when the Node oracle
# NODE_DIR/node_modules/PACKAGE is installed; otherwise says how to install it
# and exits 77, which ctest (SKIP_RETURN_CODE 77) reports as skipped.
dir=$1 pkg=$2
shift 2
if ! command -v node >/dev/null || [ ! -d "$dir/node_modules/$pkg" ]; then
  echo "skipped: the oracle $pkg is not installed; run: (cd $dir && npm ci)"
  exit 77
fi
exec "$@"
