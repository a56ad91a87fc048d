#!/bin/bash
# bench/peer_llamacpp.sh - dsv3 beside llama.cpp on this CPU: the same synthetic
# model (bench/config_16B_8L.json unless --config), the same prompt and decode
# lengths, depths and threads, the two programs alternated round by round so
# that a machine whose speed drifts treats both alike. Pairs: dsv3's FP8
# checkpoint against llama.cpp's Q8_0, dsv3's BF16 against llama.cpp's BF16.
#
# It builds llama-bench and llama-quantize from the llama.cpp source tree given
# (-march=native: with AMX where the CPU has it; --amx off|both adds a build
# without), converts dsv3's BF16 checkpoint to GGUF with the converter given
# (a `dsv3 synth` checkpoint has no tokenizer: the stock convert_hf_to_gguf.py
# needs one, hence --convert), quantizes it to Q8_0 keeping attn_k_b/attn_v_b
# in BF16 (llama.cpp's AMX path aborts on these shapes otherwise), and prints
# one table: the median over rounds of each program's mean tok/s, their ratio,
# and dsv3's figure as a percentage of the limit its own bench measured.
#
#   bench/peer_llamacpp.sh --llama-src DIR [--convert FILE] [-t N] [-p 512] [-n 32]
#                          [-d 0] [-r 3] [--rounds 2] [--amx on|off|both] [--pairs "fp8 bf16"]
#                          [--config FILE] [--work DIR] [--prep-only]
# Needs: build/dsv3 (DSV3_BIN), cmake and a C++ compiler, python3 (PYTHON) with
# what the converter imports (torch, numpy, ...). Everything it makes goes under
# --work (default .cache/peer, git-ignored) and is reused when present;
# --prep-only makes it (checkpoints, builds, GGUF files) and measures nothing.
# dsv3's prefill is compared with the tile peak where it ran on AMX.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DSV3_BIN:-$ROOT/build/dsv3}
CFG=$ROOT/bench/config_16B_8L.json
SRC= CONVERT= WORK=$ROOT/.cache/peer PREP=0
PY=${PYTHON:-python3}
T=$(nproc) P=512 N=32 D=0 R=3 ROUNDS=2 AMX=on PAIRS="fp8 bf16"
usage() { sed -n '17,19p' "$0" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    [ "$1" = --prep-only ] && { PREP=1; shift; continue; }
    [ "$1" = -h ] || [ "$1" = --help ] || [ $# -ge 2 ] || { echo "peer_llamacpp.sh: $1 needs a value" >&2; exit 2; }
    case $1 in
    --llama-src) SRC=$2 ;; --convert) CONVERT=$2 ;; --config) CFG=$2 ;; --work) WORK=$2 ;;
    -t) T=$2 ;; -p) P=$2 ;; -n) N=$2 ;; -d) D=$2 ;; -r) R=$2 ;; --rounds) ROUNDS=$2 ;;
    --amx) AMX=$2 ;; --pairs) PAIRS=$2 ;;
    -h|--help) usage ;;
    *) echo "peer_llamacpp.sh: unknown argument '$1'" >&2; usage ;;
    esac
    shift 2
done
die() { echo "peer_llamacpp.sh: $*" >&2; exit 1; }
# paths as given (relative to the caller's directory), then from the repository's root
abs() { [ -z "$1" ] || [ "${1:0:1}" = / ] && echo "$1" || echo "$PWD/$1"; }
SRC=$(abs "$SRC") CONVERT=$(abs "$CONVERT") CFG=$(abs "$CFG") BIN=$(abs "$BIN")
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
cd "$ROOT"
[ -n "$SRC" ] || { echo "peer_llamacpp.sh: --llama-src DIR is required" >&2; usage; }
[ -f "$SRC/CMakeLists.txt" ] && [ -d "$SRC/tools/llama-bench" ] || die "$SRC is not a llama.cpp source tree (no CMakeLists.txt, tools/llama-bench)"
[ -x "$BIN" ] || die "$BIN not found: build dsv3 first (cmake -B build && cmake --build build --target dsv3)"
[ -f "$CFG" ] || die "no config $CFG"
case $AMX in on) BUILDS=amx ;; off) BUILDS=noamx ;; both) BUILDS="amx noamx" ;; *) die "--amx must be on, off or both" ;; esac
for x in "$T" "$P" "$N" "$R" "$ROUNDS"; do [[ $x =~ ^[0-9]+$ ]] || die "-t, -p, -n, -r and --rounds take a number, got '$x'"; done
[[ $D =~ ^[0-9]+(,[0-9]+)*$ ]] || die "-d takes comma-separated depths, got '$D'"
for pr in $PAIRS; do [ "$pr" = fp8 ] || [ "$pr" = bf16 ] || die "--pairs takes fp8 and/or bf16, got '$pr'"; done
if [ -z "$CONVERT" ]; then
    CONVERT=$SRC/convert_hf_to_gguf.py
    [ -f "$SRC/../hf2gguf.py" ] && CONVERT=$SRC/../hf2gguf.py
