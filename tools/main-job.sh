#!/usr/bin/env bash
# The main job: installs what is missing, builds, pre-warms the cache for the Flux VAE with gnsilu-tune (tunes
# every key on the local GPU; without a GPU, compiles the kernels for sm_90 and says so), then runs a
# Flux-VAE-sized GroupNorm+SiLU (1x128x1024x1024 bf16, 32 groups, NCHW and NHWC) through the public API, timed and
# checked bit for bit against the CPU reference (gnsilu-bench check; without a GPU it says that nothing ran).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/build.sh
build=${GNSILU_BUILD_DIR:-build}
"$build/tools/gnsilu-tune" warm --preset flux
"$build/tools/gnsilu-bench" check --shapes 1x128x1024x1024 --dtypes bf16 --groups 32 --layouts nchw,nhwc
