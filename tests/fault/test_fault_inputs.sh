#!/usr/bin/env bash
# test_fault_inputs.sh - inputs that are not what they claim and outputs that
# cannot be written: a FIFO, a directory or an oversized file in place of each
# kind of input file (never a hang: every command runs under `timeout`), a
# config whose sizes would overflow, an F32 scale at an unaligned offset, a
# shard truncated under a running cast or model (SIGBUS), stdout on /dev/full,
# descriptors 0-2 closed at start, thread counts past any machine's, and
# prompts with a NUL byte or too long to tokenize before the context check.
. "$(dirname "$0")/../prelude.sh"
# expect_err NAME PATTERN CMD...: exits 1-123 (not a timeout or a signal) with PATTERN on stderr
expect_err() {
    local name="$1" pat="$2"; shift 2
    timeout 20 "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then bad "$name: exit $rc $(head -c 300 "$tmp/err")"; return; fi
    if ! grep -q -- "$pat" "$tmp/err"; then bad "$name: stderr lacks '$pat': $(head -c 300 "$tmp/err")"; return; fi
    ok "$name"
}

hf="$tmp/hf"
cp -r "$golden/tiny_hf" "$hf"
cfg="$golden/config_tiny.json"

# ---- a FIFO, a directory, an oversized file for each kind of input ----
mkfifo "$tmp/fifo"
mkdir "$tmp/adir"
expect_err "FIFO as a shard (info)" "FIFO" "$bin" info "$tmp/fifo"
expect_err "FIFO as a config (synth)" "FIFO" "$bin" synth --config "$tmp/fifo" --out "$tmp/o"
expect_err "directory as a config (synth)" "directory" "$bin" synth --config "$tmp/adir" --out "$tmp/o"
for f in config.json model.safetensors.index.json model-00001-of-00002.safetensors; do
    rm -rf "$tmp/k"; cp -r "$hf" "$tmp/k"; rm "$tmp/k/$f"; mkfifo "$tmp/k/$f"
    expect_err "FIFO as $f (convert)" "FIFO" "$bin" convert --hf-ckpt-path "$tmp/k" --save-path "$tmp/o" --n-experts 16 --model-parallel 1
    expect_err "FIFO as $f (cast-bf16)" "FIFO" "$bin" cast-bf16 --input-fp8-hf-path "$tmp/k" --output-bf16-hf-path "$tmp/o"
done
rm -rf "$tmp/k"; cp -r "$hf" "$tmp/k"; mkfifo "$tmp/k/tokenizer.json"
expect_err "FIFO as tokenizer.json (convert copies it)" "FIFO\|regular" "$bin" convert --hf-ckpt-path "$tmp/k" --save-path "$tmp/o" --n-experts 16 --model-parallel 1
[ -e "$tmp/o" ] && bad "a failed convert left its output"
mkdir -p "$tmp/tok"
mkfifo "$tmp/tok/tokenizer.json"
expect_err "FIFO as tokenizer.json (tokenize)" "FIFO" "$bin" tokenize --tokenizer "$tmp/tok" --text hi
rm "$tmp/tok/tokenizer.json"; mkdir "$tmp/tok/tokenizer.json"
expect_err "directory as tokenizer.json" "directory" "$bin" tokenize --tokenizer "$tmp/tok" --text hi
rmdir "$tmp/tok/tokenizer.json"; truncate -s 300M "$tmp/tok/tokenizer.json"
expect_err "300 MB tokenizer.json" "limit" "$bin" tokenize --tokenizer "$tmp/tok" --text hi
rm "$tmp/tok/tokenizer.json"
# perplexity's text file (it was read with fread, so a FIFO blocked and a huge file was read whole)
expect_err "FIFO as perplexity's --file" "FIFO" "$bin" perplexity --ckpt-path "$hf" --config "$cfg" --file "$tmp/fifo"
expect_err "directory as perplexity's --file" "directory" "$bin" perplexity --ckpt-path "$hf" --config "$cfg" --file "$tmp/adir"
truncate -s 2G "$tmp/big.txt"
expect_err "2 GB perplexity --file" "limit" "$bin" perplexity --ckpt-path "$hf" --config "$cfg" --file "$tmp/big.txt"
rm "$tmp/big.txt"
if [ -n "${DSV3_TOKENIZER:-}" ] || [ -f "$(dirname "$golden")/../.cache/tokenizer/tokenizer.json" ]; then
    src="${DSV3_TOKENIZER:-$(dirname "$golden")/../.cache/tokenizer}"
    cp "$src/tokenizer.json" "$tmp/tok/"
    mkfifo "$tmp/tok/tokenizer_config.json"
    expect_err "FIFO as tokenizer_config.json" "FIFO" "$bin" tokenize --tokenizer "$tmp/tok" --text hi
    rm "$tmp/tok/tokenizer_config.json"; truncate -s 20M "$tmp/tok/tokenizer_config.json"
    expect_err "20 MB tokenizer_config.json" "limit" "$bin" tokenize --tokenizer "$tmp/tok" --text hi
