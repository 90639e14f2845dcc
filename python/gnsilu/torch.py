"""gnsilu in PyTorch models: the op torch.ops.gnsilu.group_norm, GroupNormSiLU, GroupNorm and swap_group_norm_silu.

    from gnsilu.torch import swap_group_norm_silu
    swap_group_norm_silu(vae)        # returns how many GroupNorm+SiLU pairs now run as one gnsilu call
    decode = torch.compile(vae.decode)   # gnsilu's op stands in the compiled graph

Importing this module registers the operator (schema in OP_SCHEMA)
    torch.ops.gnsilu.group_norm(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu",
                                out_dtype=None, input_bias=None) -> Tensor
y = silu(group_norm(x)) ("silu") or group_norm(x) ("none"), in x's memory format (torch.empty_like(x)) and
out_dtype (default x's dtype); of x + input_bias (C values of x's dtype, gnsilu.group_norm's input_bias) where
one is given. On CUDA tensors of bfloat16/float16/float32 it is gnsilu (gnsilu.group_norm); on any other tensor
(CPU, float64, ...) or where libgnsilu cannot run, PyTorch's F.group_norm (and F.silu) of x + input_bias. It has a
fake (meta) implementation, so torch.compile traces it into its graph (fullgraph too) and CUDA graphs capture it;
it has no backward (an input that requires grad gets no gradient through it): the modules below run PyTorch's ops
whenever an autograd graph is needed.

GroupNormSiLU is nn.GroupNorm followed by SiLU in one module, with nn.GroupNorm's constructor, parameters and
state_dict. It calls gnsilu on CUDA tensors of bfloat16/float16/float32 that are contiguous or channels-last, in
inference (no autograd graph needed), and otherwise runs PyTorch's F.silu(F.group_norm(...)) exactly as the two
modules would. GroupNorm is nn.GroupNorm itself (a subclass: same constructor, parameters, state_dict, repr, and
isinstance(m, nn.GroupNorm) holds) whose forward calls gnsilu's plain group_norm under the same conditions, and
otherwise F.group_norm. Under torch.compile both put the op in the graph; in eager mode they call its
implementation directly (the same function, without the dispatcher's host time).

swap_group_norm_silu(model) replaces, in place:
  (a) in every nn.Sequential: a GroupNorm immediately followed by a SiLU module (GroupNorm -> GroupNormSiLU,
      SiLU -> nn.Identity, so the indices and the state_dict keys stay the same);
  (b) in any other module ("block"): a GroupNorm attribute whose every use in the block's code is proven, by
      reading that code (gnsilu/_fusion.py), to be followed at once by a SiLU attribute: diffusers' ResnetBlock2D
      (norm1/norm2 -> nonlinearity) and VAE Decoder (conv_norm_out -> conv_act), and blocks written like them.
      The GroupNorm becomes a GroupNormSiLU that hands its output to the SiLU, and the SiLU one that passes that
      very tensor (`is`) through and applies SiLU to everything else (a shared `nonlinearity` also applied to the
      time embedding, say, keeps doing so). The hand-off is a module attribute, which torch.compile traces;
  (c) then every other nn.GroupNorm, wherever it is a child (nn.Sequential, ModuleList, block attribute): by a
      GroupNorm (the same computation, so nothing needs proving), unless plain=False;
  (d) then, unless move_bias=False, in any module but nn.Sequential: a plain convolution (nn.Conv1d/2d/3d with a
      bias) whose every use in the block's code is proven (gnsilu/_fusion.py, proven_bias_moves) to hand its output
      to one of the norms swapped above and to nothing else while some parameters of forward are None at run time
      (diffusers' ResnetBlock2D: conv1 -> norm2 while temb is None). The conv becomes a _BiasMovingConv (its class's
      subclass, its very parameters: conv1.bias stays in the state_dict) and the block gets a forward pre-hook that
      says, per call, whether those parameters are None; where they are and gnsilu runs (CUDA tensors of its dtypes,
      inference), the conv runs with bias=None and its norm adds the bias as gnsilu's input_bias.
Per-frame GroupNorm wrappers (diffusers' MochiChunkedGroupNorm3D, and CosmosCausalGroupNorm with num_groups=1) count
as GroupNorms in (b) and (c): they become a FrameGroupNorm around a GroupNormSiLU (a proven pair) or a GroupNorm.
diffusers' MiniMaxH3VideoGroupNorm (a per-frame nn.GroupNorm subclass) becomes a FrameGroupNormContiguous in (c). A swapped module that hands a CUDA input to
PyTorch (strides in neither layout nor an order gnsilu._strided takes, another dtype) warns once, naming itself
and why. Inputs in the two orders video decoders make ((N, C, T, ...) stored frames first, and the frames of a
(1, C, T, ...) video as a batch) of at least gnsilu._strided.MIN_BYTES (16 MiB) run on gnsilu without a copy
(gnsilu/_strided.py), with the bits of the contiguous call, in eager mode and under torch.compile (there
FrameGroupNorm keeps its copy into frame order, which Inductor folds into the producer).
Only plain modules are touched: exactly nn.GroupNorm / nn.SiLU / nn.Sequential, with no hooks and no instance
forward; nothing at all while global module hooks are registered. The limits are listed in python/README.md.
"""
import collections
import importlib
import inspect
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from . import _api, _fusion, _strided
from ._api import group_norm, layout_of
from ._checks import _padded_shape
from ._errors import LibraryNotFoundError, UnsupportedDeviceError

