"""gnsilu inside torch.compile's own graph: a graph pass instead of a module swap.

    import torch, gnsilu.torch as gt
    gt.enable_inductor_pass()          # torch._inductor.config.pre_grad_custom_pass = gt.inductor_pass(), chained
    decode = torch.compile(vae.decode)

The pass runs on Dynamo's graph before AOT autograd (Inductor's pre-grad passes), where a GroupNorm is still one call
(torch.nn.functional.group_norm) and its neighbours are the calls the model made: any model's code is seen as it ran,
nothing is read from its source. Each GroupNorm is a match, with what surrounds it:
  - followed by SiLU (F.silu as the GroupNorm's only user): gnsilu's op with activation "silu", else "none";
  - then by a pad (F.pad, constant or replicate, as the SiLU's only user): gnsilu's padded op, which writes the
    padded tensor in one launch (the pad disappears);
  - preceded by a convolution's bias (torch.conv1d/2d/3d whose only user is the GroupNorm, its bias of x's dtype):
    the convolution without its bias, and the bias handed to gnsilu's op as its input bias.
A match is replaced only where the rule below says gnsilu is the faster (decide()); every decision is logged at info
level (logger "gnsilu.inductor") with its reason, and counted (last_counts()).

The rule (first version, from the measurements of docs/PERFORMANCE.md and README's tables on the H200; to be
calibrated per match kind): CUDA tensors of bfloat16, float16 or float32 only; channels-last: replaced (gnsilu was
ahead of torch.compile on every channels-last row but one); channel-major: replaced below NCHW_MAX_BYTES and with at
least MIN_GROUPS groups (torch.compile leads from 512 MiB and for a single group of 2^24 elements).

Caches: the pass runs before AOT autograd takes its key and before Inductor's FX graph cache does, so both key the
graph as the pass left it: a graph compiled with another gnsilu's decisions has another key. The FX graph cache also
pickles Inductor's config, this pass included: it pickles as its uuid() (the pass's code and rule), so the key does not
change with anything else (a pass given as a plain function makes Inductor bypass its cache: it cannot pickle one). A
graph that holds gnsilu's ops needs gnsilu.torch imported where it is loaded from a cache (enabling the pass imports
it). A model swapped by swap_group_norm_silu holds gnsilu's op already where the swap proved a pair: the pass sees that
op, not a GroupNorm, and replaces nothing twice.

GroupNorms taken per frame: where the model views a video's frames as a batch without a copy (a (1, C, T, H, W) video
permuted and flattened to (T, C, H, W): "channels first" order; or frames first), the op takes that view as it is
(gnsilu._strided, from its MIN_BYTES) under the same rule as channel-major tensors; a pad after it stays (the padded op
takes no such input). Where the reshape copies (a batch of videos), the op takes the copy. Not yet: the rule is not yet
calibrated on the GPU per match kind.
"""
import hashlib
import inspect
import logging

import torch
import torch.nn.functional as F

from . import _strided
from ._checks import layout_of

log = logging.getLogger("gnsilu.inductor")

# The rule's constants (part of uuid()).
NCHW_MAX_BYTES = 512 << 20
MIN_GROUPS = 2
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_DEVICE_TYPES = ()  # devices besides CUDA where the pass replaces (tests add "cpu": the op then runs PyTorch's ops)

_GROUP_NORMS = (F.group_norm,)
_SILUS = (F.silu,)
_PADS = (F.pad, torch._C._nn.pad)
_CONVS = (torch.conv1d, torch.conv2d, torch.conv3d, F.conv1d, F.conv2d, F.conv3d)
_PAD_MODES = ("constant", "replicate")


