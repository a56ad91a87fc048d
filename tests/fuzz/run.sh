#!/usr/bin/env bash
# run.sh SECONDS [TARGET...] - runs each libFuzzer target for SECONDS of CPU time.
#
# Builds build-fuzz with clang (-DDSV3_FUZZ=ON: ASan + UBSan + libFuzzer),
# seeds each target's corpus (build-fuzz/corpus/<target>, kept between runs)
# from the golden files, the small seed tokenizers and the kept crashers, then
# runs the targets one after another and prints, per target, the executions,
# the corpus size and any finding. A finding is written to
# build-fuzz/artifacts/<target>-crash-*; once fixed, copy it to
# tests/fuzz/crashers/<target>/ so that the test suite replays it.
# Targets: safetensors index config jinja tok_encode tokenizer_json request
# (default all). SECONDS counts the target's own CPU time (user + system), not
# the wall clock, so that a run on a loaded or niced machine still fuzzes as
# long as asked: a target is stopped with SIGINT (libFuzzer then prints its
# final statistics) once its CPU time reaches SECONDS.
# Environment: DSV3_FUZZ_BUILD (build dir), DSV3_FUZZ_JOBS (targets run at once,
# default 1), DSV3_TOKENIZER (for tok_encode).
set -u
secs="${1:-60}"
shift || true
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${DSV3_FUZZ_BUILD:-$root/build-fuzz}"
jobs="${DSV3_FUZZ_JOBS:-1}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors index config jinja tok_encode tokenizer_json request)
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
seed request "$root/tests/fuzz/seeds/request" "$root/tests/fuzz/crashers/request"
mkdir -p "$build/artifacts" "$build/logs"
run_one() { # run_one TARGET: fuzzes it, then prints its summary line
    local t="$1" log="$build/logs/$1.log" extra=() rc runs cpu
    [ "$t" = tok_encode ] && extra=(-max_len=4096)
    [ "$t" = safetensors ] && extra=(-max_len=65536)
    "$build/tests/fuzz_$t" -max_total_time=$((secs * 50)) -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$build/artifacts/$t-" "${extra[@]}" "$build/corpus/$t" >"$log" 2>&1 &
    local pid=$! ticks hz
    hz="$(getconf CLK_TCK)"
    while kill -0 "$pid" 2>/dev/null; do
        # fields 14 and 15 of /proc/PID/stat: user and system time in clock ticks
        ticks="$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)"
        cpu=$((ticks / hz))
        [ "$cpu" -ge "$secs" ] && kill -INT "$pid" 2>/dev/null
        sleep 2
    done
    wait "$pid"
    rc=$?
    # libFuzzer exits with 72 when interrupted: the budget ran out, no finding
    [ $rc -eq 72 ] && grep -q 'run interrupted' "$log" && rc=0
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')"
    printf '%-15s exit %d, %s executions in %s CPU s, corpus %d files (%s)\n' "$t" "$rc" "${runs:-?}" \
        "${cpu:-?}" "$(find "$build/corpus/$t" -type f | wc -l)" "$(du -sh "$build/corpus/$t" | cut -f1)"
    if [ $rc -ne 0 ]; then
        grep -m3 -E 'ERROR|SUMMARY|Test unit written' "$log" | sed 's/^/    /'
    fi
    return $rc
}
status=0
for t in "${targets[@]}"; do
    while [ "$(jobs -pr | wc -l)" -ge "$jobs" ]; do wait -n || status=1; done
    run_one "$t" &
done
while [ "$(jobs -pr | wc -l)" -gt 0 ]; do wait -n || status=1; done
exit $status
