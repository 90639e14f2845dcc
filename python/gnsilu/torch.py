"""gnsilu in PyTorch models: GroupNormSiLU, GroupNorm and swap_group_norm_silu.

    from gnsilu.torch import swap_group_norm_silu
    swap_group_norm_silu(vae)        # returns how many GroupNorm+SiLU pairs now run as one gnsilu call

GroupNormSiLU is nn.GroupNorm followed by SiLU in one module, with nn.GroupNorm's constructor, parameters and
state_dict. It calls gnsilu on CUDA tensors of bfloat16/float16/float32 that are contiguous or channels-last, in
inference (no autograd graph needed), and otherwise runs PyTorch's F.silu(F.group_norm(...)) exactly as the two
modules would. GroupNorm is nn.GroupNorm itself (a subclass: same constructor, parameters, state_dict, repr, and
isinstance(m, nn.GroupNorm) holds) whose forward calls gnsilu's plain group_norm under the same conditions, and
otherwise F.group_norm.

swap_group_norm_silu(model) replaces, in place:
  (a) in every nn.Sequential: a GroupNorm immediately followed by a SiLU module (GroupNorm -> GroupNormSiLU,
      SiLU -> nn.Identity, so the indices and the state_dict keys stay the same);
  (b) in any other module ("block"): a GroupNorm attribute whose every use in the block's code is proven, by
      reading that code (gnsilu/_fusion.py), to be followed at once by a SiLU attribute: diffusers' ResnetBlock2D
      (norm1/norm2 -> nonlinearity) and VAE Decoder (conv_norm_out -> conv_act), and blocks written like them.
      The GroupNorm becomes a GroupNormSiLU that marks its output, and the SiLU one that passes marked tensors
      through and applies SiLU to everything else (a shared `nonlinearity` also applied to the time embedding,
      say, keeps doing so);
  (c) then every other nn.GroupNorm, wherever it is a child (nn.Sequential, ModuleList, block attribute): by a
      GroupNorm (the same computation, so nothing needs proving), unless plain=False.
Only plain modules are touched: exactly nn.GroupNorm / nn.SiLU / nn.Sequential, with no hooks and no instance
forward; nothing at all while global module hooks are registered. The limits are listed in python/README.md.
"""
import collections
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from . import _fusion
from ._api import group_norm, group_norm_silu, layout_of
from ._errors import LibraryNotFoundError, UnsupportedDeviceError

__all__ = ["GroupNormSiLU", "GroupNorm", "SwapCounts", "swap_group_norm_silu"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MARK = "_gnsilu_silu_applied"  # set on outputs of a GroupNormSiLU whose SiLU module comes next (case b)
_unusable = None  # why gnsilu cannot run in this process (then GroupNorm and GroupNormSiLU run PyTorch's ops)


def _autocast_enabled(device_type):
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # PyTorch before 2.4: no argument, CUDA autocast only
        return device_type == "cuda" and torch.is_autocast_enabled()


def _tracing():
    compiler = getattr(torch, "compiler", None)
    compiling = compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()
    return compiling or torch.jit.is_tracing()


def _gnsilu_takes(module, x):
    """Whether gnsilu computes module(x) (GroupNorm or GroupNormSiLU): the conditions their docstrings list.
    x must be dense in either layout (gnsilu.layout_of): in any other, PyTorch's ops run as they would without
    gnsilu (they copy such an input themselves)."""
    if _unusable is not None or _tracing():
        return False
    if type(x) is not torch.Tensor or not x.is_cuda or x.dtype not in _DTYPES or x.dim() < 2 \
            or x.shape[1] != module.num_channels or layout_of(x.shape, x.stride()) is None:
        return False
    parameters = [p for p in (module.weight, module.bias) if p is not None]
    if any(p.device != x.device or p.dtype not in _DTYPES for p in parameters):
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in parameters)))


def _gnsilu_or_none(function, module, input, activation):
    """function(input, ...) with module's settings (gnsilu.group_norm or group_norm_silu), or None where gnsilu
    cannot run in this process (after one RuntimeWarning; PyTorch's ops run from then on)."""
    global _unusable
    out_dtype = torch.float32 if _autocast_enabled(input.device.type) else input.dtype
    arguments = (input, module.num_groups, module.weight, module.bias, module.eps)
    try:
        if activation == "silu":
            return function(*arguments, out_dtype=out_dtype)
        return function(*arguments, activation=activation, out_dtype=out_dtype)
    except (LibraryNotFoundError, UnsupportedDeviceError) as e:
        _unusable = str(e)
        warnings.warn(f"gnsilu cannot run here, {type(module).__name__} uses PyTorch's ops instead: {e}",
                      RuntimeWarning, stacklevel=3)
        return None


