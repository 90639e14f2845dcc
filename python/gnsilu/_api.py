"""The functions of the package: argument checks in Python, then one call of the C API (gnsilu_group_norm)."""
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
# gnsilu_layout and gnsilu_activation codes (include/gnsilu/gnsilu.h). Layouts go by name in Python
# ("channels_first", "channels_last": what layout_of returns) and become codes at the C call.
CHANNELS_FIRST, CHANNELS_LAST = 0, 1
ACTIVATION_SILU, ACTIVATION_NONE = 0, 1
_LAYOUT_CODES = {"channels_first": CHANNELS_FIRST, "channels_last": CHANNELS_LAST}
_LAYOUT_WORDS = {"channels_first": "channels-first (contiguous)", "channels_last": "channels-last"}
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


def _activation_code(activation):
    """The gnsilu_activation of "silu", or of None / "none" (plain group_norm)."""
    if activation is None or (isinstance(activation, str) and activation == "none"):
        return ACTIVATION_NONE
    if isinstance(activation, str) and activation == "silu":
        return ACTIVATION_SILU
    raise invalid_argument("activation", f"must be \"silu\" (y = silu(group_norm(x))) or None / \"none\" "
                                         f"(y = group_norm(x)), got {activation!r}")


# ---- memory layouts ---------------------------------------------------------------------------------------------
def _c_contiguous(shape, strides, item_size):
    if 0 in shape:
        return True
    expected = item_size
    for size, stride in reversed(list(zip(shape, strides))):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def _channels_last_order(ndim):
    """The dimensions of an (N, C, *spatial) array from outermost to innermost in channels-last memory:
    (0, 2, ..., ndim - 1, 1)."""
    return (0, *range(2, ndim), 1)


def _inverse(order):
    """The permutation that undoes `order`: t.permute(order).permute(inverse) has t's dimensions in t's order."""
    inverse = [0] * len(order)
    for position, dimension in enumerate(order):
        inverse[dimension] = position
    return tuple(inverse)


def layout_of(shape, strides, item_size=1):
    """How a dense (N, C, *spatial) array lies in memory, from its sizes and strides alone (a pure function).

    strides count elements (torch's Tensor.stride()) or, with item_size, bytes (__cuda_array_interface__).
    Returns "channels_first" when the strides are those of a C-contiguous array (torch.contiguous_format),
    "channels_last" when they are those of a C-contiguous (N, *spatial, C) array seen as (N, C, *spatial), that
    is channel dimension innermost (torch.channels_last for 4-D, channels_last_3d for 5-D, and the same rule for
    any rank >= 3: (N, C, L) with strides (L*C, 1, C) is channels-last), and None for anything else (gaps,
    overlaps, or dense in another order): gnsilu's C API takes the first two as they are. The strides of size-1
    dimensions do not matter, nor do any where there are no elements. An array that is both (C = 1, or a single
    spatial element) is "channels_first", which is then the same memory.
    """
    shape, strides = tuple(shape), tuple(strides)
    if len(shape) != len(strides):
        return None
    if _c_contiguous(shape, strides, item_size):
        return "channels_first"
    if len(shape) >= 3:
        order = _channels_last_order(len(shape))
        if _c_contiguous([shape[d] for d in order], [strides[d] for d in order], item_size):
            return "channels_last"
    return None


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


def _problem(x_ptr, x_code, y_ptr, y_code, layout, shape, groups, weight, bias, eps, activation):
    """The gnsilu_problem of a call (weight and bias are (pointer or None, gnsilu_dtype); x and y both lie in
    `layout`, a name from layout_of). It holds the ctypes array of its shape."""
    code = _LAYOUT_CODES[layout]
    return _lib.problem(x=x_ptr, x_dtype=x_code, x_layout=code, y=y_ptr, y_dtype=y_code, y_layout=code,
                        shape=_lib.int64_array(shape), ndim=len(shape), num_groups=groups, weight=weight[0],
                        weight_dtype=weight[1], bias=bias[0], bias_dtype=bias[1], eps=eps, activation=activation)


