#!/usr/bin/env bash
# test_fault_txn.sh - the checkpoint writers under faults: a full disk
# (ulimit -f), SIGINT/SIGTERM/SIGKILL at several moments, a concurrent second
# writer, in-place use, empty paths. After each, the destination and the inputs
# are byte-identical (sha256 of every file) to before, or the destination is
# the complete new output; never a mix, and no temporary is left behind (a
# SIGKILL's temporary is removed by the next run into that destination).
. "$(dirname "$0")/../prelude.sh"
leftovers() { find "$1" -maxdepth 1 -name '.*dsv3-*' | wc -l; }

# ~100 MB FP8 checkpoint in ~7 shards: synth takes about a second
cat > "$tmp/big.json" <<'EOF'
{"vocab_size": 16384, "dim": 1024, "inter_dim": 2048, "moe_inter_dim": 256, "n_layers": 3, "n_dense_layers": 1,
 "n_heads": 8, "n_routed_experts": 16, "n_shared_experts": 1, "n_activated_experts": 2, "q_lora_rank": 0,
 "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "dtype": "fp8"}
EOF
synth() { "$bin" synth --config "$tmp/big.json" --shard-size-mb 8 "$@"; }
# background jobs of a script start with SIGINT ignored: give the tool the default
bg_synth() { exec env --default-signal=INT,TERM "$bin" synth --config "$tmp/big.json" --shard-size-mb 8 "$@"; }
w="$tmp/w"
mkdir -p "$w"
synth --out "$tmp/ref1" --seed 1 2>/dev/null || bad "reference synth seed 1"
synth --out "$tmp/ref2" --seed 2 2>/dev/null || bad "reference synth seed 2"
old="$(dirsum "$tmp/ref1")" new="$(dirsum "$tmp/ref2")"
[ -n "$old" ] && [ "$old" != "$new" ] || bad "reference outputs"

# ---- signals at several moments: old output or new output, nothing else ----
for sig in INT TERM KILL; do
    for delay in 0.05 0.3 0.6; do
        rm -rf "$w/o"; cp -r "$tmp/ref1" "$w/o"; echo keep > "$w/o/NOTES.txt"
        bg_synth --out "$w/o" --seed 2 2>/dev/null &
        pid=$!
        sleep "$delay"
        kill -s "$sig" "$pid" 2>/dev/null
        wait "$pid"
        rc=$?
        [ "$(cat "$w/o/NOTES.txt" 2>/dev/null)" = keep ] || bad "SIG$sig after ${delay}s: a file of the user's was lost"
        rm -f "$w/o/NOTES.txt"
        got="$(dirsum "$w/o")"
        if [ "$got" != "$old" ] && [ "$got" != "$new" ]; then bad "SIG$sig after ${delay}s (exit $rc): a mix"; continue; fi
        if [ "$sig" != KILL ] && [ "$(leftovers "$w")" != 0 ]; then bad "SIG$sig after ${delay}s: temporaries left"; continue; fi
        ok "SIG$sig after ${delay}s: $([ "$got" = "$old" ] && echo old || echo new) output (exit $rc)"
    done
done
# the next run removes what a SIGKILL left
synth --out "$w/o" --seed 2 2>/dev/null && [ "$(leftovers "$w")" = 0 ] && [ "$(dirsum "$w/o")" = "$new" ] \
    && ok "next run cleans a killed run's temporary" || bad "stale temporaries after SIGKILL not removed"

# ---- a full disk: the write fails cleanly, the destination is untouched ----
rm -rf "$w/o"; cp -r "$tmp/ref1" "$w/o"
(ulimit -f 20000; synth --out "$w/o" --seed 2 2>"$tmp/err"); rc=$?
if [ $rc -ge 1 ] && [ $rc -lt 128 ] && [ "$(dirsum "$w/o")" = "$old" ] && [ "$(leftovers "$w")" = 0 ] \
    && grep -q "write failed\|File too large" "$tmp/err"; then ok "synth on a full disk (exit $rc)"
else bad "synth on a full disk: exit $rc, $(cat "$tmp/err")"; fi

hf="$tmp/hf"
cp -r "$golden/tiny_hf" "$hf"
echo '{"fake": "tokenizer"}' > "$hf/tokenizer.json"
echo '{"chat_template": ""}' > "$hf/tokenizer_config.json"
hfsum="$(dirsum "$hf")"
conv() { "$bin" convert --hf-ckpt-path "$hf" --n-experts 16 --model-parallel "$@"; }
conv 1 --save-path "$w/c" 2>/dev/null || bad "convert"
csum="$(dirsum "$w/c")"
(ulimit -f 2000; conv 2 --save-path "$w/c" 2>"$tmp/err"); rc=$?
[ $rc -ge 1 ] && [ $rc -lt 128 ] && [ "$(dirsum "$w/c")" = "$csum" ] && [ "$(leftovers "$w")" = 0 ] \
    && ok "re-convert on a full disk keeps the previous output" || bad "re-convert on a full disk: exit $rc"
# in place, refused without the flag, then failing half way: the input is as it was
conv 1 --save-path "$hf" 2>"$tmp/err" && bad "in-place convert without --in-place" \
    || { grep -q -- --in-place "$tmp/err" && ok "in-place convert needs --in-place"; }
(ulimit -f 2000; conv 1 --save-path "$hf" --in-place 2>/dev/null); rc=$?
[ $rc -ne 0 ] && [ "$(dirsum "$hf")" = "$hfsum" ] && [ "$(leftovers "$tmp")" = 0 ] \
    && ok "in-place convert on a full disk keeps the input and its tokenizer files" || bad "in-place convert on a full disk: exit $rc"

# cast-bf16: full disk in place keeps the input shards; a good in-place cast equals the out-of-place one
cast() { "$bin" cast-bf16 --input-fp8-hf-path "$hf" --threads 1 "$@"; }
cast --output-bf16-hf-path "$w/b" 2>/dev/null || bad "cast-bf16"
bsum="$(dirsum "$w/b")"
cast --output-bf16-hf-path "$hf" 2>"$tmp/err" && bad "in-place cast without --in-place" \
    || { grep -q -- --in-place "$tmp/err" && [ "$(dirsum "$hf")" = "$hfsum" ] && ok "in-place cast needs --in-place"; }
(ulimit -f 3000; cast --output-bf16-hf-path "$hf" --in-place 2>/dev/null); rc=$?
[ $rc -ge 1 ] && [ $rc -lt 128 ] && [ "$(dirsum "$hf")" = "$hfsum" ] && [ "$(leftovers "$tmp")" = 0 ] \
    && ok "in-place cast-bf16 on a full disk keeps the input shards" || bad "in-place cast-bf16 on a full disk: exit $rc"
cp -r "$hf" "$tmp/hf2"
"$bin" cast-bf16 --input-fp8-hf-path "$tmp/hf2" --output-bf16-hf-path "$tmp/hf2" --in-place --threads 1 2>/dev/null \
    && [ "$(dirsum "$tmp/hf2")" = "$bsum" ] && ok "in-place cast-bf16 gives the out-of-place output" \
    || bad "in-place cast-bf16 output differs"

# ---- a concurrent second writer fails at once, naming the first ----
rm -rf "$w/o"
bg_synth --out "$w/o" --seed 2 2>/dev/null &
pid=$!
for _ in $(seq 100); do [ -s "$w/.o.dsv3-lock" ] && break; sleep 0.01; done
synth --out "$w/o" --seed 1 2>"$tmp/err"; rc=$?
wait "$pid"; rc1=$?
[ $rc -ne 0 ] && grep -q "pid $pid" "$tmp/err" && [ $rc1 = 0 ] && [ "$(dirsum "$w/o")" = "$new" ] \
    && ok "second writer refused ($(head -c 120 "$tmp/err"))" || bad "concurrent writers: rc $rc/$rc1: $(cat "$tmp/err")"
rm -rf "$w/c2"
(exec "$bin" convert --hf-ckpt-path "$hf" --n-experts 16 --model-parallel 1 --save-path "$w/c2" 2>/dev/null) & pid=$!
conv 1 --save-path "$w/c2" 2>/dev/null; rc=$?
wait "$pid"; rc1=$?
[ "$(dirsum "$w/c2")" = "$csum" ] && { [ $rc = 0 ] || [ $rc1 = 0 ]; } \
    && ok "two converts into one directory: one complete output (exits $rc1/$rc)" || bad "two converts: a mix"

# ---- empty or impossible destinations ----
for c in "synth --config $tmp/big.json --out" "convert --hf-ckpt-path $hf --n-experts 16 --model-parallel 1 --save-path" \
         "cast-bf16 --input-fp8-hf-path $hf --output-bf16-hf-path"; do
    (cd "$w" && $bin $c '' 2>"$tmp/err"); rc=$?
    [ $rc -ge 1 ] && [ $rc -lt 128 ] && grep -q "empty" "$tmp/err" && ok "${c%% *} with an empty output path" \
        || bad "${c%% *} with an empty output path: exit $rc"
done
echo x > "$w/file"
synth --out "$w/file" 2>"$tmp/err"; rc=$?
[ $rc -ge 1 ] && [ $rc -lt 128 ] && [ "$(cat "$w/file")" = x ] && ok "output path that is a file" || bad "output path that is a file"
[ "$(dirsum "$hf")" = "$hfsum" ] || bad "the input changed"
exit $fail