__all__ = ["GroupNormSiLU", "GroupNorm", "FrameGroupNorm", "FrameGroupNormContiguous", "SwapCounts", "swap_group_norm_silu",
           "OP_SCHEMA", "inductor_pass", "enable_inductor_pass"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HANDOFF = "_gnsilu_handoff"  # on a _SiLUAfterGroupNormSiLU: the tensor its GroupNormSiLU just returned (case b)
_unusable = None  # why gnsilu cannot run in this process (then GroupNorm and GroupNormSiLU run PyTorch's ops)
_DEVICE_TYPES = ()  # devices besides CUDA where the modules call the op (tests add "cpu": it runs PyTorch's ops)
# Devices besides CUDA where a convolution whose bias the swap moved leaves it to its norm (tests add "cpu"; there the
# norm adds it with PyTorch's ops, x + b: a pass of its own, so by default a CPU convolution keeps its bias).
_BIAS_DEVICE_TYPES = ()


# ---- the operator: torch.ops.gnsilu.group_norm ---------------------------------------------------------------
OP_SCHEMA = ("group_norm(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-06, "
             "str activation=\"silu\", ScalarType? out_dtype=None, Tensor? input_bias=None) -> Tensor")


def _empty_output(x, out_dtype):
    """The op's output tensor: torch.empty_like(x) (x's memory format) in out_dtype (default x's dtype)."""
    return torch.empty_like(x, dtype=x.dtype if out_dtype is None else out_dtype)


def _with_input_bias(x, input_bias):
    """x + input_bias.view(1, C, 1, ...) in x's dtype (input_bias has it): what gnsilu normalizes with an input bias;
    x itself without one."""
    if input_bias is None:
        return x
    return x + input_bias.view(1, -1, *([1] * (x.dim() - 2)))


def _checked_input_bias(x, input_bias):
    """The op's input_bias checked against x as gnsilu.group_norm checks it (InvalidArgumentError naming
    'input_bias'), so that the op refuses the same arguments on every device; None stays None."""
    if input_bias is None or x.dim() < 2:  # (F.group_norm refuses an x of fewer dimensions itself)
        return input_bias
    return _api._torch_input_bias(torch, input_bias, x, x.shape[1])[0]


def _pytorch_group_norm(x, num_groups, weight, bias, eps, activation, input_bias=None):
    """What PyTorch's own modules compute: F.group_norm, then F.silu for activation "silu"; of x + input_bias (PyTorch's
    sum in x's dtype) where there is an input bias."""
    y = F.group_norm(_with_input_bias(x, input_bias), num_groups, weight, bias, eps)
    return F.silu(y) if activation == "silu" else y


def _unusable_here(error):
    """Records that gnsilu cannot run in this process (PyTorch's ops run from then on), with one warning."""
    global _unusable
    if _unusable is None:
        _unusable = str(error)
        warnings.warn(f"gnsilu cannot run here, PyTorch's ops run instead: {error}", RuntimeWarning, stacklevel=3)


def _op_implementation(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None,
                       input_bias=None):
    """torch.ops.gnsilu.group_norm on real tensors (the modules call it directly in eager mode): gnsilu on CUDA
    tensors of its dtypes, PyTorch's ops on others (CPU tensors, float64, ...) and where gnsilu cannot run in
    this process (of x + input_bias there, where an input bias is given); either way the result has _empty_output's
    shape, dtype and strides."""
    if activation not in ("silu", "none"):
        raise ValueError(f"gnsilu::group_norm: activation must be \"silu\" or \"none\", got {activation!r}")
    input_bias = _checked_input_bias(x, input_bias)
    if x.is_cuda and x.dtype in _DTYPES and _unusable is None:
        kind = None if activation == "none" else "silu"
        try:
            if layout_of(x.shape, x.stride()) is not None:  # y: empty_like(x)
                return group_norm(x, num_groups, weight, bias, eps, kind, out_dtype, input_bias=input_bias)
            order = _strided.plan(x)
            if order is not None:  # frames first or channels first: no copy, y with x's strides
                return _strided.group_norm(torch, x, num_groups, weight, bias, eps, kind, out_dtype, order=order,
                                           input_bias=input_bias)
            y = _empty_output(x, out_dtype)
            if layout_of(y.shape, y.stride()) is not None:  # x copied into y's layout
                return group_norm(x, num_groups, weight, bias, eps, kind, out=y, input_bias=input_bias)
            return y.copy_(group_norm(x, num_groups, weight, bias, eps, kind, out_dtype, input_bias=input_bias))
        except (LibraryNotFoundError, UnsupportedDeviceError) as e:
            _unusable_here(e)
    return _empty_output(x, out_dtype).copy_(_pytorch_group_norm(x, num_groups, weight, bias, eps, activation,
                                                                 input_bias))


def _op_fake(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None, input_bias=None):
    """The op on fake (meta) tensors, for torch.compile: the output's shape, dtype and strides."""
    return _empty_output(x, out_dtype)


# ---- the padded operator: torch.ops.gnsilu.group_norm_padded ------------------------------------------------
PADDED_OP_SCHEMA = ("group_norm_padded(Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps, "
                    "str activation, int[] pad, str pad_mode, float pad_value, ScalarType? out_dtype=None, "
                    "Tensor? input_bias=None) -> Tensor")
_PAD_MODES = ("constant", "replicate")


def _empty_padded_output(x, pad, out_dtype):
    """The padded op's output: F.pad(x)'s shape in x's memory format (channels-last when x is, else contiguous) and
    out_dtype (default x's dtype)."""
    dtype = x.dtype if out_dtype is None else out_dtype
    shape = list(_padded_shape(x.shape, pad))
    if x.dim() >= 3 and layout_of(x.shape, x.stride()) == "channels_last" and x.shape[1] != 1 \
            and any(size != 1 for size in x.shape[2:]):
        order = (0, *range(2, x.dim()), 1)
        inverse = [order.index(d) for d in range(x.dim())]
        return torch.empty([shape[d] for d in order], dtype=dtype, device=x.device).permute(inverse)
    return torch.empty(shape, dtype=dtype, device=x.device)


def _interior(padded, pad):
    """The view of `padded` without its border: what F.pad padded."""
    for k in range(len(pad) // 2):
        dim = padded.dim() - 1 - k
        padded = padded.narrow(dim, pad[2 * k], padded.shape[dim] - pad[2 * k] - pad[2 * k + 1])
    return padded


def _padded_implementation(x, num_groups, weight, bias, eps, activation, pad, pad_mode, pad_value, out_dtype=None,
                           input_bias=None):
    """torch.ops.gnsilu.group_norm_padded on real tensors: F.pad(group_norm(x) [then SiLU], pad, pad_mode, pad_value)
    as one gnsilu call on CUDA tensors of its dtypes (the interior and the border written by one launch), PyTorch's
    ops otherwise (of x + input_bias, where an input bias is given); the result has _empty_padded_output's shape,
    dtype and strides either way."""
    if activation not in ("silu", "none"):
        raise ValueError(f"gnsilu::group_norm_padded: activation must be \"silu\" or \"none\", got {activation!r}")
    if pad_mode not in _PAD_MODES:
        raise ValueError(f"gnsilu::group_norm_padded: pad_mode must be \"constant\" or \"replicate\", got {pad_mode!r}")
    pad = [int(w) for w in pad]
    input_bias = _checked_input_bias(x, input_bias)
    y = _empty_padded_output(x, pad, out_dtype)
    if x.is_cuda and x.dtype in _DTYPES and _unusable is None:
        kind = None if activation == "none" else "silu"
        try:  # an x in neither layout is copied into y's
            return group_norm(x, num_groups, weight, bias, eps, kind, out=y, pad=pad, pad_mode=pad_mode,
                              pad_value=pad_value, input_bias=input_bias)
        except (LibraryNotFoundError, UnsupportedDeviceError) as e:
            _unusable_here(e)
    unpadded = _pytorch_group_norm(x, num_groups, weight, bias, eps, activation, input_bias)
    padded = F.pad(unpadded, pad, mode=pad_mode, value=pad_value) if pad_mode == "constant" else \
        F.pad(unpadded, pad, mode=pad_mode)
    return y.copy_(padded)


def _padded_fake(x, num_groups, weight, bias, eps, activation, pad, pad_mode, pad_value, out_dtype=None,
                 input_bias=None):
    return _empty_padded_output(x, pad, out_dtype)


def _register_op():
    """Defines gnsilu::group_norm and gnsilu::group_norm_padded (once per process: importing gnsilu.torch again finds
    them defined)."""
    if hasattr(torch.ops, "gnsilu") and hasattr(torch.ops.gnsilu, "group_norm"):
        return None
    library = torch.library.Library("gnsilu", "DEF")
    tags = (torch.Tag.needs_fixed_stride_order,) if hasattr(torch.Tag, "needs_fixed_stride_order") else ()
    library.define(OP_SCHEMA, tags=tags)
    library.define(PADDED_OP_SCHEMA, tags=tags)
    for key in ("CUDA", "CPU"):
        library.impl("group_norm", _op_implementation, key)
        library.impl("group_norm_padded", _padded_implementation, key)
    register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    register_fake("gnsilu::group_norm", _op_fake, lib=library)
    register_fake("gnsilu::group_norm_padded", _padded_fake, lib=library)
    return library


# Held for the process: dropping a torch.library.Library removes its registrations (importlib.reload keeps it).
_library = globals().get("_library") or _register_op()


def _autocast_enabled(device_type):
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # PyTorch before 2.4: no argument, CUDA autocast only
        return device_type == "cuda" and torch.is_autocast_enabled()


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or torch._dynamo.is_compiling


def _gnsilu_takes(module, x, input_bias=None):
    """Whether gnsilu computes module(x) (GroupNorm or GroupNormSiLU): the conditions their docstrings list.
    x must be dense in either layout (gnsilu.layout_of), or in one of the orders gnsilu._strided takes without a
    copy (frames first, channels first: video decoders' per-frame views; under torch.compile too, where the op's
    tag needs_fixed_stride_order has Inductor hand it those strides): in any other, PyTorch's ops run as they would
    without gnsilu (they copy such an input themselves). An input bias (a convolution's, handed over by the swap:
    _handed_bias) must have x's dtype and device."""
    if _unusable is not None or torch.jit.is_tracing() or torch.jit.is_scripting():
        return False
    if type(x) is not torch.Tensor or not (x.is_cuda or x.device.type in _DEVICE_TYPES) \
            or x.dtype not in _DTYPES or x.dim() < 2 or x.shape[1] != module.num_channels \
            or (layout_of(x.shape, x.stride()) is None and _strided.plan(x) is None):
        return False
    weight, bias = module.weight, module.bias
    for p in (weight, bias):
        if p is not None and (p.device != x.device or p.dtype not in _DTYPES):
            return False
    if input_bias is not None and (input_bias.device != x.device or input_bias.dtype != x.dtype
                                   or (torch.is_grad_enabled() and input_bias.requires_grad)):
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                             or (bias is not None and bias.requires_grad)))