def _run(x_ptr, x_code, y_ptr, y_code, layout, shape, groups, weight, bias, eps, activation, stream):
    """The C call, gnsilu_group_norm, of _problem(...) on `stream`."""
    problem = _problem(x_ptr, x_code, y_ptr, y_code, layout, shape, groups, weight, bias, eps, activation)
    _lib.call("gnsilu_group_norm", ctypes.byref(problem), None, 0, stream)


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


def _torch_empty(torch, shape, dtype, device, layout):
    """A new tensor of `shape` in `layout` (for channels-last: torch.empty of the (N, *spatial, C) shape, permuted
    to (N, C, *spatial), which is torch.channels_last / channels_last_3d for 4-D / 5-D and the same for any rank)."""
    if layout == "channels_last":
        order = _channels_last_order(len(shape))
        return torch.empty([shape[d] for d in order], dtype=dtype, device=device).permute(_inverse(order))
    return torch.empty(shape, dtype=dtype, device=device)


def _torch_in_layout(x, layout):
    """A dense copy of x in `layout` (for an x that is in neither)."""
    if layout == "channels_last":
        order = _channels_last_order(x.dim())
        return x.permute(order).contiguous().permute(_inverse(order))
    return x.contiguous()


def _torch_operands(torch, x, y, y_dtype):
    """(x, y, layout) as gnsilu_group_norm takes them: x itself when layout_of finds it in either layout, else a
    dense copy (in out's layout when out is given, else contiguous); y, when None, a new tensor of y_dtype on x's
    device in that layout. A given y must be in x's layout (InvalidArgumentError naming 'out')."""
    shape = tuple(x.shape)
    x_layout = layout_of(shape, x.stride())
    if y is None:
        layout = x_layout or "channels_first"
        if x_layout is not None:
            y = torch.empty_like(x, dtype=y_dtype)  # x's very strides (also those of dimensions of size 1)
        else:
            y = _torch_empty(torch, shape, y_dtype, x.device, layout)
    else:
        layout = layout_of(shape, y.stride())
        if layout is None:
            raise invalid_argument("out", f"must be dense, contiguous or channels-last (gnsilu writes y as one "
                                          f"dense block in x's layout), got strides {tuple(y.stride())} for shape "
                                          f"{shape}")
        if x_layout is not None and layout != x_layout:
            raise invalid_argument("out", f"is {_LAYOUT_WORDS[layout]} but x is {_LAYOUT_WORDS[x_layout]}: gnsilu "
                                          "writes y in x's memory layout")
    if x_layout is None:
        x = _torch_in_layout(x, layout)  # a copy only when x is in neither layout (documented)
    return x, y, layout


# ---- the fast path: calls whose arguments were checked before --------------------------------------------------
# A torch call with out=None whose key (x's shape, strides, dtype and device; num_groups, eps, activation, out_dtype;
# weight's and bias's type, dtype, device, shape and strides) was checked and run before skips the checks and the
# building of its gnsilu_problem: a copy of the one made then, with this call's pointers. What the library does is
# the same (it checks the problem again in C); only Python's share of the host time shrinks. Grad mode with inputs
# that require grad always takes the checked path (which refuses them).
_FAST_LIMIT = 1024  # keys kept; the table starts again when full


class _FastCall:
    __slots__ = ("template", "shape", "y_dtype", "function")

    def __init__(self, problem, y_dtype, function):
        self.template = bytes(problem)  # the problem with null pointers for x, y, weight and bias
        self.shape = problem.shape  # keeps the shape array alive for the copies, which point to it
        self.y_dtype = y_dtype
        self.function = function


_fast_calls = {}


def _parameter_key(torch, value):
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise TypeError  # not a key: the checked path
    return (type(value), value.dtype, value.device, value.shape, value.stride())


def _fast_key(torch, x, num_groups, weight, bias, eps, activation, out_dtype):
    """The fast-path key of a call, or None where it has none (an unhashable or non-tensor argument)."""
    try:
        key = (type(x), x.shape, x.stride(), x.dtype, x.device, type(num_groups), num_groups, type(eps), eps,
               activation, out_dtype, _parameter_key(torch, weight), _parameter_key(torch, bias))
        hash(key)
    except TypeError:
        return None
    return key


