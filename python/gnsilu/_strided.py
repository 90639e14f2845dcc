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

A call whose key (what the dense path's fast table keys on: x's shape, strides, dtype and device, the arguments, and
weight's, bias's and input_bias's dtype, device, shape and strides) was checked and run before takes the fast path
(the checked path cost ~380 us of host time a call in Magvit's compiled decode, more than the GPU's
~100 us, so the GPU waited): the two C calls from copies of the problems built then, and the per-plane weight, bias
and input bias of the channels-first order kept from call to call (for the same tensor object at the same version
and address; a tensor modified in place or a new one gets its own). The bits are the checked path's.
"""
import ctypes
import weakref

from . import _api, _lib
from ._checks import NONE, _activation_code, _eps, _groups, _problem
from ._errors import invalid_argument
from ._torch_adapter import (_fast_key, _raw_stream, _torch_code, _torch_input_bias, fast_entry, problem_with,
                             refuse_grad)

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
    key = None
    if out is None:
        key = _fast_key(torch, x, num_groups, weight, bias, eps, activation, out_dtype, None, input_bias)
        entry = fast_entry(torch, _fast_calls, key, (x, weight, bias, input_bias))
        if entry is not None:
            return _fast_call(torch, entry, x, weight, bias, input_bias)
    y = _checked(torch, x, num_groups, weight, bias, eps, activation, out_dtype, out, order, input_bias)
    if key is not None:
        _remember(torch, key, order, x, y, num_groups, weight, bias, eps, activation)
    return y


def _checked(torch, x, num_groups, weight, bias, eps, activation, out_dtype, out, order, input_bias):
    """group_norm's checked path: every argument checked, and the calls made through gnsilu's public functions."""
    channels = x.shape[1]
    num_groups = _groups(num_groups, channels)  # the dense path's check
    input_bias, _ = _torch_input_bias(torch, input_bias, x, channels)  # the dense path's check (and contiguous copy)
    refuse_grad(torch, (("x", x), ("weight", weight), ("bias", bias), ("input_bias", input_bias),
                        ("out", out)))  # the dense path's refusal
    if out is not None and (tuple(out.shape) != tuple(x.shape) or out.stride() != x.stride()):
        raise invalid_argument("out", f"must have x's shape and strides {tuple(x.shape)} {x.stride()}, got "
                                      f"{tuple(out.shape)} {out.stride()}")
    y = torch.empty_like(x, dtype=x.dtype if out_dtype is None else out_dtype) if out is None else out
    shape, z_groups, planes, merge_view = _geometry(order, x, num_groups)
    z, y_z = _dense(order, x, shape), _dense(order, y, shape)
    if planes:  # plane c*m + i: channel c
        weight, bias, input_bias = (_per_plane(t, planes) for t in (weight, bias, input_bias))
    stats = _api.group_stats(z, z_groups, input_bias=input_bias)
    _api.group_norm_apply(z, _merged(stats, merge_view).view(stats.shape), weight, bias, eps, activation, out=y_z,
                          input_bias=input_bias)
    return y


def _geometry(order, x, groups):
    """How x (in `order`) is read as the contiguous tensor z and its records merged: z's shape, z's groups, the
    planes per channel (channels first; 0 for frames first) and the view of z's records whose dimension 1 is
    summed. Frames first: z is (N*T, C, *spatial), the (n, t) pieces' records added over t. Channels first: z is
    (1, C*M, *spatial), each plane a group, the records of a group's channels added."""
    channels = x.shape[1]
    if order == FRAMES_FIRST:
        n, t = x.shape[0], x.shape[2]
        return (n * t, channels, *x.shape[3:]), groups, 0, (n, t, groups, _api.STATS_WORDS)
    m = x.shape[0]
    return (1, channels * m, *x.shape[2:]), channels * m, m, (groups, channels // groups, m, _api.STATS_WORDS)


def _dense(order, t, shape):
    """t (x, or y with x's strides) as z's contiguous view of `shape` (no copy: t's memory is dense in that order)."""
    return (t.transpose(1, 2) if order == FRAMES_FIRST else t.transpose(0, 1)).view(shape)


def _merged(stats, merge_view):
    """The merged records, one for every record of z (contiguous): each the sum over dimension 1 of merge_view."""
    return stats.view(merge_view).sum(1, keepdim=True).expand(merge_view).contiguous()


# ---- the fast path: calls whose key was checked and run before ---------------------------------------------------
_FAST_LIMIT = 256  # keys kept (and per-plane tensors kept); each table starts again when full
_fast_calls = {}
_planes = {}  # id(tensor) -> (weak reference, version, address, planes per channel, the per-plane tensor)


class _Entry:
    """What a fast call needs: the two problems (x, y, weight, bias and input_bias set per call), the records'
    shapes, the output's dtype and the two C functions (the CPU reference's for CPU tensors)."""
    __slots__ = ("planes", "stats_problem", "apply_problem", "stats_shape", "merge_view", "y_dtype", "stats",
                 "apply")


def _per_plane(tensor, m):
    """tensor.repeat_interleave(m) (channel c's value for planes c*m .. c*m + m - 1), or None for None; kept for the
    next call with the same tensor object at the same version and address (a weight is the same from call to call)."""
    if tensor is None:
        return None
    try:
        version = tensor._version
    except RuntimeError:  # an inference tensor keeps no version counter: not kept
        return tensor.repeat_interleave(m)
    kept = _planes.get(id(tensor))
    if kept is not None and kept[0]() is tensor and kept[1:4] == (version, tensor.data_ptr(), m):
        return kept[4]
    planes = tensor.repeat_interleave(m)
    if len(_planes) >= _FAST_LIMIT:
        _planes.clear()
    _planes[id(tensor)] = (weakref.ref(tensor), version, tensor.data_ptr(), m, planes)
    return planes


def _remember(torch, key, order, x, y, num_groups, weight, bias, eps, activation):
    """Puts the problems of a checked call into the table. Kept only where weight, bias and input bias are
    contiguous (their pointers, or their per-plane copies', are then what the C calls take) and the key hashable."""
    if any(t is not None and t.stride() != (1,) for t in (weight, bias)) or (key[-1] is not None
                                                                            and key[-1][-1] != (1,)):
        return
    try:
        hash(key)
    except TypeError:
        return
    entry = _Entry()
    shape, z_groups, entry.planes, entry.merge_view = _geometry(order, x, _groups(num_groups, x.shape[1]))
    entry.stats_shape = (shape[0], z_groups, _api.STATS_WORDS)
    x_code = _torch_code(torch, x, "x")
    parameters = [(None, NONE) if t is None else (None, _torch_code(torch, t, name))
                  for t, name in ((weight, "weight"), (bias, "bias"))]
    entry.stats_problem = _problem(None, x_code, None, x_code, "channels_first", shape, z_groups, (None, NONE),
                                   (None, NONE), 1e-6, 0)
    entry.apply_problem = _problem(None, x_code, None, _torch_code(torch, y, "y"), "channels_first", shape, z_groups,
                                   parameters[0], parameters[1], _eps(eps), _activation_code(activation))
    entry.y_dtype = y.dtype
    library = _lib.library()[0]
    if x.is_cuda:
        stats_function, apply_function = library.gnsilu_group_stats, library.gnsilu_group_norm_apply
        entry.stats = lambda problem, stats, stream: stats_function(problem, stats, None, 0, stream)
        entry.apply = lambda problem, stats, stream: apply_function(problem, stats, None, 0, stream)
    else:  # the library's CPU reference (the same records and bits)
        stats_function, apply_function = library.gnsilu_reference_group_stats, library.gnsilu_reference_group_norm_apply
        entry.stats = lambda problem, stats, stream: stats_function(problem, stats, 0)
        entry.apply = lambda problem, stats, stream: apply_function(problem, stats, 0)
    if len(_fast_calls) >= _FAST_LIMIT:
        _fast_calls.clear()
    _fast_calls[key] = entry


def _fast_call(torch, entry, x, weight, bias, input_bias):
    """group_norm of a call whose key is in the table: the checked path's two C calls and its merge, nothing checked
    again in Python (the library checks each problem in C)."""
    y = torch.empty_like(x, dtype=entry.y_dtype)
    stats = torch.empty(entry.stats_shape, dtype=torch.int64, device=x.device)
    if entry.planes:  # held here until the calls return
        weight, bias, input_bias = (_per_plane(t, entry.planes) for t in (weight, bias, input_bias))
    stats_problem = problem_with(entry.stats_problem, x, None, None, None, input_bias)
    apply_problem = problem_with(entry.apply_problem, x, y, weight, bias, input_bias)
    if not x.is_cuda:
        _run(entry, stats, stats_problem, apply_problem, None)
        return y
    index = x.device.index
    if index == torch.cuda.current_device():
        _run(entry, stats, stats_problem, apply_problem, _raw_stream(torch)(index))
    else:
        with torch.cuda.device(index):
            _run(entry, stats, stats_problem, apply_problem, _raw_stream(torch)(index))
    return y


def _run(entry, stats, stats_problem, apply_problem, stream):
    status = entry.stats(ctypes.byref(stats_problem), stats.data_ptr(), stream)
    if status != 0:
        _lib.raise_for_status(status)
    merged = _merged(stats, entry.merge_view)  # held until the call returns
    status = entry.apply(ctypes.byref(apply_problem), merged.data_ptr(), stream)
    if status != 0:
        _lib.raise_for_status(status)