def _declined(module, x):
    """Why gnsilu does not take x in `module` where a user would expect it to (a CUDA tensor in inference), or None:
    also None where PyTorch's ops are the documented choice (CPU tensors, autograd, TorchScript, a library that
    cannot run here: said once already) or where F.group_norm itself will raise."""
    if _unusable is not None or type(x) is not torch.Tensor or not (x.is_cuda or x.device.type in _DEVICE_TYPES) \
            or torch.jit.is_tracing() or torch.jit.is_scripting() or x.dim() < 2 or x.shape[1] != module.num_channels:
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, module.weight, module.bias)):
        return None
    if x.dtype not in _DTYPES:
        return f"its input is {x.dtype} (gnsilu takes bfloat16, float16 and float32)"
    if layout_of(x.shape, x.stride()) is None and _strided.plan(x) is None:
        return (f"its input (shape {tuple(x.shape)}, strides {x.stride()}) is in neither layout gnsilu takes "
                "(contiguous or channels-last)")
    for name in ("weight", "bias"):
        p = getattr(module, name)
        if p is not None and (p.device != x.device or p.dtype not in _DTYPES):
            return f"its {name} is {p.dtype} on {p.device}, its input on {x.device}"
    return None


def _note_declined(module, x):
    """One RuntimeWarning per module that hands an input gnsilu would be expected to take to PyTorch (_declined),
    naming the module (its name in the model swap_group_norm_silu was given) and why."""
    if getattr(module, "_gnsilu_declined", False) or _is_compiling():
        return
    reason = _declined(module, x)
    if reason is not None:
        object.__setattr__(module, "_gnsilu_declined", True)
        name = getattr(module, "_gnsilu_name", None) or type(module).__name__
        warnings.warn(f"gnsilu: {name} runs PyTorch's GroupNorm, not gnsilu: {reason} (said once for this module)",
                      RuntimeWarning, stacklevel=3)


def _fast_forward(module, x, activation, input_bias=None):
    """module(x) through gnsilu's fast path (gnsilu/_api.py: a call whose key ran before) in eager mode, or None
    where that does not apply; then forward decides as usual. Equivalent to _gnsilu_takes: a key holds x's type,
    dtype, device, shape and strides, and the parameters' (input_bias's too) dtypes and devices, of a call that
    gnsilu ran."""
    if type(x) is not torch.Tensor or _is_compiling() or torch.jit.is_tracing() or x.dim() < 2 \
            or x.shape[1] != module.num_channels:
        return None
    parameters = module._parameters
    out_dtype = torch.float32 if _autocast_enabled("cuda") else x.dtype
    return _api.torch_fast_call(torch, x, module.num_groups, parameters["weight"], parameters["bias"], module.eps,
                                _api.ACTIVATION_SILU if activation == "silu" else _api.ACTIVATION_NONE, out_dtype,
                                input_bias=input_bias)


def _gnsilu(module, input, activation, input_bias=None):
    """module's computation through gnsilu: torch.ops.gnsilu.group_norm while torch.compile traces (the op then
    stands in the graph), else the op's implementation called directly (the same function, without the
    dispatcher's host time). The output dtype is the input's, float32 under autocast (as PyTorch's)."""
    out_dtype = torch.float32 if _autocast_enabled(input.device.type) else input.dtype
    if _is_compiling():
        return torch.ops.gnsilu.group_norm(input, module.num_groups, module.weight, module.bias, module.eps,
                                           activation, out_dtype, input_bias)
    if input_bias is not None:
        return _op_implementation(input, module.num_groups, module.weight, module.bias, module.eps, activation,
                                  out_dtype, input_bias)
    return _op_implementation(input, module.num_groups, module.weight, module.bias, module.eps, activation,
                              out_dtype)


def _like_group_norm(cls, group_norm):
    """A `cls` module with group_norm's settings and its very parameters (shared, not copied): what both modules'
    from_group_norm build (their constructors take nn.GroupNorm's arguments)."""
    module = cls(group_norm.num_groups, group_norm.num_channels, group_norm.eps, group_norm.affine, device="meta")
    module.weight = group_norm.weight
    module.bias = group_norm.bias
    return module.train(group_norm.training)


_BIASED = "_gnsilu_biased"  # on a norm: (tensor, bias) from a convolution that left its bias to the norm (the swap)


def _set_plain(module, name, value):
    """module.name = value for a plain attribute (never a parameter, buffer or submodule): object.__setattr__ in eager
    mode (a block's call sets a few per call: nn.Module.__setattr__ costs microseconds more each), setattr while
    torch.compile traces (which follows either)."""
    if _is_compiling():
        setattr(module, name, value)
    else:
        object.__setattr__(module, name, value)


def _handed_bias(norm, input):
    """The bias of the convolution whose output `input` is, when that convolution left its bias out for `norm` to add
    (the swap's bias move: _BiasMovingConv hands over (its output, its bias)), else None. Either way the hand-off is
    cleared, so no tensor is held past the next call."""
    handed = norm._gnsilu_biased
    if handed is None:
        return None
    _set_plain(norm, _BIASED, None)
    return handed[1] if handed[0] is input else None


def _group_norm_silu(module, input, input_bias):
    """GroupNormSiLU's computation of silu(group_norm(input + input_bias)) (input itself without an input bias)."""
    output = _fast_forward(module, input, "silu", input_bias)
    if output is not None:
        return output
    if _gnsilu_takes(module, input, input_bias):
        return _gnsilu(module, input, "silu", input_bias)
    _note_declined(module, input)
    return F.silu(F.group_norm(_with_input_bias(input, input_bias), module.num_groups, module.weight, module.bias,
                               module.eps))


