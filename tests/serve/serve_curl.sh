#!/usr/bin/env bash
# serve_curl.sh - `dsv3 serve` end to end with curl on 127.0.0.1: greedy chat
# equal to `dsv3 generate`'s for the same messages, streaming equal to the
# whole reply, stop strings across token boundaries, n, seeds, logprobs
# against the top alternatives, the prefix cache (hits reported, output
# unchanged), completions, tokenize/detokenize, health, models, metrics, the
# chat page, OpenAI-style errors (400 naming the field, 401, 404, 405, 413),
# a client that disconnects mid-stream and a full queue (503).
source "$(dirname "$0")/lib.sh"

start_server main --parallel 4 --ctx-size 512 --threads 2 --max-body-kb 64
U=$URL_main
chat() { post "$U" /v1/chat/completions "$@"; }
msg() { printf '{"role":"user","content":%s}' "$(jq -Rn --arg s "$1" '$s')"; }

# ---- greedy output equals dsv3 generate's for the same messages
P1="Tell me about the city."
P2="Write a few sentences about the sea."
printf '%s\n%s\n' "$P1" "$P2" >"$WORK/prompts.txt"
"$BIN" generate --ckpt-path "$MODEL" --config "$MODEL/config.json" --input-file "$WORK/prompts.txt" \
  --max-new-tokens 24 --temperature 0 2>/dev/null | sed -n 's/^Completion: //p' >"$WORK/generate.txt"
i=0
for p in "$P1" "$P2"; do
  i=$((i + 1))
  want=$(sed -n "${i}p" "$WORK/generate.txt")
  got=$(chat "{\"messages\":[$(msg "$p")],\"max_tokens\":24,\"temperature\":0}" | jq -r '.choices[0].message.content')
  check "greedy chat equals dsv3 generate for '$p' (got '$got', want '$want')" [ "$got" = "$want" ]
done
GREEDY=$(sed -n 2p "$WORK/generate.txt")

# ---- the same through the /chat/completions alias, streamed
REQ="{\"messages\":[$(msg "$P2")],\"max_tokens\":24,\"temperature\":0"
curl -sN -H 'Content-Type: application/json' -d "$REQ,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
  "$U/chat/completions" >"$WORK/sse"
check "stream ends with [DONE]" [ "$(grep '^data: ' "$WORK/sse" | tail -1)" = "data: [DONE]" ]
grep '^data: {' "$WORK/sse" | sed 's/^data: //' >"$WORK/chunks"
check "first chunk carries the role" [ "$(head -1 "$WORK/chunks" | jq -r '.choices[0].delta.role')" = assistant ]
check "chunks are chat.completion.chunk" [ "$(jq -r .object "$WORK/chunks" | sort -u)" = chat.completion.chunk ]
streamed=$(jq -j '.choices[0].delta.content // empty' "$WORK/chunks")
check "streamed deltas equal the greedy reply" [ "$streamed" = "$GREEDY" ]
check "a finish_reason chunk" [ "$(jq -r '.choices[0].finish_reason // empty' "$WORK/chunks")" = length ]
check "the usage chunk has no choices" [ "$(tail -1 "$WORK/chunks" | jq -c '[.choices, .usage.completion_tokens]')" = '[[],24]' ]

# ---- stop strings: matched across token boundaries, never sent
STOP=${GREEDY:12:7} # 7 bytes from inside the reply: spans token boundaries
WANT=${GREEDY%%"$STOP"*}
r=$(chat "$REQ,\"stop\":[\"zzz\",$(jq -Rn --arg s "$STOP" '$s')]}")
check "stop string '$STOP' cuts the reply" [ "$(jq -r '.choices[0].message.content' <<<"$r")" = "$WANT" ]
check "stop gives finish_reason stop" [ "$(jq -r '.choices[0].finish_reason' <<<"$r")" = stop ]
curl -sN -H 'Content-Type: application/json' -d "$REQ,\"stream\":true,\"stop\":$(jq -Rn --arg s "$STOP" '$s')}" \
  "$U/v1/chat/completions" | grep '^data: {' | sed 's/^data: //' >"$WORK/chunks"
