#!/usr/bin/env bash
# clang-tidy (.clang-tidy's checks, every finding an error) on the host C++ sources of src/, cache/ and tools/ that
# changed since BASE: by default since the last commit this script found clean on this machine (remembered in
# ${GNSILU_TIDY_STATE:-~/.cache/gnsilu/tidy-clean}, like CI's other caches; safe to delete), every source when
# that commit is unknown, or when a header changed (its includers are anywhere). "all" checks every source.
# Uses the build folder's compile_commands.json (${GNSILU_BUILD_DIR:-build}, configured with it if missing).
# Kernels (kernels/*.cu, *.cuh) are NVRTC's: tests/kernels and the GPU suites check them, not this.
# Usage: tools/tidy.sh [BASE|all]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GNSILU_BUILD_DIR:-build}
state=${GNSILU_TIDY_STATE:-$HOME/.cache/gnsilu/tidy-clean}
tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
if [[ -z $tidy ]]; then
  bash tools/setup.sh clang-tidy > /dev/null
  tidy=$(command -v clang-tidy-14 || command -v clang-tidy)
fi
if [[ ! -f $build/compile_commands.json ]]; then
  cmake -S . -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > /dev/null
fi
base=${1:-}
if [[ -z $base ]]; then
  base=all
  if [[ -f $state ]] && git merge-base --is-ancestor "$(cat "$state")" HEAD 2>/dev/null; then base=$(cat "$state"); fi
fi
if [[ $base != all ]]; then
  mapfile -t changed < <(git diff --name-only --diff-filter=d "$base" HEAD -- src cache tools include .clang-tidy)
  if printf '%s\n' "${changed[@]}" | grep -qE '\.(hpp|h)$|^\.clang-tidy$'; then
    base=all  # a header or the checks changed: every source
  fi
fi
if [[ $base == all ]]; then
  mapfile -t files < <(git ls-files 'src/*.cpp' 'cache/*.cpp' 'tools/*.cpp')
else
  mapfile -t files < <(printf '%s\n' "${changed[@]}" | grep -E '\.cpp$' || true)
fi
if [[ ${#files[@]} -eq 0 ]]; then
  echo "tidy: no host source changed since ${base:0:12}"
else
  echo "tidy: $($tidy --version | grep -o 'version [0-9.]*' | head -1) on ${#files[@]} sources (since ${base:0:12})"
  printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 4 "$tidy" -p "$build" --quiet 2> >(grep -v "warnings generated" >&2)
  echo "tidy: clean"
fi
mkdir -p "$(dirname "$state")"
git rev-parse HEAD > "$state"
