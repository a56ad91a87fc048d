#!/usr/bin/env bash
# test_convert_mtp.sh - `dsv3 convert --keep-mtp` on models/dsv3-mini, whose MTP
# module sits under DeepSeek-V3's HF names at layer index num_hidden_layers
# (model.layers.5.{embed_tokens, enorm, hnorm, eh_proj, shared_head.*} and a
# decoder block): kept, renamed as convert.py renames the rest, split over ranks
# as the embedding and the output head are; dropped without the flag; and the
# engine, which ignores the module, gives the HF directory's logits from either.
. "$(dirname "$0")/../prelude.sh"
dir="${DSV3_TRAINED:-models/dsv3-mini}"

for mp in 1 2; do
  "$bin" convert --hf-ckpt-path "$dir" --save-path "$tmp/mtp$mp" --n-experts 16 --model-parallel $mp --keep-mtp \
    > /dev/null 2> "$tmp/err" || bad "convert --keep-mtp mp$mp: $(cat "$tmp/err")"
done
"$bin" convert --hf-ckpt-path "$dir" --save-path "$tmp/plain" --n-experts 16 --model-parallel 1 > /dev/null 2>&1 \
  || bad "convert without --keep-mtp"
"$bin" info "$tmp/mtp1/model0-mp1.safetensors" > "$tmp/mtp1.txt" 2>&1
"$bin" info "$tmp/mtp2/model1-mp2.safetensors" > "$tmp/mtp2.txt" 2>&1
"$bin" info "$tmp/plain/model0-mp1.safetensors" > "$tmp/plain.txt" 2>&1
for t in "layers.5.embed.weight BF16 \[8192, 256\]" "layers.5.enorm.weight BF16 \[256\]" \
         "layers.5.hnorm.weight BF16 \[256\]" "layers.5.eh_proj.weight BF16 \[256, 512\]" \
         "layers.5.shared_head.norm.weight BF16 \[256\]" "layers.5.shared_head.head.weight BF16 \[8192, 256\]" \
         "layers.5.attn.wkv_b.weight F8_E4M3 \[512, 128\]" "layers.5.ffn.experts.15.w2.weight F8_E4M3"; do
  grep -Eq "^${t// /[[:space:]]+}" "$tmp/mtp1.txt" && ok "mp1 keeps ${t%% *}" || bad "mp1: no '$t'"
done
for t in "layers.5.embed.weight BF16 \[4096, 256\]" "layers.5.shared_head.head.weight BF16 \[4096, 256\]" \
         "layers.5.eh_proj.weight BF16 \[256, 512\]" "layers.5.ffn.experts.15.w1.weight"; do
  grep -Eq "^${t// /[[:space:]]+}" "$tmp/mtp2.txt" && ok "mp2 rank 1 holds ${t%% *}" || bad "mp2 rank 1: no '$t'"
done
grep -q "layers.5.ffn.experts.0.w1" "$tmp/mtp2.txt" && bad "mp2 rank 1 holds rank 0's expert 0" || ok "mp2 experts split by rank"
grep -q "^layers\.5\." "$tmp/plain.txt" && bad "without --keep-mtp the MTP module is kept" || ok "without --keep-mtp: dropped"

toks=0,56,1143,301,468,16,334,268
"$bin" logits --ckpt-path "$dir" --config "$dir/config.json" --tokens $toks --all --out "$tmp/hf.st" 2>/dev/null
for d in mtp1 plain; do
  "$bin" logits --ckpt-path "$tmp/$d" --config "$tmp/$d/config.json" --tokens $toks --all --out "$tmp/$d.st" 2> "$tmp/err" \
    || bad "logits from $d: $(cat "$tmp/err")"
  cmp -s "$tmp/hf.st" "$tmp/$d.st" && ok "logits from $d equal the HF directory's" || bad "logits from $d differ from the HF directory's"
done
[ $fail = 0 ] && echo "train_convert_mtp: passed" || echo "train_convert_mtp: failed"
exit $fail
