# Sourced by the build and test scripts (tools/build.sh, test.sh, sanitize.sh, fuzz.sh, python/tests/test_wheel.sh):
#
# step NAME COMMAND...  runs COMMAND and, where GNSILU_STEP_TIMES names a file (.ci/run sets it), appends
#                       "NAME<TAB>seconds<TAB>exit status" to it; returns COMMAND's status. .ci/run prints the file
#                       as a table at its end.
# ctest_logged BUILD ARGS...
#                       ctest over BUILD with its output shown and kept in BUILD/ctest.log (which .ci/run's table
#                       reads); ctest's exit status.
# use_ccache            makes every CMake build configured from here on compile through ccache (Debian's, from
#                       tools/setup.sh), through the environment CMake reads when it first configures a build
#                       folder (CMAKE_C_COMPILER_LAUNCHER, CMAKE_CXX_COMPILER_LAUNCHER): the Release, sanitizer and
#                       fuzz builds and the wheel's own build alike. Paths under the checkout are hashed relative
#                       to it (CCACHE_BASEDIR), so a fresh clone elsewhere hits what an earlier clone compiled.
#                       GNSILU_CCACHE=0 turns it off; without ccache installed it does nothing. The cache is ccache's
#                       own (CCACHE_DIR, default ~/.cache/ccache), outside the clone.

step() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  if [ -n "${GNSILU_STEP_TIMES:-}" ]; then
    printf '%s\t%s\t%s\n' "$name" "$((SECONDS - start))" "$rc" >> "$GNSILU_STEP_TIMES"
  fi
  return $rc
}

ctest_logged() {
  local build=$1
  shift
  mkdir -p "$build"
  ctest --test-dir "$build" --output-on-failure "$@" 2>&1 | tee "$build/ctest.log"
  return "${PIPESTATUS[0]}"
}

use_ccache() {
  if [ "${GNSILU_CCACHE:-1}" = 0 ] || ! command -v ccache > /dev/null 2>&1; then
    return 0
  fi
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}  # -g records the build folder; objects do not depend on it here
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
}
