#!/usr/bin/env bash
# test_bench.sh - `dsv3 bench` as a command, on the tiny golden model: the
# JSON lines carry the fields the issue names (test, n_prompt, n_gen, depth,
# threads, tok_s, tok_s_min, tok_s_max) with sane values, the table prints a
# limit beside every row, and bad flags exit non-zero with a message. Speed
# itself is never asserted: the suite must not fail on a slow machine.
set -u
bin=${DSV3_BIN:-build/dsv3}
golden=${DSV3_GOLDEN:-tests/golden}
fails=0; passes=0
ok() { passes=$((passes+1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails+1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
m=(--ckpt-path "$golden/tiny_hf" --config "$golden/config_tiny.json")

# 1. JSON: one object per run (pp8, tg4 at depths 0 and 16) plus the memory line
if "$bin" bench "${m[@]}" -p 8 -n 4 -d 0,16 -r 2 -t 2 --json > "$tmp/j.out" 2> "$tmp/j.err"; then ok; else bad "bench --json: $(cat "$tmp/j.err")"; fi
[ "$(grep -c '"test": "pp"' "$tmp/j.out")" = 2 ] && ok || bad "expected 2 pp lines: $(cat "$tmp/j.out")"
[ "$(grep -c '"test": "tg"' "$tmp/j.out")" = 2 ] && ok || bad "expected 2 tg lines"
grep -q '"test": "memory"' "$tmp/j.out" && ok || bad "no memory line"
for key in n_prompt n_gen depth threads tok_s tok_s_min tok_s_max bytes_per_token gbps bw_gbps bw_frac; do
    [ "$(grep '"test": "[pt][pg]"' "$tmp/j.out" | grep -c "\"$key\": ")" = 4 ] && ok || bad "key $key missing"
done
# values: min <= median <= max, all positive; depths 0 and 16; 2 threads
awk -F'[:,}]' '/"test": "(pp|tg)"/ {
    for (i = 1; i < NF; i++) { gsub(/[ "{]/, "", $i); v[$i] = $(i + 1) + 0 }
    if (!(v["tok_s_min"] > 0 && v["tok_s_min"] <= v["tok_s"] && v["tok_s"] <= v["tok_s_max"])) bad = 1
    if (v["threads"] != 2) bad = 1
    depths[v["depth"]] = 1
} END { exit bad || !(0 in depths) || !(16 in depths) }' "$tmp/j.out" && ok || bad "implausible values: $(cat "$tmp/j.out")"

# 2. the table: a limit on every row
if "$bin" bench "${m[@]}" -p 8 -n 4 -r 1 > "$tmp/t.out" 2> "$tmp/t.err"; then ok; else bad "bench table: $(cat "$tmp/t.err")"; fi
grep -q '^machine: read bandwidth' "$tmp/t.out" && ok || bad "no machine line: $(cat "$tmp/t.out")"
grep -E '^pp8 .*% of .* (bf16|f32 FMA) peak' "$tmp/t.out" >/dev/null && ok || bad "pp row without its limit"
grep -E '^tg4 .*% of .* GB/s read' "$tmp/t.out" >/dev/null && ok || bad "tg row without its limit"
grep -q '^peak RSS' "$tmp/t.out" && ok || bad "no peak RSS line"

# 3. bad flags: non-zero exit and a message naming the flag
check_bad() { # expected-substring args...
    local want=$1; shift
    if "$bin" bench "$@" > "$tmp/b.out" 2> "$tmp/b.err"; then bad "bench $* exited 0"; return; fi
    grep -q -- "$want" "$tmp/b.err" && ok || bad "bench $*: message lacks '$want': $(cat "$tmp/b.err")"
}
check_bad "-p" "${m[@]}" -p 8,x
check_bad "-n" "${m[@]}" -n -3
check_bad "-r" "${m[@]}" -r 0
check_bad "max_seq_len" "${m[@]}" -p 8 -n 4 -d 100000
check_bad "--ckpt-path" --config "$golden/config_tiny.json"
check_bad "no_such_dir" --ckpt-path "$tmp/no_such_dir" --config "$golden/config_tiny.json" -p 8 -n 0

echo "bench: $passes passed, $fails failed"
[ "$fails" = 0 ]
