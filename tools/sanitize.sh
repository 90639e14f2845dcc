#!/usr/bin/env bash
# The CPU tests under AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer (g++, -DGNSILU_SANITIZE=ON),
# built into ${GNSILU_BUILD_DIR:-build-sanitize} as ${GNSILU_BUILD_TYPE:-Debug} (assertions on; it builds in a third
# of the time of an optimised build). Any report, a leak included, fails the test. The full compile test (every
# kernel variant for every architecture: minutes of uninstrumented NVRTC work) is left to tools/test.sh; here
# test_compile runs only its quick cases. Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/steps.sh
step "setup" bash tools/setup.sh
build=${GNSILU_BUILD_DIR:-build-sanitize}
step "build ($build)" env GNSILU_BUILD_DIR="$build" GNSILU_BUILD_TYPE="${GNSILU_BUILD_TYPE:-Debug}" \
  bash tools/build.sh -DGNSILU_SANITIZE=ON -DGNSILU_BUILD_TOOLS=OFF

supp=$PWD/tools/sanitizer
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=0:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# Not here: test_compile's full case (below, only its quick cases) and the Python tests (python3 is not built with
# ASan; the C API they call is fuzzed from C by tools/fuzz.sh).
step "ctest ($build)" ctest_logged "$build" -L cpu -E '^(test_compile|test_python_.*)$' "$@"
echo "sanitize: test_compile (quick cases; the full one runs in tools/test.sh)"
step "test_compile quick cases ($build)" "$build/tests/test_compile" --test-case-exclude='every kernel instantiation*'
