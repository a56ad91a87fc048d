#!/usr/bin/env bash
# test_bench.sh - `dsv3 bench` as a command, on the tiny golden model: the
# JSON lines carry the fields the issue names (test, n_prompt, n_gen, depth,
# threads, tok_s, tok_s_min, tok_s_max) with sane values, the table prints a
# limit beside every row, --profile splits a decode step, --seqs decodes
# several sequences and counts their experts and KV bytes, -t takes a list, and
# bad flags exit non-zero with a message. Speed itself is never asserted: the suite must not fail on a slow machine.
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
grep -qE "^machine, [0-9]+ threads: read bandwidth" "$tmp/t.out" && ok || bad "no machine line: $(cat "$tmp/t.out")"
grep -E '^pp8 .*% of .* (bf16|f32 FMA) peak' "$tmp/t.out" >/dev/null && ok || bad "pp row without its limit"
grep -E '^tg4 .*% of .* GB/s read' "$tmp/t.out" >/dev/null && ok || bad "tg row without its limit"
grep -q '^peak RSS' "$tmp/t.out" && ok || bad "no peak RSS line"

# 3. --profile: after each decode row, where a step's time went (table and JSON)
if "$bin" bench "${m[@]}" -p 0 -n 4 -r 2 --profile > "$tmp/p.out" 2> "$tmp/p.err"; then ok; else bad "bench --profile: $(cat "$tmp/p.err")"; fi
grep -E '^  a step of tg4 at depth 0: [0-9.]+ ms = decode products [0-9.]+ ms \([0-9.]+%; [0-9.]+ GB/s, [0-9.]+% of [0-9.]+ GB/s read\) \+ attention [0-9.]+ ms .* \+ per-head products .* \+ the rest' \
    "$tmp/p.out" >/dev/null && ok || bad "no profile line: $(cat "$tmp/p.out")"
