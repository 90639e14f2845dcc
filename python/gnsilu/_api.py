"""The functions of the package: argument checks in Python, then one call of the C API. The checks and codes shared
by every kind of array are in _checks.py; torch tensors go through _torch_adapter.py, __cuda_array_interface__
objects through _interface_adapter.py. The names below are also read from here by gnsilu.torch, gnsilu.split,
gnsilu.chunked, the tools and the tests."""
import ctypes
import os
import sys

from . import _lib
from ._checks import (ACTIVATION_NONE, ACTIVATION_SILU, BF16, CHANNELS_FIRST, CHANNELS_LAST, FP16, FP32, NONE,  # noqa: F401
                      _ACCEPTED, _BY_NAME, _ITEM_SIZES, _LAYOUT_CODES, _NAMES, _TUNE_POLICIES, _activation_code,
                      _c_contiguous, _channels_last_order, _dtype_code, _eps, _groups, _inverse, _optional_module,
                      _problem, _shape, _stream_handle, layout_of)
from ._errors import invalid_argument
from ._interface_adapter import _interface_group_norm
# torch_fast_call: gnsilu.torch calls it as _api.torch_fast_call (the GPU tests count its calls there). The fast path's
# table and limit (_fast_calls, _FAST_LIMIT) live in _torch_adapter alone.
from ._torch_adapter import (_as_torch, _torch_code, _torch_group_norm, _torch_input_bias,  # noqa: F401
                             _torch_operands, _torch_parameter, _torch_region, torch_fast_call)

# ---- the public functions ---------------------------------------------------------------------------------------
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None, out=None,
               stream=None, *, pad=None, pad_mode="constant", pad_value=0.0, input_bias=None):
    """y = silu(group_norm(x, num_groups, weight, bias, eps)), or group_norm(...) alone with activation=None, on
    the GPU; returns y.

    x: an (N, C, *spatial) CUDA array (N >= 0, C >= 1, any number of spatial dimensions), bfloat16, float16 or
    float32, channels-first (C-contiguous: torch.contiguous_format) or channels-last (channel dimension
    innermost: torch.channels_last, channels_last_3d, and (N, C, L) with strides (L*C, 1, C), as
    hidden_states.transpose(1, 2) gives); see layout_of. Both go to the library as they are, and give the same
    bits. y is written in x's layout. As
      - a torch.Tensor: an x in neither layout (gaps, stride 0, dense in another order) is copied first, with
        .contiguous() (into out's layout when out is given): one more pass over memory. The call runs on
        torch.cuda.current_stream(x.device) (use `with torch.cuda.stream(s):` for another stream; `stream` must
        be None). weight, bias and out must be on x's device. Without out, y is a new tensor on x's device in x's
        memory format (contiguous when x was copied), like torch.empty_like(x)'s preserve_format. Inputs that require
        grad raise InvalidArgumentError while grad mode is on (gnsilu has no backward; see gnsilu.torch).
      - an object with __cuda_array_interface__ (CuPy, Numba; float16 and float32 only): it must be C-contiguous
        or channels-last (strides in bytes), out in the same layout, weight and bias contiguous (objects with the
        interface too); nothing is copied. Without out, the result is allocated with CuPy (which must then be
        installed), in x's layout. The call runs on `stream` if given, else on the stream the interfaces name (they
        must agree), else on the legacy default stream.
      - an object with __dlpack__ (JAX, ...): read with torch.from_dlpack when PyTorch is installed (the result
        is then a torch tensor), else with cupy.from_dlpack.
    num_groups: G >= 1 dividing C. weight, bias: C values each (any of the three dtypes), or None.
    eps: finite and > 0. activation: "silu" (the default: y = silu(group_norm(x))), or None or "none" (y =
    group_norm(x), as torch.nn.functional.group_norm). out_dtype: the dtype of y (default: x's), as a torch/NumPy
    dtype or a name such as "bfloat16". out: where to write y, in x's layout (x itself is allowed when both dtypes
    have one size). stream: a CUstream handle (int), torch.cuda.Stream or CuPy stream, for
    __cuda_array_interface__ objects only.
    pad, pad_mode, pad_value (torch tensors only): y = F.pad(y, pad, mode=pad_mode, value=pad_value) written by the
    same call (the border in the same launch as the interior, bit for bit what F.pad of the unpadded y holds):
    pad lists 2, 4 or 6 widths >= 0, last dimension first, as F.pad; pad_mode "constant" (pad_value, rounded to y's
    dtype) or "replicate". y (or out) then has the padded shape, in x's layout.
    input_bias (torch tensors only): C values of x's dtype on x's device, or None (the default). The tensor
    normalized is then x + input_bias[c], each sum rounded to x's dtype: y is group_norm(x + input_bias.view(1, C,
    1, ...)) as PyTorch adds them in x's dtype, bit for bit what gnsilu gives on that sum, in the statistics and the
    output alike, without a pass of its own (a convolution's bias handed over: conv(x, w, None) then input_bias=b).
    Like weight and bias, it is made contiguous first where it is not; it requires no grad in grad mode.

    Arguments are checked in Python before anything else (InvalidArgumentError names the argument); zero-element
    tensors return at once. The library is loaded on the first call (LibraryNotFoundError if it cannot be).
    """
    activation_code = _activation_code(activation)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if stream is not None:
            raise invalid_argument("stream", "must be None for torch tensors: the call runs on torch's current "
                                             "stream of x's device; use `with torch.cuda.stream(s):`")
        return _torch_group_norm(torch, x, num_groups, weight, bias, eps, activation_code, out_dtype, out, pad,
                                 pad_mode, pad_value, input_bias)
    if pad is not None:
        raise invalid_argument("pad", "is supported for torch tensors (a padded output of other arrays: not yet)")
    if hasattr(x, "__cuda_array_interface__"):
        if input_bias is not None:
            raise invalid_argument("input_bias", "is supported for torch tensors (with other arrays: not yet)")
        return _interface_group_norm(x, num_groups, weight, bias, eps, activation_code, out_dtype, out, stream)
    if hasattr(x, "__dlpack__"):
        torch = _optional_module("torch")
        if torch is not None:
            return group_norm(_as_torch(torch, x, "x"), num_groups, weight, bias, eps, activation, out_dtype, out,
                              stream, input_bias=input_bias)
        cupy = _optional_module("cupy")
        if cupy is not None:
            if input_bias is not None:
                raise invalid_argument("input_bias", "is supported for torch tensors (with other arrays: not yet)")
            return _interface_group_norm(cupy.from_dlpack(x), num_groups, weight, bias, eps, activation_code,
                                         out_dtype, out, stream)
        raise invalid_argument("x", "is a DLPack object, but neither PyTorch nor CuPy is installed to read it")
    raise invalid_argument("x", "must be a CUDA array: a torch.Tensor, or an object with __cuda_array_interface__ "
                                f"or __dlpack__, got {type(x).__name__}")


