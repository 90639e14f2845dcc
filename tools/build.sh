#!/usr/bin/env bash
# Configures and builds gnsilu into ${GNSILU_BUILD_DIR:-build} (${GNSILU_BUILD_TYPE:-Release}; extra CMake arguments
# pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GNSILU_BUILD_DIR:-build}
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="${GNSILU_BUILD_TYPE:-Release}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
