#!/usr/bin/env bash
# Configures and builds gnsilu into ${GNSILU_BUILD_DIR:-build} (${GNSILU_BUILD_TYPE:-Release}; extra CMake arguments
# pass through), through ccache where it is installed (tools/steps.sh, use_ccache; GNSILU_CCACHE=0 turns it off).
# With CI=true in the environment (the CI sets it) warnings are errors (-DGNSILU_WARNINGS_AS_ERRORS=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/steps.sh
use_ccache
build=${GNSILU_BUILD_DIR:-build}
export PATH="/usr/local/cuda/bin:$PATH"
ci_args=()
if [[ ${CI:-} == true ]]; then
  ci_args+=(-DGNSILU_WARNINGS_AS_ERRORS=ON)  # CI (CI=true): compiler warnings fail the build
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="${GNSILU_BUILD_TYPE:-Release}" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${ci_args[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
