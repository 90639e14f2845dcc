#!/usr/bin/env bash
# Tests the installation of an existing build folder (default ${GNSILU_BUILD_DIR:-build}; it builds nothing there):
#   1. `cmake --install BUILD --prefix TMP` into a fresh temporary prefix, and checks the tree: the headers,
#      libgnsilu.so -> libgnsilu.so.0 (its soname) -> libgnsilu.so.0.x.y, the CMake package files, the tools;
#      the exported gnsilu::gnsilu carries no CUDA, NVRTC, SQLite or thread dependency;
#   2. configures and builds tests/consumer against TMP (find_package(gnsilu 0.1 CONFIG REQUIRED)) in a temporary
#      folder and runs it with no LD_LIBRARY_PATH (it must find libgnsilu.so through its RUNPATH, and libgnsilu.so
#      libnvrtc through its own);
#      then builds README.md's C++, C and CMake blocks as one project against TMP (tools/check_docs.py snippets)
#      and parses the gnsilu-tune commands of README.md and docs/API.md with the installed gnsilu-tune;
#   3. runs cpack in the build folder into a temporary folder and lists the packages' contents.
# Every folder it writes is its own (mktemp), so it can run beside other tests; they are removed at the end
# (kept with GNSILU_KEEP_TMP=1). Prints a summary; exits 1 on any failure, 2 on bad usage, 77 (skipped) for a
# sanitizer build (GNSILU_SANITIZE=ON: its libgnsilu.so needs the sanitizer runtime loaded first).
#   bash tools/test_install.sh [BUILD]
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GNSILU_BUILD_DIR:-build}}
if [[ ! -d $build && -d $source_dir/$build ]]; then build=$source_dir/$build; fi
if [[ ! -f $build/CMakeCache.txt ]]; then
  echo "test_install: $build is not a configured build folder (no CMakeCache.txt)" >&2
  exit 2
fi
build=$(cd "$build" && pwd)
export PATH="/usr/local/cuda/bin:$PATH"
if grep -q '^GNSILU_SANITIZE:BOOL=ON$' "$build/CMakeCache.txt"; then
  echo "test_install: skipped: $build is a sanitizer build (GNSILU_SANITIZE=ON); install a normal build"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gnsilu-test-install.XXXXXX")
cleanup() {
  if [[ ${GNSILU_KEEP_TMP:-0} == 1 ]]; then echo "test_install: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
prefix=$tmp/prefix

summary=()
pass() { summary+=("ok    $1"); echo "test_install: ok: $1"; }
fail() {
  summary+=("FAIL  $1")
  echo "test_install: FAIL: $1" >&2
  print_summary
  exit 1
}
print_summary() {
  echo
  echo "==== test_install summary ($build) ===="
  printf '%s\n' "${summary[@]}"
}
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1; }

libdir=$(cache_value CMAKE_INSTALL_LIBDIR)
libdir=${libdir:-lib}
includedir=$(cache_value CMAKE_INSTALL_INCLUDEDIR)
includedir=${includedir:-include}
version=$(cache_value CMAKE_PROJECT_VERSION)
tools=$(cache_value GNSILU_BUILD_TOOLS)

# ---- 1. cmake --install ---------------------------------------------------------------------------------------
echo "test_install: cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install"; }
pass "cmake --install ($(grep -c -E '^-- (Installing|Up-to-date)' "$tmp/install.log") files)"

for header in gnsilu.h gnsilu.hpp reference.hpp; do
  [[ -f $prefix/$includedir/gnsilu/$header ]] || fail "$includedir/gnsilu/$header installed"
done
pass "headers in $includedir/gnsilu: $(cd "$prefix/$includedir/gnsilu" && echo *)"