check "streamed stop: the same text" [ "$(jq -j '.choices[0].delta.content // empty' "$WORK/chunks")" = "$WANT" ]

# ---- n and seeds
SREQ="{\"messages\":[$(msg "$P1")],\"max_tokens\":12,\"temperature\":1.0,\"n\":3,\"seed\":1234}"
# A token's logits move by a few ulps with what shares its forward pass (how
# many prompt tokens the prefix cache left to compute, other requests), and a
# draw near a boundary then picks another token: the compared requests run
# alike, after one that puts the prompt in the cache.
chat "$SREQ" >/dev/null
a=$(chat "$SREQ" | jq -c '[.choices[].message.content]')
b=$(chat "$SREQ" | jq -c '[.choices[].message.content]')
check "n=3 gives three choices" [ "$(jq length <<<"$a")" = 3 ]
check "the same seed gives the same choices ($a vs $b)" [ "$a" = "$b" ]
c=$(chat "${SREQ/1234/99}" | jq -c '[.choices[].message.content]')
check "another seed gives other choices" [ "$a" != "$c" ]
check "choices of one request differ" [ "$(jq -r '.[0] != .[1] or .[1] != .[2]' <<<"$a")" = true ]

# ---- logprobs: the greedy token is the likeliest alternative
r=$(chat "{\"messages\":[$(msg "$P1")],\"max_tokens\":8,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3}")
check "one logprob entry per token" [ "$(jq '.choices[0].logprobs.content | length' <<<"$r")" = 8 ]
check "three alternatives each" [ "$(jq '[.choices[0].logprobs.content[].top_logprobs | length] | unique' -c <<<"$r")" = '[3]' ]
check "greedy tokens are the top alternative, logprob <= 0" \
  [ "$(jq '[.choices[0].logprobs.content[] | (.token == .top_logprobs[0].token and .logprob <= 0 and .logprob == .top_logprobs[0].logprob)] | all' <<<"$r")" = true ]
check "logprob tokens spell the reply" \
  [ "$(jq -r '([.choices[0].logprobs.content[].token] | join("")) == .choices[0].message.content' <<<"$r")" = true ]

# ---- prefix cache: a repeated prompt and a next turn hit it; the output does not change
r1=$(chat "$REQ}")
r2=$(chat "$REQ}")
check "a repeated prompt hits the cache" [ "$(jq '.usage.prompt_cache_hit_tokens > 0' <<<"$r2")" = true ]
check "cache fields add up" [ "$(jq '.usage | (.prompt_cache_hit_tokens + .prompt_cache_miss_tokens == .prompt_tokens and .prompt_tokens_details.cached_tokens == .prompt_cache_hit_tokens)' <<<"$r2")" = true ]
check "greedy output is the same with a hit" [ "$(jq -r '.choices[0].message.content' <<<"$r2")" = "$GREEDY" ]
turn2="{\"messages\":[$(msg "$P2"),{\"role\":\"assistant\",\"content\":$(jq -Rn --arg s "$GREEDY" '$s')},$(msg "And then?")],\"max_tokens\":8,\"temperature\":0}"
t2=$(chat "$turn2")
# the same turn on a fresh server computes everything: its text must match
start_server fresh --parallel 1 --ctx-size 512 --threads 2
t2f=$(post "$URL_fresh" /v1/chat/completions "$turn2")
check "a next turn reuses the previous turn's tokens" [ "$(jq '.usage.prompt_cache_hit_tokens >= 20' <<<"$t2")" = true ]
check "next turn: the same text with and without the cache" \
  [ "$(jq -r '.choices[0].message.content' <<<"$t2")" = "$(jq -r '.choices[0].message.content' <<<"$t2f")" ]
