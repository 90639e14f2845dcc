#!/usr/bin/env python3
"""CPU tests of the Python package: no GPU, no pip install (unittest only); PyTorch optional.

    GNSILU_LIBRARY=build/libgnsilu.so python3 -m unittest python/tests/test_cpu.py   (or: ctest -R test_python_cpu)

- import works without the library; a missing or unloadable library is a LibraryNotFoundError that lists where
  it looked; the search order (GNSILU_LIBRARY, next to the package, the build folder, the system loader);
- every argument check names the argument, before the library is even loaded;
- the binding: the ctypes gnsilu_problem against the header (offsets on LP64, and gcc's sizeof/offsetof where
  gcc is installed), the codes against the header's enums, and the problem group_norm fills in (a stand-in for
  the C call records it);
- layout_of, the classification of (shape, strides) as channels-first, channels-last or neither;
- with the real library (GNSILU_LIBRARY, else the default search; those tests skip when there is none): the
  version, C errors mapped to exceptions with the library's message (no driver here: NoDriverError), every field
  of the problem read where the library reads it (each set wrong in turn is the one its message names);
- the proof behind swap_group_norm_silu on plain Python classes (no torch needed), and the one behind its bias move
  (a convolution whose output goes to one GroupNorm only, while some of forward's parameters are None).
What needs PyTorch is in test_torch_cpu.py, which ctest reports as Skipped where PyTorch is missing.
"""
import ctypes
import ctypes.util
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
sys.path[:0] = [PYTHON_DIR, HERE]

import gnsilu  # noqa: E402  (after the path set-up)
from gnsilu import _api, _checks, _errors, _fusion, _lib  # noqa: E402

try:
    import torch  # optional: a few argument checks differ with it
except ImportError:
    torch = None


def real_library():
    """The path of a loadable libgnsilu.so, or None (GNSILU_LIBRARY set but unloadable is a failure)."""
    try:
        return gnsilu.library_path()
    except gnsilu.LibraryNotFoundError:
        if os.environ.get(_lib.ENV_VARIABLE):
            raise
        return None


def library_takes_input_bias():
    """Whether the loaded library reads gnsilu_problem.input_bias (0.3 on): one that predates the field refuses a
    problem that sets it (its struct_size covers bytes it does not know). A call of the CPU reference on 2 values."""
    x, input_bias, stats = (ctypes.c_float * 2)(1.0, 2.0), (ctypes.c_float * 1)(0.5), (ctypes.c_int64 * 32)()
    problem = _lib.problem(x=ctypes.addressof(x), x_dtype=_api.FP32, shape=_lib.int64_array((1, 1, 2)), ndim=3,
                           num_groups=1, eps=1e-6, input_bias=ctypes.addressof(input_bias))
    try:
        _lib.call("gnsilu_reference_group_stats", ctypes.byref(problem), ctypes.addressof(stats), 1)
    except gnsilu.InvalidArgumentError:
        return False
    return True


