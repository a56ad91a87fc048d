#!/usr/bin/env bash
# run.sh SECONDS [TARGET...] - runs each libFuzzer target for SECONDS.
#
# Builds build-fuzz with clang (-DDSV3_FUZZ=ON: ASan + UBSan + libFuzzer),
# seeds each target's corpus (build-fuzz/corpus/<target>, kept between runs)
# from the golden files, the small seed tokenizers and the kept crashers, then
# runs the targets one after another and prints, per target, the executions,
# the corpus size and any finding. A finding is written to
# build-fuzz/artifacts/<target>-crash-*; once fixed, copy it to
# tests/fuzz/crashers/<target>/ so that the test suite replays it.
# Targets: safetensors index config jinja tok_encode tokenizer_json (default all).
# Environment: DSV3_FUZZ_BUILD (build dir), DSV3_TOKENIZER (for tok_encode).
set -u
secs="${1:-60}"
shift || true
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${DSV3_FUZZ_BUILD:-$root/build-fuzz}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors index config jinja tok_encode tokenizer_json)
CC=clang cmake -S "$root" -B "$build" -DDSV3_FUZZ=ON -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
cmake --build "$build" -j2 --target $(printf 'fuzz_%s ' "${targets[@]}") >/dev/null || exit 1
golden="$root/tests/golden"
seed() { # seed TARGET FILE_OR_DIR...
    local d="$build/corpus/$1"
    shift
    mkdir -p "$d"
    for s in "$@"; do
        if [ -d "$s" ]; then find "$s" -maxdepth 1 -type f ! -name '.*' -exec cp -n {} "$d/" \;
        elif [ -f "$s" ]; then cp -n "$s" "$d/$(basename "$(dirname "$s")")_$(basename "$s")"; fi
    done
}
seed safetensors "$golden/fp8_kernels.safetensors" "$golden/ref_logits.safetensors"
seed index "$golden/tiny_hf/model.safetensors.index.json" "$golden/cast_bf16.index.json" "$root/tests/fuzz/crashers/index"
seed config "$golden/config_tiny.json" "$golden/tiny_hf/config.json" "$root/configs" "$root/tests/fuzz/crashers/config"
seed jinja "$root/tests/tok/templates" "$root/tests/fuzz/crashers/jinja"
seed tok_encode "$root/tests/tok/corpus.txt" "$golden/tokenizer_cases.json" "$root/tests/fuzz/crashers/tok_encode"
seed tokenizer_json "$root/tests/fuzz/seeds/tokenizer_json" "$root/tests/fuzz/crashers/tokenizer_json"
mkdir -p "$build/artifacts" "$build/logs"
status=0
for t in "${targets[@]}"; do
    log="$build/logs/$t.log"
    extra=()
    [ "$t" = tok_encode ] && extra=(-max_len=4096)
    [ "$t" = safetensors ] && extra=(-max_len=65536)
    "$build/tests/fuzz_$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$build/artifacts/$t-" "${extra[@]}" "$build/corpus/$t" >"$log" 2>&1
    rc=$?
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')"
    printf '%-15s exit %d, %s executions in %ss, corpus %d files (%s)\n' "$t" "$rc" "${runs:-?}" "$secs" \
        "$(find "$build/corpus/$t" -type f | wc -l)" "$(du -sh "$build/corpus/$t" | cut -f1)"
    if [ $rc -ne 0 ]; then
        status=1
        grep -m3 -E 'ERROR|SUMMARY|Test unit written' "$log" | sed 's/^/    /'
    fi
done
exit $status