def _raw_stream(torch):
    """A function of a device index giving the handle of torch's current stream there."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def torch_fast_call(torch, x, num_groups, weight, bias, eps, activation, out_dtype, key=None):
    """y of group_norm(x, num_groups, weight, bias, eps, activation code, out_dtype) with out=None through the fast
    path, or None where it does not apply (a key not run before, inputs that require grad in grad mode): then the
    checked path must be taken. `key`: the call's _fast_key when the caller has it already."""
    if key is None:
        key = _fast_key(torch, x, num_groups, weight, bias, eps, activation, out_dtype)
    entry = _fast_calls.get(key) if key is not None else None
    if entry is None or (torch.is_grad_enabled() and (
            x.requires_grad or (weight is not None and weight.requires_grad)
            or (bias is not None and bias.requires_grad))):
        return None
    y = torch.empty_like(x, dtype=entry.y_dtype)  # x is dense in its layout: y gets its strides
    problem = _lib.Problem.from_buffer_copy(entry.template)
    problem.x = x.data_ptr()
    problem.y = y.data_ptr()
    if weight is not None:
        problem.weight = weight.data_ptr()
    if bias is not None:
        problem.bias = bias.data_ptr()
    index = x.device.index
    if index == torch.cuda.current_device():
        status = entry.function(ctypes.byref(problem), None, 0, _raw_stream(torch)(index))
    else:
        with torch.cuda.device(index):
            status = entry.function(ctypes.byref(problem), None, 0, _raw_stream(torch)(index))
    if status != 0:
        _lib.raise_for_status(status)
    return y


def _torch_group_norm(torch, x, num_groups, weight, bias, eps, activation, out_dtype, out):
    key = None
    if out is None:
        key = _fast_key(torch, x, num_groups, weight, bias, eps, activation, out_dtype)
        y = torch_fast_call(torch, x, num_groups, weight, bias, eps, activation, out_dtype, key)
        if y is not None:
            return y
    if not x.is_cuda:
        raise invalid_argument("x", f"must be a CUDA tensor, got one on {x.device}")
    x_code = _torch_code(torch, x, "x")
    shape = _shape(x.shape, "x")
    groups = _groups(num_groups, shape[1])
    eps = _eps(eps)
    weight_tensor, weight_arg = _torch_parameter(torch, weight, "weight", x, shape[1])
    bias_tensor, bias_arg = _torch_parameter(torch, bias, "bias", x, shape[1])
    y_code = x_code if out_dtype is None else _dtype_code(out_dtype, "out_dtype")
    dtypes = {BF16: torch.bfloat16, FP16: torch.float16, FP32: torch.float32}
    if out is None:
        result = y = None  # made by _torch_operands, in x's layout
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
    if torch.is_grad_enabled():
        for name, tensor in (("x", x), ("weight", weight_tensor), ("bias", bias_tensor), ("out", y)):
            if tensor is not None and tensor.requires_grad:
                raise invalid_argument(name, "requires grad, but gnsilu computes no gradients: call it under "
                                             "torch.no_grad() or torch.inference_mode(), or use "
                                             "gnsilu.torch.GroupNorm / GroupNormSiLU, which then run PyTorch's "
                                             "ops")
    x_before = x
    x, y, layout = _torch_operands(torch, x, y, dtypes[y_code])
    if result is None:
        result = y
    if x.numel() == 0:
        return result
    problem = _problem(x.data_ptr(), x_code, y.data_ptr(), y_code, layout, shape, groups, weight_arg, bias_arg,
                       eps, activation)
    with torch.cuda.device(x.device):
        _lib.call("gnsilu_group_norm", ctypes.byref(problem), None, 0,
                  torch.cuda.current_stream(x.device).cuda_stream)
    fast = (key is not None and result is y and layout_of(shape, x_before.stride()) is not None
            and all(t is None or t.stride() == (1,) for t in (weight, bias)))
    if fast and _FAST_LIMIT > 0:
        problem.x = problem.y = problem.weight = problem.bias = None
        if len(_fast_calls) >= _FAST_LIMIT:
            _fast_calls.clear()
        _fast_calls[key] = _FastCall(problem, dtypes[y_code], _lib.library()[0].gnsilu_group_norm)
    return result


