#!/usr/bin/env bash
# test_generate.sh - dsv3 generate end to end on a synthetic checkpoint with
# DeepSeek-V3's real tokenizer:
#  - greedy batch generation equals the argmax chain of `dsv3 logits` run step
#    by step (the model issue's logits path), for several prompts at once;
#  - the REPL driven through a pipe: turns, /clear, /exit and end of input;
#  - bad input: empty input file, unknown flag, prompt longer than
#    max_seq_len, invalid UTF-8, missing tokenizer files.
set -u
bin=${DSV3_BIN:-build/dsv3}
root=$(cd "$(dirname "$0")/../.." && pwd)
fails=0; passes=0
ok() { passes=$((passes+1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails+1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

tokdir="$root/.cache/tokenizer"
[ -f "$tokdir/tokenizer.json" ] || "$root/scripts/fetch_tokenizer.sh" "$tokdir" >/dev/null 2>&1
[ -f "$tokdir/tokenizer.json" ] || { echo "FAIL: no tokenizer files (scripts/fetch_tokenizer.sh)"; echo "generate: 0 passed, 1 failed"; exit 1; }

cfg="$root/tests/gen/config_gen.json"
"$bin" synth --config "$cfg" --out "$tmp/m" --dtype fp8 --seed 7 --tokenizer "$tokdir" >/dev/null 2>&1 || bad "synth"

# 1. greedy batch generation == step-by-step argmax of dsv3 logits
printf 'Hello, who are you?\nWrite a haiku about the sea.\n' > "$tmp/p.txt"
N=6
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --input-file "$tmp/p.txt" --temperature 0 \
    --max-new-tokens $N --print-ids > "$tmp/gen.out" 2> "$tmp/gen.err" || bad "generate batch: $(cat "$tmp/gen.err")"
i=0
while IFS= read -r prompt; do
  i=$((i+1))
  printf '[{"role":"user","content":%s}]' "$(node -e 'console.log(JSON.stringify(process.argv[1]))' "$prompt")" > "$tmp/chat.json"
  ids=$("$bin" tokenize --tokenizer "$tmp/m" --chat "$tmp/chat.json" --add-generation-prompt) || { bad "tokenize"; continue; }
  seq=$(echo $ids | tr ' ' ',')
  want=""
  for s in $(seq 1 $N); do
    "$bin" logits --ckpt-path "$tmp/m" --config "$cfg" --tokens "$seq" --out "$tmp/l.st" 2>/dev/null || { bad "logits"; break; }
    t=$(node "$root/tests/gen/argmax.js" "$tmp/l.st")
    [ "$t" = 1 ] && break   # eos
    want="$want $t"; seq="$seq,$t"
  done
  got=$(grep '^Ids:' "$tmp/gen.out" | sed -n "${i}p" | sed 's/^Ids://')
  if [ "$(echo $got)" = "$(echo $want)" ]; then ok; else bad "prompt $i: generate gave [$got], logits path [$want]"; fi
done < "$tmp/p.txt"
grep -q '^Prompt: Hello, who are you?$' "$tmp/gen.out" && grep -q '^Completion: ' "$tmp/gen.out" && ok || bad "batch output format"
grep -q 'tokens/s' "$tmp/gen.err" && ok || bad "speed report on stderr"
grep -q 'tokens/s' "$tmp/gen.out" && bad "speed report leaked to stdout" || ok

# a prompt of over 1024 tokens: prefilled in two passes (generate.c's PREFILL_CHUNK,
# 1024), then the same argmax chain as one pass of dsv3 logits
node -e 'let s=[];for(let i=0;i<140;i++)s.push("Sentence "+i+" is about the tide.");console.log(s.join(" "))' > "$tmp/big.txt"
node -e 'const c=JSON.parse(require("fs").readFileSync(process.argv[1]));c.max_seq_len=2048;console.log(JSON.stringify(c))' \
    "$cfg" > "$tmp/cfg_big.json"
"$bin" generate --ckpt-path "$tmp/m" --config "$tmp/cfg_big.json" --input-file "$tmp/big.txt" --temperature 0 \
    --max-new-tokens 3 --print-ids > "$tmp/big.out" 2> "$tmp/big.err" || bad "generate long prompt: $(cat "$tmp/big.err")"
printf '[{"role":"user","content":%s}]' "$(node -e 'console.log(JSON.stringify(process.argv[1]))' "$(cat "$tmp/big.txt")")" > "$tmp/chat.json"
ids=$("$bin" tokenize --tokenizer "$tmp/m" --chat "$tmp/chat.json" --add-generation-prompt) || bad "tokenize long prompt"
seq=$(echo $ids | tr ' ' ',')
nt=$(echo $ids | wc -w)
[ "$nt" -gt 1024 ] && ok || bad "long prompt: $nt tokens, want over 1024"
want=""
for s in 1 2 3; do
  "$bin" logits --ckpt-path "$tmp/m" --config "$tmp/cfg_big.json" --tokens "$seq" --out "$tmp/l.st" 2>/dev/null || { bad "logits long"; break; }
  t=$(node "$root/tests/gen/argmax.js" "$tmp/l.st")
  [ "$t" = 1 ] && break
  want="$want $t"; seq="$seq,$t"
done
got=$(grep '^Ids:' "$tmp/big.out" | sed 's/^Ids://')
[ "$(echo $got)" = "$(echo $want)" ] && ok || bad "long prompt: generate gave [$got], one-pass logits [$want]"
# sampled among the top 5 (their probabilities count, not only the largest; gaps
# far above rounding): passes of 512 and of 100 against the whole prompt in one
# pass, same seed. Shifting a later pass's positions by one fails both.
for ch in 512 100 4096; do
  "$bin" generate --prefill-chunk $ch --ckpt-path "$tmp/m" --config "$tmp/cfg_big.json" --input-file "$tmp/big.txt" \
      --temperature 1 --top-k 5 --seed 11 --max-new-tokens 12 --print-ids 2>/dev/null | grep '^Ids:' > "$tmp/big_$ch.ids" \
      || bad "generate long prompt, chunks of $ch"
done
cmp -s "$tmp/big_512.ids" "$tmp/big_4096.ids" && ok || bad "long prompt sampled: chunks of 512 [$(cat "$tmp/big_512.ids")], one pass [$(cat "$tmp/big_4096.ids")]"
cmp -s "$tmp/big_100.ids" "$tmp/big_4096.ids" && ok || bad "long prompt sampled: chunks of 100 [$(cat "$tmp/big_100.ids")], one pass [$(cat "$tmp/big_4096.ids")]"

# more prompts than max_batch_size (4 in config_demo): processed in batches
for k in 1 2 3 4 5 6; do echo "prompt number $k"; done > "$tmp/p6.txt"
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --input-file "$tmp/p6.txt" --max-new-tokens 2 --seed 3 > "$tmp/g6.out" 2>/dev/null \
  && [ "$(grep -c '^Prompt:' "$tmp/g6.out")" = 6 ] && ok || bad "6 prompts with max_batch_size 4"

# 2. REPL through a pipe
out=$(printf 'hi\n/clear\nhello again\n/exit\nnever read\n' | "$bin" generate --ckpt-path "$tmp/m" --config "$cfg" \
      --interactive --max-new-tokens 3 --temperature 0 2>"$tmp/repl.err"); rc=$?
[ $rc = 0 ] && ok || bad "REPL exit code $rc: $(cat "$tmp/repl.err")"
[ "$(printf '%s' "$out" | grep -o '>>> ' | wc -l)" = 4 ] && ok || bad "REPL prompts: $out"
out=$(printf 'hi\n' | "$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --interactive --max-new-tokens 2 2>/dev/null); rc=$?
[ $rc = 0 ] && ok || bad "REPL end of input exit code $rc"

# the REPL in a terminal: tmux types, reads the screen, /clear, /exit
if command -v tmux >/dev/null; then
  sock="$tmp/tmux.sock"
  tmux -S "$sock" new-session -d -x 200 -y 50 "$bin generate --ckpt-path $tmp/m --config $cfg --interactive --max-new-tokens 3 --temperature 0; echo EXITED \$?; sleep 30"
  wait_for() { for _ in $(seq 1 100); do tmux -S "$sock" capture-pane -p | grep -q "$1" && return 0; sleep 0.2; done; return 1; }
  wait_for '>>>' && ok || bad "tmux: no prompt"
  tmux -S "$sock" send-keys 'Hello there' Enter
  for _ in $(seq 1 100); do [ "$(tmux -S "$sock" capture-pane -p | grep -c '^>>>')" -ge 2 ] && break; sleep 0.2; done
  [ "$(tmux -S "$sock" capture-pane -p | grep -c '^>>>')" -ge 2 ] && ok || bad "tmux: no second prompt after a reply"
  tmux -S "$sock" send-keys '/clear' Enter
  for _ in $(seq 1 50); do [ "$(tmux -S "$sock" capture-pane -p | grep -c '^>>>')" -ge 3 ] && break; sleep 0.2; done
  tmux -S "$sock" send-keys '/exit' Enter
  wait_for 'EXITED 0' && ok || bad "tmux: /exit did not end the REPL cleanly: $(tmux -S "$sock" capture-pane -p)"
  tmux -S "$sock" kill-server 2>/dev/null
  # Ctrl-D at the prompt (a fresh server: the old one may still be shutting down)
  sock="$tmp/tmux2.sock"
  tmux -S "$sock" new-session -d -x 200 -y 50 "$bin generate --ckpt-path $tmp/m --config $cfg --interactive; echo EXITED \$?; sleep 30"
  wait_for '>>>' || bad "tmux: no prompt in the second session"
  sleep 0.5
  tmux -S "$sock" send-keys C-d
  wait_for 'EXITED 0' && ok || bad "tmux: Ctrl-D did not exit cleanly"
  tmux -S "$sock" kill-server 2>/dev/null
else
  bad "tmux is not installed (scripts/setup.sh installs it)"
fi

# 3. bad input
: > "$tmp/empty.txt"
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --input-file "$tmp/empty.txt" 2>"$tmp/e" >/dev/null
[ $? -ne 0 ] && grep -q 'no prompts' "$tmp/e" && ok || bad "empty input file: $(cat "$tmp/e")"
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --interactive --bogus 2>"$tmp/e" >/dev/null
[ $? -ne 0 ] && grep -q "unknown flag '--bogus'" "$tmp/e" && ok || bad "unknown flag"
node -e 'const c=require(process.argv[1]);c.max_seq_len=16;console.log(JSON.stringify(c))' "$cfg" > "$tmp/short.json"
echo "this prompt is certainly longer than sixteen tokens once the chat template has wrapped it in markup" > "$tmp/long.txt"
"$bin" generate --ckpt-path "$tmp/m" --config "$tmp/short.json" --input-file "$tmp/long.txt" 2>"$tmp/e" >/dev/null
[ $? -ne 0 ] && grep -q 'exceeds' "$tmp/e" && ok || bad "prompt longer than max_seq_len: $(cat "$tmp/e")"
out=$(printf '%s\nhi\n/exit\n' "$(cat "$tmp/long.txt")" | "$bin" generate --ckpt-path "$tmp/m" \
      --config "$tmp/short.json" --interactive --max-new-tokens 1 2>"$tmp/e"); rc=$?
[ $rc = 0 ] && grep -q 'exceeds' "$tmp/e" && [ "$(printf '%s' "$out" | grep -o '>>> ' | wc -l)" = 3 ] && ok \
  || bad "REPL: long prompt should give a message and the next prompt ($rc, $(cat "$tmp/e"))"
# a prompt line that is not UTF-8 is an error naming its line, never a prompt silently left out
printf 'good line\n\ncaf\xe9 \xff\xfe invalid utf-8\n' > "$tmp/bad_utf8.txt"
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --input-file "$tmp/bad_utf8.txt" --max-new-tokens 2 >/dev/null 2>"$tmp/e"
[ $? = 1 ] && grep -q 'bad_utf8.txt line 3: .*not valid UTF-8' "$tmp/e" && ok || bad "invalid UTF-8 prompt: $(cat "$tmp/e")"
out=$(printf 'caf\xe9\nhi\n' | "$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --interactive --max-new-tokens 1 2>"$tmp/e"); rc=$?
[ $rc = 0 ] && grep -q 'not valid UTF-8' "$tmp/e" && [ "$(printf '%s' "$out" | grep -o '>>> ' | wc -l)" = 3 ] && ok \
  || bad "REPL: invalid UTF-8 should give a message and the next prompt ($rc, $(cat "$tmp/e"))"
# sampling flags out of range are usage errors (exit 2) naming the flag
for f in "--temperature -1" "--top-p 0" "--top-p 1.5" "--top-k -2" "--repetition-penalty 0"; do
  "$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --interactive $f </dev/null >/dev/null 2>"$tmp/e"
  [ $? = 2 ] && grep -q -- "${f%% *}" "$tmp/e" && ok || bad "generate $f: $(cat "$tmp/e")"
done
mkdir "$tmp/notok"
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --tokenizer "$tmp/notok" --interactive 2>"$tmp/e" </dev/null >/dev/null
[ $? -ne 0 ] && grep -q 'tokenizer.json' "$tmp/e" && ok || bad "missing tokenizer: $(cat "$tmp/e")"
echo '{"model": ' > "$tmp/notok/tokenizer.json"
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" --tokenizer "$tmp/notok" --interactive 2>"$tmp/e" </dev/null >/dev/null
[ $? -ne 0 ] && grep -q 'tokenizer.json' "$tmp/e" && ok || bad "malformed tokenizer: $(cat "$tmp/e")"
"$bin" generate --ckpt-path "$tmp/m" --config "$cfg" 2>"$tmp/e" >/dev/null
[ $? -eq 2 ] && ok || bad "neither --interactive nor --input-file"

echo "generate: $passes passed, $fails failed"
[ $fails = 0 ]
