#!/usr/bin/env bash
# serve_reasoning.sh - the reasoning split and tool-call parsing end to end:
# a model made by tests/serve/node/chain_model.mjs (DeepSeek-V3's tokenizer,
# V3.1's chat template) whose greedy reply is known text, "Let me look</think>"
# and one call of get_weather in V3.1's format; driven by the openai npm client
# (node/reasoning_test.mjs) and by curl. Skipped (77) without the V3 tokenizer
# (scripts/fetch_tokenizer.sh) or without `npm ci` in tests/serve/node.
source "$(dirname "$0")/lib.sh"
NODE_DIR=$ROOT/tests/serve/node
TOKENIZER=${DSV3_TOKENIZER:-$ROOT/.cache/tokenizer}
if [ ! -d "$NODE_DIR/node_modules/openai" ] || [ ! -f "$TOKENIZER/tokenizer.json" ]; then
  echo "skipped: needs (cd tests/serve/node && npm ci) and scripts/fetch_tokenizer.sh .cache/tokenizer"
  exit 77
fi
MODEL=$WORK/chain
cat >"$WORK/config.json" <<'JSON'
{"vocab_size": 129280, "dim": 64, "inter_dim": 128, "moe_inter_dim": 32, "n_layers": 2, "n_dense_layers": 1,
 "n_heads": 2, "n_routed_experts": 4, "n_shared_experts": 1, "n_activated_experts": 2, "n_expert_groups": 1,
 "n_limited_groups": 1, "route_scale": 1.0, "score_func": "sigmoid", "q_lora_rank": 0, "kv_lora_rank": 32,
 "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "dtype": "bf16",
 "original_seq_len": 512, "max_seq_len": 1024, "rope_factor": 1, "mscale": 1.0}
JSON
"$BIN" synth --config "$WORK/config.json" --out "$MODEL" --dtype bf16 --tokenizer "$TOKENIZER" >/dev/null 2>"$WORK/synth.err" ||
  { cat "$WORK/synth.err" >&2; exit 1; }
# The chain starts at the generation prompt's last token, '>' of V3.1's
# "<think>" or "</think>" (DeepSeek-V3's tokenizer has no single token for
# them), and ends with <｜end▁of▁sentence｜>.
chain=()
piece() { chain+=($("$BIN" tokenize --tokenizer "$TOKENIZER" --text "$1")); }
piece '>'; piece 'Let me look'; piece '</think>'
chain[${#chain[@]}-1]=$("$BIN" tokenize --tokenizer "$TOKENIZER" --plain --text $'>\n\n') # '>' starts the chain
piece '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
piece '<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
node "$NODE_DIR/chain_model.mjs" "$MODEL" "$ROOT/tests/tok/templates/deepseek_v3_1.jinja" "${chain[@]}" >/dev/null

start_server main --parallel 2 --ctx-size 256 --threads 2
body='{"messages": [{"role": "user", "content": "Weather in Paris?"}], "temperature": 0, "max_tokens": 40,
       "thinking": {"type": "enabled"}}'
reply=$(post "$URL_main" /v1/chat/completions "$body")
check "curl: 200" [ "$(status)" = 200 ]
check "curl: reasoning_content" [ "$(jq -r '.choices[0].message.reasoning_content' <<<"$reply")" = "Let me look" ]
check "curl: the tool call" [ "$(jq -c '.choices[0].message.tool_calls[0].function' <<<"$reply")" = \
  '{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}' ]
check "curl: finish_reason" [ "$(jq -r '.choices[0].finish_reason' <<<"$reply")" = tool_calls ]
# streamed through curl: reasoning deltas, then a tool_calls delta, then [DONE]
post "$URL_main" /v1/chat/completions "${body%\}}, \"stream\": true}" -N >"$WORK/sse" || true
check "curl stream: reasoning deltas" [ "$(sed -n 's/^data: //p' "$WORK/sse" | grep -v '^\[DONE\]' |
  jq -j '.choices[0].delta.reasoning_content // empty')" = "Let me look" ]
check "curl stream: a tool_calls delta" grep -q '"tool_calls"' "$WORK/sse"
check "curl stream: [DONE]" [ "$(tail -n 2 "$WORK/sse" | head -1)" = "data: [DONE]" ]

SERVE_URL=$URL_main timeout 120 node "$NODE_DIR/reasoning_test.mjs" || fail "reasoning_test.mjs"
echo "serve_reasoning: $PASSES passed, $FAILS failed"
[ "$FAILS" = 0 ]