fi

# ---- configs whose sizes would overflow or run for ever ----
for kv in '"n_layers": 2147483647' '"vocab_size": 2147483647' '"dim": 2147483647' '"n_routed_experts": 2147483647' \
          '"moe_inter_dim": 2147483647' '"mscale": 1e308'; do
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d.update(json.loads("{" + sys.argv[2] + "}")); print(json.dumps(d))' \
        "$cfg" "$kv" > "$tmp/huge.json"
    key="${kv%%\":*}"; key="${key#\"}"
    expect_err "synth with $kv" "$key" "$bin" synth --config "$tmp/huge.json" --out "$tmp/o"
done
[ -e "$tmp/o" ] && bad "a refused synth left its output"

# ---- flag limits of the writers ----
expect_err "cast-bf16 --threads 100000" "threads" "$bin" cast-bf16 --input-fp8-hf-path "$hf" --output-bf16-hf-path "$tmp/o" --threads 100000
expect_err "convert --model-parallel 100000" "model-parallel" "$bin" convert --hf-ckpt-path "$hf" --save-path "$tmp/o" --n-experts 100000 --model-parallel 100000
# thread counts past any machine's cores: a message, not a stack overflow inside OpenMP
expect_err "bench -t 100000" "-t must be" "$bin" bench --ckpt-path "$hf" --config "$cfg" -p 8 -n 1 -t 100000
expect_err "logits --threads 100000" "n_threads" "$bin" logits --ckpt-path "$hf" --config "$cfg" --tokens 1,2 --out "$tmp/l.st" --threads 100000
expect_err "logits with OMP_NUM_THREADS=100000" "OMP_NUM_THREADS" env OMP_NUM_THREADS=100000 "$bin" logits --ckpt-path "$hf" --config "$cfg" --tokens 1,2 --out "$tmp/l.st"

# ---- an F32 scale whose data offset is not 4-aligned (legal in safetensors) ----
mkdir -p "$tmp/un"
python3 - "$tmp/un/model.safetensors" <<'EOF'
import json, struct, sys
# one U8 byte first, so the F8 weight starts at 1 and its F32 scale at 1 + 256*256
w = bytes((i * 7 + 3) % 0x7e for i in range(256 * 256))  # finite e4m3 codes
hdr = {"pad": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
       "model.layers.0.mlp.gate_proj.weight": {"dtype": "F8_E4M3", "shape": [256, 256], "data_offsets": [1, 1 + len(w)]},
       "model.layers.0.mlp.gate_proj.weight_scale_inv": {"dtype": "F32", "shape": [2, 2], "data_offsets": [1 + len(w), 17 + len(w)]}}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"\x07" + w + struct.pack("<4f", 0.5, 2.0, 0.25, 4.0))
EOF
if timeout 20 "$bin" cast-bf16 --input-fp8-hf-path "$tmp/un" --output-bf16-hf-path "$tmp/un-out" 2>"$tmp/err"; then
    python3 - "$tmp/un/model.safetensors" "$tmp/un-out/model.safetensors" <<'EOF' && ok "cast-bf16 with an unaligned F32 scale" || bad "cast-bf16 with an unaligned F32 scale: wrong values"
import json, struct, sys
def e4m3(b):
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    v = (m / 8) * 2 ** -6 if e == 0 else (1 + m / 8) * 2 ** (e - 7)
    return -v if s else v
