#!/usr/bin/env bash
# demo.sh - the README's main job: the small trained DeepSeek-V3-architecture
# model in models/dsv3-mini (5 layers, MLA, 16 routed experts, FP8 weights, an
# MTP module, trained on the Brown corpus by tools/train; see its README.md)
# answering prompts with `dsv3 generate`, straight from its Hugging Face layout.
# It knows 1960s American English prose, not facts: expect fluent-looking
# sentences, not answers. Random-weight models for benchmarks and large shapes
# come from `dsv3 synth` (configs/config_demo.json and others).
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/dsv3-mini
demo=.cache/demo
mkdir -p "$demo"
printf '%s\n' "Tell me about the city." "Write a few sentences about the sea." \
  "Continue this text: The old man walked slowly down the road." > "$demo/prompts.txt"
build/dsv3 generate --ckpt-path "$model" --config "$model/config.json" \
  --input-file "$demo/prompts.txt" --max-new-tokens 60 --temperature 0.7