# ---- statistics of regions, merged, then applied (torch tensors) ---------------------------------------------
STATS_WORDS = 32  # int64 words of one (sample, group) record: GNSILU_STATS_WORDS


def group_stats(x, num_groups, *, input_bias=None):
    """The exact statistics of x's groups, as a torch.int64 tensor of shape (N, num_groups, STATS_WORDS) on x's
    device: per (sample, group), the exact sum and sum of squares of its elements (docs/EXACT_STATISTICS.md); with
    input_bias (C values of x's dtype, as group_norm takes it), those of x + input_bias[c], each sum rounded to x's
    dtype (pass the same input_bias to every region and to group_norm_apply).

    x is any region of a larger tensor (a tile, a frame, a rank's part), with the whole tensor's N, C and groups:
    stats of the regions of any partition, added together (merge_stats, or `a + b`, or torch.distributed.all_reduce
    with SUM), are the whole tensor's, and group_norm_apply(x, merged) equals group_norm(x) bit for bit. A view in
    neither memory layout is copied first. Runs on torch.cuda.current_stream(x.device); a CPU tensor goes to the
    library's CPU reference (the same records, for tests and small CPU runs)."""
    torch = _optional_module("torch")
    if torch is None:
        raise invalid_argument("x", "must be a torch.Tensor (group_stats needs PyTorch)")
    x_code = _torch_code(torch, x, "x") if isinstance(x, torch.Tensor) else None
    x, layout = _torch_region(torch, x, "x")
    shape = _shape(x.shape, "x")
    groups = _groups(num_groups, shape[1])
    input_bias, input_bias_arg = _torch_input_bias(torch, input_bias, x, shape[1])  # held until the call returns
    stats = torch.zeros((shape[0], groups, STATS_WORDS), dtype=torch.int64, device=x.device)
    if stats.numel() == 0:
        return stats
    problem = _problem(x.data_ptr() if x.numel() else None, x_code, None, x_code, layout, shape, groups,
                       (None, NONE), (None, NONE), 1e-6, 0, input_bias=input_bias_arg)
    if not x.is_cuda:
        _lib.call("gnsilu_reference_group_stats", ctypes.byref(problem), stats.data_ptr(), 0)
        return stats
    with torch.cuda.device(x.device):
        _lib.call("gnsilu_group_stats", ctypes.byref(problem), stats.data_ptr(), None, 0,
                  torch.cuda.current_stream(x.device).cuda_stream)
    return stats


def merge_stats(*stats):
    """The sum of group_stats records (exact: integer addition, in any order)."""
    if not stats:
        raise invalid_argument("stats", "needs at least one record tensor")
    total = stats[0].clone()
    for s in stats[1:]:
        if tuple(s.shape) != tuple(total.shape):
            raise invalid_argument("stats", f"records of different shapes: {tuple(total.shape)} and {tuple(s.shape)}")
        total += s
    return total