def _value(node):
    """The example value (a FakeTensor) Dynamo recorded for a node, or None."""
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _arg(node, index, name, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def decide(x, num_groups, activation, padded):
    """(replace, reason) for a GroupNorm of example value x (its shape, strides, dtype and device)."""
    if x is None or not isinstance(x, torch.Tensor):
        return False, "no example value for its input"
    if not (x.device.type == "cuda" or x.device.type in _DEVICE_TYPES):
        return False, f"its input is on {x.device.type}"
    if x.dtype not in _DTYPES:
        return False, f"its input is {x.dtype}"
    try:
        shape, strides = tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride())
    except (TypeError, ValueError):
        return False, "its shape is symbolic"
    if len(shape) < 3:
        return False, f"its input has {len(shape)} dimensions"
    layout = layout_of(shape, strides)
    nbytes = x.numel() * x.element_size()
    if layout is None:
        layout = _strided_order(x)
        if layout is None:
            return False, (f"its input's strides {strides} are in neither layout gnsilu takes, nor in an order "
                           f"gnsilu._strided takes from {_strided.MIN_BYTES >> 20} MiB (a video's frames)")
        if padded:
            return False, f"its input is in {layout} order (a video's frames): gnsilu's padded op takes no such input"
    if layout == "channels_last":
        return True, "channels-last"
    if num_groups < MIN_GROUPS:
        return False, f"{num_groups} group in channel-major layout (Inductor's reduction is faster there)"
    if nbytes > NCHW_MAX_BYTES:
        return False, (f"{nbytes >> 20} MiB in channel-major layout (Inductor's two-pass kernel is faster from "
                       f"{NCHW_MAX_BYTES >> 20} MiB)")
    if layout in (_strided.FRAMES_FIRST, _strided.CHANNELS_FIRST):
        return True, f"{layout} order (a video's frames, normalized without a copy), {nbytes >> 20} MiB, " \
                     f"{num_groups} groups"
    return True, f"channel-major, {nbytes >> 20} MiB, {num_groups} groups"


def _strided_order(x):
    """The order gnsilu._strided takes x in without a copy (frames first, channels first), or None."""
    try:
        return _strided.plan(x)
    except (RuntimeError, TypeError, ValueError):  # symbolic sizes
        return None