class GroupNormSiLU(nn.Module):
    """silu(group_norm(x)): nn.GroupNorm(num_groups, num_channels, eps, affine) followed by nn.SiLU, in one module.

    Parameters, buffers and state_dict are those of nn.GroupNorm (weight and bias, or none without affine).
    forward runs torch.ops.gnsilu.group_norm (gnsilu) when all of these hold, and otherwise
    F.silu(F.group_norm(...)):
      - input is a plain torch.Tensor on a CUDA device, bfloat16/float16/float32, with num_channels channels in
        dimension 1, contiguous or channels-last (gnsilu.layout_of: torch.channels_last, channels_last_3d, (N, C, L)
        with the channel dimension innermost; the output then comes back in the same format); weight and bias
        on its device and of one of those dtypes;
      - no autograd graph is needed (grad mode off, or nothing requires grad): gnsilu has no backward;
      - no TorchScript tracing or scripting is under way (torch.compile is fine: the op stands in its graph);
      - libgnsilu.so loads and supports the GPU (else one RuntimeWarning and PyTorch's ops for the process).
    The output dtype is the input's, or float32 under CUDA autocast (where PyTorch runs group_norm in float32).
    """

    __constants__ = ["num_groups", "num_channels", "eps", "affine"]
    _gnsilu_biased = None  # a convolution's output and bias when it left its bias to this norm (_handed_bias)

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None):
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.empty(num_channels, device=device, dtype=dtype))
            self.bias = nn.Parameter(torch.empty(num_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    @classmethod
    def from_group_norm(cls, group_norm):
        """A GroupNormSiLU with group_norm's settings and its very parameters (shared, not copied)."""
        return _like_group_norm(cls, group_norm)

    def forward(self, input):
        return _group_norm_silu(self, input, _handed_bias(self, input))

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm whose forward runs gnsilu's plain group_norm (gnsilu.group_norm with activation=None).

    A subclass of nn.GroupNorm: the same constructor, parameters, state_dict, reset_parameters and repr, and code
    that asks isinstance(m, nn.GroupNorm) still finds it. forward calls gnsilu under GroupNormSiLU's conditions
    (a CUDA tensor of bfloat16/float16/float32, contiguous or channels-last, no autograd graph needed, no
    TorchScript, a usable library; the output in the input's memory format, float32 under CUDA autocast as
    nn.GroupNorm's), and
    otherwise F.group_norm exactly as nn.GroupNorm does. The results are gnsilu's rounding (correct rounding of the
    exact result), not PyTorch's: close, not the same bits.
    """

    _gnsilu_biased = None  # a convolution's output and bias when it left its bias to this norm (_handed_bias)

    @classmethod
    def from_group_norm(cls, group_norm):
        """A GroupNorm with group_norm's settings and its very parameters (shared, not copied)."""
        return _like_group_norm(cls, group_norm)

    def forward(self, input):
        input_bias = _handed_bias(self, input)
        output = _fast_forward(self, input, "none", input_bias)
        if output is not None:
            return output
        if _gnsilu_takes(self, input, input_bias):
            return _gnsilu(self, input, "none", input_bias)
        _note_declined(self, input)
        return F.group_norm(_with_input_bias(input, input_bias), self.num_groups, self.weight, self.bias, self.eps)


class _GroupNormSiLUBeforeSiLU(GroupNormSiLU):
    """GroupNormSiLU in a block whose code is proven to hand its output straight to a _SiLUAfterGroupNormSiLU:
    hands its output to that SiLU module (its `_gnsilu_acts`), which then passes that very tensor through."""

    def forward(self, input):
        return _hand_on(self, super().forward(input))


_PADDED = "_gnsilu_padded"  # on a PaddedInputConv: (interior, padded) its _GroupNormSiLUPadded just made


class _GroupNormSiLUPadded(_GroupNormSiLUBeforeSiLU):
    """_GroupNormSiLUBeforeSiLU in a block whose code is proven to hand the SiLU's output straight (through
    pass-through dropouts at most) to a PaddedInputConv (its `_gnsilu_conv`), which pads before it convolves
    (`_gnsilu_pad`: F.pad's widths and mode): gnsilu writes silu(group_norm(x)) already padded, in one launch, and
    this returns the interior view of it (what silu(group_norm(x)) is: the values are right whoever reads them),
    telling the SiLU to pass that view through and the conv that the padded tensor behind it is its input padded.
    Where gnsilu does not take the input, it is _GroupNormSiLUBeforeSiLU (the conv then pads itself)."""

    def forward(self, input):
        input_bias = _handed_bias(self, input)
        if not _gnsilu_takes(self, input, input_bias):
            output = _group_norm_silu(self, input, input_bias)
            for act in self._gnsilu_acts:
                setattr(act, _HANDOFF, output)
            return output
        pad, mode = self._gnsilu_pad
        out_dtype = torch.float32 if _autocast_enabled(input.device.type) else input.dtype
        call = torch.ops.gnsilu.group_norm_padded if _is_compiling() else _padded_implementation
        if input_bias is None:
            padded = call(input, self.num_groups, self.weight, self.bias, self.eps, "silu", pad, mode, 0.0, out_dtype)
        else:
            padded = call(input, self.num_groups, self.weight, self.bias, self.eps, "silu", pad, mode, 0.0, out_dtype,
                          input_bias)
        output = _interior(padded, pad)
        setattr(self._gnsilu_conv, _PADDED, (output, padded))
        return _hand_on(self, output)


class PaddedInputConv(nn.Module):
    """A convolution that pads its input first, `conv(F.pad(x, pad, mode=mode))` (diffusers'
    HunyuanVideoCausalConv3d and convolutions written like it, proven from their code: _fusion.padded_convolution),
    with the same child (so the state_dict keys stay: `....conv.weight`) and its pad widths and mode under their
    names. Given the very tensor its _GroupNormSiLUPadded returned (`is`, which torch.compile traces), it convolves
    the padded tensor gnsilu wrote behind it instead of padding again; anything else is padded as before. Either
    way the hand-off is cleared."""

    def __init__(self, original, pad_name, mode_name, conv_name):
        super().__init__()
        self._gnsilu_names = (pad_name, mode_name, conv_name)
        setattr(self, conv_name, original._modules[conv_name])
        setattr(self, pad_name, tuple(getattr(original, pad_name)))
        setattr(self, mode_name, getattr(original, mode_name))
        setattr(self, _PADDED, None)
        self.train(original.training)

    def forward(self, input):
        pad_name, mode_name, conv_name = self._gnsilu_names
        conv = self._modules[conv_name]
        handed = getattr(self, _PADDED)
        if handed is not None:
            setattr(self, _PADDED, None)
            if handed[0] is input:
                return conv(handed[1])
        return conv(F.pad(input, getattr(self, pad_name), mode=getattr(self, mode_name)))

    def extra_repr(self):
        pad_name, mode_name, _ = self._gnsilu_names
        return f"{pad_name}={getattr(self, pad_name)}, {mode_name}={getattr(self, mode_name)!r}"


_MOVE = "_gnsilu_move_bias"  # on a _BiasMovingConv: True for one call of its block where the proof holds


def _bias_moves(conv, input):
    """Whether conv (a _BiasMovingConv, told by its block that the proof holds for this call) leaves its bias to its
    norm for this input: where gnsilu adds it (a plain CUDA tensor of gnsilu's dtypes, the conv's weight and bias of
    that dtype on its device, the norm's parameters usable by gnsilu, no autocast, no autograd graph needed, no
    TorchScript, a usable library); elsewhere the conv adds its bias itself, as it always did."""
    if _unusable is not None or torch.jit.is_tracing() or torch.jit.is_scripting() or type(input) is not torch.Tensor \
            or not (input.is_cuda or input.device.type in _BIAS_DEVICE_TYPES) or input.dtype not in _DTYPES \
            or _autocast_enabled(input.device.type):
        return False
    bias, weight, norm = conv.bias, conv.weight, conv._gnsilu_norm
    if bias is None or bias.dtype != input.dtype or bias.device != input.device or weight.dtype != input.dtype:
        return False
    for p in (norm.weight, norm.bias):
        if p is not None and (p.device != input.device or p.dtype not in _DTYPES):
            return False
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                for t in (input, weight, bias, norm.weight, norm.bias)))


