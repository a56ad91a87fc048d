#!/usr/bin/env bash
# serve_spec.sh - `dsv3 serve --spec mtp`: greedy replies equal to plain
# decoding's (`dsv3 generate` without --spec) at draft lengths 1 and 3, alone
# and with other requests in the same steps (streamed, sampled, n > 1, a long
# prompt being prefilled), after a prefix-cache hit and a next turn, with stop
# strings, max_tokens and logprobs; the drafts counted in /metrics; sampled
# requests still served; bad flags and a checkpoint without the module refused.
source "$(dirname "$0")/lib.sh"

P=("Tell me about the city." "Write a few sentences about the sea." "The old man walked" "Where do the ships go?")
printf '%s\n' "${P[@]}" >"$WORK/prompts.txt"
"$BIN" generate --ckpt-path "$MODEL" --input-file "$WORK/prompts.txt" --max-new-tokens 40 --temperature 0 \
  2>/dev/null | sed -n 's/^Completion: //p' >"$WORK/generate.txt"
check "dsv3 generate gave the four plain replies" [ "$(wc -l <"$WORK/generate.txt")" = 4 ]
want() { sed -n "$(($1 + 1))p" "$WORK/generate.txt"; }
msg() { printf '{"role":"user","content":%s}' "$(jq -Rn --arg s "$1" '$s')"; }
req() { printf '{"messages":[%s],"max_tokens":40,"temperature":0%s}' "$(msg "${P[$1]}")" "${2:-}"; }

for draft in 1 3; do
  start_server d$draft --parallel 4 --ctx-size 512 --threads 2 --spec mtp --draft $draft
  eval "U=\$URL_d$draft"
  chat() { post "$U" /v1/chat/completions "$@"; }
  # concurrent requests: each its own output file (post shares $WORK/body)
  bg() { curl -s -o "$1" -H 'Content-Type: application/json' --data-binary "$2" "$U/v1/chat/completions"; }
  # ---- one request at a time
  for i in 0 1 2 3; do
    got=$(chat "$(req $i)" | jq -r '.choices[0].message.content')
    check "draft $draft: '${P[$i]}' equals plain greedy (got '$got')" [ "$got" = "$(want $i)" ]
  done
  # ---- four at once, one of them streamed, beside a sampled n=2 request and a long prompt
  long=$(printf 'the harbour and the hills %.0s' $(seq 60))
  pids=()
  for i in 0 1 2; do
    bg "$WORK/r$i.json" "$(req $i)" &
    pids+=($!)
  done
  curl -sN -H 'Content-Type: application/json' -d "$(req 3 ',"stream":true')" "$U/v1/chat/completions" >"$WORK/sse" &
  pids+=($!)
  bg "$WORK/sampled.json" "{\"messages\":[$(msg "${P[0]}")],\"max_tokens\":12,\"temperature\":0.8,\"n\":2,\"seed\":7}" &
  pids+=($!)
  bg "$WORK/long.json" "{\"messages\":[$(msg "$long")],\"max_tokens\":4,\"temperature\":0}" &
  pids+=($!)
  wait "${pids[@]}" # (not a bare wait: the server is a child too)
  for i in 0 1 2; do
    check "draft $draft, batched: '${P[$i]}' equals plain greedy" \
      [ "$(jq -r '.choices[0].message.content' "$WORK/r$i.json")" = "$(want $i)" ]
  done
  streamed=$(grep '^data: {' "$WORK/sse" | sed 's/^data: //' | jq -j '.choices[0].delta.content // empty')
  check "draft $draft, batched and streamed: equals plain greedy" [ "$streamed" = "$(want 3)" ]
  check "draft $draft: the sampled n=2 request got two replies" \
    [ "$(jq '[.choices[].message.content | length > 0] | all and length == 2' "$WORK/sampled.json")" = true ]
  check "draft $draft: the long prompt got its reply" [ "$(jq '.usage.completion_tokens' "$WORK/long.json")" = 4 ]
  # ---- the prefix cache, and a next turn over a speculated reply
  r=$(chat "$(req 1)")
  check "draft $draft: a repeated prompt hits the cache" [ "$(jq '.usage.prompt_cache_hit_tokens > 0' <<<"$r")" = true ]
  check "draft $draft: and gives plain greedy ($r)" [ "$(jq -r '.choices[0].message.content' <<<"$r")" = "$(want 1)" ]
  turn2="{\"messages\":[$(msg "${P[1]}"),{\"role\":\"assistant\",\"content\":$(jq -Rn --arg s "$(want 1)" '$s')},$(msg "And then?")],\"max_tokens\":16,\"temperature\":0}"
  chat "$turn2" | jq -r '.choices[0].message.content' >"$WORK/turn2_d$draft"
  # ---- stop strings, max_tokens, logprobs
  W=$(want 2)
  STOP=${W:14:6}
  r=$(chat "$(req 2 ",\"stop\":$(jq -Rn --arg s "$STOP" '$s')")")
  check "draft $draft: stop string cuts the reply" [ "$(jq -r '.choices[0].message.content' <<<"$r")" = "${W%%"$STOP"*}" ]
  for n in 1 2 5; do
    r=$(chat "{\"messages\":[$(msg "${P[2]}")],\"max_tokens\":$n,\"temperature\":0}")
    check "draft $draft: max_tokens $n gives $n tokens ($r)" [ "$(jq '.usage.completion_tokens' <<<"$r")" = $n ]
  done
  r=$(chat "$(req 0 ',"logprobs":true,"top_logprobs":2')")
  check "draft $draft: logprobs, one entry a token, greedy on top" \
    [ "$(jq '.choices[0].logprobs.content | (length == 40) and ([.[] | .token == .top_logprobs[0].token] | all)' <<<"$r")" = true ]
  check "draft $draft: with logprobs, plain greedy" [ "$(jq -r '.choices[0].message.content' <<<"$r")" = "$(want 0)" ]
  # ---- the drafts are counted and some are accepted
  curl -s "$U/metrics" >"$WORK/metrics"
  drafted=$(sed -n 's/^dsv3_spec_draft_tokens_total{outcome="drafted"} //p' "$WORK/metrics")
  accepted=$(sed -n 's/^dsv3_spec_draft_tokens_total{outcome="accepted"} //p' "$WORK/metrics")
  check "draft $draft: drafts made ($drafted) and accepted ($accepted)" [ "${drafted:-0}" -gt 0 -a "${accepted:-0}" -gt 0 ]
