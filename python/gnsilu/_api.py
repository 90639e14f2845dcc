"""The functions of the package: argument checks in Python, then one call of the C API."""
import ctypes
import importlib
import math
import operator
import os
import sys

from . import _lib
from ._errors import invalid_argument

# gnsilu_dtype codes (include/gnsilu/gnsilu.h).
NONE, BF16, FP16, FP32 = 0, 1, 2, 3
_NAMES = {BF16: "bfloat16", FP16: "float16", FP32: "float32"}
_ITEM_SIZES = {BF16: 2, FP16: 2, FP32: 4}
_BY_NAME = {"bfloat16": BF16, "bf16": BF16, "float16": FP16, "fp16": FP16, "half": FP16,
            "float32": FP32, "fp32": FP32, "float": FP32}
# __cuda_array_interface__ typestrs; bfloat16 has none there.
_BY_TYPESTR = {"<f2": FP16, "<f4": FP32}
if sys.byteorder == "little":
    _BY_TYPESTR.update({"=f2": FP16, "=f4": FP32})
_TUNE_POLICIES = {"on": 0, "cached": 1, "off": 2}
_ACCEPTED = "bfloat16, float16 or float32"


# ---- argument checks shared by every kind of array ------------------------------------------------------------
def _shape(shape, name):
    """The shape as a tuple of ints, checked to be (N, C, *spatial) with N >= 0 and C >= 1."""
    try:
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise invalid_argument(name, f"must be a sequence of integers, got {shape!r}") from None
    if len(shape) < 2:
        raise invalid_argument(name, f"must have at least 2 dimensions (N, C, *spatial), got shape {shape}")
    if any(s < 0 for s in shape):
        raise invalid_argument(name, f"has a negative size in shape {shape}")
    if shape[1] < 1:
        raise invalid_argument(name, f"must have at least one channel (dimension 1), got shape {shape}")
    return shape


def _groups(num_groups, channels):
    if isinstance(num_groups, bool):
        raise invalid_argument("num_groups", f"must be an integer, got {num_groups!r}")
    try:
        groups = operator.index(num_groups)
    except TypeError:
        raise invalid_argument("num_groups", f"must be an integer, got {num_groups!r}") from None
    if groups < 1:
        raise invalid_argument("num_groups", f"must be >= 1, got {groups}")
    if channels % groups != 0:
        raise invalid_argument("num_groups", f"{groups} does not divide C = {channels}")
    return groups


