#!/usr/bin/env bash
# The main job: installs what is missing, builds, then compiles every kernel variant for the local GPU and runs
# a Flux-VAE-sized GroupNorm+SiLU checked against the CPU reference (without a GPU: compiles for sm_90 and
# says so).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/build.sh
"${GNSILU_BUILD_DIR:-build}/tools/gnsilu-run"