class _BiasMovingConv:
    """What the convolutions whose bias the swap moved have in common (subclasses of nn.Conv1d/2d/3d with the same
    parameters, so the same state_dict and isinstance(m, nn.Conv2d)): their block's code is proven
    (_fusion.proven_bias_moves) to hand their output to one gnsilu norm (`_gnsilu_norm`) and nothing else whenever
    some of its forward's parameters are None (diffusers' ResnetBlock2D: `temb`). The block's forward pre-hook
    (_BiasMoveBefore) says, for one call, whether they are; then, where gnsilu will add it (_bias_moves), the conv
    runs with bias=None and hands (its output, its bias) to the norm (`is`, which torch.compile traces), whose gnsilu
    call adds the bias to x in its statistics and output alike (input_bias): conv(x) + b rounded to x's dtype, one
    elementwise pass fewer. Every other call is the convolution it was (its bias added by PyTorch)."""

    _gnsilu_move_bias = False

    @classmethod
    def from_conv(cls, conv):
        """The convolution conv is (its settings), with conv's very parameters (shared, not copied)."""
        module = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                     dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                     padding_mode=conv.padding_mode, device="meta")
        module.weight = conv.weight
        module.bias = conv.bias
        return module.train(conv.training)

    def forward(self, input):
        if self._gnsilu_move_bias:
            _set_plain(self, _MOVE, False)  # for this one call
            if _bias_moves(self, input):
                output = self._conv_forward(input, self.weight, None)
                _set_plain(self._gnsilu_norm, _BIASED, (output, self.bias))
                return output
        return super().forward(input)


class _Conv1dBiasToNorm(_BiasMovingConv, nn.Conv1d):
    """nn.Conv1d whose bias the swap moved into the norm after it (_BiasMovingConv)."""


class _Conv2dBiasToNorm(_BiasMovingConv, nn.Conv2d):
    """nn.Conv2d whose bias the swap moved into the norm after it (_BiasMovingConv)."""


class _Conv3dBiasToNorm(_BiasMovingConv, nn.Conv3d):
    """nn.Conv3d whose bias the swap moved into the norm after it (_BiasMovingConv)."""


_BIAS_CONVS = {nn.Conv1d: _Conv1dBiasToNorm, nn.Conv2d: _Conv2dBiasToNorm, nn.Conv3d: _Conv3dBiasToNorm}


class _BiasMoveBefore:
    """The forward pre-hook (with kwargs) that the swap puts on a block whose convolution `conv` left its bias to the
    norm `norm` (their attribute names): tells the conv, for this call, whether every parameter of `conditions` is
    None, which the proof needs (diffusers' ResnetBlock2D: `temb`), and whether the block's norm is still the one the
    conv hands to. conditions: (name, position among forward's positional parameters after self or None, default or
    inspect.Parameter.empty, whether it may be passed by keyword), as Python binds them. A plain object (deepcopy and
    pickling copy it with the block)."""

    def __init__(self, conv, norm, conditions):
        self.conv = conv
        self.norm = norm
        self.conditions = conditions

    def __call__(self, block, args, kwargs):
        conv = block._modules.get(self.conv)
        if not isinstance(conv, _BiasMovingConv):
            return None
        move = block._modules.get(self.norm) is conv._gnsilu_norm
        for name, index, default, keyword in self.conditions:
            if not move:
                break
            if keyword and name in kwargs:
                value = kwargs[name]
            elif index is not None and index < len(args):
                value = args[index]
            elif default is not inspect.Parameter.empty:
                value = default
            else:  # missing: forward raises TypeError
                move = False
                break
            if value is not None:
                move = False
                break
        _set_plain(conv, _MOVE, move)
        return None


class _BiasMoveAfter:
    """The forward hook (always called, also when forward raises) paired with _BiasMoveBefore: the conv's permission
    and its hand-off to the norm end with the block's call (a call of the conv or the norm from outside the block is
    theirs as before)."""

    def __init__(self, conv):
        self.conv = conv

    def __call__(self, block, args, output):
        conv = block._modules.get(self.conv)
        if isinstance(conv, _BiasMovingConv):
            if conv._gnsilu_move_bias:
                _set_plain(conv, _MOVE, False)
            if conv._gnsilu_norm._gnsilu_biased is not None:
                _set_plain(conv._gnsilu_norm, _BIASED, None)
        return None


