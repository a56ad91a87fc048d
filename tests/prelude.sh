# prelude.sh - sourced by the script tests that report ok/FAIL lines: the binary
# and golden data under test, a scratch directory removed on exit, ok/bad
# reporting into $fail, and dirsum.
set -u
bin="$(realpath "${DSV3_BIN:-build/dsv3}")"
golden="${DSV3_GOLDEN:-tests/golden}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
# sha256 of every file under a directory, with names (empty for a missing dir)
dirsum() { [ -d "$1" ] && (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum) | sha256sum | cut -c1-16; }
