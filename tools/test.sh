#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with ctest. Without a GPU the tests
# labelled "gpu" report "Skipped" with the reason. Extra arguments go to ctest (e.g. -L cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/build.sh
ctest --test-dir "${GNSILU_BUILD_DIR:-build}" --output-on-failure "$@"