def run_python(code, **environment):
    """Runs code in a fresh interpreter with the package on the path; environment values of None unset."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    for name, value in environment.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


class FakeDeviceArray:
    """An object with __cuda_array_interface__ (version 3); the pointer is never dereferenced by these tests."""

    def __init__(self, shape, typestr="<f2", pointer=0x7F0000000000, strides=None, stream=None, readonly=False,
                 mask=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (pointer, readonly),
                                         "strides": strides, "version": 3, "stream": stream, "mask": mask}


class FakeDLPack:
    def __dlpack__(self, stream=None):
        raise AssertionError("never read in these tests")


def dense_strides(shape, order, item_size=1):
    """Strides of a dense array of `shape` whose dimensions lie in memory in `order` (outermost first)."""
    strides = [0] * len(shape)
    step = item_size
    for dimension in reversed(order):
        strides[dimension] = step
        step *= shape[dimension]
    return tuple(strides)


def channels_last_strides(shape, item_size=1):
    return dense_strides(shape, (0, *range(2, len(shape)), 1), item_size)


HEADER = os.path.join(REPO, "include", "gnsilu", "gnsilu.h")
PROBLEM_FIELDS = ["struct_size", "x", "x_dtype", "x_layout", "y", "y_dtype", "y_layout", "shape", "ndim", "num_groups",
                  "weight", "weight_dtype", "bias", "bias_dtype", "eps", "activation", "pad", "pad_count", "pad_mode",
                  "pad_value", "input_bias"]


class RecordedCall:
    """Stands for _lib.call: records the name, the gnsilu_problem's fields (read during the call, while the
    arrays it points to live) and the other arguments, then succeeds."""

    def __init__(self):
        self.calls = []

    def __call__(self, name, *args):
        problem = args[0]._obj  # ctypes.byref(problem)
        fields = {field: getattr(problem, field) for field in PROBLEM_FIELDS}
        fields["shape"] = [problem.shape[i] for i in range(problem.ndim)]
        self.calls.append((name, fields, args[1:]))

    @property
    def problem(self):
        self.assert_one()
        return self.calls[0][1]

    def assert_one(self):
        if len(self.calls) != 1:
            raise AssertionError(f"expected one C call, got {len(self.calls)}")


# ---- the library: loading and searching -----------------------------------------------------------------------
class TestLoading(unittest.TestCase):
    def test_import_needs_no_library(self):
        result = run_python("import gnsilu, gnsilu._fusion; from gnsilu import _lib\n"
                            "assert _lib._loaded is None\nprint(gnsilu.__version__)",
                            GNSILU_LIBRARY="/nowhere/libgnsilu.so")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), gnsilu.__version__)

    def test_missing_library_names_the_variable_and_the_places(self):
        result = run_python("import gnsilu\n"
                            "try:\n    gnsilu.version()\n"
                            "except gnsilu.LibraryNotFoundError as e:\n"
                            "    assert isinstance(e, OSError) and isinstance(e, gnsilu.Error)\n    print(e)\n",
                            GNSILU_LIBRARY="/nowhere/libgnsilu.so")
        self.assertEqual(result.returncode, 0, result.stderr)
        message = result.stdout
        self.assertIn("GNSILU_LIBRARY=/nowhere/libgnsilu.so: no such file", message)
        self.assertIn("no other location was tried", message)
        for path, _ in _lib.default_locations():
            self.assertIn(path, message)
        self.assertIn("export GNSILU_LIBRARY=", message)

    def test_a_file_that_is_not_a_library(self):
        with tempfile.TemporaryDirectory() as folder:
            bogus = os.path.join(folder, "libgnsilu.so")
            with open(bogus, "w") as f:
                f.write("not an ELF file\n")
            result = run_python("import gnsilu\ngnsilu.check_device()", GNSILU_LIBRARY=bogus)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("LibraryNotFoundError", result.stderr)
        self.assertIn(bogus, result.stderr)

    def test_search_order(self):
        """A copy of the package in a scratch checkout: package folder, then build/, then the system loader."""
        library = real_library()
        with tempfile.TemporaryDirectory() as root:
            package = os.path.join(root, "python", "gnsilu")
            shutil.copytree(os.path.join(PYTHON_DIR, "gnsilu"), package,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            build = os.path.join(root, "build")
            loader = os.path.join(root, "loader")
            os.makedirs(build)
            os.makedirs(loader)

            def which(**environment):
                environment = dict({"GNSILU_LIBRARY": None, "LD_LIBRARY_PATH": loader}, **environment)
                env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
                for name, value in environment.items():
                    if value is None:
                        env.pop(name, None)
                    else:
                        env[name] = value
                code = ("import gnsilu\ntry:\n    print(gnsilu.library_path())\n"
                        "except gnsilu.LibraryNotFoundError as e:\n    print('NOT FOUND', e)")
                result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                        timeout=120)
                self.assertEqual(result.returncode, 0, result.stderr)
                return result.stdout.strip()

            if ctypes.util.find_library("gnsilu") is None:
                message = which()
                self.assertTrue(message.startswith("NOT FOUND"), message)
                self.assertIn("GNSILU_LIBRARY is not set", message)
                self.assertIn(os.path.join(package, "libgnsilu.so") + " (next to the package): no such file",
                              message)
                self.assertIn(os.path.join(build, "libgnsilu.so") + " (the repository's build folder)", message)
                self.assertIn("libgnsilu.so (the system loader", message)
            if library is None:
                self.skipTest("no libgnsilu.so to load")
            os.symlink(library, os.path.join(loader, "libgnsilu.so"))
            self.assertEqual(which(), "libgnsilu.so")
            os.symlink(library, os.path.join(build, "libgnsilu.so"))
            self.assertEqual(which(), os.path.join(build, "libgnsilu.so"))
            os.symlink(library, os.path.join(package, "libgnsilu.so"))
            self.assertEqual(which(), os.path.join(package, "libgnsilu.so"))
            self.assertEqual(which(GNSILU_LIBRARY=library), library)


# ---- exceptions -------------------------------------------------------------------------------------------------
class TestErrors(unittest.TestCase):
    def test_status_codes(self):
        expected = {1: gnsilu.InvalidArgumentError, 2: gnsilu.NoDriverError, 3: gnsilu.NoDeviceError,
                    4: gnsilu.UnsupportedDeviceError, 5: gnsilu.CudaError, 6: gnsilu.CompileError,
                    7: gnsilu.OutOfMemoryError, 8: gnsilu.InternalError}
        for status, cls in expected.items():
            error = _errors.error_for_status(status, f"message {status}")
            self.assertIs(type(error), cls)
            self.assertIsInstance(error, gnsilu.Error)
            self.assertEqual(error.status, status)
            self.assertEqual(str(error), f"message {status}")
        unknown = _errors.error_for_status(99, "odd")
        self.assertIs(type(unknown), gnsilu.Error)
        self.assertEqual(unknown.status, 99)
        self.assertIn("odd", str(unknown))

    def test_standard_bases(self):
        self.assertTrue(issubclass(gnsilu.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(gnsilu.OutOfMemoryError, MemoryError))
        self.assertTrue(issubclass(gnsilu.LibraryNotFoundError, OSError))


# ---- argument checks (in Python, before the library is needed) -------------------------------------------------
class TestArguments(unittest.TestCase):
    x = FakeDeviceArray((2, 64, 8, 8))
    out = FakeDeviceArray((2, 64, 8, 8), pointer=0x7F0000100000)

    def assertNames(self, argument, function, *args, **kwargs):
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            function(*args, **kwargs)
        self.assertIn(f"invalid argument '{argument}'", str(caught.exception))
        return str(caught.exception)

    def test_x(self):
        run = gnsilu.group_norm_silu
        self.assertIn("got int", self.assertNames("x", run, 3, 32))
        self.assertIn("'<f8'", self.assertNames("x", run, FakeDeviceArray((2, 64, 8, 8), "<f8"), 32))
        self.assertIn("at least 2 dimensions", self.assertNames("x", run, FakeDeviceArray((64,)), 32))
        self.assertIn("channel", self.assertNames("x", run, FakeDeviceArray((2, 0, 8)), 1, out=self.out))
        self.assertIn("C-contiguous", self.assertNames(
            "x", run, FakeDeviceArray((2, 64, 8, 8), strides=(2, 4096, 128, 16)), 32, out=self.out))
        self.assertIn("masked", self.assertNames("x", run, FakeDeviceArray((2, 64), mask=object()), 32))
        self.assertNames("x", run, FakeDeviceArray((2, 64), typestr=None), 32)
        if torch is None and _api._optional_module("cupy") is None:
            self.assertIn("neither PyTorch nor CuPy", self.assertNames("x", run, FakeDLPack(), 32))

    def test_activation(self):
        for bad in ("relu", "SiLU", "", "identity", 0, 1, True, ["silu"]):
            with self.subTest(activation=bad):
                message = self.assertNames("activation", gnsilu.group_norm, self.x, 32, activation=bad, out=self.out)
                self.assertIn("silu", message)
        # Checked first, whatever x is.
        self.assertNames("activation", gnsilu.group_norm, 3, 32, activation="gelu")
        self.assertEqual(_api._activation_code("silu"), _api.ACTIVATION_SILU)
        self.assertEqual(_api._activation_code("none"), _api.ACTIVATION_NONE)
        self.assertEqual(_api._activation_code(None), _api.ACTIVATION_NONE)

    def test_group_norm_checks_like_group_norm_silu(self):
        for function in (gnsilu.group_norm, gnsilu.group_norm_silu):
            self.assertNames("num_groups", function, self.x, 3, out=self.out)
            self.assertNames("eps", function, self.x, 32, eps=0, out=self.out)
            self.assertNames("x", function, 3, 32)
        self.assertNames("eps", gnsilu.group_norm, self.x, 32, eps=-1.0, activation=None, out=self.out)

    def test_interface_layouts(self):
        run = gnsilu.group_norm
        shape = (2, 64, 8, 8)
        nhwc = FakeDeviceArray(shape, strides=channels_last_strides(shape, 2))
        nhwc_out = FakeDeviceArray(shape, pointer=0x7F0000100000, strides=channels_last_strides(shape, 2))
        self.assertIn("channels-last but x is channels-first", self.assertNames("out", run, self.x, 32, out=nhwc_out))
        self.assertIn("channels-first (contiguous) but x is channels-last",
                      self.assertNames("out", run, nhwc, 32, out=self.out))
        other = FakeDeviceArray(shape, pointer=0x7F0000100000, strides=dense_strides(shape, (1, 0, 2, 3), 2))
        self.assertIn("channels-last", self.assertNames("out", run, nhwc, 32, out=other))
        self.assertIn("channels-last", self.assertNames("x", run, other, 32, out=nhwc_out))
        self.assertIn("C-contiguous", self.assertNames("weight", run, self.x, 32,
                                                       FakeDeviceArray((64,), strides=(4,)), out=self.out))
        self.assertNames("x", run, FakeDeviceArray(shape, strides=(1, 2)), 32, out=self.out)  # malformed strides
        self.assertNames("x", run, FakeDeviceArray(shape, strides=3), 32, out=self.out)

    def test_contiguity(self):
        self.assertTrue(_api._c_contiguous((2, 64, 8, 8), (8192, 128, 16, 2), 2))
        self.assertTrue(_api._c_contiguous((2, 64, 1, 8), (1024, 16, 7, 2), 2))  # size-1 dims: any stride
        self.assertTrue(_api._c_contiguous((0, 64, 8, 8), (1, 1, 1, 1), 2))  # no elements
        self.assertFalse(_api._c_contiguous((2, 64, 8, 8), (8192, 128, 2, 16), 2))

    def test_num_groups(self):
        for bad in (0, -32, 3, 2.0, True, "32", None):
            self.assertNames("num_groups", gnsilu.group_norm_silu, self.x, bad, out=self.out)
        self.assertIn("does not divide C = 64", self.assertNames("num_groups", gnsilu.workspace_size,
                                                                 (1, 64, 8), 3))

    def test_eps(self):
        for bad in (0, -1e-6, math.nan, math.inf, "small", None):
            self.assertNames("eps", gnsilu.group_norm_silu, self.x, 32, eps=bad, out=self.out)

    def test_weight_and_bias(self):
        run = gnsilu.group_norm_silu
        self.assertIn("(64,)", self.assertNames("weight", run, self.x, 32, FakeDeviceArray((63,)), out=self.out))
        self.assertIn("got list", self.assertNames("weight", run, self.x, 32, [1.0] * 64, out=self.out))
        self.assertNames("bias", run, self.x, 32, None, FakeDeviceArray((64,), "<i4"), out=self.out)
        self.assertNames("bias", run, self.x, 32, None, FakeDeviceArray((1, 64)), out=self.out)

    def test_input_bias_is_for_torch_tensors(self):
        for function in (gnsilu.group_norm, gnsilu.group_norm_silu):
            message = self.assertNames("input_bias", function, self.x, 32, out=self.out,
                                       input_bias=FakeDeviceArray((64,), pointer=0x7F0000200000))
            self.assertIn("torch tensors", message)

    def test_out_and_out_dtype(self):
        run = gnsilu.group_norm_silu
        self.assertIn("float64", self.assertNames("out_dtype", run, self.x, 32, out_dtype="float64", out=self.out))
        self.assertIn("x's shape", self.assertNames("out", run, self.x, 32, out=FakeDeviceArray((2, 64, 8, 4))))
        self.assertIn("read-only", self.assertNames("out", run, self.x, 32,
                                                    out=FakeDeviceArray((2, 64, 8, 8), readonly=True)))
        self.assertIn("out is float16", self.assertNames("out_dtype", run, self.x, 32, out_dtype="float32",
                                                         out=self.out))
        self.assertNames("out", run, self.x, 32, out=object())
        if _api._optional_module("cupy") is None:
            self.assertIn("CuPy is not installed", self.assertNames("out", run, self.x, 32))

    def test_stream(self):
        run = gnsilu.group_norm_silu
        self.assertIn("different streams", self.assertNames(
            "stream", run, FakeDeviceArray((2, 64), stream=1), 32, out=FakeDeviceArray((2, 64), stream=2)))
        self.assertNames("stream", run, self.x, 32, out=self.out, stream="fast")

    def test_dtype_names(self):
        class NumpyLikeDtype:
            name = "float16"

        for value, code in (("bf16", 1), ("BFloat16", 1), ("half", 2), (NumpyLikeDtype(), 2), ("float", 3)):
            self.assertEqual(_api._dtype_code(value, "out_dtype"), code)
        if torch is not None:
            self.assertEqual(_api._dtype_code(torch.bfloat16, "out_dtype"), 1)

    def test_zero_elements_return_at_once(self):
        out = FakeDeviceArray((0, 64, 8, 8))
        self.assertIs(gnsilu.group_norm_silu(FakeDeviceArray((0, 64, 8, 8)), 32, out=out), out)

    def test_other_functions(self):
        self.assertIn("at least 2", self.assertNames("shape", gnsilu.workspace_size, (64,), 32))
        self.assertNames("shape", gnsilu.workspace_size, "1x64", 32)
        message = self.assertNames("policy", gnsilu.set_tune_policy, "sometimes")
        self.assertIn("'on', 'cached', 'off'", message)
        with self.assertRaises(ValueError):
            gnsilu.set_tune_policy("ON")
        self.assertIn("':'", self.assertNames("shared", gnsilu.set_cache_paths, None, ["/a:/b"]))
        self.assertNames("shared", gnsilu.set_cache_paths, None, [3])
        self.assertNames("user", gnsilu.set_cache_paths, 3)


# ---- memory layouts from shapes and strides ---------------------------------------------------------------------
class TestLayoutOf(unittest.TestCase):
    def test_channels_first_and_last(self):
        layout = _api.layout_of
        for shape in ((2, 64, 8, 8), (2, 96, 77), (2, 32, 4, 6, 5), (1, 8, 2, 3, 4, 5), (3, 5, 7, 2)):
            with self.subTest(shape=shape):
                self.assertEqual(layout(shape, dense_strides(shape, range(len(shape)))), "channels_first")
                self.assertEqual(layout(shape, channels_last_strides(shape)), "channels_last")
                self.assertEqual(layout(shape, channels_last_strides(shape, 4), 4), "channels_last")
                self.assertIsNone(layout(shape, channels_last_strides(shape, 4), 2))  # strides are bytes of 4
        # (N, C, L) from hidden_states.transpose(1, 2) in diffusers' attention: channels-last, no copy.
        self.assertEqual(layout((2, 512, 4096), (4096 * 512, 1, 512)), "channels_last")

    def test_neither(self):
        layout = _api.layout_of
        shape = (2, 64, 8, 8)
        self.assertIsNone(layout(shape, dense_strides(shape, (0, 1, 3, 2))))  # dense, another order
        self.assertIsNone(layout(shape, dense_strides(shape, (1, 0, 2, 3))))
        self.assertIsNone(layout(shape, dense_strides(shape, (0, 3, 2, 1))))
        self.assertIsNone(layout(shape, (8192, 128, 16, 2)))  # gaps
        self.assertIsNone(layout(shape, (0, 64, 8, 1)))  # expanded along N
        self.assertIsNone(layout(shape, (4096, 64, 8)))  # not a stride per dimension
        self.assertIsNone(layout((2, 64, 8), (512, 1, 128)))  # channels innermost, with gaps

    def test_size_one_dimensions_and_both(self):
        layout = _api.layout_of
        # Strides of size-1 dimensions do not matter.
        self.assertEqual(layout((1, 64, 8, 8), (7, 64, 8, 1)), "channels_first")
        self.assertEqual(layout((1, 64, 8, 8), (99, 1, 512, 64)), "channels_last")
        self.assertEqual(layout((2, 64, 1, 8), (512, 1, 3, 64)), "channels_last")
        # Both at once (C = 1, one spatial element, no spatial dimension): channels_first, the same memory.
        self.assertEqual(layout((2, 1, 8, 8), (64, 64, 8, 1)), "channels_first")
        self.assertEqual(layout((2, 1, 8, 8), (64, 1, 8, 1)), "channels_first")
        self.assertEqual(layout((2, 64, 1, 1), (64, 1, 64, 64)), "channels_first")
        self.assertEqual(layout((2, 64), (64, 1)), "channels_first")
        self.assertIsNone(layout((2, 64), (1, 2)))  # no channels-last for 2-D: it would be channels-first
        # No elements: nothing is read, any strides.
        self.assertEqual(layout((0, 64, 8, 8), (1, 2, 3, 4)), "channels_first")

    def test_orders(self):
        self.assertEqual(_api._channels_last_order(4), (0, 2, 3, 1))
        self.assertEqual(_api._channels_last_order(3), (0, 2, 1))
        for ndim in range(3, 7):
            order = _api._channels_last_order(ndim)
            inverse = _api._inverse(order)
            self.assertEqual(tuple(order[i] for i in inverse), tuple(range(ndim)))
        self.assertEqual(_api._inverse((0, 2, 3, 1)), (0, 3, 1, 2))


# ---- the binding: gnsilu_problem and the codes ------------------------------------------------------------------
class TestBinding(unittest.TestCase):
    # Offsets on LP64 (x86-64 and aarch64 Linux): 8-byte pointers, size_t, int64_t and double, 4-byte enums and int.
    LP64_OFFSETS = {"struct_size": 0, "x": 8, "x_dtype": 16, "x_layout": 20, "y": 24, "y_dtype": 32, "y_layout": 36,
                    "shape": 40, "ndim": 48, "num_groups": 56, "weight": 64, "weight_dtype": 72, "bias": 80,
                    "bias_dtype": 88, "eps": 96, "activation": 104, "pad": 112, "pad_count": 120, "pad_mode": 124,
                    "pad_value": 128, "input_bias": 136}

    def test_fields_in_header_order(self):
        self.assertEqual([name for name, _ in _lib.Problem._fields_], PROBLEM_FIELDS)
        with open(HEADER) as f:
            header = f.read()
        body = re.search(r"typedef struct gnsilu_problem \{(.*?)\} gnsilu_problem;", header, re.S).group(1)
        declared = re.findall(r"(\w+);", re.sub(r"/\*.*?\*/", "", body, flags=re.S))
        self.assertEqual(declared, PROBLEM_FIELDS)

    def test_lp64_layout(self):
        if ctypes.sizeof(ctypes.c_void_p) != 8 or ctypes.sizeof(ctypes.c_int) != 4:
            self.skipTest("not an LP64 platform")
        self.assertEqual(ctypes.sizeof(_lib.Problem), 144)
        self.assertEqual({name: getattr(_lib.Problem, name).offset for name in PROBLEM_FIELDS}, self.LP64_OFFSETS)
        problem = _lib.problem()
        self.assertEqual(problem.struct_size, 144)
        self.assertEqual((problem.x_layout, problem.activation, problem.weight, problem.eps, problem.input_bias),
                         (0, 0, None, 0.0, None))

    def test_layout_matches_the_c_compiler(self):
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            self.skipTest("no C compiler")
        enums = ["GNSILU_" + name for name in ("NONE", "BF16", "FP16", "FP32", "CHANNELS_FIRST", "CHANNELS_LAST",
                                              "ACTIVATION_SILU", "ACTIVATION_NONE", "PAD_CONSTANT", "PAD_REPLICATE")]
        program = "#include <stddef.h>\n#include <stdio.h>\n#include \"gnsilu/gnsilu.h\"\nint main(void) {\n"
        program += '  printf("sizeof %zu\\n", sizeof(gnsilu_problem));\n'
        for name in PROBLEM_FIELDS:
            program += (f'  printf("{name} %zu %zu\\n", offsetof(gnsilu_problem, {name}), '
                        f'sizeof(((gnsilu_problem*)0)->{name}));\n')
        for name in enums:
            program += f'  printf("{name} %d\\n", (int){name});\n'
        program += "  return 0;\n}\n"
        with tempfile.TemporaryDirectory() as folder:
            source, binary = os.path.join(folder, "layout.c"), os.path.join(folder, "layout")
            with open(source, "w") as f:
                f.write(program)
            built = subprocess.run([compiler, "-std=c99", "-I", os.path.join(REPO, "include"), source, "-o", binary],
                                   capture_output=True, text=True, timeout=120)
            self.assertEqual(built.returncode, 0, built.stderr)
            printed = subprocess.run([binary], capture_output=True, text=True, timeout=60, check=True).stdout
        values = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in printed.splitlines()}
        self.assertEqual(values["sizeof"], [ctypes.sizeof(_lib.Problem)])
        for name, field_type in _lib.Problem._fields_:
            with self.subTest(field=name):
                self.assertEqual(values[name], [getattr(_lib.Problem, name).offset, ctypes.sizeof(field_type)])
        self.assertEqual([values[name][0] for name in enums],
                         [_api.NONE, _api.BF16, _api.FP16, _api.FP32, _api.CHANNELS_FIRST, _api.CHANNELS_LAST,
                          _api.ACTIVATION_SILU, _api.ACTIVATION_NONE, _checks.PAD_CONSTANT, _checks.PAD_REPLICATE])

    def test_codes_match_the_header(self):
        with open(HEADER) as f:
            header = f.read()
        enums = {}
        for name, body in re.findall(r"typedef enum (\w+) \{(.*?)\}", header, re.S):
            enums[name] = {k: int(v) for k, v in re.findall(r"GNSILU_(\w+) = (\d+)", body)}
        self.assertEqual(enums["gnsilu_dtype"], {"NONE": _api.NONE, "BF16": _api.BF16, "FP16": _api.FP16,
                                                 "FP32": _api.FP32})
        self.assertEqual(enums["gnsilu_layout"], {"CHANNELS_FIRST": _api.CHANNELS_FIRST,
                                                  "CHANNELS_LAST": _api.CHANNELS_LAST})
        self.assertEqual(enums["gnsilu_activation"], {"ACTIVATION_SILU": _api.ACTIVATION_SILU,
                                                      "ACTIVATION_NONE": _api.ACTIVATION_NONE})
        self.assertEqual(enums["gnsilu_tune_policy"], {"TUNE_ON_FIRST_USE": _api._TUNE_POLICIES["on"],
                                                       "TUNE_CACHED_ONLY": _api._TUNE_POLICIES["cached"],
                                                       "TUNE_NEVER": _api._TUNE_POLICIES["off"]})
        statuses = {name: code for name, code in enums["gnsilu_status"].items() if name != "SUCCESS"}
        by_status = {cls.status: cls for cls in vars(_errors).values()
                     if isinstance(cls, type) and issubclass(cls, gnsilu.Error) and cls.status is not None}
        self.assertEqual(enums["gnsilu_status"]["SUCCESS"], 0)
        self.assertEqual(sorted(statuses.values()), sorted(by_status))
        names = {"ERROR_INVALID_ARGUMENT": "InvalidArgumentError", "ERROR_NO_DRIVER": "NoDriverError",
                 "ERROR_NO_DEVICE": "NoDeviceError", "ERROR_UNSUPPORTED_DEVICE": "UnsupportedDeviceError",
                 "ERROR_CUDA": "CudaError", "ERROR_COMPILE": "CompileError", "ERROR_OUT_OF_MEMORY": "OutOfMemoryError",
                 "ERROR_INTERNAL": "InternalError"}
        self.assertEqual({name: by_status[code].__name__ for name, code in statuses.items()}, names)

    def test_every_function_is_declared(self):
        with open(HEADER) as f:
            declared = set(re.findall(r"GNSILU_API [^;]*?\b(gnsilu_\w+)\(", f.read()))
        self.assertEqual(declared, set(_lib._SIGNATURES))

    def test_the_problem_group_norm_fills_in(self):
        shape = (2, 64, 8, 8)
        weight = FakeDeviceArray((64,), "<f4", pointer=0x7F0000200000)
        bias = FakeDeviceArray((64,), "<f2", pointer=0x7F0000300000)
        cases = [
            ("silu, channels-first", dict(x=FakeDeviceArray(shape), out=FakeDeviceArray(shape, "<f4", 0x7F0000100000),
                                          weight=weight, bias=bias, eps=1e-5, stream=7),
             dict(x_layout=0, y_layout=0, activation=0, y_dtype=3, weight=0x7F0000200000, weight_dtype=3,
                  bias=0x7F0000300000, bias_dtype=2, eps=1e-5)),
            ("none, channels-last", dict(x=FakeDeviceArray(shape, strides=channels_last_strides(shape, 2)),
                                         out=FakeDeviceArray(shape, pointer=0x7F0000100000,
                                                             strides=channels_last_strides(shape, 2)),
                                         activation=None, stream=7),
             dict(x_layout=1, y_layout=1, activation=1, y_dtype=2, weight=None, weight_dtype=0, bias=None,
                  bias_dtype=0, eps=1e-6)),
            ("'none', C = 1: channels-first", dict(x=FakeDeviceArray((2, 1, 8, 8), strides=(128, 2, 16, 2)),
                                                   out=FakeDeviceArray((2, 1, 8, 8), pointer=0x7F0000100000),
                                                   activation="none", stream=7),
             dict(x_layout=0, y_layout=0, activation=1, y_dtype=2)),
        ]
        for name, arguments, expected in cases:
            with self.subTest(case=name):
                recorder = RecordedCall()
                x = arguments.pop("x")
                with mock.patch.object(_lib, "call", recorder):
                    result = gnsilu.group_norm(x, 16 if x.__cuda_array_interface__["shape"][1] == 64 else 1,
                                               **arguments)
                self.assertIs(result, arguments["out"])
                problem = recorder.problem
                self.assertEqual(recorder.calls[0][0], "gnsilu_group_norm")
                self.assertEqual(recorder.calls[0][2], (None, 0, 7))  # internal workspace, the stream given
                self.assertEqual(problem["struct_size"], ctypes.sizeof(_lib.Problem))
                self.assertEqual(problem["x"], 0x7F0000000000)
                self.assertEqual(problem["y"], 0x7F0000100000)
                self.assertEqual(problem["x_dtype"], _api.FP16)
                self.assertEqual(problem["shape"], list(x.__cuda_array_interface__["shape"]))
                self.assertEqual(problem["ndim"], 4)
                self.assertEqual(problem["num_groups"], 16 if problem["shape"][1] == 64 else 1)
                for field, value in expected.items():
                    self.assertEqual(problem[field], value, field)
        recorder = RecordedCall()
        with mock.patch.object(_lib, "call", recorder):
            gnsilu.group_norm_silu(FakeDeviceArray((3, 32)), 8, out=FakeDeviceArray((3, 32), pointer=0x7F0000100000))
        self.assertEqual((recorder.problem["activation"], recorder.problem["shape"]), (_api.ACTIVATION_SILU, [3, 32]))
        self.assertEqual(recorder.calls[0][2], (None, 0, 0))  # no stream named: the legacy default stream


# ---- with the real library (no GPU on this machine) -------------------------------------------------------------
class TestWithLibrary(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.library = real_library()
        if cls.library is None:
            raise unittest.SkipTest("no libgnsilu.so: set GNSILU_LIBRARY or build the repository")

    def test_versions_agree(self):
        with open(os.path.join(REPO, "VERSION")) as f:
            project_version = f.readline().strip()  # the one place (CMakeLists.txt and pyproject.toml read it)
        self.assertRegex(project_version, r"^[0-9]+\.[0-9]+\.[0-9]+")
        self.assertEqual(gnsilu.version(), project_version)
        self.assertEqual(gnsilu.__version__, project_version)

    def test_library_path(self):
        if os.environ.get(_lib.ENV_VARIABLE):
            self.assertEqual(gnsilu.library_path(), os.environ[_lib.ENV_VARIABLE])

    def device_error(self):
        """The exception check_device raises here, or a skip where a usable GPU is present."""
        try:
            gnsilu.check_device()
        except (gnsilu.NoDriverError, gnsilu.NoDeviceError) as e:
            return e
        self.skipTest("a usable CUDA device is present")

    def test_check_device_without_gpu(self):
        error = self.device_error()
        direct = ctypes.CDLL(self.library)
        direct.gnsilu_last_error.restype = ctypes.c_char_p
        status = direct.gnsilu_check_device()
        self.assertEqual(status, error.status)
        self.assertEqual(str(error), direct.gnsilu_last_error().decode())
        self.assertTrue(str(error))

    def test_stub_driver(self):
        stub = "/usr/local/cuda/lib64/stubs/libcuda.so"
        if not os.path.exists(stub):
            self.skipTest("no CUDA toolkit stub")
        result = run_python("import gnsilu\ntry:\n    gnsilu.check_device()\n"
                            "except gnsilu.NoDriverError as e:\n    print('NoDriverError', e)",
                            GNSILU_LIBRARY=self.library, GNSILU_LIBCUDA=stub)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("NoDriverError", result.stdout)
        self.assertIn("stub", result.stdout)

    def test_call_without_gpu(self):
        error = self.device_error()
        with self.assertRaises(type(error)) as caught:
            gnsilu.group_norm_silu(FakeDeviceArray((2, 64, 8, 8)), 32, out=FakeDeviceArray(
                (2, 64, 8, 8), pointer=0x7F0000100000))
        self.assertEqual(str(caught.exception), str(error))

    def test_c_errors_carry_the_library_message(self):
        size = ctypes.c_size_t()
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            _lib.call("gnsilu_workspace_size", _lib.int64_array((1, 64, 8)), 3, 33, ctypes.byref(size))
        self.assertIn("'num_groups'", str(caught.exception))
        self.assertEqual(caught.exception.status, 1)

    def test_workspace_size(self):
        # 32 bytes per 1024 elements plus 16 per channel and sample (README).
        self.assertEqual(gnsilu.workspace_size((1, 512, 128, 128), 32), 32 * 512 * 128 * 128 // 1024 + 16 * 512)
        self.assertIsInstance(gnsilu.workspace_size([2, 64], 1), int)

    def problem_status(self, function="gnsilu_group_norm", size=None, **fields):
        """Calls the C function directly with a problem over fake device pointers (never dereferenced: no GPU
        here), changed by `fields`; returns the exception raised, or None."""
        values = dict(x=0x7F0000000000, x_dtype=_api.FP16, y=0x7F0000100000, y_dtype=_api.FP16,
                      shape=_lib.int64_array((2, 64, 8, 8)), ndim=4, num_groups=32, weight=0x7F0000200000,
                      weight_dtype=_api.FP32, bias=0x7F0000300000, bias_dtype=_api.FP32, eps=1e-6)
        values.update(fields)
        problem = _lib.problem(**values)
        if size is not None:
            problem.struct_size = size
        try:
            if function == "gnsilu_group_norm":
                _lib.call(function, ctypes.byref(problem), None, 0, None)
            else:
                _lib.call(function, ctypes.byref(problem), ctypes.byref(ctypes.c_size_t()))
        except gnsilu.Error as e:
            return e
        return None

    def test_problem_fields_reach_the_library(self):
        """Each field set wrong in turn is the one the library's message names: the library reads every field
        where the ctypes Structure puts it."""
        error = self.device_error()
        for fields in ({}, dict(x_layout=1, y_layout=1), dict(activation=1), dict(weight=None, bias=None),
                       dict(x_layout=0, y_layout=1, shape=_lib.int64_array((2, 64, 1, 1))),
                       dict(x_layout=1, y_layout=0, shape=_lib.int64_array((2, 1, 8, 8)), num_groups=1)):
            with self.subTest(valid=fields):  # past every argument check: the missing driver or device
                self.assertEqual(str(self.problem_status(**fields)), str(error))
        wrong = [("x", dict(x=None)), ("y", dict(y=None)), ("x_dtype", dict(x_dtype=9)),
                 ("y_dtype", dict(y_dtype=9)), ("weight_dtype", dict(weight_dtype=9)),
                 ("bias_dtype", dict(bias_dtype=9)), ("x", dict(x=0x7F0000000001)), ("y", dict(y=0x7F0000100001)),
                 ("weight", dict(weight=0x7F0000200002)), ("bias", dict(bias=0x7F0000300002)),
                 ("eps", dict(eps=-1.0)), ("x_layout", dict(x_layout=5, y_layout=5)), ("y_layout", dict(y_layout=5)),
                 ("y_layout", dict(y_layout=1)), ("activation", dict(activation=5)), ("num_groups", dict(num_groups=3)),
                 ("ndim", dict(ndim=1)), ("shape", dict(shape=None)),
                 ("problem.struct_size", dict(size=8)), ("problem.struct_size", dict(size=1 << 20))]
        if library_takes_input_bias():  # (a library built before 0.3 refuses the field: the test of it above)
            wrong.append(("input_bias", dict(input_bias=0x7F0000400001)))  # not aligned to x's dtype
        for name, fields in wrong:
            with self.subTest(field=name, fields=fields):
                raised = self.problem_status(**fields)
                self.assertIsInstance(raised, gnsilu.InvalidArgumentError)
                self.assertIn(f"invalid argument '{name}'", str(raised))

    def test_problem_workspace_size(self):
        for layout in (0, 1):
            for activation in (0, 1):
                size = ctypes.c_size_t()
                problem = _lib.problem(x_layout=layout, y_layout=layout, activation=activation, eps=1e-6,
                                       shape=_lib.int64_array((2, 512, 32, 48)), ndim=4, num_groups=32)
                _lib.call("gnsilu_problem_workspace_size", ctypes.byref(problem), ctypes.byref(size))
                self.assertEqual(size.value, gnsilu.workspace_size((2, 512, 32, 48), 32))
        raised = self.problem_status("gnsilu_problem_workspace_size", num_groups=5)
        self.assertIn("'num_groups'", str(raised))

    def test_group_norm_without_gpu(self):
        error = self.device_error()
        shape = (2, 64, 8, 8)
        for activation in ("silu", None):
            with self.assertRaises(type(error)) as caught:
                gnsilu.group_norm(FakeDeviceArray(shape, strides=channels_last_strides(shape, 2)), 32,
                                  activation=activation, out=FakeDeviceArray(
                                      shape, pointer=0x7F0000100000, strides=channels_last_strides(shape, 2)))
            self.assertEqual(str(caught.exception), str(error))

    def test_settings(self):
        for policy in ("off", "cached", "on"):
            self.assertIsNone(gnsilu.set_tune_policy(policy))
        with tempfile.TemporaryDirectory() as folder:
            self.assertIsNone(gnsilu.set_cache_paths(os.path.join(folder, "cache.sqlite"),
                                                     [os.path.join(folder, "a"), os.path.join(folder, "b")]))
            self.assertIsNone(gnsilu.set_cache_paths(None))
        self.assertIsNone(gnsilu.release_workspaces())


# ---- the proof behind swap_group_norm_silu (plain classes, no torch) --------------------------------------------
class Base:
    """Stands for torch.nn.Module: where the examined classes end."""


class DiffusersResnet(Base):
    """diffusers ResnetBlock2D.forward (recent versions), as far as the pattern goes."""

    def forward(self, input_tensor, temb, *args, **kwargs):
        if len(args) > 0 or kwargs.get("scale", None) is not None:
            print("deprecated")
        hidden_states = input_tensor
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        if self.upsample is not None:
            hidden_states = self.upsample(hidden_states)
        hidden_states = self.conv1(hidden_states)
        if self.time_emb_proj is not None:
            if not self.skip_time_act:
                temb = self.nonlinearity(temb)
        if self.time_embedding_norm == "default":
            if temb is not None:
                hidden_states = hidden_states + temb
            hidden_states = self.norm2(hidden_states)
        elif self.time_embedding_norm == "scale_shift":
            hidden_states = self.norm2(hidden_states)
            hidden_states = hidden_states * 2
        else:
            hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        return input_tensor + self.conv2(hidden_states)


class OldDiffusersResnet(Base):
    """diffusers ResnetBlock2D.forward of older versions (norm1 with temb for ada_group, scale_shift after)."""

    def forward(self, input_tensor, temb, scale=1.0):
        hidden_states = input_tensor
        if self.time_embedding_norm == "ada_group" or self.time_embedding_norm == "spatial":
            hidden_states = self.norm1(hidden_states, temb)
        else:
            hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        if temb is not None and self.time_embedding_norm == "default":
            hidden_states = hidden_states + temb
        if self.time_embedding_norm == "ada_group" or self.time_embedding_norm == "spatial":
            hidden_states = self.norm2(hidden_states, temb)
        else:
            hidden_states = self.norm2(hidden_states)
        if temb is not None and self.time_embedding_norm == "scale_shift":
            hidden_states = hidden_states * (1 + scale)
        hidden_states = self.nonlinearity(hidden_states)
        return hidden_states


class DiffusersDecoder(Base):
    def forward(self, sample, latent_embeds=None):
        sample = self.conv_in(sample)
        if latent_embeds is None:
            sample = self.conv_norm_out(sample)
        else:
            sample = self.conv_norm_out(sample, latent_embeds)
        sample = self.conv_act(sample)
        return self.conv_out(sample)

    def extra_repr(self):
        return f"{type(self).__name__} eps={self.conv_norm_out.eps}"


class Composed(Base):
    def forward(self, x):
        return self.conv(self.act(self.norm(x)))


class ReturnsAct(Base):
    def forward(self, x):
        x = self.norm(x)
        return self.act(x)


class ResidualUse(Base):
    def forward(self, x):
        h = self.norm(x)
        y = self.act(h)
        return y + h


class OtherMethod(Base):
    def forward(self, x):
        x = self.norm(x)
        x = self.act(x)
        return self.again(x)

    def again(self, x):
        return self.norm(x)


class SelfEscapes(Base):
    def forward(self, x):
        x = self.norm(x)
        x = self.act(x)
        return helper(self, x)


class DynamicAccess(Base):
    def forward(self, x):
        x = self.norm(x)
        x = self.act(x)
        return self._modules["norm"](x)


class InLoop(Base):
    def forward(self, x):
        for _ in range(2):
            x = self.norm(x)
        x = self.act(x)
        return x


class ImpureTest(Base):
    def forward(self, x):
        x = self.norm(x)
        if self.check(x) and self.mode == "never":
            x = x * 2
        x = self.act(x)
        return x

    def check(self, x):
        return x.sum() > 0


class TensorTruth(Base):
    def forward(self, x, scale):
        x = self.norm(x)
        if scale and self.mode == "never":
            x = x * 2
        x = self.act(x)
        return x


class InWith(Base):
    def forward(self, x):
        with self.context():
            x = self.norm(x)
        x = self.act(x)
        return x


class ReplacesAct(Base):
    def forward(self, x):
        x = self.norm(x)
        x = self.act(x)
        self.act = None
        return x


def passthrough(function):
    return function


class Decorated(Base):
    @passthrough
    def forward(self, x):
        x = self.norm(x)
        return self.act(x)


class LambdaInBody(Base):
    other = lambda self, x: self.norm(x)  # noqa: E731  (the case under test)

    def forward(self, x):
        x = self.norm(x)
        return self.act(x)


class Patched(Base):
    def forward(self, x):
        x = self.norm(x)
        return self.act(x)


def patched_helper(self, x):
    return self.norm(x)


Patched.helper = patched_helper


class Harmless(Base):
    def forward(self, x):
        if isinstance(self, Harmless) and self.norm.num_groups > 1:
            x = self.norm(x, "two arguments: a TypeError before and after")
        x = self.norm(x)
        return self.act(x)


def helper(module, x):
    return module.norm(x)



class ThroughViews(Base):
    """Magvit's spatial norm: views between the norm and the SiLU."""

    def forward(self, h):
        if self.spatial:
            batch = h.size(0)
            h = h.permute(0, 2, 1, 3, 4).flatten(0, 1)
            h = self.norm(h)
            h = h.unflatten(0, (batch, -1)).permute(0, 2, 1, 3, 4)
        else:
            h = self.norm(h)
        h = self.act(h)
        return h


