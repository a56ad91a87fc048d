#!/usr/bin/env bash
# test_install.sh - what a user of the installed library sees: `cmake --install`
# into a staging prefix puts dsv3, libdsv3.so and libdsv3.a, dsv3.h and dsv3.pc
# there; examples/simple.c builds with `pkg-config --cflags --libs dsv3` (shared)
# and with --static against libdsv3.a, and both run on models/dsv3-mini with
# the same output; the shared library exports the ds_* API and nothing else.
set -u
build=${DSV3_BUILD:?set by ctest}
root=$(cd "$(dirname "$0")/../.." && pwd)
fails=0; passes=0
ok() { passes=$((passes+1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails+1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1 && ok || bad "cmake --install: $(cat "$tmp/install.log")"
[ -x "$prefix/bin/dsv3" ] && "$prefix/bin/dsv3" --help >/dev/null && ok || bad "no runnable bin/dsv3"
[ -f "$prefix/include/dsv3.h" ] && ok || bad "no include/dsv3.h"
pc=$(find "$prefix" -name dsv3.pc | head -1)
[ -n "$pc" ] && ok || bad "no dsv3.pc"
libdir=$(dirname "$(dirname "$pc")")
ls "$libdir"/libdsv3.so* >/dev/null 2>&1 && [ -f "$libdir/libdsv3.a" ] && ok || bad "libdsv3.so and libdsv3.a not both in $libdir"
export PKG_CONFIG_PATH=$(dirname "$pc")

# only the public API is exported
extra=$(nm -D --defined-only "$libdir/libdsv3.so" | awk '{print $3}' | grep -v -E '^(ds_|_init$|_fini$|_edata$|_end$|__bss_start$)')
[ -z "$extra" ] && ok || bad "libdsv3.so exports more than ds_*: $(echo $extra | head -c 300)"
nm -D --defined-only "$libdir/libdsv3.so" | grep -q ' ds_engine_load$' && ok || bad "ds_engine_load not exported"

cc=${CC:-cc}
# shared: the include and library paths from pkg-config alone
$cc -std=c11 -Wall -Wextra -Werror "$root/examples/simple.c" $(pkg-config --cflags --libs dsv3) -o "$tmp/simple" \
  2> "$tmp/cc.err" && ok || bad "build against libdsv3.so: $(cat "$tmp/cc.err")"
# static: libdsv3.a and the libraries it needs (pkg-config --static)
libs=$(pkg-config --static --libs dsv3 | sed 's/-ldsv3\b/-l:libdsv3.a/')
$cc -std=c11 -Wall -Wextra -Werror "$root/examples/simple.c" $(pkg-config --cflags dsv3) $libs -o "$tmp/simple_static" \
  2> "$tmp/cc.err" && ok || bad "build against libdsv3.a: $(cat "$tmp/cc.err")"
ldd "$tmp/simple_static" 2>/dev/null | grep -q libdsv3 && bad "simple_static links libdsv3.so" || ok

model="$root/models/dsv3-mini"
LD_LIBRARY_PATH="$libdir" OMP_NUM_THREADS=2 "$tmp/simple" "$model" "Tell me about the city." > "$tmp/out1" 2> "$tmp/err1" \
  && [ -s "$tmp/out1" ] && ok || bad "simple (shared): $(cat "$tmp/err1")"
OMP_NUM_THREADS=2 "$tmp/simple_static" "$model" "Tell me about the city." > "$tmp/out2" 2> "$tmp/err2" \
  && ok || bad "simple (static): $(cat "$tmp/err2")"
cmp -s "$tmp/out1" "$tmp/out2" && ok || bad "shared and static replies differ: [$(cat "$tmp/out1")] [$(cat "$tmp/out2")]"
LD_LIBRARY_PATH="$libdir" "$tmp/simple" 2>/dev/null; [ $? = 2 ] && ok || bad "simple without arguments should exit 2"
LD_LIBRARY_PATH="$libdir" "$tmp/simple" "$tmp/nowhere" > /dev/null 2> "$tmp/err3"
[ $? = 1 ] && grep -q "nowhere" "$tmp/err3" && ok || bad "simple on a missing checkpoint: $(cat "$tmp/err3")"

echo "install: $passes passed, $fails failed"
[ "$fails" = 0 ]