class GroupNormSiLU(nn.Module):
    """silu(group_norm(x)): nn.GroupNorm(num_groups, num_channels, eps, affine) followed by nn.SiLU, in one module.

    Parameters, buffers and state_dict are those of nn.GroupNorm (weight and bias, or none without affine).
    forward calls gnsilu.group_norm_silu when all of these hold, and otherwise F.silu(F.group_norm(...)):
      - input is a plain torch.Tensor on a CUDA device, bfloat16/float16/float32, with num_channels channels in
        dimension 1, contiguous or channels-last (gnsilu.layout_of: torch.channels_last, channels_last_3d, (N, C, L)
        with the channel dimension innermost; the output then comes back in the same format); weight and bias
        on its device and of one of those dtypes;
      - no autograd graph is needed (grad mode off, or nothing requires grad): gnsilu has no backward;
      - no torch.compile / TorchScript tracing is under way (the compiler fuses the PyTorch ops itself);
      - libgnsilu.so loads and supports the GPU (else one RuntimeWarning and PyTorch's ops for the process).
    The output dtype is the input's, or float32 under CUDA autocast (where PyTorch runs group_norm in float32).
    """

    __constants__ = ["num_groups", "num_channels", "eps", "affine"]

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
        module = cls(group_norm.num_groups, group_norm.num_channels, group_norm.eps, group_norm.affine,
                     device="meta")
        module.weight = group_norm.weight
        module.bias = group_norm.bias
        return module.train(group_norm.training)

    def _gnsilu_takes(self, x):
        return _gnsilu_takes(self, x)

    def forward(self, input):
        if self._gnsilu_takes(input):
            output = _gnsilu_or_none(group_norm_silu, self, input, "silu")
            if output is not None:
                return output
        return F.silu(F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps))

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm whose forward runs gnsilu's plain group_norm (gnsilu.group_norm with activation=None).

    A subclass of nn.GroupNorm: the same constructor, parameters, state_dict, reset_parameters and repr, and code
    that asks isinstance(m, nn.GroupNorm) still finds it. forward calls gnsilu under GroupNormSiLU's conditions
    (a CUDA tensor of bfloat16/float16/float32, contiguous or channels-last, no autograd graph needed, no tracing,
    a usable library; the output in the input's memory format, float32 under CUDA autocast as nn.GroupNorm's), and
    otherwise F.group_norm exactly as nn.GroupNorm does. The results are gnsilu's rounding (correct rounding of the
    exact result), not PyTorch's: close, not the same bits.
    """

    @classmethod
    def from_group_norm(cls, group_norm):
        """A GroupNorm with group_norm's settings and its very parameters (shared, not copied)."""
        module = cls(group_norm.num_groups, group_norm.num_channels, group_norm.eps, group_norm.affine,
                     device="meta")
        module.weight = group_norm.weight
        module.bias = group_norm.bias
        return module.train(group_norm.training)

    def _gnsilu_takes(self, x):
        return _gnsilu_takes(self, x)

    def forward(self, input):
        if self._gnsilu_takes(input):
            output = _gnsilu_or_none(group_norm, self, input, None)
            if output is not None:
                return output
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class _GroupNormSiLUBeforeSiLU(GroupNormSiLU):
    """GroupNormSiLU in a block whose code is proven to hand its output straight to a _SiLUAfterGroupNormSiLU:
    marks the output so that the SiLU passes it through."""

    def forward(self, input):
        output = super().forward(input)
        setattr(output, _MARK, True)
        return output


class _SiLUAfterGroupNormSiLU(nn.SiLU):
    """nn.SiLU that passes a tensor marked by _GroupNormSiLUBeforeSiLU through (removing the mark)."""

    def forward(self, input):
        marks = getattr(input, "__dict__", None)
        if marks is not None and marks.pop(_MARK, False):
            return input
        return super().forward(input)


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
    """Puts GroupNorm in place of every plain nn.GroupNorm child in `module` and its submodules (one replacement
    per GroupNorm object, so a norm shared by two parents stays shared); returns how many were replaced."""
    replacements = {}
    for parent in list(module.modules()):
        for name, child in list(parent._modules.items()):
            if _plain(child, nn.GroupNorm):
                if id(child) not in replacements:
                    replacements[id(child)] = GroupNorm.from_group_norm(child)
                setattr(parent, name, replacements[id(child)])
    return len(replacements)


def _swap_block(block):
    children = block._modules
    norms = {name for name, child in children.items() if _plain(child, nn.GroupNorm)}
    acts = {name for name, child in children.items()
            if _plain(child, nn.SiLU) or _plain(child, _SiLUAfterGroupNormSiLU)}
    if not norms or not acts or "forward" in vars(block):
        return 0
    pairs = _fusion.proven_pairs(type(block), nn.Module, norms, acts, lambda name: _plain_attribute(block, name))
    for norm, act_names in pairs.items():
        setattr(block, norm, _GroupNormSiLUBeforeSiLU.from_group_norm(children[norm]))
        for act in act_names:
            if type(children[act]) is nn.SiLU:
                setattr(block, act, _SiLUAfterGroupNormSiLU(children[act].inplace))
    return len(pairs)


SwapCounts = collections.namedtuple("SwapCounts", ["pairs", "plain"])
SwapCounts.__doc__ = """What swap_group_norm_silu(..., return_counts=True) replaced: `pairs` GroupNorm+SiLU pairs by
GroupNormSiLU, `plain` other nn.GroupNorms by GroupNorm."""


def swap_group_norm_silu(module, *, plain=True, return_counts=False):
    """Puts GroupNormSiLU in place of the GroupNorm+SiLU pairs of `module` (and its submodules) that it can prove,
    then (with plain=True, the default) GroupNorm in place of every other plain nn.GroupNorm (see the module
    docstring). Returns how many GroupNorm+SiLU pairs were replaced, or with return_counts=True a
    SwapCounts(pairs, plain) that also counts the plain GroupNorms replaced. Parameters are shared, not copied;
    the state_dict keys do not change; calling it again replaces nothing more; `module` itself is not replaced,
    only its submodules; nothing at all is replaced while global module hooks are registered."""
    counts = SwapCounts(0, 0)
    if not _global_hooks():
        pairs = 0
        for parent in list(module.modules()):
            if type(parent) is nn.Sequential:
                pairs += _swap_sequential(parent)
            else:
                pairs += _swap_block(parent)
        counts = SwapCounts(pairs, _swap_plain_group_norms(module) if plain else 0)
    return counts if return_counts else counts.pairs
