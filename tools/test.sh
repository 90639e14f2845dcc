#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with ctest. Without a GPU the tests
# labelled "gpu" report "Skipped" with the reason. Extra arguments go to ctest (e.g. -L cpu, -j 2).
#
# GNSILU_TEST_TORCH=1 (.ci/run sets it) also makes the Python environment of tools/python_env.sh (PyTorch and
# diffusers, pinned in tools/requirements-test.txt, in a venv outside the checkout: about 2 minutes and 5 GB the
# first time, mostly downloads, so it is made beside the build; nothing later) and runs the PyTorch and diffusers
# tests in it; they must then run: a missing PyTorch fails them instead of skipping them
# (GNSILU_TEST_REQUIRE_TORCH=1). Without it they use python3, and report Skipped where it has no PyTorch or diffusers.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/steps.sh
build=${GNSILU_BUILD_DIR:-build}
step "setup" bash tools/setup.sh
cmake_args=()
env_pid=
if [ "${GNSILU_TEST_TORCH:-0}" = 1 ]; then
  python=$(bash tools/python_env.sh --path)
  cmake_args+=("-DGNSILU_TEST_PYTHON=$python")
  export GNSILU_TEST_REQUIRE_TORCH=1
  step "python environment (PyTorch, diffusers), beside the build" bash tools/python_env.sh &
  env_pid=$!
fi
build_status=0
step "build ($build)" bash tools/build.sh "${cmake_args[@]}" || build_status=$?
if [ -n "$env_pid" ]; then
  wait "$env_pid"  # its failure ends the script here (set -e), with python_env.sh's reason above
  echo "test: the PyTorch and diffusers tests run with $python ($("$python" -c 'import torch, diffusers; print("torch", torch.__version__, "diffusers", diffusers.__version__)'))"
fi
[ "$build_status" -eq 0 ] || exit "$build_status"
step "ctest ($build)" ctest_logged "$build" "$@"