check "fresh server: no hit" [ "$(jq '.usage.prompt_cache_hit_tokens' <<<"$t2f")" = 0 ]
# --cache-mem: whole slots beyond --parallel keep prefixes (least recently used reused first)
OTHER="{\"messages\":[$(msg "$P1")],\"max_tokens\":4,\"temperature\":0}"
post "$URL_fresh" /v1/chat/completions "$OTHER" >/dev/null
t2e=$(post "$URL_fresh" /v1/chat/completions "$turn2")
check "one slot: another prompt took the conversation's place" [ "$(jq '.usage.prompt_cache_hit_tokens < 20' <<<"$t2e")" = true ]
start_server cached --parallel 1 --ctx-size 512 --threads 2 --cache-mem 4
check "4 MiB hold two more slots of 1.6 MiB" grep -q 'prefix cache: 2 more slots, 3.1 MiB' "$WORK/cached.log"
post "$URL_cached" /v1/chat/completions "$turn2" >/dev/null
post "$URL_cached" /v1/chat/completions "$OTHER" >/dev/null
t2c=$(post "$URL_cached" /v1/chat/completions "$turn2")
check "with --cache-mem the conversation outlives another prompt" [ "$(jq '.usage.prompt_cache_hit_tokens >= 20' <<<"$t2c")" = true ]
check "and gives the same text" \
  [ "$(jq -r '.choices[0].message.content' <<<"$t2c")" = "$(jq -r '.choices[0].message.content' <<<"$t2f")" ]

