"""gnsilu inside torch.compile's own graph: a graph pass instead of a module swap.

    import torch, gnsilu.torch as gt
    gt.enable_inductor_pass()          # torch._inductor.config.pre_grad_custom_pass = gt.inductor_pass(), chained
    decode = torch.compile(vae.decode)

The pass runs on Dynamo's graph before AOT autograd (Inductor's pre-grad passes), where a GroupNorm is still one call
(torch.nn.functional.group_norm) and its neighbours are the calls the model made: any model's code is seen as it ran,
nothing is read from its source. Each GroupNorm is a match, with what surrounds it:
  - followed by SiLU (F.silu as the GroupNorm's only user, or behind views of it such as unflatten and permute, each
    the only user of the one before): gnsilu's op with activation "silu" (the views then take its result), else
    "none";
  - then by a pad (F.pad, constant or replicate, as the SiLU's only user, directly or behind dropouts that pass their
    input through: an inference graph's): gnsilu's padded op, which writes the padded tensor in one launch (the pad
    disappears);
  - preceded by a convolution's bias (torch.conv1d/2d/3d whose only user is the GroupNorm, its bias of x's dtype):
    the convolution without its bias, and the bias handed to gnsilu's op as its input bias.
A match is replaced only where the rule below says gnsilu is the faster (decide()); every decision is logged at info
level (logger "gnsilu.inductor") with its reason, and counted (last_counts()).

The rule (from the measurements of docs/PERFORMANCE.md and README's tables on the H200, and a count of bytes; to be
calibrated per match kind on the GPU): CUDA tensors of bfloat16, float16 or float32 only; channels-last: replaced
(gnsilu was ahead of torch.compile on every channels-last row but one); channel-major: replaced below NCHW_MAX_BYTES
and with at least MIN_GROUPS groups (torch.compile leads from 512 MiB and for a single group of 2^24 elements). And a
channel-major match is kept wherever its result (behind views, identity dropouts and slices) is read by anything but
a convolution, a matrix product, attention or the graph's output: Inductor computes a GroupNorm's normalization in
the kernel of the pointwise ops, pads and concatenations after it, so its GroupNorm reads x twice and writes once,
where gnsilu's op would write its result and the fused kernel read it again (5 passes over the tensor against 3).
Channels-last matches are replaced all the same: Inductor's channels-last GroupNorm took 5.4x a copy where gnsilu's
took 2.3x (4x128x1024x1024 bf16), more than the extra pass. Inputs below MIN_BYTES (1 MiB) are kept in either layout:
gnsilu's op costs 20-30 us of host time a call from Python (tools/bench_host.py), more than its kernels take there,
where Inductor launches its fused kernel from its compiled wrapper; SVD's temporal decoder (22 GroupNorms of 0.5 MiB)
compiled with the swap took 2.02 -> 2.11 ms NCHW and 1.72 -> 3.45 ms channels-last, bound by host time.

Caches: the pass runs before AOT autograd takes its key and before Inductor's FX graph cache does, so both key the
graph as the pass left it: a graph compiled with another gnsilu's decisions has another key. The FX graph cache also
pickles Inductor's config, this pass included: it pickles as its uuid() (the pass's code and rule), so the key does not
change with anything else (a pass given as a plain function makes Inductor bypass its cache: it cannot pickle one). A
graph that holds gnsilu's ops needs gnsilu.torch imported where it is loaded from a cache (enabling the pass imports
it). A model swapped by swap_group_norm_silu holds gnsilu's op already where the swap proved a pair: the pass sees that
op, not a GroupNorm, and replaces nothing twice.

GroupNorms taken per frame: where the model views a video's frames as a batch without a copy (a (1, C, T, H, W) video
permuted and flattened to (T, C, H, W): "channels first" order; or frames first), the op takes that view as it is
(gnsilu._strided, from its MIN_BYTES) under the same rule as channel-major tensors; where a pad follows, the match is
kept (the padded op takes no such input, and Inductor computes the pad in its GroupNorm's kernel). Where the reshape
copies (a batch of videos), the op takes the copy. What the pass does to each decode of tools/bench_vae.py, without a
GPU: tools/pass_census.py. Not yet: the rule is not yet calibrated on the GPU per match kind.
"""
import contextlib
import hashlib
import inspect
import logging
import operator

import torch
import torch.nn.functional as F

from . import _strided
from ._checks import layout_of

log = logging.getLogger("gnsilu.inductor")

# The rule's constants (part of uuid()). READER_RULE False replaces channel-major matches whatever reads them (to time
# what the reader rule keeps).
NCHW_MAX_BYTES = 512 << 20
MIN_BYTES = 1 << 20
MIN_GROUPS = 2
READER_RULE = True
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


# Nodes that only view (or copy in another order) what they take: a SiLU after them is the GroupNorm's SiLU, and what
# reads the GroupNorm's result is found behind them, and behind dropouts that pass their input through (_identity).
_VIEW_METHODS = ("view", "reshape", "permute", "transpose", "flatten", "unflatten", "squeeze", "unsqueeze",
                 "contiguous")
_VIEW_FUNCTIONS = (torch.reshape, torch.permute, torch.transpose, torch.flatten, torch.unflatten, torch.squeeze,
                   torch.unsqueeze)
