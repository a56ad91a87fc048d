#!/usr/bin/env bash
# dsv3's flags on the trained model: --help (stdout, exit 0) for every
# subcommand, --version, -p, --input-file -, -n -1, the llama.cpp short forms,
# --config taken from the checkpoint, and invalid UTF-8 in a prompt.
set -u
bin=${DSV3_BIN:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
m=$root/models/dsv3-mini
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

for c in generate logits tokenize perplexity serve bench convert cast-bf16 synth info; do
  out=$("$bin" $c --help 2>"$tmp/e"); rc=$?
  [ $rc = 0 ] && [[ "$out" == *"usage: dsv3 $c"* ]] && [ ! -s "$tmp/e" ] && ok || bad "$c --help: rc $rc, stdout '$out'"
done
out=$("$bin" generate -h); [[ "$out" == *"-m, --ckpt-path"* && "$out" == *"--temp, --temperature"* ]] && ok \
  || bad "generate --help does not list the short forms: $out"
out=$("$bin" --version); rc=$?
[ $rc = 0 ] && [[ "$out" == *"commit "* && "$out" == *"cpu features:"* && "$out" == *"cuda: "* && "$out" == *"mpi: "* ]] \
  && ok || bad "--version: $out"
# the commit the binary was built from: one of this repository's (HEAD unless the build is stale)
c=$(printf '%s' "$out" | sed -n 's/.*(commit \([0-9a-f]*\).*/\1/p' | head -1)
git -C "$root" rev-parse HEAD >/dev/null 2>&1 && { [ -n "$c" ] && git -C "$root" cat-file -e "$c^{commit}" 2>/dev/null \
  && ok || bad "--version names no commit of this repository: $out"; }

# -p (no --config: the checkpoint's config.json) against the long forms and against --input-file -
a=$("$bin" generate -m "$m" -p "What is the capital of France?" -n 12 --temp 0 -t 1 -s 5 2>"$tmp/e"); rc=$?
[ $rc = 0 ] && [ -n "$a" ] && ok || bad "-p: rc $rc, '$a', $(cat "$tmp/e")"
b=$("$bin" generate --ckpt-path "$m" --config "$m/config.json" --prompt "What is the capital of France?" \
    --max-new-tokens 12 --temperature 0 --threads 1 --seed 5 2>/dev/null)
[ "$a" = "$b" ] && ok || bad "-p short and long forms differ: '$a' vs '$b'"
c=$(printf 'What is the capital of France?\n' | "$bin" generate -m "$m" --input-file - -n 12 --temp 0 2>/dev/null \
    | sed -n 's/^Completion: //p')
[ "$a" = "$c" ] && ok || bad "--input-file - gave '$c', -p '$a'"
# -n -1: until eos or the context end (-c 48), which stderr names
"$bin" generate -m "$m" -p "Tell me a story" -n -1 -c 48 --temp 0 >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc = 0 ] && { grep -q 'end of the context' "$tmp/e" || [ -s "$tmp/o" ]; } && ok || bad "-n -1: rc $rc $(cat "$tmp/e")"
"$bin" generate -m "$m" -p hi -n 0 >/dev/null 2>"$tmp/e"; [ $? = 2 ] && grep -q 'max-new-tokens' "$tmp/e" && ok || bad "-n 0 accepted"
"$bin" generate -m "$m" -p hi -c 999999 >/dev/null 2>"$tmp/e"; [ $? = 1 ] && grep -q 'ctx-size' "$tmp/e" && ok || bad "-c 999999: $(cat "$tmp/e")"
"$bin" generate -m "$m" -p hi -t -3 >/dev/null 2>"$tmp/e"; [ $? = 2 ] && grep -q 'threads' "$tmp/e" && ok || bad "-t -3 accepted"
"$bin" generate -m "$m" -p hi --temp -1 >/dev/null 2>"$tmp/e"; [ $? = 2 ] && grep -q 'temperature' "$tmp/e" && ok || bad "--temp -1 accepted"
"$bin" serve -m "$m" --queue 2147483647 >/dev/null 2>"$tmp/e"; [ $? = 2 ] && grep -q -- '--queue must be in' "$tmp/e" && ok \
  || bad "serve --queue 2^31-1 accepted: $(cat "$tmp/e")"