# ---- completions
r=$(post "$U" /v1/completions '{"prompt":"The old man walked","max_tokens":6,"temperature":0,"logprobs":2,"echo":true}')
check "completion echoes its prompt" [ "$(jq -r '.choices[0].text | startswith("The old man walked")' <<<"$r")" = true ]
check "completion logprobs: legacy arrays" [ "$(jq '.choices[0].logprobs | (.tokens|length) == 6 and (.top_logprobs[0]|length) == 2' <<<"$r")" = true ]
ids=$(post "$U" /tokenize '{"content":"The old man walked"}' | jq -c .tokens)
check "tokenize gives ids" [ "$(jq length <<<"$ids")" -ge 3 ]
check "detokenize inverts it" [ "$(post "$U" /detokenize "{\"tokens\":$ids}" | jq -r .content)" = "The old man walked" ]
r2=$(post "$U" /v1/completions "{\"prompt\":$(jq -c '[0] + .' <<<"$ids"),\"max_tokens\":6,\"temperature\":0}")
check "a prompt of token ids (bos first) gives the same text" \
  [ "$(jq -r '.choices[0].text' <<<"$r2")" = "$(jq -r '.choices[0].text | ltrimstr("The old man walked")' <<<"$r")" ]
n=$(post "$U" /tokenize "{\"messages\":[$(msg "$P1")]}" | jq '.tokens | length')
check "tokenize of messages counts the prompt" [ "$n" = "$(chat "{\"messages\":[$(msg "$P1")],\"max_tokens\":1}" | jq .usage.prompt_tokens)" ]

# ---- the other endpoints
check "health" [ "$(curl -s "$U/health" | jq -r .status)" = ok ]
check "models lists the model" [ "$(curl -s "$U/v1/models" | jq -r '.data[0].id')" = dsv3-mini ]
curl -s "$U/metrics" >"$WORK/metrics"
for m in dsv3_requests_total dsv3_prompt_tokens_total dsv3_completion_tokens_total dsv3_prompt_cache_hit_tokens_total \
  dsv3_queue_depth dsv3_time_to_first_token_seconds_bucket dsv3_decode_step_seconds_count dsv3_prompt_cache_tokens \
  dsv3_scheduler_busy_seconds_total; do
  check "metrics has $m" grep -q "^$m" "$WORK/metrics"
done
check "the chat page" bash -c "curl -s '$U/' | grep -q '<title>dsv3 chat</title>'"

# ---- errors: OpenAI's shape, a 4xx, the field named
err() { # err STATUS PARAM BODY
  local r; r=$(chat "$3")
  check "status $1 for $3 (got $(status): $r)" [ "$(status)" = "$1" ]
  check "error object for $3" [ "$(jq -r '.error | (.message|length>0) and (.type|length>0)' <<<"$r")" = true ]
  [ -z "$2" ] || check "param $2 for $3" [ "$(jq -r .error.param <<<"$r")" = "$2" ]
}
err 400 "" '{"messages": [ {'
err 400 "" '[]'
err 400 messages '{"messages":"hi"}'
err 400 'messages[0].role' '{"messages":[{"role":"wizard","content":"x"}]}'
err 400 temperature "{\"messages\":[$(msg x)],\"temperature\":\"warm\"}"
err 400 max_tokens "{\"messages\":[$(msg x)],\"max_tokens\":-5}"
err 400 n "{\"messages\":[$(msg x)],\"n\":99}"
err 400 messages "{\"messages\":[$(msg "$(head -c 3000 /dev/zero | tr '\0' 'a')")]}" # past the 512-token context
r=$(post "$U" /v1/nope '{}'); check "404" [ "$(status)" = 404 ]
r=$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/chat/completions"); check "405 for GET" [ "$r" = 405 ]
head -c 100000 /dev/zero | tr '\0' 'x' >"$WORK/big"
r=$(curl -s -o "$WORK/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$WORK/big" "$U/v1/chat/completions")
check "413 past --max-body-kb" [ "$r" = 413 ]

# ---- a client that leaves mid-stream is cancelled and its slot freed
LONG="{\"messages\":[$(msg "$P1")],\"max_tokens\":400,\"temperature\":1,\"stream\":true,\"ignore_eos\":true}"
pids=()
for k in 1 2 3 4 5 6; do
  curl -sN --max-time 0.5 -H 'Content-Type: application/json' -d "$LONG" "$U/v1/chat/completions" >/dev/null &
  pids+=($!)
done
wait "${pids[@]}" || true
sleep 0.3
for _ in $(seq 30); do # each is seen within a 50 ms poll and freed at the next step
  c=$(curl -s "$U/metrics" | awk "/^dsv3_requests_cancelled_total/{print \$2}")
  [ "$c" = 6 ] && break
  sleep 0.1
done
check "cancelled requests counted ($c)" [ "$c" = 6 ]
check "no sequence left running" [ "$(curl -s "$U/metrics" | awk '/^dsv3_running_sequences/{print $2}')" = 0 ]
r=$(chat "$REQ}")
check "the server still answers after disconnects" [ "$(jq -r '.choices[0].message.content' <<<"$r")" = "$GREEDY" ]

# ---- API key (constant-time compare) and a full queue
printf 'sk-test-123\n' >"$WORK/key"
start_server auth --parallel 1 --queue 1 --ctx-size 512 --threads 2 --api-key-file "$WORK/key"
A=$URL_auth
r=$(post "$A" /v1/chat/completions "$REQ}"); check "401 without a key" [ "$(status)" = 401 ]
check "401 names the error" [ "$(jq -r .error.code <<<"$r")" = invalid_api_key ]
r=$(post "$A" /v1/chat/completions "$REQ}" -H 'Authorization: Bearer sk-test-12'); check "401 with a wrong key" [ "$(status)" = 401 ]
r=$(post "$A" /v1/chat/completions "$REQ}" -H 'Authorization: Bearer sk-test-123')
check "200 with the key" [ "$(status)" = 200 ]
check "health needs no key" [ "$(curl -s -o /dev/null -w '%{http_code}' "$A/health")" = 200 ]
pids=()
SLOW="{\"messages\":[$(msg "$P1")],\"max_tokens\":100,\"temperature\":1,\"ignore_eos\":true}"
for k in 1 2 3 4 5; do
  curl -s -o /dev/null -D "$WORK/h$k" -w '%{http_code}\n' -H 'Authorization: Bearer sk-test-123' \
    -H 'Content-Type: application/json' -d "$SLOW" "$A/v1/chat/completions" >"$WORK/q$k" &
  pids+=($!)
done
wait "${pids[@]}" || true
codes=$(cat "$WORK"/q? | sort | uniq -c | tr -s ' ' | tr '\n' ';')
check "a full queue answers 503 ($codes)" grep -q 503 <(cat "$WORK"/q?)
check "and the rest 200 ($codes)" grep -q 200 <(cat "$WORK"/q?)
check "503 carries Retry-After" grep -qi '^retry-after' <(cat "$WORK"/h?)

finish