class ThroughACopy(Base):
    """reshape and contiguous may copy: the SiLU would then get a new tensor."""

    def forward(self, h):
        h = self.norm(h)
        h = h.reshape(h.shape[0], -1)
        return self.act(h)


class ThroughAnImpureView(Base):
    """A view whose argument calls code."""

    def forward(self, h):
        h = self.norm(h)
        h = h.permute(*self.order())
        return self.act(h)


class ThroughAnotherName(Base):
    """The view under another name: the norm's output is still held by `h`."""

    def forward(self, h):
        h = self.norm(h)
        v = h.permute(0, 1, 3, 2)
        v = self.act(v)
        return v + h

class KvaeLike(Base):
    """diffusers' KVAEResnetBlock2D: the branch of `if zq is None:` taken when zq is None holds norm2's call."""

    def forward(self, x, temb, zq=None):
        h = self.conv1(x)
        if temb is not None:
            h = h + temb
        if zq is None:
            h = self.norm2(h)
        else:
            h = self.norm2(h, zq)
        return self.conv2(h)


class GuardedAnd(Base):
    def forward(self, x, temb=None):
        h = self.conv1(x)
        if temb is not None and self.mode == "default":  # not evaluated past `temb is not None` when temb is None
            h = h + temb
        h = self.norm2(h)
        return h


