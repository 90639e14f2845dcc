"""torch.Tensor arguments: dtypes, devices and layouts checked and turned into the C call's problem, the fast path
for calls whose arguments were checked before (torch_fast_call), and regions of tensors (_torch_region)."""
import ctypes

from . import _lib
from ._checks import (BF16, FP16, FP32, NONE, PAD_CONSTANT, _ACCEPTED, _LAYOUT_WORDS, _NAMES, _channels_last_order,
                      _dtype_code, _eps, _groups, _inverse, _pad, _pad_mode, _padded_shape, _problem, _shape, layout_of)
from ._errors import invalid_argument

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


def _torch_input_bias(torch, value, x, channels):
    """(tensor, pointer) of input_bias checked against x: C values of x's very dtype on x's device (the tensor
    normalized is x + input_bias[c], each sum rounded to x's dtype); (None, None) for None. As for weight and bias,
    a tensor that is not contiguous is copied, and the caller holds the tensor until the call returns."""
    if value is None:
        return None, None
    tensor = _as_torch(torch, value, "input_bias")
    if tensor.device != x.device:
        raise invalid_argument("input_bias", f"is on {tensor.device}, but x is on {x.device}")
    if tensor.dtype != x.dtype:
        raise invalid_argument("input_bias", f"has dtype {tensor.dtype}, but must have x's dtype {x.dtype} (x + "
                                             "input_bias is rounded to x's dtype, as PyTorch's x + b.view(1, C, ...))")
    if tensor.dim() != 1 or tensor.shape[0] != channels:
        raise invalid_argument("input_bias", f"must have shape ({channels},) (C of x), got {tuple(tensor.shape)}")
    tensor = tensor.contiguous()
    return tensor, tensor.data_ptr()


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


def _torch_operands(torch, x, y, y_dtype, y_shape=None):
    """(x, y, layout) as gnsilu_group_norm takes them: x itself when layout_of finds it in either layout, else a
    dense copy (in out's layout when out is given, else contiguous); y, when None, a new tensor of y_dtype on x's
    device in that layout (of y_shape, for a padded output). A given y must be in x's layout (InvalidArgumentError
    naming 'out'); where x's two layouts are one memory (one channel, or one pixel) a padded y may be in either."""
    shape = tuple(x.shape)
    x_layout = found = layout_of(shape, x.stride())
    padded = y_shape is not None and tuple(y_shape) != shape
    either = found is not None and (shape[1] == 1 or all(d == 1 for d in shape[2:]))  # one memory in both layouts
    if padded and either and y is not None:
        x_layout = None  # y's layout decides
    if y is None:
        layout = x_layout or "channels_first"
        if x_layout is not None and not padded:
            y = torch.empty_like(x, dtype=y_dtype)  # x's very strides (also those of dimensions of size 1)
        else:
            y = _torch_empty(torch, y_shape or shape, y_dtype, x.device, layout)
    else:
        layout = layout_of(tuple(y_shape or shape), y.stride())
        if layout is None:
            raise invalid_argument("out", f"must be dense, contiguous or channels-last (gnsilu writes y as one "
                                          f"dense block in x's layout), got strides {tuple(y.stride())} for shape "
                                          f"{shape}")
        if x_layout is not None and layout != x_layout:
            raise invalid_argument("out", f"is {_LAYOUT_WORDS[layout]} but x is {_LAYOUT_WORDS[x_layout]}: gnsilu "
                                          "writes y in x's memory layout")
    if found is None or (found != layout and not either):
        x = _torch_in_layout(x, layout)  # a copy only when x is in neither layout (documented)
    return x, y, layout


# ---- the fast path: calls whose arguments were checked before --------------------------------------------------
# A torch call without padding whose key (x's shape, strides, dtype and device; num_groups, eps, activation,
# out_dtype; weight's, bias's and input_bias's type, dtype, device, shape and strides, or None for each one absent;
# out's, when given, and whether it is x) was
# checked and run before skips the checks and the building of its gnsilu_problem: a copy of the one made then, with
# this call's pointers (input_bias's too: a key with None there has a null input_bias, a key with a tensor there one
# of its own). What the library does is the same (it checks the problem again in C); only Python's share of
# the host time shrinks. Grad mode with inputs that require grad always takes the checked path (which refuses them).
_FAST_LIMIT = 1024  # keys kept; the table starts again when full


class _FastCall:
    __slots__ = ("template", "shape", "y_dtype", "function")

    def __init__(self, problem, y_dtype, function):
        self.template = bytes(problem)  # the problem with null pointers for x, y, weight, bias and input_bias
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


def _fast_key(torch, x, num_groups, weight, bias, eps, activation, out_dtype, out=None, input_bias=None):
    """The fast-path key of a call, or None where it has none (a non-tensor argument). An unhashable part (a list
    for num_groups, say) makes the table's look-up raise TypeError: torch_fast_call then takes the checked path."""
    try:
        key = (type(x), x.shape, x.stride(), x.dtype, x.device, type(num_groups), num_groups, type(eps), eps,
               activation, out_dtype, _parameter_key(torch, weight), _parameter_key(torch, bias),
               _parameter_key(torch, input_bias))
        if out is not None:
            key += (_parameter_key(torch, out), out is x)
    except TypeError:
        return None
    return key


