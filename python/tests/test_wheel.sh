#!/usr/bin/env bash
# The one-command install: `pip wheel ./python` builds libgnsilu.so with CMake (scikit-build-core) and ships it
# inside the package; the wheel, installed into a new venv, loads that library by itself.
#
#   bash python/tests/test_wheel.sh          (or: ctest -R test_python_wheel; several minutes on 2 cores)
#
# - builds the wheel with `python3 -m pip wheel ./python --no-deps` into a temporary folder; pip gets
#   scikit-build-core (and CMake, if the system's is too old) from the package index: without network or with
#   PIP_NO_INDEX, when that fails, the test is skipped (exit 77, with the reason);
# - checks the wheel's files: the package's modules, gnsilu/libgnsilu.so and the metadata, nothing else, and the
#   library's RUNPATH (readelf, where installed): no empty entry (the loader would read it as the current folder);
# - installs it into a new venv (--no-deps) and, from a folder outside the checkout, with GNSILU_LIBRARY and
#   PYTHONPATH unset, checks that `import gnsilu` comes from the venv's site-packages, that the library loaded is
#   the venv's gnsilu/libgnsilu.so, its version, and that without a GPU a call raises the no-driver or no-device
#   error the C library reports (as python/tests/test_cpu.py expects); with a usable GPU, that check_device passes;
# - checks that the build wrote nothing into the checkout: python/ as it was (no build/, dist/, *.egg-info, no
#   library copied into python/gnsilu/), no CMake files at the root.
# GNSILU_WHEEL_DIR=folder also copies the wheel there. The temporary folder is removed at the end
# (GNSILU_KEEP_TMP=1 keeps it). PYTHON names the interpreter (default python3).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$repo/tools/steps.sh"
use_ccache  # the wheel's CMake build compiles through ccache too (where installed)
python="${PYTHON:-python3}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/gnsilu-wheel.XXXXXX")"
cleanup() {
  if [ "${GNSILU_KEEP_TMP:-0}" = 1 ]; then echo "test_wheel: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() { echo "test_wheel: FAILED: $*" >&2; exit 1; }
skip() { echo "test_wheel: SKIPPED: $*"; exit 77; }

# What is in the checkout before the build (caches aside), to compare afterwards.
listing() { (cd "$repo/python" && find . -name __pycache__ -prune -o -print | LC_ALL=C sort); }
listing > "$tmp/before.txt"
for leftover in CMakeCache.txt CMakeFiles; do
  if [ -e "$repo/$leftover" ]; then touch "$tmp/root-$leftover"; fi
done

echo "test_wheel: building the wheel (pip wheel $repo/python --no-deps; CMake builds libgnsilu.so: minutes)"
start=$SECONDS
if ! "$python" -m pip wheel "$repo/python" -w "$tmp/dist" --no-deps > "$tmp/pip-wheel.log" 2>&1; then
  if grep -Eq "install build dependencies|No matching distribution found|Could not find a version that satisfies|Failed to establish a new connection|Temporary failure in name resolution|Network is unreachable|NewConnectionError" \
       "$tmp/pip-wheel.log"; then
    tail -n 15 "$tmp/pip-wheel.log"
    skip "pip could not get the build requirements (scikit-build-core) from the package index: no network, or" \
         "PIP_NO_INDEX=${PIP_NO_INDEX:-} (allow network, or put scikit-build-core on PIP_FIND_LINKS)"
  fi
  tail -n 60 "$tmp/pip-wheel.log" >&2
  fail "pip wheel failed (log above)"
fi
echo "test_wheel: built in $((SECONDS - start)) s"

wheels=("$tmp"/dist/gnsilu-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  fail "expected one gnsilu wheel in $tmp/dist: $(ls "$tmp/dist")"
fi
wheel="${wheels[0]}"
echo "test_wheel: $(basename "$wheel") ($(stat -c %s "$wheel") bytes)"
if [ -n "${GNSILU_WHEEL_DIR:-}" ]; then
  mkdir -p "$GNSILU_WHEEL_DIR" && cp "$wheel" "$GNSILU_WHEEL_DIR/" || fail "cannot copy the wheel to $GNSILU_WHEEL_DIR"
  echo "test_wheel: copied to $GNSILU_WHEEL_DIR/$(basename "$wheel")"
fi

# The wheel's files: gnsilu/*.py, gnsilu/libgnsilu.so, gnsilu/VERSION (the repository's, which __init__ reads) and
# gnsilu-VERSION.dist-info/, nothing else.
cat > "$tmp/contents.py" <<'PY'
import os, sys, zipfile
wheel, package = sys.argv[1], sys.argv[2]
names = zipfile.ZipFile(wheel).namelist()
modules = sorted(f"gnsilu/{n}" for n in os.listdir(package) if n.endswith(".py"))
files = sorted(n for n in names if not (n.startswith("gnsilu-") and ".dist-info/" in n))
expected = sorted(modules + ["gnsilu/libgnsilu.so", "gnsilu/VERSION"])
if files != expected:
    sys.exit(f"test_wheel: the wheel holds {files}, expected {expected}")
print(f"test_wheel: the wheel holds {len(modules)} modules, gnsilu/libgnsilu.so, gnsilu/VERSION and "
      f"{len(names) - len(files)} metadata files")
PY
"$python" "$tmp/contents.py" "$wheel" "$repo/python/gnsilu" || fail "the wheel's contents"

# Installed into a new venv.
if ! "$python" -m venv "$tmp/venv" > "$tmp/venv.log" 2>&1; then
  cat "$tmp/venv.log"
  skip "$python -m venv does not work here (Debian: apt-get install python3-venv)"
fi
"$tmp/venv/bin/python" -m pip install --no-deps --no-index "$wheel" > "$tmp/pip-install.log" 2>&1 ||
  { cat "$tmp/pip-install.log" >&2; fail "pip install of the wheel into the venv"; }
site="$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
bundled="$site/gnsilu/libgnsilu.so"
[ -f "$bundled" ] || fail "no $bundled after installing the wheel"

if command -v readelf > /dev/null; then
  dynamic="$(readelf -d "$bundled")"
  echo "$dynamic" | grep -E "NEEDED|RUNPATH|RPATH|SONAME" | sed 's/^ */test_wheel:   /'
  runpath="$(echo "$dynamic" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')"
  [ -n "$runpath" ] || fail "the bundled library has no RUNPATH (it would not find libnvrtc without LD_LIBRARY_PATH)"
  case ":$runpath:" in
    *::*) fail "the bundled library's RUNPATH '$runpath' has an empty entry (the loader reads it as the current folder)";;
  esac
else
  echo "test_wheel: no readelf here: the RUNPATH check is left out"
fi

# From a folder outside the checkout, with GNSILU_LIBRARY and PYTHONPATH unset.
cat > "$tmp/check.py" <<'PY'
import os, sys
site, repo = (os.path.realpath(p) for p in sys.argv[1:3])
import gnsilu


def inside(path, folder):
    return os.path.commonpath([os.path.realpath(path), folder]) == folder


print("test_wheel: gnsilu imported from", gnsilu.__file__)
if not inside(gnsilu.__file__, site) or inside(gnsilu.__file__, repo):
    sys.exit(f"test_wheel: gnsilu was imported from {gnsilu.__file__}, not from the venv's {site}")
path = gnsilu.library_path()
print("test_wheel: gnsilu.library_path():", path)
if os.path.realpath(path) != os.path.join(site, "gnsilu", "libgnsilu.so"):
    sys.exit(f"test_wheel: loaded {path}, not the bundled {site}/gnsilu/libgnsilu.so")
print("test_wheel: gnsilu.version():", gnsilu.version(), "gnsilu.__version__:", gnsilu.__version__)
if gnsilu.version() != gnsilu.__version__:
    sys.exit("test_wheel: the library's version is not the package's")
import importlib.metadata
if importlib.metadata.version("gnsilu") != gnsilu.__version__:
    sys.exit(f"test_wheel: the wheel's metadata says {importlib.metadata.version('gnsilu')}, the package "
             f"{gnsilu.__version__}")


class FakeDeviceArray:
    """__cuda_array_interface__ (version 3) of a float16 array; the pointer is never dereferenced without a GPU."""

    def __init__(self, shape, pointer):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": "<f2", "data": (pointer, False),
                                         "strides": None, "version": 3, "stream": None, "mask": None}


