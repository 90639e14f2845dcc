"""Finding, loading and calling libgnsilu.so through ctypes.

The library is loaded on first use, not on import, so that `import gnsilu` works on any machine. Where it looks,
in this order (the first that loads wins):

1. the file named by the environment variable GNSILU_LIBRARY; when it is set, nothing else is tried;
2. the library inside the package, libgnsilu.so next to this file: where `pip install ./python` puts it (the
   wheel's build compiles it with CMake, cmake/GnsiluPython.cmake), or a copy of build/libgnsilu.so put there;
3. the repository's build folder, ../../build/libgnsilu.so from this file (a checkout on PYTHONPATH, or an
   editable install);
4. the system loader: "libgnsilu.so" on LD_LIBRARY_PATH or in the ldconfig cache.
"""
import ctypes
import os
import threading

from ._errors import LibraryNotFoundError, error_for_status

ENV_VARIABLE = "GNSILU_LIBRARY"
LIBRARY_NAME = "libgnsilu.so"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

_c_int64_p = ctypes.POINTER(ctypes.c_int64)


class Problem(ctypes.Structure):
    """struct gnsilu_problem of include/gnsilu/gnsilu.h, field for field (the enums are C ints): what
    gnsilu_group_norm takes. struct_size must be ctypes.sizeof(Problem), the size of this version of the struct
    (the library reads that many bytes and gives later fields their defaults). Keep it in step with the header:
    python/tests/test_cpu.py compares sizeof and every offset with a C compiler's."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("x", ctypes.c_void_p),
        ("x_dtype", ctypes.c_int),
        ("x_layout", ctypes.c_int),
        ("y", ctypes.c_void_p),
        ("y_dtype", ctypes.c_int),
        ("y_layout", ctypes.c_int),
        ("shape", _c_int64_p),
        ("ndim", ctypes.c_int),
        ("num_groups", ctypes.c_int64),
        ("weight", ctypes.c_void_p),
        ("weight_dtype", ctypes.c_int),
        ("bias", ctypes.c_void_p),
        ("bias_dtype", ctypes.c_int),
        ("eps", ctypes.c_double),
        ("activation", ctypes.c_int),
        ("pad", _c_int64_p),  # since 0.2: a padded output
        ("pad_count", ctypes.c_int),
        ("pad_mode", ctypes.c_int),
        ("pad_value", ctypes.c_double),
        ("input_bias", ctypes.c_void_p),  # since 0.3: C values of x_dtype added to x before the statistics, or NULL
    ]


# Every function of include/gnsilu/gnsilu.h: (restype, argtypes).
_SIGNATURES = {
    "gnsilu_group_norm": (ctypes.c_int, [ctypes.POINTER(Problem), ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.c_void_p]),
    "gnsilu_problem_workspace_size": (ctypes.c_int, [ctypes.POINTER(Problem), ctypes.POINTER(ctypes.c_size_t)]),
    "gnsilu_group_stats": (ctypes.c_int, [ctypes.POINTER(Problem), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_void_p]),
    "gnsilu_group_norm_apply": (ctypes.c_int, [ctypes.POINTER(Problem), ctypes.c_void_p, ctypes.c_void_p,
                                               ctypes.c_size_t, ctypes.c_void_p]),
    "gnsilu_reference_group_norm": (ctypes.c_int, [ctypes.POINTER(Problem), ctypes.c_uint]),
    "gnsilu_reference_group_stats": (ctypes.c_int, [ctypes.POINTER(Problem), ctypes.c_void_p, ctypes.c_uint]),
    "gnsilu_reference_group_norm_apply": (ctypes.c_int, [ctypes.POINTER(Problem), ctypes.c_void_p, ctypes.c_uint]),
    "gnsilu_group_norm_silu": (ctypes.c_int, [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, _c_int64_p, ctypes.c_int, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_void_p,
        ctypes.c_size_t, ctypes.c_void_p]),
    "gnsilu_workspace_size": (ctypes.c_int, [_c_int64_p, ctypes.c_int, ctypes.c_int64,
                                             ctypes.POINTER(ctypes.c_size_t)]),
    "gnsilu_check_device": (ctypes.c_int, []),
    "gnsilu_release_workspaces": (ctypes.c_int, []),
    "gnsilu_set_tune_policy": (ctypes.c_int, [ctypes.c_int]),
    "gnsilu_set_cache_paths": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p]),
    "gnsilu_last_error": (ctypes.c_char_p, []),
    "gnsilu_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "gnsilu_version": (ctypes.c_char_p, []),
}

_lock = threading.Lock()
_loaded = None  # (ctypes.CDLL, path) once loaded


def default_locations():
    """(path, where) pairs searched when GNSILU_LIBRARY is not set, in order."""
    return [
        (os.path.join(_PACKAGE_DIR, LIBRARY_NAME), "next to the package"),
        (os.path.normpath(os.path.join(_PACKAGE_DIR, os.pardir, os.pardir, "build", LIBRARY_NAME)),
         "the repository's build folder"),
        (LIBRARY_NAME, "the system loader: LD_LIBRARY_PATH and the ldconfig cache"),
    ]


def _open(path):
    """Loads one candidate and declares its functions; raises OSError saying why it is not usable."""
    if os.sep in path and not os.path.exists(path):
        raise OSError("no such file")
    cdll = ctypes.CDLL(path)
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            function = getattr(cdll, name)
        except AttributeError:
            raise OSError(f"not a gnsilu library of this version (no symbol {name})") from None
        function.restype = restype
        function.argtypes = argtypes
    return cdll


def _load():
    fix = (f"Install the package with its library (pip install ./python in the gnsilu repository builds it; it "
           f"needs the CUDA toolkit and the packages of tools/setup.sh), or build it (bash tools/build.sh) and set "
           f"{ENV_VARIABLE} to the full path of {LIBRARY_NAME}, e.g. export {ENV_VARIABLE}=/path/to/gnsilu/build/"
           f"{LIBRARY_NAME}, or put it inside the package ({os.path.join(_PACKAGE_DIR, LIBRARY_NAME)}). It needs "
           "libnvrtc and libsqlite3 on the loader path.")
    explicit = os.environ.get(ENV_VARIABLE)
    if explicit:
        try:
            return _open(explicit), explicit
        except OSError as e:
            searched = "\n".join(f"  {path} ({where})" for path, where in default_locations())
            raise LibraryNotFoundError(
                f"gnsilu: cannot load {LIBRARY_NAME}: {ENV_VARIABLE}={explicit}: {e}\n"
                f"{ENV_VARIABLE} is set, so no other location was tried; unset it to search:\n{searched}\n"
                f"{fix}") from None
    failures = []
    for path, where in default_locations():
        try:
            return _open(path), path
        except OSError as e:
            failures.append(f"  {path} ({where}): {e}")
    raise LibraryNotFoundError(f"gnsilu: cannot load {LIBRARY_NAME}; {ENV_VARIABLE} is not set and it is not in:\n"
                               + "\n".join(failures) + f"\n{fix}")


def library():
    """(ctypes.CDLL, path) of libgnsilu.so, loaded on the first call; raises LibraryNotFoundError."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded = _load()
    return _loaded


def call(name, *args):
    """Calls a gnsilu_status function of the C API; raises the matching gnsilu.Error when it fails."""
    status = getattr(library()[0], name)(*args)
    if status != 0:
        raise_for_status(status)


def raise_for_status(status):
    """Raises the gnsilu.Error of a failed call's status, with this thread's gnsilu_last_error() (the message is
    thread-local in the library and this thread made the call, so it is that call's)."""
    raise error_for_status(status, library()[0].gnsilu_last_error().decode(errors="replace"))


def int64_array(values):
    """A ctypes int64_t[] holding values."""
    return (ctypes.c_int64 * len(values))(*values)


def problem(**fields):
    """A Problem with struct_size set and the given fields; the others are zero (channels-first layouts, SiLU,
    no weight or bias, and null pointers). Pointer fields keep the ctypes objects they are given alive."""
    return Problem(struct_size=ctypes.sizeof(Problem), **fields)
