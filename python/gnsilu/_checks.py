"""What every kind of array shares: the C API's codes, the argument checks (InvalidArgumentError names the argument),
the two memory layouts (layout_of) and the one C call of a checked problem. The adapters (_torch_adapter.py,
_interface_adapter.py) and the public functions (_api.py) build on it."""
import ctypes
import importlib
import math
import operator
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


PAD_CONSTANT, PAD_REPLICATE = 0, 1  # gnsilu_pad_mode
_PAD_MODES = {"constant": PAD_CONSTANT, "replicate": PAD_REPLICATE}


def _pad(pad, shape):
    """F.pad's widths (last dimension first) as a tuple of ints, checked against x's shape: 2, 4 or 6 of them, >= 0,
    on at most the last three spatial dimensions."""
    try:
        widths = tuple(operator.index(w) for w in pad)
    except TypeError:
        raise invalid_argument("pad", f"must be a sequence of integers (F.pad's widths), got {pad!r}") from None
    if len(widths) not in (2, 4, 6):
        raise invalid_argument("pad", f"must hold 2, 4 or 6 widths (two per padded dimension, last dimension "
                                      f"first, as F.pad), got {len(widths)}")
    if len(widths) // 2 > len(shape) - 2:
        raise invalid_argument("pad", f"pads {len(widths) // 2} dimensions, but x has {len(shape) - 2} spatial "
                                      "dimensions")
    if any(w < 0 for w in widths):
        raise invalid_argument("pad", f"widths must be >= 0 (gnsilu pads, it does not crop), got {widths}")
    return widths


def _pad_mode(mode):
    if mode not in _PAD_MODES:
        raise invalid_argument("pad_mode", f"must be \"constant\" or \"replicate\", got {mode!r}")
    return _PAD_MODES[mode]


def _padded_shape(shape, pad):
    """The shape of F.pad(x, pad) for an x of `shape`."""
    shape = list(shape)
    for k in range(len(pad) // 2):
        shape[len(shape) - 1 - k] += pad[2 * k] + pad[2 * k + 1]
    return tuple(shape)


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


def _problem(x_ptr, x_code, y_ptr, y_code, layout, shape, groups, weight, bias, eps, activation, pad=None,
             pad_mode=PAD_CONSTANT, pad_value=0.0, input_bias=None):
    """The gnsilu_problem of a call (weight and bias are (pointer or None, gnsilu_dtype); x and y both lie in
    `layout`, a name from layout_of; pad: checked widths (_pad) or None; input_bias: a pointer to C values of x's
    dtype, or None). It holds the ctypes arrays it points to."""
    code = _LAYOUT_CODES[layout]
    padding = {} if not pad else dict(pad=_lib.int64_array(pad), pad_count=len(pad), pad_mode=pad_mode,
                                      pad_value=float(pad_value))
    return _lib.problem(x=x_ptr, x_dtype=x_code, x_layout=code, y=y_ptr, y_dtype=y_code, y_layout=code,
                        shape=_lib.int64_array(shape), ndim=len(shape), num_groups=groups, weight=weight[0],
                        weight_dtype=weight[1], bias=bias[0], bias_dtype=bias[1], eps=eps, activation=activation,
                        input_bias=input_bias, **padding)


def _run(x_ptr, x_code, y_ptr, y_code, layout, shape, groups, weight, bias, eps, activation, stream):
    """The C call, gnsilu_group_norm, of _problem(...) on `stream`."""
    problem = _problem(x_ptr, x_code, y_ptr, y_code, layout, shape, groups, weight, bias, eps, activation)
    _lib.call("gnsilu_group_norm", ctypes.byref(problem), None, 0, stream)