try:
    gnsilu.check_device()
except (gnsilu.NoDriverError, gnsilu.NoDeviceError) as e:
    print(f"test_wheel: gnsilu.check_device(): {type(e).__name__} (status {e.status}): {e}")
    try:
        gnsilu.group_norm_silu(FakeDeviceArray((2, 64, 8, 8), 0x7F0000000000), 32,
                               out=FakeDeviceArray((2, 64, 8, 8), 0x7F0000100000))
    except type(e) as call_error:
        if str(call_error) != str(e):
            sys.exit(f"test_wheel: group_norm_silu raised '{call_error}', check_device '{e}'")
        print(f"test_wheel: gnsilu.group_norm_silu without a GPU: {type(call_error).__name__}, the same message")
    else:
        sys.exit("test_wheel: group_norm_silu without a GPU raised nothing")
else:
    print("test_wheel: a usable CUDA device is present: check_device() passed (the no-GPU error is not checked)")
PY
mkdir -p "$tmp/elsewhere"
(cd "$tmp/elsewhere" && env -u GNSILU_LIBRARY -u PYTHONPATH "$tmp/venv/bin/python" "$tmp/check.py" "$site" "$repo") ||
  fail "the installed wheel (see above)"

# Nothing written into the checkout.
listing > "$tmp/after.txt"
if ! diff "$tmp/before.txt" "$tmp/after.txt" > "$tmp/diff.txt"; then
  cat "$tmp/diff.txt" >&2
  fail "building the wheel changed the files under $repo/python"
fi
for leftover in CMakeCache.txt CMakeFiles; do
  if [ -e "$repo/$leftover" ] && [ ! -e "$tmp/root-$leftover" ]; then fail "the build left $repo/$leftover"; fi
done
echo "test_wheel: PASSED"