def _none_conditions(forward, names):
    """_BiasMoveBefore's conditions for the parameters `names` of forward (a function: self first), or None where one
    is not a named parameter."""
    try:
        parameters = list(inspect.signature(forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in parameters}
    conditions = []
    for name in names:
        p = by_name.get(name)
        if p is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return None
        conditions.append((name, positional.index(name) if name in positional else None, p.default,
                           p.kind != p.POSITIONAL_ONLY))
    return tuple(conditions)


class _PassThroughDropout(nn.Dropout):
    """nn.Dropout that returns its input itself when p == 0 (what nn.Dropout computes then, in eager mode the same
    object too), so that torch.compile also sees the tensor a _GroupNormSiLUPadded returned reach its conv."""

    def forward(self, input):
        if self.p == 0:
            return input
        return super().forward(input)


class _SiLUApplied(torch.Tensor):
    """silu(group_norm(x)) from a norm whose output the block's code (proven: _fusion.FUNCTIONAL_SILU) hands straight
    to F.silu(...): F.silu returns it as the plain tensor it is, SiLU already applied. The proof rules out any other
    use; one would be an error here (RuntimeError), never a silently wrong value."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is F.silu and len(args) == 1 and type(args[0]) is cls:
            with torch._C.DisableTorchFunctionSubclass():
                return args[0].as_subclass(torch.Tensor)
        raise RuntimeError(f"gnsilu: the output of a GroupNorm swapped for one followed by F.silu (proven from the "
                           f"model's code to go straight into F.silu, which it holds already applied) reached "
                           f"{getattr(func, '__name__', func)}; call gnsilu.torch.swap_group_norm_silu after changing "
                           "the model's code, or not at all")


def _norm_before_silu_function(module, input):
    """(output, whether SiLU is applied) for a norm whose output goes straight into F.silu: silu(group_norm(x))
    from gnsilu in eager mode (F.silu then passes it through); under torch.compile, gnsilu's plain group_norm (the
    op in the graph; F.silu follows in the graph); where gnsilu does not take the input, PyTorch's group_norm. Of x
    plus the input bias a convolution handed over (_handed_bias), where one did."""
    input_bias = _handed_bias(module, input)
    output = _fast_forward(module, input, "silu", input_bias)
    if output is not None:
        return output, True
    if _gnsilu_takes(module, input, input_bias):
        if _is_compiling():
            return _gnsilu(module, input, "none", input_bias), False
        return _gnsilu(module, input, "silu", input_bias), True
    _note_declined(module, input)
    return F.group_norm(_with_input_bias(input, input_bias), module.num_groups, module.weight, module.bias,
                        module.eps), False


def _handed_to_silu_function(output, applied):
    return output.as_subclass(_SiLUApplied) if applied else output


def _hand_on(norm, output):
    """What a swapped norm returns once it has computed silu(group_norm(x)) (its forward, or gnsilu.split's band
    forward): output marked for F.silu to pass through where the block hands it straight to F.silu(...)
    (_GroupNormBeforeSiLUFunction), else output, handed to the SiLU modules that pass it through (`_gnsilu_acts`,
    none for a norm without a proven SiLU)."""
    if isinstance(norm, _GroupNormBeforeSiLUFunction):
        return _handed_to_silu_function(output, True)
    for act in getattr(norm, "_gnsilu_acts", ()):
        setattr(act, _HANDOFF, output)
    return output


class _GroupNormBeforeSiLUFunction(GroupNormSiLU):
    """GroupNormSiLU in a block whose code is proven to hand its output straight to F.silu(...): returns
    silu(group_norm(x)) marked so that F.silu passes it through (_SiLUApplied), or group_norm(x) where F.silu must
    still run (torch.compile, PyTorch's fallback)."""

    def forward(self, input):
        return _handed_to_silu_function(*_norm_before_silu_function(self, input))


class _SiLUAfterGroupNormSiLU(nn.SiLU):
    """nn.SiLU that passes through the tensor its _GroupNormSiLUBeforeSiLU just returned (the same object, `is`,
    which torch.compile traces) or a view of it (`input._base is handed`, or in inference mode, where views keep no
    `_base`, the same storage: the block's code, proven, only takes views
    such as permute/unflatten in between, and SiLU commutes with them), and applies SiLU to anything else. Either
    way the hand-off is cleared, so no tensor is held past the next call."""

    def __init__(self, inplace=False):
        super().__init__(inplace)
        setattr(self, _HANDOFF, None)

    def forward(self, input):
        handed = getattr(self, _HANDOFF)
        if handed is not None:
            setattr(self, _HANDOFF, None)
            if handed is input or input._base is handed or _inference_view(input, handed):
                return input
        return super().forward(input)


def _inference_view(input, handed):
    """Whether input is a view of handed made in inference mode, where PyTorch keeps no `_base` for views: the same
    storage (the proof leaves views as the only way from the norm's output to the SiLU)."""
    return input._base is None and handed.is_inference() and input.is_inference() and \
        input.untyped_storage().data_ptr() == handed.untyped_storage().data_ptr()



class FrameGroupNorm(nn.Module):
    """A GroupNorm of each frame of a video tensor (B, C, T, H, W) apart: `norm_layer` (a gnsilu GroupNorm or
    GroupNormSiLU) applied to the frames as a batch of B*T images, the output (B, C, T, H, W) as a view of them.
    What diffusers' MochiChunkedGroupNorm3D and CosmosCausalGroupNorm (num_groups=1) compute (swap_group_norm_silu
    puts it in their place, their GroupNorm swapped, under its own name: the state_dict keys stay
    `....norm_layer.weight` / `....norm.weight`), without the chunks and the concatenation:
    a channels_last_3d input is already a channels-last batch of frames (a view: no copy); so, in eager mode, is a
    contiguous one with B = 1 from gnsilu._strided.MIN_BYTES (its frames a batch in "channels first" order, which
    gnsilu._strided normalizes in place); otherwise a contiguous input is copied into frame order once (PyTorch's
    GroupNorm would copy that view too; under torch.compile Inductor folds the copy into the tensor's producer). Where its output is proven to go
    straight into a SiLU (`_gnsilu_acts`, as for GroupNormSiLU), norm_layer is a GroupNormSiLU and the SiLU passes
    the output through."""

    def __init__(self, norm_layer, name="norm_layer"):
        super().__init__()
        self._norm_name = name  # the child's name: the replaced wrapper's, so that the state_dict keys stay
        setattr(self, name, norm_layer)

    @property
    def norm_layer(self):
        """The GroupNorm (or GroupNormSiLU) applied to the frames, whatever its name among the children."""
        return self._modules[self._norm_name]

    def forward(self, input):
        if getattr(self, "_gnsilu_silu_function", False):  # proven to go straight into F.silu(...)
            return _frames_before_silu_function(self.norm_layer, input, type(self).__name__, contiguous=False)
        return _hand_on(self, _frames_forward(self.norm_layer, input, type(self).__name__))


def _frames_forward(norm, input, name):
    """norm (a module of 4-D inputs) applied to the frames of a (B, C, T, H, W) input as a batch of B*T images; the
    output (B, C, T, H, W) as a view of norm's output."""
    if input.dim() != 5:
        raise ValueError(f"{name} expects a 5-D (B, C, T, H, W) input, got {input.dim()}-D")
    batch, frames = input.shape[0], input.shape[2]
    x = input.transpose(1, 2).flatten(0, 1)  # (B*T, C, H, W): a view where the strides allow
    if x.dim() == 4 and layout_of(tuple(x.shape), x.stride()) is None \
            and (_is_compiling() or _strided.plan(x) is None):
        # One copy into frame order: a view in neither layout gnsilu's strided path takes or, under torch.compile,
        # any such view: Inductor writes the frames in order where it computes them (Mochi, H200: 49.3 ms a decode
        # with the copy, 53.5 with the strided path, whose per-plane statistics cost more than the copy saves).
        x = x.contiguous()
    return norm(x).unflatten(0, (batch, frames)).transpose(1, 2)


def _frames_before_silu_function(norm, input, name, contiguous):
    """_frames_forward with `norm` (a GroupNorm-like module) run as _norm_before_silu_function runs it, the output
    (contiguous if asked) marked for F.silu to pass through where SiLU was applied."""
    applied = []

    def run(x):
        output, silu = _norm_before_silu_function(norm, x)
        applied.append(silu)
        return output
    output = _frames_forward(run, input, name)
    return _handed_to_silu_function(output.contiguous() if contiguous else output, applied[0])


class FrameGroupNormContiguous(GroupNorm):
    """gnsilu's GroupNorm of each frame of a (B, C, T, H, W) input apart, its output contiguous: what diffusers'
    MiniMaxH3VideoGroupNorm (an nn.GroupNorm subclass: permute, contiguous, GroupNorm of the B*T frames, permute,
    contiguous) computes, with that module's parameters and state_dict keys. swap_group_norm_silu puts it in
    MiniMaxH3VideoGroupNorm's place."""

    def forward(self, input):
        if getattr(self, "_gnsilu_silu_function", False):  # proven to go straight into F.silu(...)
            return _frames_before_silu_function(self, input, type(self).__name__, contiguous=True)
        return _frames_forward(super().forward, input, type(self).__name__).contiguous()


def _diffusers_class(module_name, class_name):
    """diffusers.models.autoencoders.<module_name>.<class_name>, or None (diffusers absent, or a version without
    it)."""
    try:
        module = importlib.import_module(f"diffusers.models.autoencoders.{module_name}")
    except ImportError:
        return None
    return getattr(module, class_name, None)


def _frame_norm_kinds():
    """The per-frame GroupNorm wrappers FrameGroupNorm replaces, as (class, name of the wrapped nn.GroupNorm,
    whether an instance normalizes per frame): diffusers' MochiChunkedGroupNorm3D (always) and
    CosmosCausalGroupNorm (with num_groups == 1; otherwise its GroupNorm sees the whole tensor), where present."""
    kinds = []
    mochi = _diffusers_class("autoencoder_kl_mochi", "MochiChunkedGroupNorm3D")
    if mochi is not None:
        kinds.append((mochi, "norm_layer", lambda module: True))
    cosmos = _diffusers_class("autoencoder_kl_cosmos", "CosmosCausalGroupNorm")
    if cosmos is not None:
        kinds.append((cosmos, "norm", lambda module: vars(module).get("num_groups") == 1))
    return kinds


def _frame_norm(module):
    """The name of the plain nn.GroupNorm inside module when module is a plain per-frame wrapper (_frame_norm_kinds)
    around it and nothing else, else None."""
    for cls, name, per_frame in _frame_norm_kinds():
        if _plain(module, cls) and per_frame(module) and _plain(module._modules.get(name), nn.GroupNorm) \
                and set(module._modules) == {name}:
            return name
    return None


def _contiguous_frame_norm(module):
    """Whether module is a plain diffusers MiniMaxH3VideoGroupNorm (a per-frame nn.GroupNorm subclass)."""
    cls = _diffusers_class("autoencoder_kl_minimax_h3", "MiniMaxH3VideoGroupNorm")
    return cls is not None and _plain(module, cls)

def _plain(module, cls):
    """Whether module is exactly a cls with no hooks of its own and no forward set on the instance."""
    if type(module) is not cls or "forward" in vars(module):
        return False
    return not any(value for name, value in vars(module).items() if "hook" in name and isinstance(value, dict))


def _global_hooks():
    state = vars(nn.modules.module)
    return any(value for name, value in state.items()
               if name.startswith("_global") and "hook" in name and isinstance(value, dict))


def _plain_attribute(block, name):
    """The block's value of `name` when it is an instance attribute, a parameter, buffer or submodule (where
    reading it runs no code), else _fusion.UNKNOWN."""
    if hasattr(type(block), name):
        return _fusion.UNKNOWN
    for table in (vars(block), block._parameters, block._buffers, block._modules):
        if name in table:
            return table[name]
    return _fusion.UNKNOWN


def _swap_sequential(sequential):
    names = list(sequential._modules)
    swapped = 0
    i = 0
    while i + 1 < len(names):
        first, second = sequential._modules[names[i]], sequential._modules[names[i + 1]]
        if _plain(first, nn.GroupNorm) and _plain(second, nn.SiLU):
            setattr(sequential, names[i], GroupNormSiLU.from_group_norm(first))
            setattr(sequential, names[i + 1], nn.Identity())
            swapped += 1
            i += 2
        else:
            i += 1
    return swapped


def _swap_plain_group_norms(module):
    """Puts GroupNorm in place of every plain nn.GroupNorm child in `module` and its submodules, and a
    FrameGroupNorm around a GroupNorm in place of every per-frame wrapper (_frame_norm) (one replacement per
    object, so a norm shared by two parents stays shared); returns how many were replaced."""
    replacements = {}
    for parent in list(module.modules()):
        if id(parent) in replacements:
            continue  # a wrapper replaced above (its parent comes first): out of the model now
        for name, child in list(parent._modules.items()):
            if id(child) not in replacements:
                inner = _frame_norm(child)
                if inner is not None:
                    replacements[id(child)] = FrameGroupNorm(
                        GroupNorm.from_group_norm(child._modules[inner]), inner).train(child.training)
                elif _contiguous_frame_norm(child):
                    replacements[id(child)] = FrameGroupNormContiguous.from_group_norm(child)
                elif _plain(child, nn.GroupNorm):
                    replacements[id(child)] = GroupNorm.from_group_norm(child)
            if id(child) in replacements:
                setattr(parent, name, replacements[id(child)])
    return len(replacements)


def _padded_convolution(module):
    """(pad, mode, conv) attribute names when module is a plain convolution that pads first (_fusion's proof), with
    widths gnsilu can write (2, 4 or 6 ints >= 0) and mode "replicate" or "constant"; else None."""
    if module is None or not _plain(module, type(module)) or type(module).__module__.startswith("torch."):
        return None
    names = _fusion.padded_convolution(type(module), (F.pad,))
    if names is None:
        return None
    pad, mode, conv = (_plain_attribute(module, name) for name in names)
    if not isinstance(conv, nn.Module) or mode not in _PAD_MODES or not isinstance(pad, (tuple, list)) \
            or len(pad) not in (2, 4, 6) or not all(type(w) is int and w >= 0 for w in pad):
        return None
    return names


def _swap_block(block, fuse_pad=True):
    """Swaps the proven pairs of one block; returns (pairs, pads): pads of them now written by gnsilu into their
    convolution's input (_GroupNormSiLUPadded, PaddedInputConv)."""
    children = block._modules
    norms = {name for name, child in children.items()
             if _plain(child, nn.GroupNorm) or _frame_norm(child) is not None or _contiguous_frame_norm(child)}
    acts = {name for name, child in children.items()
            if _plain(child, nn.SiLU) or _plain(child, _SiLUAfterGroupNormSiLU)}
    if not norms or "forward" in vars(block):
        return 0, 0
    convs = {name: _padded_convolution(child) for name, child in children.items()} if fuse_pad else {}
    convs = {name: names for name, names in convs.items() if names is not None}
    drops = {name for name, child in children.items()
             if (_plain(child, nn.Dropout) or _plain(child, _PassThroughDropout)) and child.p == 0}
    chains = _fusion.proven_chains(type(block), nn.Module, norms, acts, lambda name: _plain_attribute(block, name),
                                   silu_functions=(F.silu,), convs=set(convs), drops=drops)
    pairs = {norm: chain[0] for norm, chain in chains.items()}
    swapped = padded = 0
    wrappers = {}
    for norm, act_names in pairs.items():
        if _fusion.FUNCTIONAL_SILU in act_names:
            if len(act_names) == 1:  # only ever into F.silu(...); with SiLU modules too: not swapped as a pair
                setattr(block, norm, _before_silu_function(children[norm]))
                swapped += 1
            continue
        if _contiguous_frame_norm(children[norm]):
            continue  # its SiLU modules are not told of its output: swapped as a plain GroupNorm later
        swapped += 1
        inner = _frame_norm(children[norm])
        follower = chains[norm][1]
        if inner is not None:  # per frame: the frames' GroupNormSiLU, the hand-off by the wrapper
            fused = FrameGroupNorm(GroupNormSiLU.from_group_norm(children[norm]._modules[inner]), inner)
            fused.train(children[norm].training)
        elif follower is not None and _plain(children[norm], nn.GroupNorm):
            # Its SiLU's output goes straight into a convolution that pads first: gnsilu writes it padded.
            conv_name, drop_names = follower
            fused = _GroupNormSiLUPadded.from_group_norm(children[norm])
            wrapper = wrappers.get(conv_name)
            if wrapper is None:
                wrapper = PaddedInputConv(children[conv_name], *convs[conv_name])
                wrappers[conv_name] = wrapper
                setattr(block, conv_name, wrapper)
            for drop in drop_names:
                if type(children[drop]) is nn.Dropout:
                    setattr(block, drop, _PassThroughDropout(children[drop].p, children[drop].inplace).train(
                        children[drop].training))
            pad_name, mode_name, _ = convs[conv_name]
            object.__setattr__(fused, "_gnsilu_pad", (tuple(getattr(wrapper, pad_name)), getattr(wrapper, mode_name)))
            object.__setattr__(fused, "_gnsilu_conv", wrapper)
            padded += 1
        else:
            fused = _GroupNormSiLUBeforeSiLU.from_group_norm(children[norm])
        for act in act_names:
            if type(children[act]) is nn.SiLU:
                setattr(block, act, _SiLUAfterGroupNormSiLU(children[act].inplace))
        # A plain attribute, not a submodule: named_modules() and the state_dict do not change.
        object.__setattr__(fused, "_gnsilu_acts", tuple(children[act] for act in sorted(act_names)))
        setattr(block, norm, fused)
    return swapped, padded


def _before_silu_function(norm):
    """The replacement of a norm (plain nn.GroupNorm, a per-frame wrapper or MiniMaxH3VideoGroupNorm) whose output the
    block's code hands only to F.silu(...): it returns silu(group_norm(x)) marked for F.silu to pass through."""
    inner = _frame_norm(norm)
    if inner is not None:
        fused = FrameGroupNorm(GroupNormSiLU.from_group_norm(norm._modules[inner]), inner).train(norm.training)
    elif _contiguous_frame_norm(norm):
        fused = FrameGroupNormContiguous.from_group_norm(norm)
    else:
        return _GroupNormBeforeSiLUFunction.from_group_norm(norm)
    object.__setattr__(fused, "_gnsilu_silu_function", True)  # a plain attribute: the state_dict stays
    return fused


# The norms that take a convolution's bias (_handed_bias): gnsilu's, as the swap leaves them in a block.
_BIAS_NORMS = (GroupNorm, GroupNormSiLU, _GroupNormSiLUBeforeSiLU, _GroupNormSiLUPadded, _GroupNormBeforeSiLUFunction)


def _move_block_biases(block, holders):
    """Moves the bias of each of the block's plain convolutions (nn.Conv1d/2d/3d with a bias, a child of no other
    module: holders counts the parents of each module) that the block's code is proven to hand to one of its gnsilu
    norms and nothing else (_fusion.proven_bias_moves) into that norm: the conv becomes a _BiasMovingConv (its very
    parameters, so the same state_dict) and the block gets the hooks that say when the proof holds (_BiasMoveBefore,
    _BiasMoveAfter). Returns how many biases it moved."""
    children = block._modules
    if "forward" in vars(block):
        return 0
    convs = {name for name, child in children.items() if type(child) in _BIAS_CONVS and _plain(child, type(child))
             and child.bias is not None and holders[id(child)] == 1}
    norms = {name for name, child in children.items() if type(child) in _BIAS_NORMS and _plain(child, type(child))}
    if not convs or not norms:
        return 0
    moves = _fusion.proven_bias_moves(type(block), nn.Module, convs, norms, lambda name: _plain_attribute(block, name))
    moved = 0
    for conv_name, (norm_name, names) in moves.items():
        conv, norm = children[conv_name], children[norm_name]
        conditions = _none_conditions(type(block).forward, names)
        if conditions is None or conv.out_channels != norm.num_channels:
            continue
        fused = _BIAS_CONVS[type(conv)].from_conv(conv)
        object.__setattr__(fused, "_gnsilu_norm", norm)  # a plain attribute, not a submodule: the state_dict stays
        setattr(block, conv_name, fused)
        block.register_forward_pre_hook(_BiasMoveBefore(conv_name, norm_name, conditions), with_kwargs=True)
        block.register_forward_hook(_BiasMoveAfter(conv_name), always_call=True)
        moved += 1
    return moved


def _move_biases(module):
    """_move_block_biases in every block under module (nn.Sequential aside); returns how many biases moved."""
    holders = collections.Counter(id(child) for parent in module.modules() for child in parent._modules.values()
                                  if child is not None)
    return sum(_move_block_biases(parent, holders) for parent in list(module.modules())
               if type(parent) is not nn.Sequential)


SwapCounts = collections.namedtuple("SwapCounts", ["pairs", "plain", "padded", "biases_moved"], defaults=(0, 0))
SwapCounts.__doc__ = """What swap_group_norm_silu(..., return_counts=True) replaced: `pairs` GroupNorm+SiLU pairs by
GroupNormSiLU, `plain` other nn.GroupNorms by GroupNorm; `padded` of the pairs write their convolution's padded input
(GroupNorm -> SiLU -> pad -> conv: the pad is gnsilu's border, PaddedInputConv skips its own); `biases_moved`
convolutions proven to feed only a swapped norm leave their bias to it (conv -> GroupNorm: gnsilu adds the bias as
its input_bias, the conv runs without it)."""


def swap_group_norm_silu(module, *, plain=True, return_counts=False, fuse_pad=True, move_bias=True):
    """Puts GroupNormSiLU in place of the GroupNorm+SiLU pairs of `module` (and its submodules) that it can prove,
    then (with plain=True, the default) GroupNorm in place of every other plain nn.GroupNorm (see the module
    docstring), then (with move_bias=True, the default) moves the bias of each convolution proven to feed only one of
    these norms into it (d). Returns how many GroupNorm+SiLU pairs were replaced, or with return_counts=True a
    SwapCounts(pairs, plain, padded, biases_moved) that also counts the plain GroupNorms replaced, the pairs that
    write their convolution's padded input (fuse_pad=False: none do) and the convolution biases moved
    (move_bias=False: none). Parameters are shared, not copied; the state_dict keys and values do not change; calling
    it again replaces nothing more; `module` itself is not replaced, only its submodules; nothing at all is replaced
    while global module hooks are registered."""
    counts = SwapCounts(0, 0, 0, 0)
    if not _global_hooks():
        pairs = pads = 0
        for parent in list(module.modules()):
            if type(parent) is nn.Sequential:
                pairs += _swap_sequential(parent)
            else:
                swapped, padded = _swap_block(parent, fuse_pad)
                pairs, pads = pairs + swapped, pads + padded
        plain_count = _swap_plain_group_norms(module) if plain else 0
        counts = SwapCounts(pairs, plain_count, pads, _move_biases(module) if move_bias else 0)
        for name, m in module.named_modules():  # their names, for _note_declined's warning
            if isinstance(m, (GroupNormSiLU, GroupNorm)) and not hasattr(m, "_gnsilu_name"):
                object.__setattr__(m, "_gnsilu_name", f"{type(module).__name__}.{name}" if name else type(m).__name__)
    return counts if return_counts else counts.pairs


# The graph pass for torch.compile (gnsilu/_inductor_pass.py): after the operators are registered above.
from ._inductor_pass import enable_inductor_pass, inductor_pass  # noqa: E402