class GnsiluPass:
    """The pre-grad pass (a callable on torch.fx.Graph) with uuid() as Inductor's CustomGraphPass has it."""

    def __init__(self):
        self.counts = {}

    # Inductor's FX graph cache pickles its config, this pass included: what it pickles is the pass's code and rule
    # (uuid), not what it last counted, so that the key changes with them and with nothing else.
    def __getstate__(self):
        return {"uuid": self.uuid()}

    def __setstate__(self, state):
        self.counts = {}

    def uuid(self):
        text = inspect.getsource(inspect.getmodule(GnsiluPass))
        text += f"|{NCHW_MAX_BYTES}|{MIN_GROUPS}|{_DEVICE_TYPES}"
        from . import __version__
        return hashlib.sha256((text + "|" + __version__).encode()).hexdigest()

    def __call__(self, graph):
        counts = {"replaced": 0, "kept": 0, "padded": 0, "input_bias": 0}
        for norm in [n for n in graph.nodes if n.op == "call_function" and n.target in _GROUP_NORMS]:
            self._match(graph, norm, counts)
        graph.eliminate_dead_code()
        self.counts = counts
        return graph

    def _match(self, graph, norm, counts):
        x = _arg(norm, 0, "input")
        num_groups = _arg(norm, 1, "num_groups")
        weight, bias, eps = _arg(norm, 2, "weight"), _arg(norm, 3, "bias"), _arg(norm, 4, "eps", 1e-5)
        if not isinstance(x, torch.fx.Node) or not isinstance(num_groups, int) or not isinstance(eps, float):
            return
        silu = None
        users = list(norm.users)
        if len(users) == 1 and users[0].op == "call_function" and users[0].target in _SILUS:
            silu = users[0]
        last = silu if silu is not None else norm
        pad = None
        users = list(last.users)
        if silu is not None and len(users) == 1 and users[0].op == "call_function" and users[0].target in _PADS:
            p = users[0]
            widths, mode, value = _arg(p, 1, "pad"), _arg(p, 2, "mode", "constant"), _arg(p, 3, "value", None)
            if mode in _PAD_MODES and isinstance(widths, (tuple, list)) and all(isinstance(w, int) for w in widths) \
                    and (value is None or isinstance(value, (int, float))):
                pad = (p, list(widths), mode, 0.0 if value is None else float(value))
        conv = None
        if x.op == "call_function" and x.target in _CONVS and len(x.users) == 1:
            conv_bias = _arg(x, 2, "bias")
            bias_value, x_value = _value(conv_bias), _value(x)
            if isinstance(conv_bias, torch.fx.Node) and bias_value is not None and x_value is not None \
                    and bias_value.dtype == x_value.dtype:
                conv = x
        activation = "silu" if silu is not None else "none"
        replace, why = decide(_value(x), num_groups, activation, pad is not None)
        if not replace and pad is not None:  # the op without the pad (a video's frames: the padded op takes none)
            replace_alone, why_alone = decide(_value(x), num_groups, activation, False)
            if replace_alone:
                pad, replace, why = None, True, why_alone + "; its pad kept"
        what = ("GroupNorm" + ("+SiLU" if silu is not None else "") + ("+pad" if pad is not None else "")
                + (" after a convolution's bias" if conv is not None and replace else ""))
        shape = tuple(_value(x).shape) if _value(x) is not None else "?"
        if not replace:
            counts["kept"] += 1
            log.info("gnsilu.inductor: kept %s of %s: %s", what, shape, why)
            return
        input_bias = None
        if conv is not None:  # the convolution without its bias; the bias goes to gnsilu's op
            input_bias = _arg(conv, 2, "bias")
            args = list(conv.args)
            if len(args) > 2:
                args[2] = None
                conv.args = tuple(args)
            else:
                conv.kwargs = {**conv.kwargs, "bias": None}
            counts["input_bias"] += 1
        anchor = pad[0] if pad is not None else last
        with graph.inserting_before(anchor):
            if pad is not None:
                node = graph.call_function(torch.ops.gnsilu.group_norm_padded.default,
                                           (x, num_groups, weight, bias, float(eps), activation, pad[1], pad[2],
                                            pad[3], None, input_bias))
                counts["padded"] += 1
            else:
                node = graph.call_function(torch.ops.gnsilu.group_norm.default,
                                           (x, num_groups, weight, bias, float(eps), activation, None, input_bias))
        node.meta.update({k: v for k, v in anchor.meta.items() if k != "example_value"})
        if _value(anchor) is not None:
            node.meta["example_value"] = _value(anchor)
        anchor.replace_all_uses_with(node)
        for dead in (pad[0] if pad is not None else None, silu, norm):  # each the only user of the next
            if dead is not None and not dead.users:
                graph.erase_node(dead)
        counts["replaced"] += 1
        log.info("gnsilu.inductor: replaced %s of %s (%s): %s", what, shape, activation, why)


_PASS = None


def inductor_pass():
    """The pass (one per process): torch._inductor.config.pre_grad_custom_pass = gnsilu.torch.inductor_pass()."""
    global _PASS
    if _PASS is None:
        _PASS = GnsiluPass()
    return _PASS


class _Chained:
    """Two pre-grad passes in turn (the one that was set, then gnsilu's)."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __call__(self, graph):
        self.first(graph)
        return self.second(graph)

    def uuid(self):
        first = self.first.uuid() if hasattr(self.first, "uuid") else repr(self.first)
        return hashlib.sha256((str(first) + self.second.uuid()).encode()).hexdigest()


def enable_inductor_pass():
    """Sets torch._inductor.config.pre_grad_custom_pass to gnsilu's pass, after any pass already set there (once:
    enabling it again changes nothing). Returns the pass."""
    import torch._inductor.config as inductor_config
    p = inductor_pass()
    current = inductor_config.pre_grad_custom_pass
    if current is None:
        inductor_config.pre_grad_custom_pass = p
    elif current is not p and not (isinstance(current, _Chained) and current.second is p):
        inductor_config.pre_grad_custom_pass = _Chained(current, p)
    return p


def last_counts():
    """What the pass did to the last graph it saw: replaced, kept, padded, input_bias."""
    return dict(inductor_pass().counts)