fi
[ -f "$CONVERT" ] || die "no converter $CONVERT (--convert FILE)"
name=$(basename "$CFG" .json); name=${name#config_}
log=$WORK/runs.jsonl
: > "$log"

# 1. dsv3's checkpoints (the bench's own, shared with bench/run.sh), made
# while llama.cpp builds
ckpt() { echo "$ROOT/.cache/bench/${name}_$1"; }
synth_all() {
    for dt in bf16 $PAIRS; do
        d=$(ckpt "$dt")
        [ -f "$d/model.safetensors.index.json" ] || "$BIN" synth --config "$CFG" --out "$d" --dtype "$dt" || return 1
    done
}
synth_all > "$WORK/synth.log" 2>&1 &
synth_pid=$!

# 2. llama.cpp, built for this CPU; the no-AMX build switches the AMX ISA off
# (explicit -mno-* options win over -march=native in GCC and Clang)
for b in $BUILDS; do
    dir=$WORK/llama-$b
    if [ ! -x "$dir/bin/llama-bench" ] || [ ! -x "$dir/bin/llama-quantize" ]; then
        flags=; [ "$b" = noamx ] && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        cmake -S "$SRC" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" > "$WORK/cmake-$b.log" 2>&1 \
            || die "llama.cpp configure failed: $WORK/cmake-$b.log"
        cmake --build "$dir" -j "$(nproc)" --target llama-bench llama-quantize > "$WORK/build-$b.log" 2>&1 \
            || die "llama.cpp build failed: $WORK/build-$b.log"
    fi
done
lb=$WORK/llama-${BUILDS%% *}/bin
wait "$synth_pid" || die "dsv3 synth failed: $WORK/synth.log"

# 3. the same weights' shapes as GGUF: BF16, and Q8_0 beside dsv3's FP8
g16=$WORK/$name-bf16.gguf g8=$WORK/$name-q8_0.gguf
if [ ! -f "$g16" ]; then
    "$PY" "$CONVERT" "$(ckpt bf16)" --outtype bf16 --outfile "$g16.tmp" > "$WORK/convert.log" 2>&1 \
        || die "conversion failed: $WORK/convert.log"
    mv "$g16.tmp" "$g16"
fi
if [[ " $PAIRS " == *" fp8 "* ]] && [ ! -f "$g8" ]; then
    "$lb/llama-quantize" --tensor-type attn_k_b=bf16 --tensor-type attn_v_b=bf16 "$g16" "$g8.tmp" Q8_0 \
        > "$WORK/quantize.log" 2>&1 || die "quantization failed: $WORK/quantize.log"
    mv "$g8.tmp" "$g8"
fi
[ "$PREP" = 0 ] || { echo "peer_llamacpp.sh: prepared under $WORK" >&2; exit 0; }

# 4. alternated: each round runs every pair, llama.cpp then dsv3
tag() { python3 -c 'import json,sys; t=json.loads(sys.argv[1])
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): o=json.loads(l); o.update(t); print(json.dumps(o))' "$1"; }
for round in $(seq "$ROUNDS"); do
    for pr in $PAIRS; do
        g=$g16; [ "$pr" = fp8 ] && g=$g8
        for b in $BUILDS; do
            echo "round $round: llama.cpp ($b) $(basename "$g")" >&2
            "$WORK/llama-$b/bin/llama-bench" -m "$g" -t "$T" -p "$P" -n "$N" -d "$D" -r "$R" -o jsonl \
                2> "$WORK/llama-bench.err" | tag "{\"engine\": \"llama.cpp-$b\", \"pair\": \"$pr\", \"round\": $round}" >> "$log" \
                || die "llama-bench failed: $WORK/llama-bench.err"
        done
        echo "round $round: dsv3 $(ckpt "$pr")" >&2
        "$BIN" bench --ckpt-path "$(ckpt "$pr")" --config "$CFG" --device cpu -t "$T" -p "$P" -n "$N" -d "$D" -r "$R" \
            -o jsonl 2> "$WORK/dsv3-bench.err" | tag "{\"engine\": \"dsv3\", \"pair\": \"$pr\", \"round\": $round}" >> "$log" \
            || die "dsv3 bench failed: $WORK/dsv3-bench.err"
    done
done

# 5. one table
python3 - "$log" "$T" "$ROUNDS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = {}
lim = {}
for r in rows:
    if "avg_ts" not in r:
        continue
    test = "pp%d" % r["n_prompt"] if r.get("n_gen", 0) == 0 else "tg%d" % r["n_gen"]
    key = (r["pair"], test, r.get("n_depth", 0))
    runs.setdefault(key, {}).setdefault(r["engine"], []).append(r["avg_ts"])
    if r["engine"] == "dsv3":  # its own limit: read bandwidth for decode, the dot peak for prefill
        peak = r.get("amx_peak_gflops", 0) or max(r.get("bf16_peak_gflops", 0), r.get("fma_peak_gflops", 0))
        frac = r.get("bw_frac", 0) if test.startswith("tg") else (r.get("gflops", 0) / peak if peak else 0)
        lim.setdefault(key, []).append(frac)
peers = sorted({e for k in runs for e in runs[k] if e != "dsv3"})
names = {"fp8": "dsv3 FP8 / llama.cpp Q8_0", "bf16": "dsv3 BF16 / llama.cpp BF16"}
print("threads %s, median over %s rounds of each run's mean tok/s" % (sys.argv[2], sys.argv[3]))
head = "%-28s %-6s %6s %10s %8s" % ("pair", "test", "depth", "dsv3", "of limit")
for p in peers:
    head += " %18s %7s" % (p, "ratio")
print(head)
for key in sorted(runs, key=lambda k: (k[0] != "fp8", k[1][:2] != "pp", k[1], k[2])):
    d = runs[key].get("dsv3")
    if not d:
        continue
    m = statistics.median(d)
    line = "%-28s %-6s %6d %10.2f %7.1f%%" % (names[key[0]], key[1], key[2], m, 100 * statistics.median(lim[key]))
    for p in peers:
        v = runs[key].get(p)
        line += " %18.2f %6.2fx" % (statistics.median(v), m / statistics.median(v)) if v else " %18s %7s" % ("-", "-")
    print(line)
EOF