def _eps(eps):
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise invalid_argument("eps", f"must be a number, got {eps!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise invalid_argument("eps", f"must be a finite number > 0, got {eps!r}")
    return value


def _dtype_code(dtype, name):
    """The gnsilu_dtype of a torch.dtype, a NumPy/CuPy dtype or scalar type, or a name such as "bfloat16"."""
    if isinstance(dtype, str):
        key = dtype
    elif type(dtype).__module__ == "torch":  # torch.dtype: str() is "torch.bfloat16"
        key = str(dtype).rpartition(".")[2]
    else:  # numpy.dtype has .name, numpy.float16 (a type) has __name__
        key = getattr(dtype, "name", None) or getattr(dtype, "__name__", "")
    code = _BY_NAME.get(str(key).lower())
    if code is None:
        raise invalid_argument(name, f"must be {_ACCEPTED}, got {dtype!r}")
    return code


def _stream_handle(stream):
    """A CUstream handle from an int, a torch.cuda.Stream (.cuda_stream) or a CuPy stream (.ptr)."""
    for attribute in ("cuda_stream", "ptr"):
        if hasattr(stream, attribute):
            stream = getattr(stream, attribute)
            break
    try:
        return operator.index(stream)
    except TypeError:
        raise invalid_argument("stream", "must be a CUstream handle (int), a torch.cuda.Stream or a CuPy stream, "
                                         f"got {type(stream).__name__}") from None


def _optional_module(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _run(x_ptr, x_code, y_ptr, y_code, shape, groups, weight, bias, eps, stream):
    """The C call; weight and bias are (pointer or None, gnsilu_dtype)."""
    _lib.call("gnsilu_group_norm_silu", x_ptr, x_code, y_ptr, y_code, _lib.int64_array(shape), len(shape), groups,
              weight[0], weight[1], bias[0], bias[1], eps, None, 0, stream)


# ---- torch tensors --------------------------------------------------------------------------------------------
def _torch_code(torch, tensor, name):
    code = {torch.bfloat16: BF16, torch.float16: FP16, torch.float32: FP32}.get(tensor.dtype)
    if code is None:
        raise invalid_argument(name, f"has dtype {tensor.dtype}; gnsilu takes {_ACCEPTED}")
    return code


def _as_torch(torch, value, name):
    """value as a torch tensor sharing its memory: a tensor, a DLPack object or a __cuda_array_interface__ one."""
    if isinstance(value, torch.Tensor):
        return value
    try:
        if hasattr(value, "__dlpack__"):
            return torch.from_dlpack(value)
        if hasattr(value, "__cuda_array_interface__"):
            return torch.as_tensor(value)
    except Exception as e:  # the producer's own error, whatever its type
        raise invalid_argument(name, f"could not be read as a tensor ({type(e).__name__}: {e})") from None
    raise invalid_argument(name, f"must be a torch tensor (like x), got {type(value).__name__}")


def _torch_parameter(torch, value, name, x, channels):
    """(tensor, (pointer, gnsilu_dtype)) of weight or bias checked against x; (None, (None, NONE)) for None.
    The caller holds the tensor until the call returns (a contiguous copy when it was not contiguous)."""
    if value is None:
        return None, (None, NONE)
    tensor = _as_torch(torch, value, name)
    if tensor.device != x.device:
        raise invalid_argument(name, f"is on {tensor.device}, but x is on {x.device}")
    code = _torch_code(torch, tensor, name)
    if tensor.dim() != 1 or tensor.shape[0] != channels:
        raise invalid_argument(name, f"must have shape ({channels},) (C of x), got {tuple(tensor.shape)}")
    tensor = tensor.contiguous()
    return tensor, (tensor.data_ptr(), code)


def _torch_group_norm_silu(torch, x, num_groups, weight, bias, eps, out_dtype, out):
    if not x.is_cuda:
        raise invalid_argument("x", f"must be a CUDA tensor, got one on {x.device}")
    x_code = _torch_code(torch, x, "x")
    shape = _shape(x.shape, "x")
    groups = _groups(num_groups, shape[1])
    eps = _eps(eps)
    weight_tensor, weight_arg = _torch_parameter(torch, weight, "weight", x, shape[1])
    bias_tensor, bias_arg = _torch_parameter(torch, bias, "bias", x, shape[1])
    y_code = x_code if out_dtype is None else _dtype_code(out_dtype, "out_dtype")
    if out is None:
        dtypes = {BF16: torch.bfloat16, FP16: torch.float16, FP32: torch.float32}
        result = y = torch.empty(shape, dtype=dtypes[y_code], device=x.device)
    else:
        result, y = out, _as_torch(torch, out, "out")
        if y.device != x.device:
            raise invalid_argument("out", f"is on {y.device}, but x is on {x.device}")
        out_code = _torch_code(torch, y, "out")
        if out_dtype is not None and out_code != y_code:
            raise invalid_argument("out_dtype", f"is {_NAMES[y_code]}, but out has dtype {y.dtype}")
        y_code = out_code
        if tuple(y.shape) != shape:
            raise invalid_argument("out", f"must have x's shape {shape}, got {tuple(y.shape)}")
        if not y.is_contiguous():
            raise invalid_argument("out", "must be contiguous (gnsilu writes it as one dense block)")
    if torch.is_grad_enabled():
        for name, tensor in (("x", x), ("weight", weight_tensor), ("bias", bias_tensor), ("out", y)):
            if tensor is not None and tensor.requires_grad:
                raise invalid_argument(name, "requires grad, but gnsilu computes no gradients: call it under "
                                             "torch.no_grad() or torch.inference_mode(), or use "
                                             "gnsilu.torch.GroupNormSiLU, which then runs PyTorch's ops")
    x = x.contiguous()  # a copy only when x is not contiguous (documented)
    if x.numel() == 0:
        return result
    with torch.cuda.device(x.device):
        _run(x.data_ptr(), x_code, y.data_ptr(), y_code, shape, groups, weight_arg, bias_arg, eps,
             torch.cuda.current_stream(x.device).cuda_stream)
    return result


# ---- __cuda_array_interface__ objects (CuPy, Numba, ...) -------------------------------------------------------
class _Interface:
    """What gnsilu needs from an object's __cuda_array_interface__."""

    def __init__(self, value, name):
        try:
            interface = value.__cuda_array_interface__
            self.shape = tuple(int(s) for s in interface["shape"])
            typestr = interface["typestr"]
            self.pointer, self.readonly = interface["data"]
            strides = interface.get("strides")
            mask = interface.get("mask")
            self.stream = interface.get("stream")  # version 3; None: no synchronization needed
        except Exception as e:  # a malformed interface, whatever the error
            raise invalid_argument(name, f"has no usable __cuda_array_interface__ ({type(e).__name__}: {e})") from None
        self.code = _BY_TYPESTR.get(typestr)
        if self.code is None:
            raise invalid_argument(name, f"has typestr {typestr!r}; gnsilu takes float16 ('<f2') and float32 ('<f4') "
                                         "through __cuda_array_interface__ (for bfloat16 pass torch tensors)")
        if mask is not None:
            raise invalid_argument(name, "is a masked array; gnsilu takes plain arrays")
        if strides is not None and not _c_contiguous(self.shape, tuple(strides), _ITEM_SIZES[self.code]):
            raise invalid_argument(name, f"must be C-contiguous, got strides {tuple(strides)} for shape {self.shape}")


def _c_contiguous(shape, strides, item_size):
    if 0 in shape:
        return True
    expected = item_size
    for size, stride in reversed(list(zip(shape, strides))):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def _interface_parameter(value, name, channels):
    if value is None:
        return None, (None, NONE)
    if not hasattr(value, "__cuda_array_interface__"):
        raise invalid_argument(name, f"must have __cuda_array_interface__ like x, got {type(value).__name__}")
    interface = _Interface(value, name)
    if interface.shape != (channels,):
        raise invalid_argument(name, f"must have shape ({channels},) (C of x), got {interface.shape}")
    return interface, (interface.pointer, interface.code)


def _cupy_empty(x, shape, code):
    cupy = _optional_module("cupy")
    if cupy is None:
        raise invalid_argument("out", "x has __cuda_array_interface__ and CuPy is not installed, so gnsilu cannot "
                                      "allocate the result: pass out= (a C-contiguous array of x's shape on x's "
                                      "device), or use torch tensors")
    if code == BF16:
        raise invalid_argument("out_dtype", "CuPy has no bfloat16: pass out=, or use torch tensors")
    with cupy.asarray(x).device:
        return cupy.empty(shape, dtype=_NAMES[code])


def _interface_group_norm_silu(x, num_groups, weight, bias, eps, out_dtype, out, stream):
    x_interface = _Interface(x, "x")
    shape = _shape(x_interface.shape, "x")
    groups = _groups(num_groups, shape[1])
    eps = _eps(eps)
    weight_interface, weight_arg = _interface_parameter(weight, "weight", shape[1])
    bias_interface, bias_arg = _interface_parameter(bias, "bias", shape[1])
    given = [i for i in (x_interface, weight_interface, bias_interface) if i is not None]
    y_code = x_interface.code if out_dtype is None else _dtype_code(out_dtype, "out_dtype")
    if out is None:
        out = _cupy_empty(x, shape, y_code)
        y_interface = _Interface(out, "out")
    else:
        if not hasattr(out, "__cuda_array_interface__"):
            raise invalid_argument("out", f"must have __cuda_array_interface__ like x, got {type(out).__name__}")
        y_interface = _Interface(out, "out")
        given.append(y_interface)
        if out_dtype is not None and y_interface.code != y_code:
            raise invalid_argument("out_dtype", f"is {_NAMES[y_code]}, but out is {_NAMES[y_interface.code]}")
        if y_interface.shape != shape:
            raise invalid_argument("out", f"must have x's shape {shape}, got {y_interface.shape}")
        if y_interface.readonly:
            raise invalid_argument("out", "is read-only")
    if stream is not None:
        handle = _stream_handle(stream)
    else:
        streams = {i.stream for i in given if i.stream is not None}
        if len(streams) > 1:
            raise invalid_argument("stream", f"the arrays' __cuda_array_interface__ name different streams "
                                             f"{sorted(streams)}: make them ready on one stream and pass stream=")
        handle = streams.pop() if streams else 0
    if math.prod(shape) == 0:
        return out
    _run(x_interface.pointer, x_interface.code, y_interface.pointer, y_interface.code, shape, groups, weight_arg,
         bias_arg, eps, handle)
    return out


# ---- the public functions ---------------------------------------------------------------------------------------
def group_norm_silu(x, num_groups, weight=None, bias=None, eps=1e-6, out_dtype=None, out=None, stream=None):
    """y = silu(group_norm(x, num_groups, weight, bias, eps)) on the GPU, in one pass; returns y.

    x: a contiguous (N, C, *spatial) CUDA array, bfloat16, float16 or float32, as
      - a torch.Tensor: a non-contiguous x is copied with .contiguous() first (one more pass over memory; pass
        contiguous tensors for speed). The call runs on torch.cuda.current_stream(x.device) (use
        `with torch.cuda.stream(s):` for another stream; `stream` must be None). weight, bias and out must be
        on x's device. y is a new tensor from torch.empty on x's device unless out is given. Inputs that require
        grad raise InvalidArgumentError while grad mode is on (gnsilu has no backward; see gnsilu.torch).
      - an object with __cuda_array_interface__ (CuPy, Numba; float16 and float32 only): it must be C-contiguous,
        and so must weight, bias and out (objects with the interface too). Without out, the result is allocated
        with CuPy (which must then be installed). The call runs on `stream` if given, else on the stream the
        interfaces name (they must agree), else on the legacy default stream.
      - an object with __dlpack__ (JAX, ...): read with torch.from_dlpack when PyTorch is installed (the result
        is then a torch tensor), else with cupy.from_dlpack.
    num_groups: G >= 1 dividing C. weight, bias: C values each (any of the three dtypes), or None.
    eps: finite and > 0. out_dtype: the dtype of y (default: x's), as a torch/NumPy dtype or a name such as
    "bfloat16". out: where to write y (x itself is allowed when both dtypes have one size).
    stream: a CUstream handle (int), torch.cuda.Stream or CuPy stream, for __cuda_array_interface__ objects only.

    Arguments are checked in Python before anything else (InvalidArgumentError names the argument); zero-element
    tensors return at once. The library is loaded on the first call (LibraryNotFoundError if it cannot be).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if stream is not None:
            raise invalid_argument("stream", "must be None for torch tensors: the call runs on torch's current "
                                             "stream of x's device; use `with torch.cuda.stream(s):`")
        return _torch_group_norm_silu(torch, x, num_groups, weight, bias, eps, out_dtype, out)
    if hasattr(x, "__cuda_array_interface__"):
        return _interface_group_norm_silu(x, num_groups, weight, bias, eps, out_dtype, out, stream)
    if hasattr(x, "__dlpack__"):
        torch = _optional_module("torch")
        if torch is not None:
            return group_norm_silu(_as_torch(torch, x, "x"), num_groups, weight, bias, eps, out_dtype, out, stream)
        cupy = _optional_module("cupy")
        if cupy is not None:
            return _interface_group_norm_silu(cupy.from_dlpack(x), num_groups, weight, bias, eps, out_dtype, out,
                                              stream)
        raise invalid_argument("x", "is a DLPack object, but neither PyTorch nor CuPy is installed to read it")
    raise invalid_argument("x", "must be a CUDA array: a torch.Tensor, or an object with __cuda_array_interface__ "
                                f"or __dlpack__, got {type(x).__name__}")


def workspace_size(shape, num_groups):
    """Bytes of workspace a call on an x of this shape may need (internal workspaces are managed for you)."""
    shape = _shape(shape, "shape")
    groups = _groups(num_groups, shape[1])
    size = ctypes.c_size_t()
    _lib.call("gnsilu_workspace_size", _lib.int64_array(shape), len(shape), groups, ctypes.byref(size))
    return size.value


def check_device():
    """Returns None if a usable CUDA driver and device are present; raises NoDriverError or NoDeviceError."""
    _lib.call("gnsilu_check_device")


def release_workspaces():
    """Frees gnsilu's internal workspaces (call with no gnsilu work in flight; later calls allocate again)."""
    _lib.call("gnsilu_release_workspaces")


def set_tune_policy(policy):
    """The process's tuning policy: "on" (tune a key on first use), "cached" (cached entries only) or "off"."""
    if policy not in _TUNE_POLICIES:
        raise invalid_argument("policy", f"must be one of {', '.join(map(repr, _TUNE_POLICIES))}, got {policy!r}")
    _lib.call("gnsilu_set_tune_policy", _TUNE_POLICIES[policy])


def set_cache_paths(user, shared=()):
    """The cache files from now on: `user` (writable; None or "" keeps everything in memory) over the read-only
    files in `shared` (a path or a sequence of paths). Replaces GNSILU_CACHE and GNSILU_CACHE_SHARED."""
    if isinstance(shared, (str, bytes, os.PathLike)):
        shared = [shared]
    try:
        user = b"" if user is None else os.fsencode(user)
    except TypeError:
        raise invalid_argument("user", f"must be a path or None, got {type(user).__name__}") from None
    try:
        shared = [os.fsencode(path) for path in shared]
    except TypeError:
        raise invalid_argument("shared", f"must be a path or a sequence of paths, got {shared!r}") from None
    for path in shared:
        if b":" in path:
            raise invalid_argument("shared", f"{os.fsdecode(path)!r} contains ':', the separator of the C API")
    _lib.call("gnsilu_set_cache_paths", user, b":".join(p for p in shared if p) or None)


def version():
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return _lib.library()[0].gnsilu_version().decode()


def library_path():
    """The path libgnsilu.so was loaded from (loading it if needed)."""
    return _lib.library()[1]
