#!/usr/bin/env bash
# demo.sh - the README's main job on the embedded default model: a small
# random-weight DeepSeek-V3-shaped checkpoint made by `dsv3 synth`, converted
# and run. Random weights produce arbitrary text: the demo shows the pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=.cache/demo
if [ ! -f "$demo/hf/model.safetensors.index.json" ]; then
  rm -rf "$demo"
  mkdir -p "$demo"
  tokflag=()
  [ -f .cache/tokenizer/tokenizer.json ] && tokflag=(--tokenizer .cache/tokenizer)
  build/dsv3 synth --config configs/config_demo.json --out "$demo/hf" --dtype fp8 --seed 1 "${tokflag[@]}"
fi
build/dsv3 convert --hf-ckpt-path "$demo/hf" --save-path "$demo/mp1" --n-experts 16 --model-parallel 1
build/dsv3 info "$demo/mp1/model0-mp1.safetensors" | tail -n 3
build/dsv3 logits --ckpt-path "$demo/mp1" --config configs/config_demo.json --tokens 0,100,200,300 --out "$demo/logits.safetensors"
echo "wrote $demo/logits.safetensors"
