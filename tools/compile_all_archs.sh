#!/usr/bin/env bash
# The compile guard in full, and the record CI checks against: every kernel instantiation for every architecture this
# NVRTC offers from sm_75 up (12 with CUDA 13.0), with no spill and no stack frame, and every sibling of a ptxas class
# (tests/kernels/compile_guard.cpp, arch_classes) with the same registers, stack and spills per kernel as its class's
# representative. On success it writes tests/kernels/compile_record.txt: commit it with the kernel change. CI then
# takes each job's reports from the record where its key is the tree's, compiles a random sample of them and fails
# on any difference (tests/kernels/test_compile.cpp); without a current record CI compiles the 8 classes' jobs itself
# (26 minutes of a 36-minute CI run on 2 cores). Run this after any change under kernels/ or to the candidate
# configurations (CONTRIBUTING.md).
#
#   bash tools/compile_all_archs.sh [build folder, default build]
#
# Time: 48 minutes on the 2-core development machine (288 jobs, 7704 kernels; CONTRIBUTING.md). Jobs that pass are
# remembered in ${GNSILU_COMPILE_PASS_CACHE:-~/.cache/gnsilu/compile-passes}, so a run cut short resumes where it
# stopped, and a run with every job remembered takes a second. The record is useful where CI's NVRTC is the same
# library file (its SHA-256 is in the record's identity); elsewhere CI ignores it. The log:
# <build>/compile_all_archs.log.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${GNSILU_BUILD_DIR:-build}}
record=$PWD/tests/kernels/compile_record.txt
GNSILU_BUILD_DIR=$build bash tools/build.sh > /dev/null
export GNSILU_COMPILE_PASS_CACHE=${GNSILU_COMPILE_PASS_CACHE:-$HOME/.cache/gnsilu/compile-passes}
log=$build/compile_all_archs.log
echo "compile_all_archs: every architecture, $(nproc) threads; GNSILU_COMPILE_PASS_CACHE=$GNSILU_COMPILE_PASS_CACHE; log $log"
start=$SECONDS
status=0
GNSILU_TEST_ARCHS=all GNSILU_COMPILE_RECORD_WRITE=$record "$build/tests/test_compile" \
  --test-case='every kernel instantiation*' > "$log" 2>&1 || status=$?
grep -E "MESSAGE: ([0-9]+ jobs|sm_[0-9]+ against|GNSILU|the record|no record)|ERROR|test cases|Status" "$log" |
  sed 's/^.*MESSAGE: /  /' | cut -c1-240
if [ "$status" -ne 0 ]; then
  grep -E "ERROR|CHECK" "$log" | head -40 >&2
  echo "compile_all_archs: FAILED after $((SECONDS - start)) s (log $log); the record was not written" >&2
  exit 1
fi
echo "compile_all_archs: PASSED in $((SECONDS - start)) s; commit tests/kernels/compile_record.txt"