class Straight(Base):
    def forward(self, x):
        x = self.conv1(x)
        x = self.norm2(x)
        return x


class ConvToResidual(Base):
    def forward(self, x):
        h = self.conv1(x)
        y = self.norm2(h)
        return y + h


class ConvTwice(Base):
    def forward(self, x):
        h = self.conv1(x)
        h = self.norm2(h)
        return self.conv1(h)


class ConvInOtherMethod(Base):
    def forward(self, x):
        h = self.conv1(x)
        h = self.norm2(h)
        return h

    def again(self, x):
        return self.conv1(x)


class ElseRunsWhenNone(Base):
    def forward(self, x, temb=None):
        h = self.conv1(x)
        if temb is not None:
            h = h + temb
        else:
            h = h * 2
        h = self.norm2(h)
        return h


class TembRebound(Base):
    def forward(self, x, temb=None):
        h = self.conv1(x)
        temb = self.default_temb  # the value tested below is no longer the argument's
        if temb is not None:
            h = h + temb
        h = self.norm2(h)
        return h


class NormReplaced(Base):
    def forward(self, x):
        h = self.conv1(x)
        h = self.norm2(h)
        return h

    def reset(self):
        self.norm2 = None


class ConfigFirst(Base):
    def forward(self, x, temb=None):
        h = self.conv1(x)
        if self.check() and temb is not None:  # evaluated whatever temb is
            h = h + temb
        h = self.norm2(h)
        return h


