#!/usr/bin/env bash
# Runs the GPU test suite on a machine with a GPU from a build folder made elsewhere (see README: the build
# travels; the tests are run directly because ctest's files hold the build machine's paths). Logs go under
# $OUT (default /tmp/gnsilu-gpu); a summary table is printed last.
set -u
build=${1:-build}
out=${OUT:-/tmp/gnsilu-gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

"$build/tests/test_gpu" > "$out/test_gpu.log" 2>&1
gpu_rc=$?
GNSILU_LIBRARY="$build/libgnsilu.so" OUT="$out" python3 tests/gpu/precision_vs_torch.py > "$out/precision.log" 2>&1
torch_rc=$?
"$build/tools/gnsilu-run" > "$out/run.log" 2>&1
run_rc=$?

grep -E "MESSAGE|ERROR|FAIL|test cases|assertions|Status" "$out/test_gpu.log" | cut -c1-400 | tail -40
cat "$out/precision.log" | tail -40
cat "$out/run.log"
printf '\n%-28s %s\n' "test_gpu (C++, doctest)" "exit $gpu_rc"
printf '%-28s %s\n' "precision_vs_torch.py" "exit $torch_rc"
printf '%-28s %s\n' "gnsilu-run" "exit $run_rc"
[ $gpu_rc -eq 0 ] && [ $torch_rc -eq 0 ] && [ $run_rc -eq 0 ]