# ---- __cuda_array_interface__ objects (CuPy, Numba, ...) -------------------------------------------------------
class _Interface:
    """What gnsilu needs from an object's __cuda_array_interface__. `layout` is layout_of's name for its strides
    ("channels_first" for C-contiguous, also where the interface gives no strides); arrays in neither layout are
    refused (InvalidArgumentError naming the argument): there is no copy for these."""

    def __init__(self, value, name):
        try:
            interface = value.__cuda_array_interface__
            self.shape = tuple(int(s) for s in interface["shape"])
            typestr = interface["typestr"]
            self.pointer, self.readonly = interface["data"]
            strides = interface.get("strides")
            if strides is not None:
                strides = tuple(int(s) for s in strides)
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
        self.layout = "channels_first" if strides is None else layout_of(self.shape, strides, _ITEM_SIZES[self.code])
        if self.layout is None:
            also = " or channels-last (N, *spatial, C order: channel dimension innermost)" if len(self.shape) >= 3 \
                else ""
            raise invalid_argument(name, f"must be C-contiguous{also}, got strides {strides} (bytes) for shape "
                                         f"{self.shape}")


def _interface_parameter(value, name, channels):
    if value is None:
        return None, (None, NONE)
    if not hasattr(value, "__cuda_array_interface__"):
        raise invalid_argument(name, f"must have __cuda_array_interface__ like x, got {type(value).__name__}")
    interface = _Interface(value, name)
    if interface.shape != (channels,):
        raise invalid_argument(name, f"must have shape ({channels},) (C of x), got {interface.shape}")
    return interface, (interface.pointer, interface.code)


def _cupy_empty(x, shape, code, layout):
    """A new CuPy array of `shape` in `layout` (channels-last: the (N, *spatial, C) array, transposed)."""
    cupy = _optional_module("cupy")
    if cupy is None:
        raise invalid_argument("out", "x has __cuda_array_interface__ and CuPy is not installed, so gnsilu cannot "
                                      "allocate the result: pass out= (an array of x's shape in x's layout on x's "
                                      "device), or use torch tensors")
    if code == BF16:
        raise invalid_argument("out_dtype", "CuPy has no bfloat16: pass out=, or use torch tensors")
    with cupy.asarray(x).device:
        if layout == "channels_last":
            order = _channels_last_order(len(shape))
            return cupy.empty([shape[d] for d in order], dtype=_NAMES[code]).transpose(_inverse(order))
        return cupy.empty(shape, dtype=_NAMES[code])


def _interface_group_norm(x, num_groups, weight, bias, eps, activation, out_dtype, out, stream):
    x_interface = _Interface(x, "x")
    shape = _shape(x_interface.shape, "x")
    groups = _groups(num_groups, shape[1])
    eps = _eps(eps)
    weight_interface, weight_arg = _interface_parameter(weight, "weight", shape[1])
    bias_interface, bias_arg = _interface_parameter(bias, "bias", shape[1])
    given = [i for i in (x_interface, weight_interface, bias_interface) if i is not None]
    y_code = x_interface.code if out_dtype is None else _dtype_code(out_dtype, "out_dtype")
    if out is None:
        out = _cupy_empty(x, shape, y_code, x_interface.layout)
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
        if y_interface.layout != x_interface.layout:
            raise invalid_argument("out", f"is {_LAYOUT_WORDS[y_interface.layout]} but x is "
                                          f"{_LAYOUT_WORDS[x_interface.layout]}: gnsilu writes y in x's memory layout")
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
    _run(x_interface.pointer, x_interface.code, y_interface.pointer, y_interface.code, x_interface.layout, shape,
         groups, weight_arg, bias_arg, eps, activation, handle)
    return out


