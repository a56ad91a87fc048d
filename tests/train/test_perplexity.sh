#!/usr/bin/env bash
# test_perplexity.sh - `dsv3 perplexity` on the trained checkpoint
# models/dsv3-mini against the PyTorch model's logits (ref/ref_logits.safetensors,
# read by ref_nll.js): the text of the reference sequence s24 (BOS + 23 tokens,
# logits at every position) scored in one window gives the mean loss of the
# reference's 23 predictions, float32 path within 1e-4 relative, and with --mtp
# the MTP module's 22 predictions of the token after next. Also: batched
# windows equal one at a time, and bad flags are usage errors.
. "$(dirname "$0")/../prelude.sh"
dir="${DSV3_TRAINED:-models/dsv3-mini}"
here="$(cd "$(dirname "$0")" && pwd)"

# s24's text without its BOS (the command adds one)
node -e 'const r = require(process.argv[1]); process.stdout.write(r.sequences.s24.text.replace(/^<｜begin▁of▁sentence｜>/, ""))' \
  "$dir/ref/ref.json" > "$tmp/s24.txt"
read -r want n_want < <(node "$here/ref_nll.js" "$dir/ref/ref_logits.safetensors" s24)
got_json="$("$bin" perplexity --ckpt-path "$dir" --file "$tmp/s24.txt" --ctx-size 24 --json 2>"$tmp/err")" \
  || { bad "perplexity s24: exit $?: $(cat "$tmp/err")"; }
got=$(printf '%s' "$got_json" | node -e 'const j = JSON.parse(require("fs").readFileSync(0)); console.log(j.mean_nll, j.tokens_scored)')
read -r got_nll got_n <<< "$got"
if [ "$got_n" = "$n_want" ] && node -e "process.exit(Math.abs($got_nll - $want) <= 1e-4 * Math.abs($want) ? 0 : 1)"; then
  ok "s24 mean nll $got_nll over $got_n tokens (reference $want over $n_want)"
else
  bad "s24 mean nll: dsv3 [$got_nll over $got_n] reference [$want over $n_want]"
fi

# --mtp: the MTP module's losses of t[p + 2] given t[p + 1] at every position of s24
read -r mwant mn_want < <(node "$here/ref_nll.js" "$dir/ref/ref_logits.safetensors" s24 mtp)
got=$("$bin" perplexity --ckpt-path "$dir" --file "$tmp/s24.txt" --ctx-size 24 --mtp --json 2>"$tmp/err" \
  | node -e 'const j = JSON.parse(require("fs").readFileSync(0)); console.log(j.mtp.mean_nll, j.mtp.tokens_scored)')
read -r got_nll got_n <<< "$got"
if [ "$got_n" = "$mn_want" ] && node -e "process.exit(Math.abs($got_nll - $mwant) <= 1e-4 * Math.abs($mwant) ? 0 : 1)"; then
  ok "s24 MTP mean nll $got_nll over $got_n tokens (reference $mwant over $mn_want)"
else
  bad "s24 MTP mean nll: dsv3 [$got_nll over $got_n] reference [$mwant over $mn_want] $(cat "$tmp/err")"
fi

# windows of 8 every 4 tokens: batched passes give what one window a pass gives
a="$("$bin" perplexity --ckpt-path "$dir" --file "$tmp/s24.txt" --ctx-size 8 --stride 4 --json 2>/dev/null)"
b="$("$bin" perplexity --ckpt-path "$dir" --file "$tmp/s24.txt" --ctx-size 8 --stride 4 --batch 3 --json 2>/dev/null)"
na=$(printf '%s' "$a" | node -e 'const j = JSON.parse(require("fs").readFileSync(0)); console.log(j.tokens_scored, j.mean_nll)')
nb=$(printf '%s' "$b" | node -e 'const j = JSON.parse(require("fs").readFileSync(0)); console.log(j.tokens_scored, j.mean_nll)')
# the same windows; a batched pass may round differently (its kernels take other paths)
if [ "${na%% *}" = 23 ] && [ "${nb%% *}" = 23 ] && node -e "process.exit(Math.abs(${na##* } - ${nb##* }) <= 1e-4 * ${na##* } ? 0 : 1)"; then
  ok "stride 4, batch 1 and 3: [$na] [$nb]"
else
  bad "stride 4: batch 1 [$na] batch 3 [$nb], want 23 tokens scored and equal losses"
fi

for args in "--ctx-size 2" "--stride 0 --ctx-size 8" "--stride 9 --ctx-size 8" "--batch 0" "--gemm-impl x"; do
  # shellcheck disable=SC2086
  "$bin" perplexity --ckpt-path "$dir" --file "$tmp/s24.txt" $args > /dev/null 2>&1
  rc=$?
  [ $rc = 2 ] && ok "usage error: $args" || bad "$args: exit $rc, want 2"
done
"$bin" perplexity --ckpt-path "$dir" --file "$tmp/missing.txt" > /dev/null 2> "$tmp/err"
[ $? = 1 ] && grep -q "missing.txt" "$tmp/err" && ok "missing file named" || bad "missing file: $(cat "$tmp/err")"
[ $fail = 0 ] && echo "train_perplexity: passed" || echo "train_perplexity: failed"
exit $fail