grep -E '^    products of +[0-9.]+ MB: +[0-9.]+ a step, +[0-9.]+ GB/s' "$tmp/p.out" >/dev/null && ok || bad "no product sizes: $(cat "$tmp/p.out")"
if "$bin" bench "${m[@]}" -p 0 -n 4 -d 0,8 -r 2 --profile --json > "$tmp/pj.out" 2> "$tmp/pj.err"; then ok; else bad "bench --profile --json: $(cat "$tmp/pj.err")"; fi
[ "$(grep -c '"test": "profile"' "$tmp/pj.out")" = 2 ] && ok || bad "expected 2 profile lines: $(cat "$tmp/pj.out")"
# the parts are positive (the products and the attention ran) and add up to the step
awk -F'[:,}]' '/"test": "profile"/ {
    for (i = 1; i < NF; i++) { gsub(/[ "{\[]/, "", $i); v[$i] = $(i + 1) + 0 }
    if (!(v["step_ms"] > 0 && v["products_ms"] > 0 && v["attention_ms"] > 0 && v["heads_t_ms"] >= 0)) bad = 1
    sum = v["products_ms"] + v["attention_ms"] + v["heads_t_ms"] + v["other_ms"]
    if (sum < 0.999 * v["step_ms"] || sum > 1.001 * v["step_ms"] || v["products_ms"] > v["step_ms"]) bad = 1
    if (!(v["products_gbps"] > 0 && v["bytes_per_call"] > 0 && v["calls_per_token"] > 0)) bad = 1
    n++
} END { exit bad || n != 2 }' "$tmp/pj.out" && ok || bad "implausible profile: $(cat "$tmp/pj.out")"
"$bin" bench "${m[@]}" -p 0 -n 2 -r 1 --profile --ref-kernels > "$tmp/pr.out" 2>&1 && \
    grep -q 'counts the vectorised kernels, and none ran' "$tmp/pr.out" && ok || bad "--profile --ref-kernels: $(cat "$tmp/pr.out")"

# 4. -o json (one array, read by JSON.parse), -o jsonl, -o csv: the llama-bench fields and the run's provenance
if "$bin" bench "${m[@]}" -p 8 -n 4 -r 2 -t 1 -o json > "$tmp/a.json" 2> "$tmp/a.err"; then ok; else bad "bench -o json: $(cat "$tmp/a.err")"; fi
node -e '
const a = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const runs = a.filter(r => r.test === "pp" || r.test === "tg");
const want = ["model_filename", "config", "dtype", "build_commit", "build_options", "cpu_info", "n_threads", "test_time",
              "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "avg_ns", "samples_ts", "samples_ns", "backends"];
let bad = runs.length !== 2 || !a.some(r => r.test === "memory");
for (const r of runs) {
  for (const k of want) if (!(k in r)) { console.log("missing " + k); bad = true; }
  if (r.n_threads !== 1 || r.samples_ts.length !== 2 || !(r.avg_ts > 0) || isNaN(Date.parse(r.test_time))) bad = true;
  if (!/config_tiny\.json$/.test(r.config) || !/tiny_hf$/.test(r.model_filename)) bad = true;
}
process.exit(bad ? 1 : 0)' "$tmp/a.json" && ok || bad "bench -o json: $(head -c 2000 "$tmp/a.json")"
"$bin" bench "${m[@]}" -p 8 -n 4 -r 1 -o jsonl > "$tmp/a.jsonl" 2>/dev/null \
  && node -e 'const l = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
              process.exit(l.length === 3 && l[0].build_commit && l[2].test === "memory" ? 0 : 1)' "$tmp/a.jsonl" \
  && ok || bad "bench -o jsonl: $(cat "$tmp/a.jsonl")"
"$bin" bench "${m[@]}" -p 8 -n 4 -r 1 -o csv > "$tmp/a.csv" 2>/dev/null
[ "$(wc -l < "$tmp/a.csv")" = 3 ] && head -1 "$tmp/a.csv" | grep -q '^test,n_prompt,n_gen,.*avg_ts' && ok || bad "bench -o csv: $(cat "$tmp/a.csv")"

# 5. --seqs: decode steps of several sequences at once; the row's bytes count
# each MoE layer's distinct experts (between K and the batch's K B) and the KV
# rows at depth (a position's rows: (kv_lora_rank + rope) floats a layer)
if "$bin" bench "${m[@]}" -p 0 -n 3 -d 0,16 --seqs 1,4 -r 1 --json > "$tmp/s.out" 2> "$tmp/s.err"; then ok; else bad "bench --seqs: $(cat "$tmp/s.err")"; fi
node -e '
const l = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse).filter(r => r.test === "tg");
const cfg = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
const K = cfg.n_activated_experts, pos = 4 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * cfg.n_layers;
let bad = l.length !== 4;
for (const r of l) {
  const e = r.experts_per_layer;
  if (r.n_seqs === 1 ? e !== K : !(e > K && e <= K * r.n_seqs)) { console.log("experts " + e); bad = true; }
  const kv = pos * (r.depth + 2); /* positions depth+1 .. depth+3, on average depth + 2 */
  if (Math.abs(r.kv_bytes_per_token - kv) > 1e-6 * kv) { console.log("kv " + r.kv_bytes_per_token + " vs " + kv); bad = true; }
}
process.exit(bad ? 1 : 0)' "$tmp/s.out" "$golden/config_tiny.json" && ok || bad "bench --seqs: $(cat "$tmp/s.out")"
"$bin" bench "${m[@]}" -p 0 -n 2 --seqs 3 -r 1 > "$tmp/s.md" 2>&1 && grep -qE '^tg2x3 .*% of .* GB/s read.*experts a layer, KV' "$tmp/s.md" \
  && ok || bad "bench --seqs table: $(cat "$tmp/s.md")"

# 6. -t LIST: the runs again for each thread count, each after its own limits
"$bin" bench "${m[@]}" -p 4 -n 2 -t 1,2 -r 1 > "$tmp/tl.md" 2>&1 && [ "$(grep -cE '^machine, [12] threads: read bandwidth' "$tmp/tl.md")" = 2 ] \
  && [ "$(grep -c '^tg2 ' "$tmp/tl.md")" = 2 ] && ok || bad "bench -t 1,2: $(cat "$tmp/tl.md")"
"$bin" bench "${m[@]}" -p 0 -n 2 -t 2,1 -r 1 --json 2>/dev/null | grep '"test": "tg"' | grep -o '"n_threads": [0-9]*' | tr '\n' ' ' \
  | grep -q '^"n_threads": 2 "n_threads": 1 $' && ok || bad "bench -t 2,1 --json: threads not as asked"

# 7. bad flags: non-zero exit and a message naming the flag
check_bad() { # expected-substring args...
    local want=$1; shift
    if "$bin" bench "$@" > "$tmp/b.out" 2> "$tmp/b.err"; then bad "bench $* exited 0"; return; fi
    grep -q -- "$want" "$tmp/b.err" && ok || bad "bench $*: message lacks '$want': $(cat "$tmp/b.err")"
}
check_bad "-p" "${m[@]}" -p 8,x
check_bad "-n" "${m[@]}" -n -3
check_bad "-r" "${m[@]}" -r 0
check_bad "--seqs" "${m[@]}" --seqs 0
check_bad "-t must be" "${m[@]}" -t 2,0
check_bad "-o must be" "${m[@]}" -o xml
check_bad "max_seq_len" "${m[@]}" -p 8 -n 4 -d 100000
check_bad "--ckpt-path" --config "$golden/config_tiny.json"
check_bad "no_such_dir" --ckpt-path "$tmp/no_such_dir" --config "$golden/config_tiny.json" -p 8 -n 0

echo "bench: $passes passed, $fails failed"
[ "$fails" = 0 ]