def _raw_stream(torch):
    """A function of a device index giving the handle of torch's current stream there."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def problem_with(template, x, y, weight, bias, input_bias):
    """A copy of a kept problem (a Problem, or its bytes) with the pointers of this call's tensors (None: left as
    the template has it)."""
    problem = _lib.Problem.from_buffer_copy(template)
    problem.x = x.data_ptr()
    if y is not None:
        problem.y = y.data_ptr()
    if weight is not None:
        problem.weight = weight.data_ptr()
    if bias is not None:
        problem.bias = bias.data_ptr()
    if input_bias is not None:
        problem.input_bias = input_bias.data_ptr()
    return problem


def fast_entry(torch, table, key, tensors):
    """table's entry for key, or None where the checked path must run: no key, a key not run before (or one that
    cannot be hashed), or grad mode with one of `tensors` (None allowed) requiring grad (the checked path refuses
    it). gnsilu._strided's table shares this."""
    if key is None:
        return None
    try:
        entry = table.get(key)
    except TypeError:  # an unhashable argument
        return None
    if entry is None or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)):
        return None
    return entry


def torch_fast_call(torch, x, num_groups, weight, bias, eps, activation, out_dtype, key=None, out=None,
                    input_bias=None):
    """y of group_norm(x, num_groups, weight, bias, eps, activation code, out_dtype, out=out, input_bias=input_bias)
    through the fast path, or None where it does not apply (a key not run before, inputs that require grad in grad
    mode): then the checked path must be taken. `key`: the call's _fast_key when the caller has it already. Returns
    out when given."""
    if key is None:
        key = _fast_key(torch, x, num_groups, weight, bias, eps, activation, out_dtype, out, input_bias)
    entry = fast_entry(torch, _fast_calls, key, (x, weight, bias, out, input_bias))
    if entry is None:
        return None
    y = torch.empty_like(x, dtype=entry.y_dtype) if out is None else out  # x is dense in its layout: y gets its strides
    problem = problem_with(entry.template, x, y, weight, bias, input_bias)
    index = x.device.index
    if index == torch.cuda.current_device():
        status = entry.function(ctypes.byref(problem), None, 0, _raw_stream(torch)(index))
    else:
        with torch.cuda.device(index):
            status = entry.function(ctypes.byref(problem), None, 0, _raw_stream(torch)(index))
    if status != 0:
        _lib.raise_for_status(status)
    return y


def refuse_grad(torch, named_tensors):
    """InvalidArgumentError naming the first of (name, tensor or None) that requires grad while grad mode is on:
    gnsilu computes no gradients."""
    if not torch.is_grad_enabled():
        return
    for name, tensor in named_tensors:
        if tensor is not None and tensor.requires_grad:
            raise invalid_argument(name, "requires grad, but gnsilu computes no gradients: call it under "
                                         "torch.no_grad() or torch.inference_mode(), or use "
                                         "gnsilu.torch.GroupNorm / GroupNormSiLU, which then run PyTorch's ops")


def _torch_group_norm(torch, x, num_groups, weight, bias, eps, activation, out_dtype, out, pad=None,
                      pad_mode="constant", pad_value=0.0, input_bias=None):
    key = None
    if pad is None:
        key = _fast_key(torch, x, num_groups, weight, bias, eps, activation, out_dtype, out, input_bias)
        if key is not None:
            y = torch_fast_call(torch, x, num_groups, weight, bias, eps, activation, out_dtype, key, out, input_bias)
            if y is not None:
                return y
    if not x.is_cuda:
        raise invalid_argument("x", f"must be a CUDA tensor, got one on {x.device}")
    x_code = _torch_code(torch, x, "x")
    shape = _shape(x.shape, "x")
    groups = _groups(num_groups, shape[1])
    eps = _eps(eps)
    y_shape, mode_code = shape, PAD_CONSTANT
    if pad is not None:
        pad = _pad(pad, shape)
        mode_code = _pad_mode(pad_mode)
        try:
            pad_value = float(pad_value)
        except (TypeError, ValueError):
            raise invalid_argument("pad_value", f"must be a number, got {pad_value!r}") from None
        y_shape = _padded_shape(shape, pad)
    weight_tensor, weight_arg = _torch_parameter(torch, weight, "weight", x, shape[1])
    bias_tensor, bias_arg = _torch_parameter(torch, bias, "bias", x, shape[1])
    input_bias_tensor, input_bias_arg = _torch_input_bias(torch, input_bias, x, shape[1])
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
        if tuple(y.shape) != y_shape:
            what = "x's shape" if pad is None else "the padded shape"
            raise invalid_argument("out", f"must have {what} {y_shape}, got {tuple(y.shape)}")
    refuse_grad(torch, (("x", x), ("weight", weight_tensor), ("bias", bias_tensor), ("input_bias", input_bias_tensor),
                        ("out", y)))
    x_before = x
    x, y, layout = _torch_operands(torch, x, y, dtypes[y_code], y_shape if pad is not None else None)
    if result is None:
        result = y
    if x.numel() == 0 and y.numel() == 0:
        return result
    problem = _problem(x.data_ptr(), x_code, y.data_ptr(), y_code, layout, shape, groups, weight_arg, bias_arg,
                       eps, activation, pad, mode_code, pad_value, input_bias_arg)
    with torch.cuda.device(x.device):
        _lib.call("gnsilu_group_norm", ctypes.byref(problem), None, 0,
                  torch.cuda.current_stream(x.device).cuda_stream)
    fast = (key is not None and pad is None and result is y and layout_of(shape, x_before.stride()) is not None
            and all(t is None or t.stride() == (1,) for t in (weight, bias, input_bias)))
    try:
        fast = fast and _FAST_LIMIT > 0 and hash(key) is not None
    except TypeError:  # an unhashable argument: no key
        fast = False
    if fast:
        problem.x = problem.y = problem.weight = problem.bias = problem.input_bias = None
        if len(_fast_calls) >= _FAST_LIMIT:
            _fast_calls.clear()
        _fast_calls[key] = _FastCall(problem, dtypes[y_code], _lib.library()[0].gnsilu_group_norm)
    return result


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