lib=$prefix/$libdir
[[ -f $lib/libgnsilu.so.$version && ! -L $lib/libgnsilu.so.$version ]] || fail "$libdir/libgnsilu.so.$version (a file)"
[[ $(readlink "$lib/libgnsilu.so.0") == "libgnsilu.so.$version" ]] || fail "$libdir/libgnsilu.so.0 -> libgnsilu.so.$version"
[[ $(readlink "$lib/libgnsilu.so") == "libgnsilu.so.0" ]] || fail "$libdir/libgnsilu.so -> libgnsilu.so.0 (namelink)"
soname=$(readelf -d "$lib/libgnsilu.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == libgnsilu.so.0 ]] || fail "soname of libgnsilu.so.$version is libgnsilu.so.0 (readelf: '$soname')"
runpath=$(readelf -d "$lib/libgnsilu.so.$version" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
pass "libgnsilu.so -> libgnsilu.so.0 -> libgnsilu.so.$version, soname $soname, RUNPATH '${runpath:-none}'"
if env -u LD_LIBRARY_PATH ldd "$lib/libgnsilu.so.$version" | grep -q 'not found'; then
  env -u LD_LIBRARY_PATH ldd "$lib/libgnsilu.so.$version"
  fail "the installed libgnsilu.so finds its libraries without LD_LIBRARY_PATH"
fi
pass "the installed libgnsilu.so finds libnvrtc without LD_LIBRARY_PATH ($(env -u LD_LIBRARY_PATH ldd \
  "$lib/libgnsilu.so.$version" | sed -n 's/^\s*libnvrtc[^ ]* => \([^ ]*\).*/\1/p'))"

pkg=$lib/cmake/gnsilu
for file in gnsilu-config.cmake gnsilu-config-version.cmake gnsilu-targets.cmake; do
  [[ -f $pkg/$file ]] || fail "$libdir/cmake/gnsilu/$file installed"
done
if grep -n -E 'CUDA::|nvrtc|SQLite|sqlite|Threads|find_dependency\(' "$pkg"/gnsilu-targets*.cmake "$pkg/gnsilu-config.cmake" \
    | grep -v -E '^[^:]*:[0-9]+:[[:space:]]*#'; then
  fail "the package names no CUDA, NVRTC, SQLite or thread dependency"
fi
grep -q 'INTERFACE_INCLUDE_DIRECTORIES "\${_IMPORT_PREFIX}/'"$includedir"'"' "$pkg/gnsilu-targets.cmake" \
  || fail "gnsilu::gnsilu's INTERFACE_INCLUDE_DIRECTORIES is \${_IMPORT_PREFIX}/$includedir"
pass "$libdir/cmake/gnsilu: $(cd "$pkg" && echo *) (gnsilu::gnsilu: the include folder only)"

if [[ $tools == ON ]]; then
  for tool in gnsilu-tune gnsilu-bench; do
    [[ -x $prefix/bin/$tool ]] || fail "bin/$tool installed"
  done
  env -u LD_LIBRARY_PATH "$prefix/bin/gnsilu-tune" --help >"$tmp/tune-help.log" 2>&1 \
    || { cat "$tmp/tune-help.log"; fail "bin/gnsilu-tune --help runs without LD_LIBRARY_PATH"; }
  pass "bin: gnsilu-tune gnsilu-bench (gnsilu-tune --help runs without LD_LIBRARY_PATH)"
else
  pass "bin: no tools (GNSILU_BUILD_TOOLS is OFF in this build)"
fi

# ---- 2. a consumer project: find_package(gnsilu CONFIG) ---------------------------------------------------------
consumer=$tmp/consumer
compilers=()
cxx=$(cache_value CMAKE_CXX_COMPILER)
cc=$(cache_value CMAKE_C_COMPILER)
[[ -n $cxx ]] && compilers+=("-DCMAKE_CXX_COMPILER=$cxx")
[[ -n $cc ]] && compilers+=("-DCMAKE_C_COMPILER=$cc")
echo "test_install: configuring tests/consumer against $prefix"
cmake -S "$source_dir/tests/consumer" -B "$consumer" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "${compilers[@]}" >"$tmp/consumer-configure.log" 2>&1 \
  || { cat "$tmp/consumer-configure.log"; fail "tests/consumer configures (find_package(gnsilu 0.1 CONFIG REQUIRED))"; }
found=$(sed -n 's/^gnsilu_DIR:PATH=//p' "$consumer/CMakeCache.txt")
[[ $found == "$pkg" ]] || fail "find_package found the package just installed ($pkg), not '$found'"
pass "tests/consumer configures: find_package(gnsilu 0.1 CONFIG) found $found"
cmake --build "$consumer" -j "$(nproc)" >"$tmp/consumer-build.log" 2>&1 \
  || { cat "$tmp/consumer-build.log"; fail "tests/consumer builds (C and C++, -Werror)"; }
consumer_runpath=$(readelf -d "$consumer/gnsilu-consumer" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
pass "tests/consumer builds (C and C++, -Wall -Wextra -Wpedantic -Werror); RUNPATH '${consumer_runpath:-none}'"
echo "test_install: running the consumer (no LD_LIBRARY_PATH)"
set +e
env -u LD_LIBRARY_PATH "$consumer/gnsilu-consumer" | tee "$tmp/consumer-run.log"
rc=${PIPESTATUS[0]}
set -e
if [[ $rc -ne 0 ]]; then
  if [[ $rc -eq 134 ]] && ! readelf -d "$lib/libgnsilu.so.$version" | grep -q 'NEEDED.*libgcc_s'; then
    echo "test_install: the consumer aborted (SIGABRT) and libgnsilu.so has no libgcc_s.so.1: it was linked with" \
         "-static-libgcc (GNSILU_STATIC_RUNTIME), so a gnsilu::Error it throws cannot unwind into the application" >&2
  fi
  fail "the consumer runs and passes (exit status $rc)"
fi
pass "the consumer: $(tail -n 1 "$tmp/consumer-run.log")"
# The README's C++, C and CMake blocks, as one project, against the same prefix (tools/check_docs.py snippets).
python3 "$source_dir/tools/check_docs.py" snippets "$prefix" "$tmp/readme" >"$tmp/readme.log" 2>&1 \
  || { cat "$tmp/readme.log"; fail "README.md's C++, C and CMake blocks build against the installed package"; }
pass "README.md's C++, C and CMake blocks build against the installed package"
# The gnsilu-tune commands of the README and docs/API.md, parsed by the installed gnsilu-tune (nothing runs).
python3 "$source_dir/tools/check_docs.py" tune "$prefix/bin/gnsilu-tune" >"$tmp/readme-tune.log" 2>&1 \
  || { cat "$tmp/readme-tune.log"; fail "README.md's and docs/API.md's gnsilu-tune commands parse"; }
pass "README.md's and docs/API.md's gnsilu-tune commands parse ($(head -n 1 "$tmp/readme-tune.log" | grep -o '[0-9]* gnsilu-tune commands'))"

# ---- 3. cpack -----------------------------------------------------------------------------------------------------
packages=$tmp/packages
echo "test_install: cpack in $build into $packages"
(cd "$build" && cpack -B "$packages") >"$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log"; fail "cpack"; }
shopt -s nullglob
tgz=("$packages"/*.tar.gz)
debs=("$packages"/*.deb)
shopt -u nullglob
[[ ${#tgz[@]} -eq 1 ]] || fail "cpack made one .tar.gz (found ${#tgz[@]})"
echo "---- $(basename "${tgz[0]}")"
tar -tzf "${tgz[0]}" | tee "$tmp/tgz.list"
grep -q "/$libdir/libgnsilu.so.0\$" "$tmp/tgz.list" || fail "the .tar.gz holds $libdir/libgnsilu.so.0"
grep -q "/$libdir/cmake/gnsilu/gnsilu-config.cmake\$" "$tmp/tgz.list" || fail "the .tar.gz holds the CMake package"
made="$(basename "${tgz[0]}") ($(wc -l <"$tmp/tgz.list") entries)"
if command -v dpkg-deb >/dev/null; then
  [[ ${#debs[@]} -eq 1 ]] || fail "cpack made one .deb where dpkg-deb exists (found ${#debs[@]})"
  echo "---- $(basename "${debs[0]}")"
  dpkg-deb -c "${debs[0]}" | tee "$tmp/deb.list"
  dpkg-deb -f "${debs[0]}" Package Version Depends Maintainer
  grep -q "/libgnsilu.so.0 ->" "$tmp/deb.list" || fail "the .deb holds libgnsilu.so.0"
  [[ $(dpkg-deb -f "${debs[0]}" Depends) == *libsqlite3-0* ]] || fail "the .deb depends on libsqlite3-0"
  made+=", $(basename "${debs[0]}") ($(wc -l <"$tmp/deb.list") entries, Depends: $(dpkg-deb -f "${debs[0]}" Depends))"
fi
pass "cpack: $made"

print_summary
echo "test_install: PASSED"