"$bin" generate -m "$m" -p hi -i >/dev/null 2>"$tmp/e" </dev/null; [ $? = 2 ] && ok || bad "-p with -i accepted"
# logits with -t and no --config
"$bin" logits -m "$m" -t 1 --tokens 1,2,3 --out "$tmp/l.st" 2>"$tmp/e" && [ -s "$tmp/l.st" ] && ok || bad "logits -m -t: $(cat "$tmp/e")"

# invalid UTF-8: an error naming where, never a prompt silently dropped
"$bin" generate -m "$m" -p "$(printf 'caf\xe9')" -n 2 >/dev/null 2>"$tmp/e"; rc=$?
[ $rc = 1 ] && grep -q 'prompt.*not valid UTF-8' "$tmp/e" && ok || bad "-p invalid UTF-8: rc $rc $(cat "$tmp/e")"
printf 'good\ncaf\xe9\n' | "$bin" generate -m "$m" --input-file - -n 2 >/dev/null 2>"$tmp/e"; rc=$?
[ $rc = 1 ] && grep -q 'standard input line 2.*not valid UTF-8' "$tmp/e" && ok || bad "stdin invalid UTF-8: rc $rc $(cat "$tmp/e")"
out=$("$bin" generate -m "$m" -p "$(printf 'caf\xc3\xa9 \xe2\x82\xac')" -n 2 --temp 0 2>"$tmp/e"); [ $? = 0 ] && ok \
  || bad "valid UTF-8 refused: $(cat "$tmp/e")"

# a FIFO where a regular file is read (tokenize --chat, the REPL's /load): a message naming it, never a hang
mkfifo "$tmp/fifo"
timeout 20 "$bin" tokenize --tokenizer "$m" --chat "$tmp/fifo" >/dev/null 2>"$tmp/e"; rc=$?
[ $rc = 1 ] && grep -q 'chat file is a FIFO' "$tmp/e" && ok || bad "tokenize --chat FIFO: rc $rc $(cat "$tmp/e")"
printf '/load %s\n/exit\n' "$tmp/fifo" | timeout 30 "$bin" generate -m "$m" -i -n 4 --temp 0 >/dev/null 2>"$tmp/e"; rc=$?
[ $rc = 0 ] && grep -q 'chat file is a FIFO' "$tmp/e" && ok || bad "/load FIFO: rc $rc $(cat "$tmp/e")"

# the REPL through a pipe: /save writes JSON that JSON.parse reads, /load restores it, //x sends /x
printf 'Hello\n/save %s\n/clear\n/load %s\n/bogus\n//x\n/exit\n' "$tmp/chat.json" "$tmp/chat.json" \
  | "$bin" generate -m "$m" -i -n 4 --temp 0 >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc = 0 ] && grep -q 'loaded 2 messages' "$tmp/e" && grep -q "unknown command '/bogus'" "$tmp/e" && ok \
  || bad "REPL /save /load: rc $rc $(cat "$tmp/e")"
node -e 'const a=JSON.parse(require("fs").readFileSync(process.argv[1]));
  if(a.length!==2||a[0].role!=="user"||a[0].content!=="Hello"||a[1].role!=="assistant")process.exit(1)' "$tmp/chat.json" \
  && ok || bad "/save wrote $(cat "$tmp/chat.json")"
# multi-line input: a line ending in \ continues
printf 'one \\\ntwo\n' | "$bin" generate -m "$m" -i -n 2 --temp 0 >"$tmp/o" 2>/dev/null
[ "$(grep -o '\.\.\. ' "$tmp/o" | wc -l)" = 1 ] && [ "$(grep -o '>>> ' "$tmp/o" | wc -l)" = 2 ] && ok \
  || bad "multi-line input: $(cat "$tmp/o")"

echo "cli flags: $pass passed, $fail failed"
[ $fail = 0 ]