class ConvInLoopTail(Base):
    def forward(self, x):
        for _ in range(2):
            x = self.conv1(x)  # the next statement is the loop's header again
        x = self.norm2(x)
        return x


class ConvEscapes(Base):
    def forward(self, x):
        h = self.conv1(x)
        return helper(self, h)


class TestProof(unittest.TestCase):
    def pairs(self, cls, norms=("norm",), acts=("act",), **config):
        return _fusion.proven_pairs(cls, Base, set(norms), set(acts), lambda name: config.get(name, _fusion.UNKNOWN))

    def test_diffusers_resnet(self):
        config = {"time_embedding_norm": "default", "upsample": None, "skip_time_act": False, "time_emb_proj": None}
        both = {"norm1": {"nonlinearity"}, "norm2": {"nonlinearity"}}
        for cls in (DiffusersResnet, OldDiffusersResnet):
            self.assertEqual(self.pairs(cls, ("norm1", "norm2"), ("nonlinearity",), **config), both)
        # scale_shift puts a multiply between norm2 and the SiLU; unknown settings decide nothing.
        self.assertEqual(self.pairs(DiffusersResnet, ("norm1", "norm2"), ("nonlinearity",),
                                    **dict(config, time_embedding_norm="scale_shift")), {"norm1": {"nonlinearity"}})
        self.assertEqual(self.pairs(DiffusersResnet, ("norm1", "norm2"), ("nonlinearity",)),
                         {"norm1": {"nonlinearity"}})
        # Older code: norm1 ends both branches of an undecided if (the two-argument call fails either way).
        self.assertEqual(self.pairs(OldDiffusersResnet, ("norm1", "norm2"), ("nonlinearity",)),
                         {"norm1": {"nonlinearity"}})

    def test_decoder_and_simple_forms(self):
        self.assertEqual(self.pairs(DiffusersDecoder, ("conv_norm_out",), ("conv_act",)),
                         {"conv_norm_out": {"conv_act"}})
        self.assertEqual(self.pairs(Composed), {"norm": {"act"}})
        self.assertEqual(self.pairs(ReturnsAct), {"norm": {"act"}})
        self.assertEqual(self.pairs(Harmless), {"norm": {"act"}})

    def test_not_proven(self):
        for cls in (ResidualUse, OtherMethod, SelfEscapes, DynamicAccess, InLoop, ImpureTest, InWith, ReplacesAct,
                    Decorated, LambdaInBody, Patched):
            with self.subTest(cls=cls.__name__):
                self.assertEqual(self.pairs(cls, mode="always"), {})
        self.assertEqual(self.pairs(TensorTruth, mode="never"), {})
        self.assertEqual(self.pairs(ReturnsAct, acts=("other",)), {})
        self.assertEqual(self.pairs(ReturnsAct), {"norm": {"act"}})

    def test_views_between_norm_and_act(self):
        self.assertEqual(self.pairs(ThroughViews, spatial=True), {"norm": {"act"}})
        self.assertEqual(self.pairs(ThroughViews, spatial=False), {"norm": {"act"}})
        self.assertEqual(self.pairs(ThroughViews), {"norm": {"act"}})  # both branches of the undecided if
        for cls in (ThroughACopy, ThroughAnImpureView, ThroughAnotherName):
            with self.subTest(cls=cls.__name__):
                self.assertEqual(self.pairs(cls), {})

    def test_base_must_be_in_the_mro(self):
        self.assertEqual(_fusion.proven_pairs(ReturnsAct, int, {"norm"}, {"act"}, lambda name: _fusion.UNKNOWN), {})


