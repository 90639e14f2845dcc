#!/usr/bin/env bash
# Runs the GPU test suite and the benchmarks on a machine with a GPU, from a build folder made elsewhere (the
# build travels; the tests are run directly because ctest's files hold the build machine's paths). Logs go
# under $OUT (default /tmp/gnsilu-gpu); a summary is printed last. Usage: gpu_tests.sh [build] [tests|bench|all]
set -u
build=${1:-build}
what=${2:-all}
out=${OUT:-/tmp/gnsilu-gpu}
mkdir -p "$out"
export GNSILU_CACHE="$out/cache.sqlite"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
summary=()
step() {  # name, log, command...
  local name=$1 log=$2
  shift 2
  "$@" > "$out/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-34s exit %s' "$name" "$rc")")
  return $rc
}
if [ "$what" = tests ] || [ "$what" = all ]; then
  step "test_gpu (C++, doctest)" test_gpu.log "$build/tests/test_gpu"
  step "precision_vs_torch.py" precision.log env GNSILU_LIBRARY="$build/libgnsilu.so" OUT="$out" \
    python3 tests/gpu/precision_vs_torch.py
  step "gnsilu-run" run.log "$build/tools/gnsilu-run"
  grep -E "MESSAGE|ERROR|FAIL|test cases|assertions|Status" "$out/test_gpu.log" | cut -c1-300 | tail -40
  tail -3 "$out/precision.log"
  cat "$out/run.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  rm -f "$out/cold.sqlite"*
  step "start, empty cache" start_cold.log env GNSILU_CACHE="$out/cold.sqlite" \
    "$build/tools/gnsilu-bench" start --shape 1x128x1024x1024 --dtypes bf16
  step "start, warm cache" start_warm.log env GNSILU_CACHE="$out/cold.sqlite" \
    "$build/tools/gnsilu-bench" start --shape 1x128x1024x1024 --dtypes bf16
  step "overhead" overhead.log "$build/tools/gnsilu-bench" overhead
  step "shapes" shapes.log "$build/tools/gnsilu-bench" shapes --json "$out/shapes.json"
  echo "--- cold start"; cat "$out/start_cold.log"
  echo "--- warm start"; cat "$out/start_warm.log"
  cat "$out/overhead.log"
  sed -n '/^shape/,$p' "$out/shapes.log"
fi
printf '\n'
printf '%s\n' "${summary[@]}"
