#!/usr/bin/env bash
# libFuzzer (clang, with ASan+UBSan): builds tests/fuzz into ${GNSILU_FUZZ_BUILD_DIR:-build-fuzz}, replays every
# committed input in tests/fuzz/corpus/<target>/ (regressions: any failure stops here), then fuzzes each target for
# ${GNSILU_FUZZ_SECONDS:-60} seconds from that corpus (the targets side by side). New inputs go to build-fuzz/corpus/<target>/ (not committed);
# a crash leaves build-fuzz/artifacts/crash-* (reproduce: build-fuzz/tests/fuzz/<target> <file>) and fails the
# script; keep it as tests/fuzz/corpus/<target>/crash-<what> once fixed (tests/fuzz/corpus/README.md). fuzz_c_api's
# corpus is also replayed with the toolkit's stub libcuda (GNSILU_LIBCUDA): the same code runs after a driver load
# that fails differently. GNSILU_FUZZ_SECONDS=0 only replays. fuzz_cache_file's files live in a private folder under
# $TMPDIR (here /dev/shm when there is one: the cache's fsyncs are then free).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/steps.sh
step "setup (clang)" bash tools/setup.sh clang-14 libclang-rt-14-dev  # clang, and its libFuzzer and sanitizer runtimes
use_ccache

build=${GNSILU_FUZZ_BUILD_DIR:-build-fuzz}
seconds=${GNSILU_FUZZ_SECONDS:-60}
export PATH="/usr/local/cuda/bin:$PATH"
build_fuzzers() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
    -DCMAKE_CXX_COMPILER=clang++-14 -DGNSILU_SANITIZE=ON -DGNSILU_FUZZ=ON -DGNSILU_BUILD_TESTS=OFF \
    -DGNSILU_BUILD_TOOLS=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)" --target fuzz_c_api fuzz_cache_file
}
step "build ($build)" build_fuzzers

supp=$PWD/tools/sanitizer
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
stub=/usr/local/cuda/lib64/stubs/libcuda.so
mkdir -p "$build/artifacts"

if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

# target, then the environment it runs in ("" or GNSILU_LIBCUDA=...)
replays=("fuzz_c_api|" "fuzz_c_api|GNSILU_LIBCUDA=$stub" "fuzz_cache_file|")
runs=("fuzz_c_api|" "fuzz_cache_file|")
passed=0
report_target() {  # label, log file, exit status: the log's end shown on failure (which ends the script)
  local label=$1 log=$2 status=$3
  if [ "$status" -ne 0 ]; then
    tail -n 80 "$log" >&2
    echo "fuzz: $label FAILED; log $log, inputs in $build/artifacts/" >&2
    exit 1
  fi
  passed=$((passed + 1))
  grep -E '^(Done|INFO: Seed|stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)' "$log" | sed "s/^/  /" || true
}
run_target() {  # label, log file, command...: the fuzzer's output goes to the log
  local label=$1 log=$2 status=0
  shift 2
  "$@" >"$log" 2>&1 || status=$?
  report_target "$label" "$log" "$status"
}
replay_all() {
  for run in "${replays[@]}"; do
    target=${run%%|*}
    env_vars=${run#*|}
    seeds=tests/fuzz/corpus/$target
    echo "fuzz: $target${env_vars:+ ($env_vars)}: replaying $(ls "$seeds" | wc -l) committed inputs"
    run_target "$target replay" "$build/$target-replay${env_vars:+-stub}.log" \
      env $env_vars "$build/tests/fuzz/$target" -runs=0 -artifact_prefix="$build/artifacts/" "$seeds"
  done
}
# The targets fuzz side by side, one per core (each libFuzzer process is single-threaded); their reports follow
# in order.
fuzz_all() {
  local pids=() labels=() logs=() i
  for run in "${runs[@]}"; do
    target=${run%%|*}
    env_vars=${run#*|}
    mkdir -p "$build/corpus/$target"
    echo "fuzz: $target${env_vars:+ ($env_vars)}: fuzzing for $seconds s"
    env $env_vars "$build/tests/fuzz/$target" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
      -max_len=16384 -print_final_stats=1 -artifact_prefix="$build/artifacts/" \
      "$build/corpus/$target" "tests/fuzz/corpus/$target" > "$build/$target.log" 2>&1 &
    pids+=($!)
    labels+=("$target")
    logs+=("$build/$target.log")
  done
  local statuses=()
  for i in "${!pids[@]}"; do
    statuses[i]=0
    wait "${pids[$i]}" || statuses[i]=$?
  done
  for i in "${!pids[@]}"; do
    report_target "${labels[$i]}" "${logs[$i]}" "${statuses[$i]}"
  done
}
step "fuzz: replay the committed inputs" replay_all
if [ "$seconds" != 0 ]; then
  step "fuzz: ${#runs[@]} targets for $seconds s side by side" fuzz_all
fi
echo "fuzz: $passed passed, 0 failed"
