"""GroupNorm of torch tensors whose strides are in neither of gnsilu's layouts but whose memory is one dense block in
another order that video decoders make, computed without copying x: the statistics of pieces of each group, merged
exactly (records add: docs/EXACT_STATISTICS.md), then applied. The bits are group_norm's of x.contiguous() (with an
input_bias, of x.contiguous() and that input_bias).

Two orders are taken (`plan`):
  - "frames first": a (N, C, T, *spatial) tensor whose memory is (N, T, C, *spatial), x.transpose(1, 2) contiguous
    (what a per-frame 2-D layer followed by a permute back leaves: CogVideoX's and KVAE's upsamplers). Read as the
    contiguous (N*T, C, *spatial) tensor z: each (n, t) sample's group is a piece of the (n) group; the records of
    the T pieces are added, and z is normalized with the sum in every piece.
  - "channels first": a (M, C, *spatial) tensor whose memory is (C, M, *spatial), x.transpose(0, 1) contiguous
    (the frames of a contiguous (1, C, T, H, W) video as a batch: Mochi's and Magvit's per-frame GroupNorm). Read as
    the contiguous (1, C*M, *spatial) tensor z, each (c, m) plane a group of its own: the records of a group's
    channels in one sample are added, and each plane is normalized with its (m, group)'s sum, its channel's weight
    and bias.
The output has x's strides (torch.empty_like(x)), as the op's fake implementation says.
"""
from . import _api
from ._checks import _groups
from ._errors import invalid_argument
from ._torch_adapter import _torch_input_bias, refuse_grad

FRAMES_FIRST = "frames first"
CHANNELS_FIRST = "channels first"
# The smallest x (bytes) this path takes. It saves a copy of x (or PyTorch's copy and its own passes) but makes
# about five more launches and a few small tensors than a call on a dense x, which costs more than the copy on small
# tensors (host-bound decodes). 16 MiB is where a copy's time reaches about five launches' worth on the H200; a
# first estimate, not yet measured against the decodes. Smaller inputs keep the copy (FrameGroupNorm) or go to
# PyTorch's ops (the modules).
MIN_BYTES = 16 << 20


def plan(x):
    """The order of a torch tensor x that this module takes (FRAMES_FIRST, CHANNELS_FIRST), or None (another order,
    or fewer than MIN_BYTES). x must be in neither gnsilu layout (the caller checks: a dense x goes to the library as
    it is)."""
    if x.numel() * x.element_size() < MIN_BYTES:
        return None
    if x.dim() >= 4 and x.shape[2] > 1 and x.transpose(1, 2).is_contiguous():
        return FRAMES_FIRST
    if x.dim() >= 3 and x.shape[0] > 1 and x.transpose(0, 1).is_contiguous():
        return CHANNELS_FIRST
    return None


def group_norm(torch, x, num_groups, weight, bias, eps, activation, out_dtype=None, out=None, order=None,
               input_bias=None):
    """group_norm(x.contiguous(), ..., input_bias=input_bias)'s values (and bits) in a tensor with x's strides (or in
    `out`, which must have them), for an x that plan() takes. activation: "silu" or None. order: plan(x), when the
    caller has it already."""
    order = order or plan(x)
    if order is None:
        raise ValueError("gnsilu._strided.group_norm: x is in neither order this path takes")
    channels = x.shape[1]
    num_groups = _groups(num_groups, channels)  # the dense path's check
    input_bias, _ = _torch_input_bias(torch, input_bias, x, channels)  # the dense path's check (and contiguous copy)
    refuse_grad(torch, (("x", x), ("weight", weight), ("bias", bias), ("input_bias", input_bias),
                        ("out", out)))  # the dense path's refusal
    if out is not None and (tuple(out.shape) != tuple(x.shape) or out.stride() != x.stride()):
        raise invalid_argument("out", f"must have x's shape and strides {tuple(x.shape)} {x.stride()}, got "
                                      f"{tuple(out.shape)} {out.stride()}")
    y = torch.empty_like(x, dtype=x.dtype if out_dtype is None else out_dtype) if out is None else out
    if order == FRAMES_FIRST:
        n, t = x.shape[0], x.shape[2]
        z = x.transpose(1, 2).reshape(n * t, channels, *x.shape[3:])  # a view: x.transpose(1, 2) is contiguous
        y_z = y.transpose(1, 2).view(n * t, channels, *x.shape[3:])
        stats = _api.group_stats(z, num_groups, input_bias=input_bias).view(n, t, num_groups, _api.STATS_WORDS)
        merged = stats.sum(1, keepdim=True).expand(n, t, num_groups, _api.STATS_WORDS)
        _api.group_norm_apply(z, merged.reshape(n * t, num_groups, _api.STATS_WORDS), weight, bias, eps, activation,
                              out=y_z, input_bias=input_bias)
        return y
    m = x.shape[0]
    planes = channels * m
    z = x.transpose(0, 1).reshape(1, planes, *x.shape[2:])  # a view: x.transpose(0, 1) is contiguous
    y_z = y.transpose(0, 1).view(1, planes, *x.shape[2:])
    per_group = channels // num_groups
    plane_input_bias = None if input_bias is None else input_bias.repeat_interleave(m)  # plane c*m + i: channel c
    stats = _api.group_stats(z, planes, input_bias=plane_input_bias).view(num_groups, per_group, m, _api.STATS_WORDS)
    merged = stats.sum(1, keepdim=True).expand(num_groups, per_group, m, _api.STATS_WORDS)
    plane_weight = None if weight is None else weight.repeat_interleave(m)
    plane_bias = None if bias is None else bias.repeat_interleave(m)
    _api.group_norm_apply(z, merged.reshape(1, planes, _api.STATS_WORDS), plane_weight, plane_bias, eps, activation,
                          out=y_z, input_bias=plane_input_bias)
    return y
