#!/usr/bin/env bash
# test_nonfinite.sh - NaN weights never become logits silently: a copy of the
# golden tiny checkpoint with layer 1's ffn_norm weight set to NaN makes `dsv3
# logits` fail with a message (exit 1, no output file), and --check-numerics names
# layer 1 as the first whose output is not finite. The clean copy still works.
. "$(dirname "$0")/../prelude.sh"

cp -r "$golden/tiny_hf" "$tmp/nan"
# every element of the tensor (BF16) becomes 0xffff, a NaN
node -e '
const fs = require("fs"), [file, name] = process.argv.slice(1);
const b = fs.readFileSync(file), n = Number(b.readBigUInt64LE(0));
const t = JSON.parse(b.subarray(8, 8 + n).toString())[name];
if (!t || t.dtype !== "BF16") { console.error("no BF16 tensor " + name); process.exit(1); }
b.fill(0xff, 8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
fs.writeFileSync(file, b);' "$tmp/nan/model-00001-of-00002.safetensors" model.layers.1.post_attention_layernorm.weight \
  || bad "could not plant the NaN"
args=(--config "$golden/config_tiny.json" --tokens 1,2,3,4 --all)
"$bin" logits --ckpt-path "$golden/tiny_hf" "${args[@]}" --out "$tmp/clean.st" 2> "$tmp/err" \
  && ok "clean checkpoint" || bad "clean checkpoint: $(cat "$tmp/err")"
"$bin" logits --ckpt-path "$tmp/nan" "${args[@]}" --out "$tmp/nan.st" 2> "$tmp/err"
rc=$?
[ $rc = 1 ] && grep -q "not finite" "$tmp/err" && [ ! -e "$tmp/nan.st" ] && ok "NaN logits refused: $(cat "$tmp/err")" \
  || bad "NaN logits: exit $rc, [$(cat "$tmp/err")], output $(ls "$tmp")"
"$bin" logits --ckpt-path "$tmp/nan" "${args[@]}" --check-numerics --out "$tmp/nan.st" 2> "$tmp/err"
rc=$?
[ $rc = 1 ] && grep -q "layer 1's output is not finite" "$tmp/err" && ok "--check-numerics: $(cat "$tmp/err")" \
  || bad "--check-numerics: exit $rc, [$(cat "$tmp/err")]"
[ $fail = 0 ] && echo "model_nonfinite: passed" || echo "model_nonfinite: failed"
exit $fail