_PASS_THROUGH = (F.dropout, torch.dropout, F.dropout1d, F.dropout2d, F.dropout3d)
# Readers that need the tensor in memory whatever made it (Inductor computes none of them in the producer's kernel):
# convolutions, matrix products, attention, and the graph's outputs.
_MATERIALIZING = _CONVS + (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.linear, torch.matmul,
                           torch.bmm, torch.mm, torch.baddbmm, torch.addmm, F.scaled_dot_product_attention,
                           operator.matmul)


def _is_view(node):
    return (node.op == "call_method" and node.target in _VIEW_METHODS) or \
        (node.op == "call_function" and node.target in _VIEW_FUNCTIONS)


def _identity(node):
    """A dropout that passes its input through: training False (a module in eval mode) or p = 0."""
    if node.op != "call_function" or node.target not in _PASS_THROUGH:
        return False
    training = _arg(node, 2, "train" if node.target is torch.dropout else "training", True)
    return training is False or _arg(node, 1, "p", 0.5) == 0


def _readers(node):
    """The nodes that read node's result, behind views, identity dropouts and tensor slices (operator.getitem)."""
    found, todo, seen = [], list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if _is_view(user) or _identity(user) or (user.op == "call_function" and user.target is operator.getitem):
            todo.extend(user.users)
        else:
            found.append(user)
    return found


def _channels_last(x):
    try:
        return layout_of(tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride())) == "channels_last"
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return False


def _materializes(node):
    return node.op == "output" or (node.op == "call_function" and node.target in _MATERIALIZING)


def _name(node):
    target = node.target
    return f"{node.op} {getattr(target, '__name__', target)}"


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
    if nbytes < MIN_BYTES:
        return False, (f"{nbytes >> 10} KiB: below {MIN_BYTES >> 20} MiB a call's host time (gnsilu's op from Python) "
                       f"outweighs its kernels, where Inductor launches its own from its compiled wrapper")
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
        text += f"|{NCHW_MAX_BYTES}|{MIN_BYTES}|{MIN_GROUPS}|{READER_RULE}|{_DEVICE_TYPES}"
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
        silu, views = None, []  # SiLU after the GroupNorm, directly or through views of it (each the only user)
        cur = norm
        while len(cur.users) == 1:
            user = next(iter(cur.users))
            if user.op == "call_function" and user.target in _SILUS:
                silu = user
                break
            # .view() needs its input's strides to allow it: taken only where the op's result (x's strides) is the
            # contiguous tensor F.group_norm gives for a contiguous x.
            if not _is_view(user) or (user.op == "call_method" and user.target == "view"
                                      and not (_value(x) is not None and _value(x).is_contiguous())):
                break
            views.append(user)
            cur = user
        if silu is None:
            views = []
        last = silu if silu is not None else norm
        pad = None
        users, between = list(last.users), []
        while len(users) == 1 and _identity(users[0]):  # an inference graph's dropout between the SiLU and the pad
            between.append(users[0])
            users = list(users[0].users)
        if silu is not None and not views and len(users) == 1 and users[0].op == "call_function" \
                and users[0].target in _PADS:
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
        # What reads the result: where Inductor would compute the normalization in that reader's kernel, keep the
        # match (channels-last: Inductor's GroupNorm is slower by more than the extra pass).
        if replace and READER_RULE and not _channels_last(_value(x)):
            fused = [u for u in _readers(pad[0] if pad is not None else last) if not _materializes(u)]
            if fused:
                replace, why = False, (f"its result goes to {_name(fused[0])}, which Inductor computes in the "
                                       f"GroupNorm's own kernel (gnsilu's op would add a write and a read of the "
                                       f"tensor); {why}")
        what = ("GroupNorm" + ("+SiLU" if silu is not None else "")
                + (f" (through {len(views)} view{'s' if len(views) > 1 else ''})" if views else "")
                + ("+pad" if pad is not None else "")
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
        anchor = pad[0] if pad is not None else views[0] if views else last
        with graph.inserting_before(anchor):
            if pad is not None:
                node = graph.call_function(torch.ops.gnsilu.group_norm_padded.default,
                                           (x, num_groups, weight, bias, float(eps), activation, pad[1], pad[2],
                                            pad[3], None, input_bias))
                counts["padded"] += 1
            else:
                node = graph.call_function(torch.ops.gnsilu.group_norm.default,
                                           (x, num_groups, weight, bias, float(eps), activation, None, input_bias))
        if views:  # the op's output (x's shape, with the SiLU) takes the GroupNorm's place before the views
            node.meta.update({k: v for k, v in norm.meta.items() if k != "example_value"})
            if _value(norm) is not None:
                node.meta["example_value"] = _value(norm)
            norm.replace_all_uses_with(node)
            silu.replace_all_uses_with(views[-1])
        else:
            node.meta.update({k: v for k, v in anchor.meta.items() if k != "example_value"})
            if _value(anchor) is not None:
                node.meta["example_value"] = _value(anchor)
            anchor.replace_all_uses_with(node)
        dead_nodes = [pad[0]] + between[::-1] if pad is not None else []
        for dead in dead_nodes + [silu, norm]:  # each the only user of the next
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


@contextlib.contextmanager
def logged_decisions():
    """The pass's decisions made inside the block, as the list of their log lines (logger "gnsilu.inductor", taken at
    info level for the block whatever its level)."""
    lines = []

    class _Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    handler, level = _Lines(logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