# ---- the public functions ---------------------------------------------------------------------------------------
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None, out=None,
               stream=None):
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

    Arguments are checked in Python before anything else (InvalidArgumentError names the argument); zero-element
    tensors return at once. The library is loaded on the first call (LibraryNotFoundError if it cannot be).
    """
    activation_code = _activation_code(activation)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if stream is not None:
            raise invalid_argument("stream", "must be None for torch tensors: the call runs on torch's current "
                                             "stream of x's device; use `with torch.cuda.stream(s):`")
        return _torch_group_norm(torch, x, num_groups, weight, bias, eps, activation_code, out_dtype, out)
    if hasattr(x, "__cuda_array_interface__"):
        return _interface_group_norm(x, num_groups, weight, bias, eps, activation_code, out_dtype, out, stream)
    if hasattr(x, "__dlpack__"):
        torch = _optional_module("torch")
        if torch is not None:
            return group_norm(_as_torch(torch, x, "x"), num_groups, weight, bias, eps, activation, out_dtype, out,
                              stream)
        cupy = _optional_module("cupy")
        if cupy is not None:
            return _interface_group_norm(cupy.from_dlpack(x), num_groups, weight, bias, eps, activation_code,
                                         out_dtype, out, stream)
        raise invalid_argument("x", "is a DLPack object, but neither PyTorch nor CuPy is installed to read it")
    raise invalid_argument("x", "must be a CUDA array: a torch.Tensor, or an object with __cuda_array_interface__ "
                                f"or __dlpack__, got {type(x).__name__}")


# ---- statistics of regions, merged, then applied (torch tensors) ---------------------------------------------
STATS_WORDS = 32  # int64 words of one (sample, group) record: GNSILU_STATS_WORDS


def _torch_region(torch, x, name):
    """x as a dense tensor in one of the two layouts (a copy for a strided view in neither), and that layout. CUDA
    and CPU tensors (CPU ones go to the library's CPU reference: the same records and bits, slowly)."""
    if not isinstance(x, torch.Tensor):
        raise invalid_argument(name, f"must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_cuda and x.device.type != "cpu":
        raise invalid_argument(name, f"must be a CUDA or CPU tensor, got one on {x.device}")
    layout = layout_of(tuple(x.shape), x.stride())
    if layout is None:
        layout = "channels_first"
        x = x.contiguous()  # a view in neither layout (a tile cut out of a larger tensor): one copy
    return x, layout


def group_stats(x, num_groups):
    """The exact statistics of x's groups, as a torch.int64 tensor of shape (N, num_groups, STATS_WORDS) on x's
    device: per (sample, group), the exact sum and sum of squares of its elements (docs/EXACT_STATISTICS.md).

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
    stats = torch.zeros((shape[0], groups, STATS_WORDS), dtype=torch.int64, device=x.device)
    if stats.numel() == 0:
        return stats
    problem = _problem(x.data_ptr() if x.numel() else None, x_code, None, x_code, layout, shape, groups,
                       (None, NONE), (None, NONE), 1e-6, 0)
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


def group_norm_apply(x, stats, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None, out=None):
    """y = silu(group_norm(x)) (or group_norm(x) with activation=None) with the given statistics (group_stats
    records, usually merged over the regions of a larger tensor) instead of x's own; returns y, in x's layout.
    Arguments as group_norm for torch tensors; stats: a torch.int64 tensor (N, num_groups, STATS_WORDS) on x's
    device. CPU tensors go to the library's CPU reference (the same bits)."""
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
                       activation_code)
    if not x.is_cuda:
        _lib.call("gnsilu_reference_group_norm_apply", ctypes.byref(problem), stats.data_ptr(), 0)
        del weight_tensor, bias_tensor
        return y
    with torch.cuda.device(x.device):
        _lib.call("gnsilu_group_norm_apply", ctypes.byref(problem), stats.data_ptr(), None, 0,
                  torch.cuda.current_stream(x.device).cuda_stream)
    del weight_tensor, bias_tensor
    return y


def group_norm_silu(x, num_groups, weight=None, bias=None, eps=1e-6, out_dtype=None, out=None, stream=None):
    """y = silu(group_norm(x, num_groups, weight, bias, eps)) on the GPU, in one pass; returns y.

    group_norm(x, num_groups, weight, bias, eps, activation="silu", out_dtype=out_dtype, out=out, stream=stream):
    the arrays it takes (channels-first or channels-last), the copies it makes and the layout of y are described
    there.
    """
    return group_norm(x, num_groups, weight, bias, eps, "silu", out_dtype, out, stream)


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
