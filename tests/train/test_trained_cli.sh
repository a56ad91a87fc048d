#!/usr/bin/env bash
# test_trained_cli.sh - the CLI on the trained checkpoint models/dsv3-mini:
# the chat template gives the token ids that tools/train/train.py trained on
# (BOS, <｜User｜>, the question, <｜Assistant｜>: the prefix of the reference
# sequence chat160), and greedy `dsv3 generate` answers with English words.
set -u
bin="${DSV3_BIN:-build/dsv3}"
dir="${DSV3_TOKENIZER:-models/dsv3-mini}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
printf '[{"role": "user", "content": "Tell me about the weather."}]' > "$tmp/chat.json"
want="0 8180 54 605 453 586 263 4035 16 8181"
got="$("$bin" tokenize --tokenizer "$dir" --chat "$tmp/chat.json" --add-generation-prompt)"
if [ "$got" = "$want" ]; then echo "ok   chat ids"; else echo "FAIL chat ids: want [$want] got [$got]"; fail=1; fi
printf '%s\n' "Tell me about the city." > "$tmp/prompts.txt"
if "$bin" generate --ckpt-path "$dir" --config "$dir/config.json" --input-file "$tmp/prompts.txt" \
     --max-new-tokens 32 --temperature 0 > "$tmp/out" 2> "$tmp/err"; then
  completion="$(sed -n 's/^Completion: //p' "$tmp/out")"
  echo "completion: $completion"
  # English: at least 10 lowercase words of 2+ letters, most of them common ones
  words=$(printf '%s' "$completion" | tr -c 'a-z' '\n' | grep -c '^[a-z][a-z]*[a-z]$')
  common=$(printf '%s' "$completion" | tr 'A-Z' 'a-z' | tr -c 'a-z' '\n' | grep -c -x -E 'the|of|and|a|to|in|is|was|he|it|that|for|as|with|his|on|be|at|by|had|not|are|but|from|or|have|an|they|which|this|were|her|she|there|been|would|one|all|we|their|has|its|who|will|more|if|no|so|said|what|up|out|about|into|than|them|can|only|other|new|some|could|time|these|two|may|then|do|first|any|my|now|such|like|our|over|man|me|even|most|made|after|also|did|many|before|must|through|back|years|where|much|your|way|well|down|should|because|each|just|those|people|how|too|little|state|good|very|make|world|still|own|see|men|work|long|get|here|between|both|life|being|under|never|day|same|another|know|while|last|might|us|great|old|year|off|come|since|against|go|came|right|used|take|three|city|i')
  echo "words $words, common $common"
  if [ "$words" -lt 10 ] || [ "$common" -lt 5 ]; then echo "FAIL generate: not English enough"; fail=1; else echo "ok   generate"; fi
else
  echo "FAIL generate: exit status $?"; cat "$tmp/err"; fail=1
fi
[ $fail = 0 ] && echo "train_cli: passed" || echo "train_cli: failed"
exit $fail
