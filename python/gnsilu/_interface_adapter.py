"""Objects with __cuda_array_interface__ (CuPy, Numba, ...): their pointers, dtypes and strides read and checked,
nothing copied; results allocated with CuPy."""
import math

from ._checks import (BF16, NONE, _BY_TYPESTR, _ITEM_SIZES, _LAYOUT_WORDS, _NAMES, _channels_last_order, _dtype_code,
                      _eps, _groups, _inverse, _optional_module, _run, _shape, _stream_handle, layout_of)
from ._errors import invalid_argument

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
