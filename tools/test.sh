#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with ctest. Without a GPU the tests
# labelled "gpu" report "Skipped" with the reason. Extra arguments go to ctest (e.g. -L cpu, -j 2).
#
# GNSILU_TEST_TORCH=1 (.ci/run sets it) first makes the Python environment of tools/python_env.sh (PyTorch and
# diffusers, pinned in tools/requirements-test.txt, in a venv outside the checkout: about 2 minutes and 5 GB the
# first time, nothing later) and runs the PyTorch and diffusers tests in it; they must then run: a missing PyTorch
# fails them instead of skipping them (GNSILU_TEST_REQUIRE_TORCH=1). Without it they use python3, and report
# Skipped where it has no PyTorch or diffusers.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/steps.sh
build=${GNSILU_BUILD_DIR:-build}
step "setup" bash tools/setup.sh
cmake_args=()
if [ "${GNSILU_TEST_TORCH:-0}" = 1 ]; then
  step "python environment (PyTorch, diffusers)" bash tools/python_env.sh
  python=$(bash tools/python_env.sh --print)
  cmake_args+=("-DGNSILU_TEST_PYTHON=$python")
  export GNSILU_TEST_REQUIRE_TORCH=1
  echo "test: the PyTorch and diffusers tests run with $python ($("$python" -c 'import torch, diffusers; print("torch", torch.__version__, "diffusers", diffusers.__version__)'))"
fi
step "build ($build)" bash tools/build.sh "${cmake_args[@]}"
step "ctest ($build)" ctest_logged "$build" "$@"
