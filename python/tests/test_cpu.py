#!/usr/bin/env python3
"""CPU tests of the Python package: no GPU, no pip install (unittest only); PyTorch optional.

    GNSILU_LIBRARY=build/libgnsilu.so python3 -m unittest python/tests/test_cpu.py   (or: ctest -R test_python_cpu)

- import works without the library; a missing or unloadable library is a LibraryNotFoundError that lists where
  it looked; the search order (GNSILU_LIBRARY, next to the package, the build folder, the system loader);
- every argument check names the argument, before the library is even loaded;
- with the real library (GNSILU_LIBRARY, else the default search; those tests skip when there is none): the
  version, C errors mapped to exceptions with the library's message (no driver here: NoDriverError);
- the proof behind swap_group_norm_silu on plain Python classes (no torch needed);
- with PyTorch installed: GroupNormSiLU and swap_group_norm_silu on CPU tensors give PyTorch's exact results.
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

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
sys.path[:0] = [PYTHON_DIR, HERE]

import gnsilu  # noqa: E402  (after the path set-up)
from gnsilu import _api, _errors, _fusion, _lib  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
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


# ---- with the real library (no GPU on this machine) -------------------------------------------------------------
class TestWithLibrary(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.library = real_library()
        if cls.library is None:
            raise unittest.SkipTest("no libgnsilu.so: set GNSILU_LIBRARY or build the repository")

    def test_versions_agree(self):
        with open(os.path.join(REPO, "CMakeLists.txt")) as f:
            project_version = re.search(r"project\(gnsilu VERSION ([0-9.]+)", f.read()).group(1)
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

    def test_base_must_be_in_the_mro(self):
        self.assertEqual(_fusion.proven_pairs(ReturnsAct, int, {"norm"}, {"act"}, lambda name: _fusion.UNKNOWN), {})


# ---- PyTorch on CPU (skipped without torch) ---------------------------------------------------------------------
@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestTorchOnCPU(unittest.TestCase):
    def setUp(self):
        import gnsilu.torch as gt
        import toy_models
        self.gt = gt
        self.models = toy_models
        torch.manual_seed(0)

    def test_cpu_tensor_is_refused_by_the_function(self):
        x = torch.randn(2, 64, 4, 4)
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            gnsilu.group_norm_silu(x, 32)
        self.assertIn("'x'", str(caught.exception))
        self.assertIn("CUDA", str(caught.exception))

    def test_group_norm_silu_module_falls_back_on_cpu(self):
        gn = nn.GroupNorm(8, 64, eps=1e-6)
        with torch.no_grad():
            gn.weight.uniform_(0.5, 1.5)
            gn.bias.uniform_(-0.5, 0.5)
        fused = self.gt.GroupNormSiLU.from_group_norm(gn)
        self.assertIs(fused.weight, gn.weight)
        self.assertEqual(list(fused.state_dict()), list(gn.state_dict()))
        x = torch.randn(2, 64, 5, 3, requires_grad=True)
        expected = F.silu(gn(x))
        got = fused(x)
        self.assertTrue(torch.equal(got, expected))
        got.sum().backward()  # the fallback keeps autograd
        self.assertIsNotNone(gn.weight.grad)
        fresh = self.gt.GroupNormSiLU(8, 64, eps=1e-6)
        fresh.load_state_dict(gn.state_dict())
        self.assertTrue(torch.equal(fresh(x), expected))
        self.assertEqual(repr(fresh), "GroupNormSiLU(8, 64, eps=1e-06, affine=True)")
        plain = self.gt.GroupNormSiLU(4, 64, affine=False)
        self.assertEqual(list(plain.state_dict()), [])
        self.assertTrue(torch.equal(plain(x), F.silu(F.group_norm(x, 4, eps=1e-5))))
        with self.assertRaises(ValueError):
            self.gt.GroupNormSiLU(3, 64)

    def test_swap_keeps_results_and_state(self):
        decoder = self.models.FluxLikeDecoder(block_out_channels=(32, 64, 64, 64), layers_per_block=1)
        head = self.models.sequential_head(32)
        others = nn.ModuleList([self.models.ResidualNorm(32), self.models.FunctionalSiLU(32)])
        keys = list(decoder.state_dict())
        latent = torch.randn(1, 16, 8, 8)
        features = torch.randn(1, 32, 6, 6)
        with torch.no_grad():
            expected = decoder(latent), head(features), [m(features) for m in others]
            self.assertEqual(self.gt.swap_group_norm_silu(decoder), self.models.expected_swaps(decoder))
            self.assertEqual(self.gt.swap_group_norm_silu(head), 1)
            self.assertEqual(self.gt.swap_group_norm_silu(others), 0)
            got = decoder(latent), head(features), [m(features) for m in others]
        self.assertEqual(list(decoder.state_dict()), keys)
        self.assertTrue(torch.equal(got[0], expected[0]))  # on CPU the swapped modules run the same ops
        self.assertTrue(torch.equal(got[1], expected[1]))
        self.assertIsInstance(head[1], nn.Identity)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got[2], expected[2])))
        attention = decoder.mid_block.attentions[0]
        self.assertIs(type(attention.group_norm), nn.GroupNorm)
        self.assertEqual(self.gt.swap_group_norm_silu(decoder), 0)

    def test_shared_nonlinearity_still_applies_to_other_tensors(self):
        block = self.models.ResnetBlock2D(32, 32, temb_channels=8)
        x, temb = torch.randn(2, 32, 4, 4), torch.randn(2, 8)
        with torch.no_grad():
            expected = block(x, temb)
            self.assertEqual(self.gt.swap_group_norm_silu(block), 2)
            self.assertTrue(torch.equal(block(x, temb), expected))

    def test_scale_shift_block_keeps_norm2(self):
        block = self.models.ResnetBlock2D(32, 32, temb_channels=8, time_embedding_norm="scale_shift")
        self.assertEqual(self.gt.swap_group_norm_silu(block), 1)
        self.assertIs(type(block.norm2), nn.GroupNorm)

    def test_hooks_prevent_swaps(self):
        block = self.models.ResnetBlock2D(32, 32)
        block.norm1.register_forward_hook(lambda module, args, output: output * 2)
        self.assertEqual(self.gt.swap_group_norm_silu(block), 1)  # norm2 only
        self.assertIs(type(block.norm1), nn.GroupNorm)
        handle = nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
        try:
            self.assertEqual(self.gt.swap_group_norm_silu(self.models.sequential_head(32)), 0)
        finally:
            handle.remove()


if __name__ == "__main__":
    unittest.main()
