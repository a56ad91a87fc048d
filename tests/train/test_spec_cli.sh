#!/usr/bin/env bash
# test_spec_cli.sh - `dsv3 generate --spec mtp --draft N` on models/dsv3-mini:
# greedy completions with speculation are those without, one prompt at a time
# (--prompt) and batched (--input-file, four prompts decoding together), for
# drafts 1 to 3; `dsv3 bench --spec mtp` runs and prints its table.
# DSV3_DEVICE=cuda runs the same on the GPU (default cpu).
set -u
bin="${DSV3_BIN:-build/dsv3}"
dir="${DSV3_TRAINED:-models/dsv3-mini}"
dev="${DSV3_DEVICE:-cpu}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
common=(--ckpt-path "$dir" --device "$dev" --threads 1 --temperature 0 --max-new-tokens 100)
printf '%s\n' "Tell me about the city." "Write a few sentences about the sea." "Describe the church." \
  "Continue this text: The jury said it did find that" > "$tmp/prompts.txt"
run() { # name, then flags
  local name=$1
  shift
  if ! "$bin" generate "${common[@]}" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"; then
    echo "FAIL $name: exit status"; cat "$tmp/$name.err"; fail=1
  fi
}
run one --prompt "Tell me about the city."
run batch --input-file "$tmp/prompts.txt"
for d in 1 2 3; do
  for m in one batch; do
    if [ $m = one ]; then run "$m$d" --prompt "Tell me about the city." --spec mtp --draft $d
    else run "$m$d" --input-file "$tmp/prompts.txt" --spec mtp --draft $d; fi
    stats="$(grep '^speculative:' "$tmp/$m$d.err")"
    if cmp -s "$tmp/$m.out" "$tmp/$m$d.out"; then echo "ok   $m draft $d: identical ($stats)"
    else echo "FAIL $m draft $d: differs from plain greedy"; diff "$tmp/$m.out" "$tmp/$m$d.out" | head -5; fail=1; fi
  done
done
if "$bin" bench --spec mtp --ckpt-path "$dir" --device "$dev" -t 1 -n 8 -r 1 --draft 1 > "$tmp/bench" 2>&1 &&
   grep -q '^draft 1 ' "$tmp/bench" && grep -q '^plain ' "$tmp/bench"; then
  echo "ok   bench --spec mtp"
else
  echo "FAIL bench --spec mtp"; cat "$tmp/bench"; fail=1
fi
if "$bin" generate "${common[@]}" --prompt x --spec eagle > /dev/null 2>&1; then echo "FAIL --spec eagle accepted"; fail=1
else echo "ok   --spec eagle refused"; fi
[ $fail = 0 ] && echo "train_spec_cli: passed" || echo "train_spec_cli: failed"
exit $fail