class TestBiasProof(unittest.TestCase):
    """_fusion.proven_bias_moves: a convolution whose output goes to one GroupNorm and nowhere else, under the
    condition that some of forward's parameters are None at run time."""

    def moves(self, cls, convs=("conv1", "conv2"), norms=("norm1", "norm2"), **config):
        return _fusion.proven_bias_moves(cls, Base, set(convs), set(norms),
                                         lambda name: config.get(name, _fusion.UNKNOWN))

    def test_diffusers_resnet(self):
        config = {"time_embedding_norm": "default", "upsample": None, "skip_time_act": False, "time_emb_proj": None}
        # conv1 -> (if temb is not None: + temb) -> norm2: proven while temb is None; conv2 feeds the residual sum.
        self.assertEqual(self.moves(DiffusersResnet, **config), {"conv1": ("norm2", ("temb",))})
        # scale_shift (the elif decided): norm2 follows conv1 at once, no condition.
        self.assertEqual(self.moves(DiffusersResnet, **dict(config, time_embedding_norm="scale_shift")),
                         {"conv1": ("norm2", ())})
        # A time embedding projection (its statements between conv1 and norm2), or an undecided configuration.
        self.assertEqual(self.moves(DiffusersResnet, **dict(config, time_emb_proj=object())), {})
        self.assertEqual(self.moves(DiffusersResnet), {})
        self.assertEqual(self.moves(DiffusersResnet, norms=("norm1",), **config), {})  # norm2 not a gnsilu norm

    def test_branches_taken_when_none(self):
        self.assertEqual(self.moves(KvaeLike), {"conv1": ("norm2", ("temb", "zq"))})
        self.assertEqual(self.moves(GuardedAnd), {"conv1": ("norm2", ("temb",))})
        self.assertEqual(self.moves(Straight), {"conv1": ("norm2", ())})

    def test_not_proven(self):
        for cls in (ConvToResidual, ConvTwice, ConvInOtherMethod, ElseRunsWhenNone, TembRebound, NormReplaced,
                    ConfigFirst, ConvInLoopTail, ConvEscapes):
            with self.subTest(cls=cls.__name__):
                self.assertEqual(self.moves(cls, flag=True), {})
        self.assertEqual(_fusion.proven_bias_moves(Straight, int, {"conv1"}, {"norm2"}, lambda name: _fusion.UNKNOWN),
                         {})


if __name__ == "__main__":
    unittest.main()