def all_reduce_stats(stats, group=None):
    """Merges group_stats records across the processes of a torch.distributed process group, in place: an
    all-reduce SUM of the int64 words (exact, so every rank gets the records of the whole tensor whatever the
    backend's reduction order). Returns stats."""
    import torch.distributed as dist  # only here: the package itself does not need torch
    if not isinstance(stats, sys.modules["torch"].Tensor) or stats.dtype != sys.modules["torch"].int64:
        raise invalid_argument("stats", "must be a torch.int64 tensor of group_stats records")
    dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
    return stats


def group_norm_apply(x, stats, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None, out=None, *,
                     input_bias=None):
    """y = silu(group_norm(x)) (or group_norm(x) with activation=None) with the given statistics (group_stats
    records, usually merged over the regions of a larger tensor) instead of x's own; returns y, in x's layout.
    Arguments as group_norm for torch tensors (input_bias: the one the statistics were taken with, added to x
    here too); stats: a torch.int64 tensor (N, num_groups, STATS_WORDS) on x's device. CPU tensors go to the
    library's CPU reference (the same bits)."""
    torch = _optional_module("torch")
    activation_code = _activation_code(activation)
    if torch is None or not isinstance(stats, torch.Tensor):
        raise invalid_argument("stats", "must be a torch.Tensor of int64 records from group_stats")
    if stats.dtype != torch.int64 or stats.dim() != 3 or stats.shape[2] != STATS_WORDS:
        raise invalid_argument("stats", f"must be int64 of shape (N, num_groups, {STATS_WORDS}), got "
                                        f"{stats.dtype} {tuple(stats.shape)}")
    x_code = _torch_code(torch, x, "x") if isinstance(x, torch.Tensor) else None
    x, _ = _torch_region(torch, x, "x")
    shape = _shape(x.shape, "x")
    if stats.shape[0] != shape[0]:
        raise invalid_argument("stats", f"holds {stats.shape[0]} samples, but x has N = {shape[0]}")
    groups = _groups(int(stats.shape[1]), shape[1])
    if stats.device != x.device:
        raise invalid_argument("stats", f"is on {stats.device}, but x is on {x.device}")
    stats = stats.contiguous()
    eps = _eps(eps)
    weight_tensor, weight_arg = _torch_parameter(torch, weight, "weight", x, shape[1])  # held until the call returns
    bias_tensor, bias_arg = _torch_parameter(torch, bias, "bias", x, shape[1])
    input_bias_tensor, input_bias_arg = _torch_input_bias(torch, input_bias, x, shape[1])
    y_code = x_code if out_dtype is None else _dtype_code(out_dtype, "out_dtype")
    dtypes = {BF16: torch.bfloat16, FP16: torch.float16, FP32: torch.float32}
    x, y, layout = _torch_operands(torch, x, None if out is None else _as_torch(torch, out, "out"), dtypes[y_code])
    if out is not None:
        y_code = _torch_code(torch, y, "out")
        if tuple(y.shape) != shape:
            raise invalid_argument("out", f"must have x's shape {shape}, got {tuple(y.shape)}")
    if x.numel() == 0:
        return y
    problem = _problem(x.data_ptr(), x_code, y.data_ptr(), y_code, layout, shape, groups, weight_arg, bias_arg, eps,
                       activation_code, input_bias=input_bias_arg)
    if not x.is_cuda:
        _lib.call("gnsilu_reference_group_norm_apply", ctypes.byref(problem), stats.data_ptr(), 0)
        del weight_tensor, bias_tensor, input_bias_tensor
        return y
    with torch.cuda.device(x.device):
        _lib.call("gnsilu_group_norm_apply", ctypes.byref(problem), stats.data_ptr(), None, 0,
                  torch.cuda.current_stream(x.device).cuda_stream)
    del weight_tensor, bias_tensor, input_bias_tensor
    return y


def group_norm_silu(x, num_groups, weight=None, bias=None, eps=1e-6, out_dtype=None, out=None, stream=None, *,
                    input_bias=None):
    """y = silu(group_norm(x, num_groups, weight, bias, eps)) on the GPU, in one pass; returns y.

    group_norm(x, num_groups, weight, bias, eps, activation="silu", out_dtype=out_dtype, out=out, stream=stream,
    input_bias=input_bias): the arrays it takes (channels-first or channels-last), the copies it makes, the layout
    of y and the input bias are described there.
    """
    return group_norm(x, num_groups, weight, bias, eps, "silu", out_dtype, out, stream, input_bias=input_bias)


def workspace_size(shape, num_groups):
    """Bytes of workspace a call on an x of this shape may need (internal workspaces are managed for you). The
    same for every dtype, layout (shape is (N, C, *spatial) in both) and activation."""
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
