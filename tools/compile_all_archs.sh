#!/usr/bin/env bash
# Every kernel variant for every architecture this NVRTC offers from sm_75 up (12 with CUDA 13.0), with no spills
# and no stack frame, and every sibling of a ptxas class (tests/kernels/test_compile.cpp, kArchClasses) with the same
# registers, stack and spills per kernel as its class's representative. CI compiles the representatives only; run
# this after any change under kernels/ or to the candidate configurations (CONTRIBUTING.md), and report its result
# in the issue note. About 40 minutes on 2 cores without remembered passes.
#
#   bash tools/compile_all_archs.sh [build folder, default build]
#
# It builds test_compile (tools/build.sh) and runs its full case with GNSILU_TEST_ARCHS=all. Passes are remembered
# where GNSILU_COMPILE_PASS_CACHE says (unset: nothing remembered, everything compiled); a remembered pass keeps its
# per-kernel summary, so the sibling check works from remembered passes too. The log: <build>/compile_all_archs.log.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${GNSILU_BUILD_DIR:-build}}
GNSILU_BUILD_DIR=$build bash tools/build.sh
log=$build/compile_all_archs.log
echo "compile_all_archs: every architecture, $(nproc) threads; GNSILU_COMPILE_PASS_CACHE=${GNSILU_COMPILE_PASS_CACHE:-unset}; log $log"
start=$SECONDS
status=0
GNSILU_TEST_ARCHS=all "$build/tests/test_compile" --test-case='every kernel variant*' > "$log" 2>&1 || status=$?
grep -E "MESSAGE: (sm_|GNSILU|[0-9]+ jobs)|ERROR|test cases|Status" "$log" | sed 's/^.*MESSAGE: /  /' | cut -c1-240
if [ "$status" -ne 0 ]; then
  grep -E "ERROR|CHECK" "$log" | head -40 >&2
  echo "compile_all_archs: FAILED after $((SECONDS - start)) s (log $log)" >&2
  exit 1
fi
echo "compile_all_archs: PASSED in $((SECONDS - start)) s"
