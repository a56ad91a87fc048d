#!/usr/bin/env bash
# demo.sh - the README's main job on the embedded default model: a small
# random-weight checkpoint shaped like DeepSeek-V3 (configs/config_demo.json)
# with DeepSeek-V3's real tokenizer, made by `dsv3 synth`, converted with
# `dsv3 convert`, then answering prompts with `dsv3 generate`. Random weights
# produce arbitrary text: the demo shows the pipeline, not a language model.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=.cache/demo
if [ ! -f "$demo/hf/model.safetensors.index.json" ]; then
  rm -rf "$demo"
  mkdir -p "$demo"
  build/dsv3 synth --config configs/config_demo.json --out "$demo/hf" --dtype fp8 --seed 1 --tokenizer .cache/tokenizer
fi
if [ ! -f "$demo/mp1/model0-mp1.safetensors" ]; then
  build/dsv3 convert --hf-ckpt-path "$demo/hf" --save-path "$demo/mp1" --n-experts 16 --model-parallel 1
fi
printf '%s\n' "Hello! Who are you?" "Write a haiku about the sea." > "$demo/prompts.txt"
build/dsv3 generate --ckpt-path "$demo/mp1" --config configs/config_demo.json \
  --input-file "$demo/prompts.txt" --max-new-tokens 24 --temperature 0.7