done
check "a next turn: the same text at draft 1 and 3" [ "$(cat "$WORK/turn2_d1")" = "$(cat "$WORK/turn2_d3")" ]
start_server plain --parallel 1 --ctx-size 512 --threads 2
check "a next turn: the same text as plain decoding" \
  [ "$(post "$URL_plain" /v1/chat/completions "$turn2" | jq -r '.choices[0].message.content')" = "$(cat "$WORK/turn2_d1")" ]

# ---- the drafts themselves: one request on an idle server drafts and accepts
# as many as `dsv3 generate --spec` for the same prompt (the same module
# passes, chained the same way)
printf '%s\n' "${P[1]}" >"$WORK/p1.txt"
gen=$("$BIN" generate --ckpt-path "$MODEL" --input-file "$WORK/p1.txt" --max-new-tokens 40 --temperature 0 --spec mtp \
  --draft 3 2>&1 | grep -o '[0-9.]*% of [0-9]* drafts')
start_server one --parallel 1 --ctx-size 512 --threads 2 --spec mtp --draft 3
post "$URL_one" /v1/chat/completions "$(req 1)" >/dev/null
srv=$(curl -s "$URL_one/metrics" | awk '/outcome="drafted"/ {d = $2} /outcome="accepted"/ {a = $2}
  END {if (d > 0) printf "%.1f%% of %d drafts", 100 * a / d, d}')
check "draft 3: the server's drafts ($srv) are generate's ($gen)" [ -n "$gen" -a "$srv" = "$gen" ]

# ---- refused: a bad --spec or --draft, a checkpoint without the module
for bad in "--spec eagle" "--spec mtp --draft 0" "--spec mtp --draft 8"; do
  # shellcheck disable=SC2086
  "$BIN" serve --ckpt-path "$MODEL" --port 0 $bad 2>"$WORK/bad.log" && rc=0 || rc=$?
  check "serve $bad exits 2 (got $rc)" [ "$rc" = 2 ]
done
"$BIN" synth --config "$MODEL/config.json" --out "$WORK/nomtp" --tokenizer "$MODEL" >/dev/null 2>&1
timeout 60 "$BIN" serve --ckpt-path "$WORK/nomtp" --port 0 --spec mtp 2>"$WORK/nomtp.log" && rc=0 || rc=$?
check "a checkpoint without the MTP module is refused (rc $rc)" [ "$rc" = 1 ]
check "and the message names the module" grep -q 'MTP module' "$WORK/nomtp.log"
finish
