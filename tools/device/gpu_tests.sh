#!/usr/bin/env bash
# Runs the GPU test suite and the benchmarks on a machine with a GPU, from a build folder made elsewhere (the
# build travels; the tests are run directly because ctest's files hold the build machine's paths). Logs go
# under $OUT (default /tmp/gnsilu-gpu); a summary is printed last. Usage: gpu_tests.sh [build] [tests|bench|all]
set -u
build=${1:-build}
what=${2:-all}
out=${OUT:-/tmp/gnsilu-gpu}
mkdir -p "$out"
mkdir -p /tmp/gnsilu-cache
export GNSILU_CACHE=/tmp/gnsilu-cache/cache.sqlite
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
  rm -f /tmp/gnsilu-cache/cold.sqlite*
  cold=/tmp/gnsilu-cache/cold.sqlite
  {
    echo "--- cold start (empty cache file)"
    GNSILU_CACHE=$cold "$build/tools/gnsilu-bench" start --shape 1x128x1024x1024 --dtypes bf16
    echo "--- warm start (the same file, a new process)"
    GNSILU_CACHE=$cold "$build/tools/gnsilu-bench" start --shape 1x128x1024x1024 --dtypes bf16
    "$build/tools/gnsilu-bench" overhead
  } > "$out/start.log" 2>&1
  summary+=("$(printf '%-34s exit %s' "start and overhead" "$?")")
  step "shapes" shapes.log "$build/tools/gnsilu-bench" shapes --json "$out/shapes.json"
  cat "$out/start.log"
  sed -n '/^shape/,$p' "$out/shapes.log"
fi
if [ "$what" = profile ]; then
  # Nsight Compute on the three kernels of one large call (no tuning, so that the first launches are the call's).
  GNSILU_TUNE=off ncu --clock-control none --kernel-name regex:"chunk_stats|finalize|apply" --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats \
    "$build/tools/gnsilu-bench" shapes --shapes 1x128x1024x1024 --dtypes bf16 --repeats 2 > "$out/ncu.log" 2>&1
  summary+=("$(printf '%-34s exit %s' "ncu" "$?")")
  grep -E "chunk_stats|finalize|apply|Duration|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions  |Issue Slots Busy" "$out/ncu.log" | head -60
  mkdir -p /tmp/gnsilu-cubin && "$build/tools/gnsilu-bench" cubin --json /tmp/gnsilu-cubin > /dev/null 2>&1
  for f in /tmp/gnsilu-cubin/*.cubin; do cuobjdump -sass "$f"; done > "$out/sass.txt" 2>&1
  awk '/Function :/ {name=$3} /\/\*[0-9a-f]+\*\// {count[name]++} END {for (n in count) printf "%6d SASS instructions  %s\n", count[n], n}' "$out/sass.txt" | sort -k4
fi
printf '\n'
printf '%s\n' "${summary[@]}"