def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (u + 0x7fff + ((u >> 16) & 1)) >> 16
src = open(sys.argv[1], "rb").read()
hl = struct.unpack("<Q", src[:8])[0]
w = src[8 + hl + 1: 8 + hl + 1 + 65536]
sc = struct.unpack("<4f", src[8 + hl + 1 + 65536:])
out = open(sys.argv[2], "rb").read()
ol = struct.unpack("<Q", out[:8])[0]
oh = json.loads(out[8:8 + ol])
t = oh["model.layers.0.mlp.gate_proj.weight"]
b0 = 8 + ol + t["data_offsets"][0]
got = struct.unpack("<65536H", out[b0:b0 + 131072])
for r in range(256):
    for c in range(256):
        want = bf16(struct.unpack("<f", struct.pack("<f", e4m3(w[r * 256 + c]) * sc[(r // 128) * 2 + c // 128]))[0])
        if got[r * 256 + c] != want:
            sys.exit(1)
EOF
else bad "cast-bf16 with an unaligned F32 scale: exit $? $(head -c 300 "$tmp/err")"; fi

# ---- a shard truncated under a running cast: a message, not a bare SIGBUS ----
cat > "$tmp/big.json" <<'EOF'
{"vocab_size": 16384, "dim": 1024, "inter_dim": 2048, "moe_inter_dim": 256, "n_layers": 3, "n_dense_layers": 1,
 "n_heads": 8, "n_routed_experts": 16, "n_shared_experts": 1, "n_activated_experts": 2, "q_lora_rank": 0,
 "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "dtype": "fp8"}
EOF
"$bin" synth --config "$tmp/big.json" --out "$tmp/big" --shard-size-mb 32 2>/dev/null || bad "synth big"
"$bin" cast-bf16 --input-fp8-hf-path "$tmp/big" --output-bf16-hf-path "$tmp/bus" --threads 1 2>"$tmp/err" &
pid=$!
for _ in $(seq 200); do compgen -G "$tmp/.bus.dsv3-tmp-*/*" >/dev/null && break; sleep 0.005; done
# all shards but the first (which the cast is reading): their FP8 weights are
# read in user space (SIGBUS); bytes passed to write() give EFAULT instead
for f in "$tmp"/big/model-0000[2-9]-*.safetensors; do truncate -s 4096 "$f"; done
wait $pid; rc=$?
if [ $rc -eq 0 ]; then ok "shard truncated under cast-bf16: the cast had finished (inconclusive)"
elif [ $rc = 1 ] && grep -q "changed while in use" "$tmp/err" && [ ! -e "$tmp/bus" ] && ! compgen -G "$tmp/.bus.dsv3-*" >/dev/null; then
    ok "shard truncated under cast-bf16: $(head -c 160 "$tmp/err")"
else bad "shard truncated under cast-bf16: exit $rc: $(head -c 300 "$tmp/err")"; fi

# ---- write errors on stdout and closed descriptors ----
expect_err "info > /dev/full" "standard output" bash -c "exec '$bin' info '$hf' > /dev/full"
expect_err "--help > /dev/full" "standard output" bash -c "exec '$bin' --help > /dev/full"
expect_err "info --summary > /dev/full" "standard output" bash -c "exec '$bin' info '$hf' --summary > /dev/full"
"$bin" synth --config "$cfg" --out "$tmp/ref" --seed 3 2>/dev/null
"$bin" synth --config "$cfg" --out "$tmp/closed" --seed 3 <&- >&- 2>&-
[ $? = 0 ] && [ "$(dirsum "$tmp/closed")" = "$(dirsum "$tmp/ref")" ] && ok "synth with descriptors 0-2 closed" \
    || bad "synth with descriptors 0-2 closed"
# a warning written while the output is open must not land in a shard: two
# input shards take descriptors 0 and 1, so the output would get 2 (stderr)
mkdir -p "$tmp/ms"
python3 - "$tmp/ms" <<'EOF'
import json, struct, sys
def put(path, hdr, data):
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
w = bytes((i * 7 + 3) % 0x7e for i in range(64 * 64))
put(sys.argv[1] + "/model-1.safetensors", {"model.layers.0.mlp.gate_proj.weight": {"dtype": "F8_E4M3",
    "shape": [64, 64], "data_offsets": [0, len(w)]}}, w)
put(sys.argv[1] + "/model-2.safetensors", {"model.norm.weight": {"dtype": "BF16", "shape": [64],
    "data_offsets": [0, 128]}}, bytes(range(128)))
EOF
"$bin" cast-bf16 --input-fp8-hf-path "$tmp/ms" --output-bf16-hf-path "$tmp/ms-ref" --allow-missing-scale 2>/dev/null
"$bin" cast-bf16 --input-fp8-hf-path "$tmp/ms" --output-bf16-hf-path "$tmp/ms-closed" --allow-missing-scale <&- >&- 2>&-
[ "$(dirsum "$tmp/ms-closed")" = "$(dirsum "$tmp/ms-ref")" ] && ok "cast-bf16 warning with descriptors 0-2 closed" \
    || bad "cast-bf16 with descriptors 0-2 closed: the warning went into an output file"
# the REPL with stdin closed: stdin is /dev/null, so it ends at once (it looped on EBADF)
tokdir="$(dirname "$golden")/../.cache/tokenizer"
gcfg="$(dirname "$golden")/gen/config_gen.json"
if [ -f "$tokdir/tokenizer.json" ] && [ -f "$gcfg" ]; then
    "$bin" synth --config "$gcfg" --out "$tmp/gm" --dtype fp8 --seed 7 --tokenizer "$tokdir" >/dev/null 2>&1
    timeout 60 "$bin" generate --ckpt-path "$tmp/gm" --config "$gcfg" --max-new-tokens 3 --interactive <&- >/dev/null 2>&1
    rc=$?
    [ $rc = 0 ] && ok "generate --interactive with stdin closed ends" || bad "generate --interactive with stdin closed: exit $rc"
    expect_err "generate --threads 100000" "n_threads" "$bin" generate --ckpt-path "$tmp/gm" --config "$gcfg" -p hi -n 2 --threads 100000
    # a checkpoint's own chat template with an integer overflow: an error, not SIGFPE
    mkdir -p "$tmp/jt"
    cp "$tmp/gm/tokenizer.json" "$tmp/jt/"
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["chat_template"] = "{{ (-9223372036854775807 - 1) // -1 }}"; json.dump(d, open(sys.argv[2], "w"))' \
        "$tmp/gm/tokenizer_config.json" "$tmp/jt/tokenizer_config.json"
    expect_err "template integer overflow under generate" "integer overflow" "$bin" generate --ckpt-path "$tmp/gm" --config "$gcfg" --tokenizer "$tmp/jt" -p hi -n 2
    # prompts: text after a NUL byte is an error naming the line, never dropped unseen
    printf 'fine\nhello\0 world\n' > "$tmp/nul.txt"
    expect_err "a NUL in a prompt line" "line 2: a NUL byte" "$bin" generate --ckpt-path "$tmp/gm" --config "$gcfg" --input-file "$tmp/nul.txt" -n 2
    # a 50 MB one-word line is refused from its length at once (tokenizing it took minutes)
    head -c 50000000 /dev/zero | tr '\0' a > "$tmp/word.txt"
    expect_err "a 50 MB one-word prompt" "more than the context" "$bin" generate --ckpt-path "$tmp/gm" --config "$gcfg" --input-file "$tmp/word.txt" -n 2
    rm "$tmp/word.txt"
    # a shard truncated while a model runs from it: a message naming the file, not a bare SIGBUS
    cp -r "$tmp/gm" "$tmp/gm2"
    mkfifo "$tmp/in"
    "$bin" generate --ckpt-path "$tmp/gm2" --config "$gcfg" --interactive --max-new-tokens 3 <"$tmp/in" >/dev/null 2>"$tmp/err" &
    pid=$!
    exec 7>"$tmp/in"
    for _ in $(seq 600); do grep -q '^loaded' "$tmp/err" && break; sleep 0.1; done
    for f in "$tmp"/gm2/*.safetensors; do truncate -s 4096 "$f"; done
    echo hi >&7
    exec 7>&-
    wait $pid; rc=$?
    [ $rc = 1 ] && grep -q "safetensors changed while in use" "$tmp/err" && ok "shard truncated under generate" \
        || bad "shard truncated under generate: exit $rc: $(tail -c 300 "$tmp/err")"
fi
exit $fail
