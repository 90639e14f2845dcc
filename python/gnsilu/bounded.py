"""VAE decodes in a GPU memory budget, with the whole decode's GroupNorm statistics.

    import gnsilu.bounded
    p = gnsilu.bounded.plan(vae, latents, max_gpu_bytes=8 << 30)   # before any work: what goes where, host bytes
    print(p)
    image = gnsilu.bounded.decode(vae, latents, max_gpu_bytes=8 << 30)

A decode whose activations do not fit on the GPU is usually tiled, and every tile then normalizes with its own
statistics. Here the decoder runs layer by layer instead, each layer over slabs of rows (the height): a slab of its
output is computed from the rows of its input it needs (its halo), and every activation between two layers lives
whole where the plan puts it, on the GPU or in (pinned) host memory. Each GroupNorm takes its statistics over the whole
tensor: the exact records of every output slab of the layer that makes its input (gnsilu.group_stats) are added up
as the slabs are made, and each slab of the layer after it is normalized with them (gnsilu.group_norm_apply: the
whole call's bits). No normalized tensor exists whole. So the output is the whole decode's wherever a convolution
rounds alike on fewer rows.

The layers (diffusers' classes; anything else is refused with the module's name):
  AutoencoderKL (Flux, SD3, SDXL configurations) and AutoencoderKLFlux2: post_quant_conv, Decoder's conv_in,
  UNetMidBlock2D (ResnetBlock2D, Attention), UpDecoderBlock2D (ResnetBlock2D, Upsample2D), conv_norm_out + SiLU +
  conv_out;
  AutoencoderKLHunyuanVideo: post_quant_conv, HunyuanVideoCausalConv3d, HunyuanVideoMidBlock3D (its attention frame
  by frame without the dense causal mask: gnsilu.chunked._frame_causal_attention), HunyuanVideoResnetBlockCausal3D,
  HunyuanVideoUpsampleCausal3D, conv_norm_out + SiLU + conv_out.
A resnet block is two layers (conv1 of its normalized input; then conv2 of conv1's normalized output plus the
shortcut); the mid block's attention runs whole on the GPU (its tensor is the latent's size, times the channels), its
queries in chunks of matrix products where its heads are wider than PyTorch's fused attention kernels take (the Flux
VAE's 512: gnsilu.chunked._attention_by_query_chunks, within rounding of the module's own call).
Modules swapped by gnsilu.torch (GroupNormSiLU, GroupNorm, PaddedInputConv, a convolution whose bias the swap moves)
are taken as the modules they stand for: the plan reads their parameters, never their forwards.

The plan (gnsilu.bounded.plan): each activation's bytes and life; the slab height of each layer, chosen so that its
working set (its input rows with halo, their normalized and padded copies, its output rows, in proportion) is a share of
the budget; which activations stay on the GPU (the smaller ones, while the GPU's total at every layer, with the working
set and a reserve for the convolutions' workspaces, stays under max_gpu_bytes), the others recomputed where they can be
(a resnet block's conv1 output is kept nowhere: conv1 runs once for its records, and again for each slab of the block's
second layer, which reads the block's input for the residual anyway; two passes of a convolution cost less than copying
the tensor out and back over PCIe) or else in host memory (laid out with the height outermost, so that a slab of rows is
one block to copy); where room is left (besides _ROOM_PERCENT of the budget), the first rows of host activations on the
GPU (Activation.gpu_rows), the earliest made first, so that only the rest is copied out and back; the host bytes that
takes at its peak. A budget below the smallest working set (two rows a slab,
everything else on the host) is refused before any work with the smallest budget that works, as is a host need above
max_host_bytes. Where the model says the whole decode fits max_gpu_bytes, decode() is vae.decode() itself over the whole
tensor (diffusers' tiling and HunyuanVideo's decoding by groups of frames turned off for the call: either would give
each tile or group of frames its own statistics). The model's weights are not counted in the budget; on a CUDA device
the memory it uses outside PyTorch's allocator when the plan is made (CUDA's context and the libraries' modules, other
processes: cudaMemGetInfo's used memory less the allocator's reserved bytes) is, so that the device's used memory stays
within the budget besides the weights (Plan.outside_bytes; a budget not above it is refused with the smallest that
works; a first layered decode runs warm_up() before its plan, so that what a layered decode loads there is counted).
The plan bounds what the decode allocates; on a card larger than the budget PyTorch's caching allocator may
keep freed blocks beyond it unless capped (torch.cuda.set_per_process_memory_fraction).
"""
import contextlib
import dataclasses
import math
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from . import _api
from . import chunked as _chunked

__all__ = ["plan", "decode", "warm_up", "last_counts", "last_timeline", "Plan", "Layer", "Activation"]

# Working-set model of a layer (bytes a slab holds on the GPU, as multiples of its rows' bytes): each input's rows
# with their halo are fetched (host activations), normalized and padded (3 copies); the output rows are made and
# summed with a residual (2 copies); an upsampling layer holds its input rows upsampled besides. An input in host
# memory holds one more copy (the next slab's rows, fetched while this one is computed), and so does an output that
# goes to host memory (the slab being copied out while the next is made). An input recomputed in the layer that reads
# it adds the working set of its own layer's slab of those rows.
_INPUT_COPIES = 3
_OUTPUT_COPIES = 2
_OVERLAP_COPIES = 1
# Of the budget, the share a slab's working set may take, and the share kept for what the model does not count
# (cuDNN's workspaces, the allocator's rounding).
_SLAB_SHARE = 0.25
_RESERVE_PERCENT = 10
# Of the budget, the share left free when the first rows of host activations are kept on the GPU in the room the
# placement left (besides the reserve): the model's peak was 4% under the allocator's in a HunyuanVideo decode, and a
# plan filled to the budget would leave the allocator no slack.
_ROOM_PERCENT = 10
# The working set of the mid block's attention, in copies of its input besides the input: the module's own call holds
# the normalized tokens, q, k, v and the output, then the projected output (6); in chunks (_attention_run) q, k, v,
# the output and a chunk of scores of twice the input's bytes.
_ATTENTION_COPIES = 6
# The fewest rows a slab has (but for a tensor of one row): PyTorch's CPU convolutions round an output of one row
# differently from the same row among others (1e-6), so one-row slabs would lose the whole decode's bits there.
_MIN_ROWS = 2
# Slabs the host may queue ahead of the GPU (their events not yet reached): it waits for the oldest beyond that, so
# that fetched rows and slabs being copied out, whose memory the caching allocator holds until the GPU is past them,
# stay within the working set.
_SLABS_AHEAD = 2


@dataclasses.dataclass
class Activation:
    """A tensor between two layers: its shape, bytes, the layers that make and last read it (indices into
    Plan.layers), where it lives ("gpu", "host", or "recomputed": kept nowhere, its layer runs for its records only
    and again for each slab of the one layer that reads it), and the GroupNorm groups of the layer that normalizes it
    (its records are taken as it is made), if any."""
    name: str
    shape: tuple
    dtype: torch.dtype
    made_by: int
    last_use: int
    where: str = "gpu"
    groups: int = 0
    gpu_rows: int = 0  # of a host activation, its first rows kept on the GPU (the room the placement left)
    producer: object = dataclasses.field(default=None, repr=False)  # the Layer that makes it
    consumer: object = dataclasses.field(default=None, repr=False)  # the first Layer that reads it

    @property
    def recomputable(self):
        """Made by a slab layer from inputs that the one layer reading it reads too (a resnet block's conv1 output:
        its out layer reads the block's input for the residual), so that it may be made again there, slab by slab."""
        return (self.producer is not None and self.producer.kind == "norm_conv" and self.last_use == self.made_by + 1
                and self.consumer is not None and set(self.producer.inputs) <= set(self.consumer.inputs))

    @property
    def bytes(self):
        return math.prod(self.shape) * _element_size(self.dtype)

    @property
    def row_bytes(self):
        return self.bytes // max(1, self.shape[-2])

    @property
    def gpu_bytes(self):
        """Its bytes on the GPU: all of a "gpu" one, the first gpu_rows rows of a "host" one, none of a
        "recomputed" one."""
        return self.bytes if self.where == "gpu" else self.gpu_rows * self.row_bytes if self.where == "host" else 0

    @property
    def host_bytes(self):
        return self.bytes - self.gpu_rows * self.row_bytes if self.where == "host" else 0


@dataclasses.dataclass
class Layer:
    """One pass over slabs of output rows (kind: conv, norm_conv, resnet_out, upsample_conv) or a whole call on the
    GPU (kind: whole)."""
    name: str
    kind: str
    inputs: list
    output: str
    rows: int = 0  # output rows a slab (0: whole)
    run: object = dataclasses.field(default=None, repr=False)  # how its output rows are made (see _Decode)


@dataclasses.dataclass
class Plan:
    """What decode() will do, decided before it starts (gnsilu.bounded.plan)."""
    max_gpu_bytes: int
    plain: bool  # the whole decode fits: decode() is vae.decode()
    plain_gpu_bytes: int  # the model's estimate of the whole decode's peak (weights aside)
    gpu_bytes: int  # the model's peak of the layered decode: GPU-resident activations, the working set, the reserve
    host_bytes: int  # pinned host memory at its peak (0 for the plain decode)
    layers: list
    activations: dict
    slabs: int  # slabs in all (the progress bar's total)
    outside_bytes: int = 0  # the device's memory outside PyTorch's allocator when planned, taken from the budget

    def __str__(self):
        gib = 1 << 30
        outside = (f" ({self.outside_bytes / gib:.2f} GiB of it CUDA's own, outside PyTorch's allocator)"
                   if self.outside_bytes else "")
        lines = [f"gnsilu.bounded plan for max_gpu_bytes={self.max_gpu_bytes / gib:.2f} GiB{outside}: "
                 + ("the whole decode (vae.decode), estimated peak "
                    f"{self.plain_gpu_bytes / gib:.2f} GiB besides the weights" if self.plain else
                    f"layer by layer, {len(self.layers)} layers, {self.slabs} slabs; GPU "
                    f"{self.gpu_bytes / gib:.2f} GiB "
                    f"at its peak (the whole decode: about {self.plain_gpu_bytes / gib:.2f} GiB), host "
                    f"{self.host_bytes / gib:.2f} GiB pinned")]
        if not self.plain:
            for layer in self.layers:
                out = self.activations[layer.output]
                rows = "whole" if layer.kind == "whole" else f"{layer.rows} rows a slab"
                where = out.where + (f", its first {out.gpu_rows} rows on the GPU" if out.gpu_rows else "")
                lines.append(f"  {layer.name}: {layer.kind}, {rows}; output {tuple(out.shape)} "
                             f"({out.bytes / (1 << 20):.0f} MiB, {where})")
        return "\n".join(lines)


def _element_size(dtype):
    return dtype.itemsize


def _check_bytes(value, name, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"gnsilu.bounded: {name} must be a positive int (bytes), got {value!r}")
    return value


# ---- the decoder as layers -------------------------------------------------------------------------------------------
class _Unsupported(ValueError):
    pass


def _need(condition, module_name, why):
    if not condition:
        raise _Unsupported(f"gnsilu.bounded: {module_name} is not a layer it can run ({why})")


def _is_silu(module):
    return isinstance(module, nn.SiLU)


def _is_group_norm(module):
    """nn.GroupNorm, or gnsilu.torch's GroupNormSiLU (nn.GroupNorm's parameters; its SiLU is the block's)."""
    from .torch import GroupNormSiLU
    return isinstance(module, (nn.GroupNorm, GroupNormSiLU))


def _norm_params(norm):
    """(num_groups, weight, bias, eps) of an nn.GroupNorm or gnsilu's GroupNormSiLU (the same parameters)."""
    return norm.num_groups, norm.weight, norm.bias, norm.eps


def _causal_reach(causal):
    """(padding, reach) along the height of a causal convolution (HunyuanVideoCausalConv3d or its PaddedInputConv)."""
    return causal.time_causal_padding[2], causal.conv.dilation[-2] * (causal.conv.kernel_size[-2] - 1)


def _conv_shape(conv, shape):
    """The output shape of a plain stride-1 nn.Conv2d/3d (integer zero padding) for an input shape."""
    out = [shape[0], conv.out_channels]
    for i in range(2, len(shape)):
        k, d, p = conv.kernel_size[i - 2], conv.dilation[i - 2], conv.padding[i - 2]
        out.append(shape[i] + 2 * p - d * (k - 1))
    return tuple(out)


def _causal_shape(causal, shape):
    pw, pw2, ph, ph2, pt, pt2 = causal.time_causal_padding
    padded = (shape[0], shape[1], shape[2] + pt + pt2, shape[3] + ph + ph2, shape[4] + pw + pw2)
    return _conv_shape(causal.conv, padded)


class _Builder:
    """Builds the layers and activations of one decode (shapes by the modules' arithmetic: nothing runs)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.layers = []
        self.acts = {}

    def act(self, name, shape, made_by):
        a = Activation(name, tuple(int(s) for s in shape), self.dtype, made_by, made_by)
        self.acts[name] = a
        return name

    def layer(self, name, kind, inputs, shape, run):
        index = len(self.layers)
        out = self.act(name, shape, index)
        layer = Layer(name, kind, list(inputs), out, 0, run)
        for i in inputs:
            a = self.acts[i]
            a.last_use = max(a.last_use, index)
            a.consumer = layer if a.consumer is None else a.consumer
        self.acts[out].producer = layer
        self.layers.append(layer)
        return out

    def normalized_by(self, act, norm):
        groups = norm.num_groups
        a = self.acts[act]
        if a.groups and a.groups != groups:
            raise _Unsupported(f"gnsilu.bounded: {act} is normalized with {a.groups} and {groups} groups")
        a.groups = groups


# Each layer's run: a function (decode, output rows r0..r1) -> those rows on the GPU, or for a whole layer (decode) ->
# the whole output. `decode.rows(name, lo, hi)` gives an input's rows [max(lo, 0), min(hi, height)) on the GPU with
# (start, stop); `decode.records(name)` its merged records. A slab layer's run also says which input rows a slab will
# ask for (run.needs(decode, r0, r1): [(name, lo, hi)], from the same arithmetic), so that the next slab's rows in host
# memory are fetched while this one is computed.
class _Run:
    def __init__(self, run, needs):
        self.run, self.needs = run, needs

    def __call__(self, d, r0, r1):
        return self.run(d, r0, r1)


def _row_window(ph, reach):
    """The input rows [lo, hi) that output rows [r0, r1) of a stride-1 convolution read (padding rows included)."""
    return lambda r0, r1: (r0 - ph, r1 - ph + reach)


def _conv2d_run(conv, source):
    window = _row_window(*_chunked._reach(conv))

    def run(d, r0, r1):
        lo, hi = window(r0, r1)
        x, start, stop = d.rows(source, lo, hi)
        return _chunked._conv_slab(conv, _chunked._pad_rows(x, start - lo, hi - stop, "zeros"))
    return _Run(run, lambda d, r0, r1: [(source, *window(r0, r1))])


def _causal_run(causal, source):
    window = _row_window(*_causal_reach(causal))
    pw, _, _, _, pt, pt2 = causal.time_causal_padding

    def run(d, r0, r1):
        lo, hi = window(r0, r1)
        x, start, stop = d.rows(source, lo, hi)
        return _chunked._causal_slab(causal, F.pad(x, (pw, pw, start - lo, hi - stop, pt, pt2), mode=causal.pad_mode))
    return _Run(run, lambda d, r0, r1: [(source, *window(r0, r1))])


def _normalized(d, source, norm, lo, hi):
    """silu(group_norm(source)) of rows [lo, hi) with the whole tensor's records, and (start, stop)."""
    x, start, stop = d.rows(source, lo, hi)
    _, weight, bias, eps = _norm_params(norm)
    return _api.group_norm_apply(x, d.records(source), weight, bias, eps, "silu"), start, stop


def _norm_conv2d_run(norm, conv, source):
    window = _row_window(*_chunked._reach(conv))

    def run(d, r0, r1):
        lo, hi = window(r0, r1)
        y, start, stop = _normalized(d, source, norm, lo, hi)
        return _chunked._conv_slab(conv, _chunked._pad_rows(y, start - lo, hi - stop, "zeros"))
    return _Run(run, lambda d, r0, r1: [(source, *window(r0, r1))])


def _norm_causal_run(norm, causal, source):
    window = _row_window(*_causal_reach(causal))
    pw, _, _, _, pt, pt2 = causal.time_causal_padding

    def run(d, r0, r1):
        lo, hi = window(r0, r1)
        y, start, stop = _normalized(d, source, norm, lo, hi)
        return _chunked._causal_slab(causal, F.pad(y, (pw, pw, start - lo, hi - stop, pt, pt2), mode=causal.pad_mode))
    return _Run(run, lambda d, r0, r1: [(source, *window(r0, r1))])


def _resnet_out_run(conv_run, shortcut_run, residual, scale):
    """(residual rows, or shortcut(residual) rows) + conv_run rows, divided by the block's output scale."""
    def run(d, r0, r1):
        h = conv_run(d, r0, r1)
        if shortcut_run is None:
            res, _, _ = d.rows(residual, r0, r1)
        else:
            res = shortcut_run(d, r0, r1)
        out = res + h
        return out if scale == 1.0 else out / scale

    def needs(d, r0, r1):
        rest = [(residual, r0, r1)] if shortcut_run is None else shortcut_run.needs(d, r0, r1)
        return conv_run.needs(d, r0, r1) + rest
    return _Run(run, needs)


def _upsampled_window(ph, reach, factor, height):
    """For output rows [r0, r1) of a convolution of an input upsampled by `factor` along the height (nearest): the
    upsampled rows [lo, hi) it reads (padding included), those that exist [lo_c, hi_c), and the source rows [src_lo,
    src_hi) they repeat. height(d): the source's height."""
    def window(d, r0, r1):
        lo, hi = r0 - ph, r1 - ph + reach
        lo_c, hi_c = max(lo, 0), min(hi, factor * height(d))
        return lo, hi, lo_c, hi_c, lo_c // factor, (hi_c + factor - 1) // factor
    return window


def _upsample2d_run(module, source):
    conv = module.conv
    window = _upsampled_window(*_chunked._reach(conv), 2, lambda d: d.height(source))

    def run(d, r0, r1):
        lo, hi, lo_c, hi_c, src_lo, src_hi = window(d, r0, r1)
        x, _, _ = d.rows(source, src_lo, src_hi)
        up = F.interpolate(x, scale_factor=2.0, mode="nearest")[..., lo_c - 2 * src_lo:hi_c - 2 * src_lo, :]
        return _chunked._conv_slab(conv, _chunked._pad_rows(up, lo_c - lo, hi - hi_c, "zeros"))
    return _Run(run, lambda d, r0, r1: [(source, *window(d, r0, r1)[4:])])


def _hunyuan_upsample_run(module, source):
    causal = module.conv
    factor = int(module.upsample_factor[1])
    window = _upsampled_window(*_causal_reach(causal), factor, lambda d: d.height(source))
    pw, _, _, _, pt, pt2 = causal.time_causal_padding

    def run(d, r0, r1):
        lo, hi, lo_c, hi_c, src_lo, src_hi = window(d, r0, r1)
        x, _, _ = d.rows(source, src_lo, src_hi)
        up = _chunked._hunyuan_upsample(module, x)[..., lo_c - factor * src_lo:hi_c - factor * src_lo, :]
        up = F.pad(up, (pw, pw, lo_c - lo, hi - hi_c, pt, pt2), mode=causal.pad_mode)
        return _chunked._causal_slab(causal, up)
    return _Run(run, lambda d, r0, r1: [(source, *window(d, r0, r1)[4:])])


def _attention_run(attn, source):
    """The mid block's attention over the whole tensor. Heads wider than 256 on a CUDA device (the Flux VAE's 512,
    for which PyTorch has no fused attention kernel) take their queries in chunks of matrix products
    (gnsilu.chunked._attention_by_query_chunks: within rounding of attn's own call), with at most twice the input's
    bytes of scores at a time (a chunk re-reads k and v, so fewer rows a chunk would cost more passes over them than
    they save); anything else is attn's own call, and so are 16-bit tensors where torch.bmm cannot give FP32 products
    (older PyTorch)."""
    chunked = _chunked._frame_attention_plain(attn) and _chunked._wide_heads(attn)

    def run(d):
        x = d.whole(source)
        if chunked and x.is_cuda and (x.dtype == torch.float32 or _chunked._fp32_products(x)):
            return _chunked._attention_by_query_chunks(attn, x, 2 * x.numel() * x.element_size())
        return attn(x)
    return run


def _layers_2d(vae, shape, dtype):
    """The layers of AutoencoderKL's decode (post_quant_conv, then its Decoder)."""
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2D, UpDecoderBlock2D
    from diffusers.models.upsampling import Upsample2D
    b = _Builder(dtype)
    dec = vae.decoder
    x = b.act("latents", shape, -1)
    pqc = getattr(vae, "post_quant_conv", None)
    if pqc is not None:
        _need(isinstance(pqc, nn.Conv2d) and _chunked._conv_plain(pqc), "post_quant_conv", "a plain nn.Conv2d")
        x = b.layer("post_quant_conv", "conv", [x], _conv_shape(pqc, shape), _conv2d_run(pqc, x))
    _need(_chunked._conv_plain(dec.conv_in), "decoder.conv_in", "a plain stride-1 nn.Conv2d")
    x = b.layer("conv_in", "conv", [x], _conv_shape(dec.conv_in, b.acts[x].shape), _conv2d_run(dec.conv_in, x))

    def resnet(block, name, x):
        _need(isinstance(block, ResnetBlock2D), name, type(block).__name__)
        _need(block.upsample is None and block.downsample is None, name, "up- or downsampling")
        _need(block.time_emb_proj is None and block.time_embedding_norm in ("default", "group"), name,
              "a time embedding")
        _need(_is_group_norm(block.norm1) and _is_group_norm(block.norm2), name, "its norms are not GroupNorms")
        _need(_is_silu(block.nonlinearity), name, "its nonlinearity is not SiLU")
        _need(not (block.dropout.training and block.dropout.p > 0), name, "dropout in training mode")
        for c in ("conv1", "conv2"):
            _need(_chunked._conv_plain(getattr(block, c)), f"{name}.{c}", "a plain stride-1 nn.Conv2d")
        shortcut = block.conv_shortcut
        _need(shortcut is None or _chunked._conv_plain(shortcut), f"{name}.conv_shortcut", "a plain nn.Conv2d")
        b.normalized_by(x, block.norm1)
        h = b.layer(f"{name}.conv1", "norm_conv", [x], _conv_shape(block.conv1, b.acts[x].shape),
                    _norm_conv2d_run(block.norm1, block.conv1, x))
        b.normalized_by(h, block.norm2)
        out_shape = _conv_shape(block.conv2, b.acts[h].shape)
        return b.layer(f"{name}.out", "resnet_out", [h, x], out_shape, _resnet_out_run(
            _norm_conv2d_run(block.norm2, block.conv2, h), None if shortcut is None else _conv2d_run(shortcut, x), x,
            float(block.output_scale_factor)))

    mid = dec.mid_block
    _need(isinstance(mid, UNetMidBlock2D), "decoder.mid_block", type(mid).__name__)
    x = resnet(mid.resnets[0], "mid_block.resnets.0", x)
    for i, (attn, res) in enumerate(zip(mid.attentions, mid.resnets[1:])):
        if attn is not None:
            x = b.layer(f"mid_block.attentions.{i}", "whole", [x], b.acts[x].shape, _attention_run(attn, x))
        x = resnet(res, f"mid_block.resnets.{i + 1}", x)
    for u, block in enumerate(dec.up_blocks):
        _need(isinstance(block, UpDecoderBlock2D), f"decoder.up_blocks.{u}", type(block).__name__)
        for r, res in enumerate(block.resnets):
            x = resnet(res, f"up_blocks.{u}.resnets.{r}", x)
        for s, up in enumerate(block.upsamplers or []):
            name = f"up_blocks.{u}.upsamplers.{s}"
            _need(isinstance(up, Upsample2D) and _chunked._upsample2d_plain(up), name, "nearest x2 then a convolution")
            in_shape = b.acts[x].shape
            up_shape = in_shape[:-2] + (2 * in_shape[-2], 2 * in_shape[-1])
            x = b.layer(name, "upsample_conv", [x], _conv_shape(up.conv, up_shape), _upsample2d_run(up, x))
    _need(_is_silu(dec.conv_act), "decoder.conv_act", "not SiLU")
    _need(_is_group_norm(dec.conv_norm_out), "decoder.conv_norm_out", "not a GroupNorm (a SpatialNorm?)")
    _need(_chunked._conv_plain(dec.conv_out), "decoder.conv_out", "a plain stride-1 nn.Conv2d")
    b.normalized_by(x, dec.conv_norm_out)
    b.layer("conv_out", "norm_conv", [x], _conv_shape(dec.conv_out, b.acts[x].shape),
            _norm_conv2d_run(dec.conv_norm_out, dec.conv_out, x))
    return b


def _layers_hunyuan(vae, shape, dtype):
    """The layers of AutoencoderKLHunyuanVideo's decode (post_quant_conv, then its HunyuanVideoDecoder3D)."""
    from diffusers.models.autoencoders import autoencoder_kl_hunyuan_video as hv
    b = _Builder(dtype)
    dec = vae.decoder
    x = b.act("latents", shape, -1)
    pqc = vae.post_quant_conv
    _need(isinstance(pqc, nn.Conv3d) and _chunked._conv_plain(pqc), "post_quant_conv", "a plain nn.Conv3d")
    x = b.layer("post_quant_conv", "conv", [x], _conv_shape(pqc, shape), _conv2d_run(pqc, x))

    def causal(module, name):
        _need(_chunked._causal_like(module), name, "a causal convolution with stride 1 along the height")
        return module

    c = causal(dec.conv_in, "decoder.conv_in")
    x = b.layer("conv_in", "conv", [x], _causal_shape(c, b.acts[x].shape), _causal_run(c, x))

    def resnet(block, name, x):
        _need(isinstance(block, hv.HunyuanVideoResnetBlockCausal3D), name, type(block).__name__)
        _need(_is_silu(block.nonlinearity), name, "its nonlinearity is not SiLU")
        _need(_is_group_norm(block.norm1) and _is_group_norm(block.norm2), name, "its norms are not GroupNorms")
        _need(not (block.dropout.training and block.dropout.p > 0), name, "dropout in training mode")
        c1, c2 = causal(block.conv1, f"{name}.conv1"), causal(block.conv2, f"{name}.conv2")
        shortcut = block.conv_shortcut
        if shortcut is not None:
            causal(shortcut, f"{name}.conv_shortcut")
        b.normalized_by(x, block.norm1)
        h = b.layer(f"{name}.conv1", "norm_conv", [x], _causal_shape(c1, b.acts[x].shape),
                    _norm_causal_run(block.norm1, c1, x))
        b.normalized_by(h, block.norm2)
        return b.layer(f"{name}.out", "resnet_out", [h, x], _causal_shape(c2, b.acts[h].shape), _resnet_out_run(
            _norm_causal_run(block.norm2, c2, h), None if shortcut is None else _causal_run(shortcut, x), x, 1.0))

    mid = dec.mid_block
    _need(isinstance(mid, hv.HunyuanVideoMidBlock3D), "decoder.mid_block", type(mid).__name__)
    x = resnet(mid.resnets[0], "mid_block.resnets.0", x)
    for i, (attn, res) in enumerate(zip(mid.attentions, mid.resnets[1:])):
        if attn is not None:
            _need(_chunked._frame_attention_plain(attn), f"mid_block.attentions.{i}", "not AttnProcessor2_0's")

            def whole(d, _a=attn, _x=x):
                t = d.whole(_x)
                batch, channels, frames, height, width = t.shape
                tokens = _chunked._frame_causal_attention(_a, t.permute(0, 2, 3, 4, 1).flatten(1, 3), frames)
                return tokens.unflatten(1, (frames, height, width)).permute(0, 4, 1, 2, 3)
            x = b.layer(f"mid_block.attentions.{i}", "whole", [x], b.acts[x].shape, whole)
        x = resnet(res, f"mid_block.resnets.{i + 1}", x)
    for u, block in enumerate(dec.up_blocks):
        _need(isinstance(block, hv.HunyuanVideoUpBlock3D), f"decoder.up_blocks.{u}", type(block).__name__)
        for r, res in enumerate(block.resnets):
            x = resnet(res, f"up_blocks.{u}.resnets.{r}", x)
        for s, up in enumerate(block.upsamplers or []):
            name = f"up_blocks.{u}.upsamplers.{s}"
            _need(isinstance(up, hv.HunyuanVideoUpsampleCausal3D) and _chunked._hunyuan_upsample_plain(up), name,
                  "nearest upsampling by integers then a causal convolution")
            ft, fh, fw = (int(f) for f in up.upsample_factor)
            n, ch, t, hh, ww = b.acts[x].shape
            up_shape = (n, ch, 1 + (t - 1) * ft, hh * fh, ww * fw)
            x = b.layer(name, "upsample_conv", [x], _causal_shape(up.conv, up_shape), _hunyuan_upsample_run(up, x))
    _need(_is_silu(dec.conv_act), "decoder.conv_act", "not SiLU")
    _need(_is_group_norm(dec.conv_norm_out), "decoder.conv_norm_out", "not a GroupNorm")
    c = causal(dec.conv_out, "decoder.conv_out")
    b.normalized_by(x, dec.conv_norm_out)
    b.layer("conv_out", "norm_conv", [x], _causal_shape(c, b.acts[x].shape), _norm_causal_run(dec.conv_norm_out, c, x))
    return b


def _layers(vae, shape, dtype):
    kind = type(vae).__name__
    try:
        from diffusers.models import autoencoders
    except ImportError as e:
        raise ValueError(f"gnsilu.bounded needs diffusers ({e})") from e
    if isinstance(vae, getattr(autoencoders, "AutoencoderKLHunyuanVideo", ())):
        if len(shape) != 5:
            raise ValueError(f"gnsilu.bounded: latents must be 5-D (N, C, T, H, W) for {kind}, got shape {shape}")
        return _layers_hunyuan(vae, shape, dtype)
    # AutoencoderKLFlux2 decodes as AutoencoderKL does (post_quant_conv, then the same Decoder).
    two_d = tuple(getattr(autoencoders, c) for c in ("AutoencoderKL", "AutoencoderKLFlux2") if hasattr(autoencoders, c))
    if isinstance(vae, two_d):
        if len(shape) != 4:
            raise ValueError(f"gnsilu.bounded: latents must be 4-D (N, C, H, W) for {kind}, got shape {shape}")
        return _layers_2d(vae, shape, dtype)
    raise ValueError(f"gnsilu.bounded: vae must be a diffusers AutoencoderKL, AutoencoderKLFlux2 or "
                     f"AutoencoderKLHunyuanVideo, got {kind}")


# ---- the plan --------------------------------------------------------------------------------------------------------
def _slab_bytes(layer, acts, rows):
    """The model's working set of a slab of `rows` output rows of `layer` (bytes)."""
    out = acts[layer.output]
    total = (_OUTPUT_COPIES + (_OVERLAP_COPIES if out.where == "host" else 0)) * rows * out.row_bytes
    for name in layer.inputs:
        a = acts[name]
        scale = out.shape[-2] / max(1, a.shape[-2])  # input rows a slab reads (upsampling layers: fewer)
        in_rows = rows / scale + 4  # and a halo
        growth = max(1.0, out.bytes / max(1, a.bytes)) if layer.kind == "upsample_conv" else 1.0
        total += int(_INPUT_COPIES * in_rows * a.row_bytes * growth)
        if a.where == "host":
            total += int((_OVERLAP_COPIES + (1 if a.gpu_rows else 0)) * in_rows * a.row_bytes)
        elif a.where == "recomputed":
            total += _slab_bytes(a.producer, acts, math.ceil(in_rows))
    return total


def _reserve(budget):
    return budget * _RESERVE_PERCENT // 100


def _smallest_budget(work):
    """The smallest budget whose share besides the reserve holds `work` bytes."""
    budget = work * 100 // (100 - _RESERVE_PERCENT)
    while budget - _reserve(budget) < work:
        budget += 1
    while budget > 1 and (budget - 1) - _reserve(budget - 1) >= work:
        budget -= 1
    return budget


def _peaks(layers, acts, budget):
    """(GPU peak of the layered decode, host peak) for the current placement and slab heights."""
    gpu = host = 0
    for i, layer in enumerate(layers):
        live = [a for a in acts.values() if a.made_by <= i <= a.last_use]
        resident = sum(a.gpu_bytes for a in live)
        hosted = sum(a.host_bytes for a in live)
        if layer.kind == "whole":
            work = sum(acts[n].bytes for n in layer.inputs) * _ATTENTION_COPIES
        else:
            work = _slab_bytes(layer, acts, layer.rows)
        gpu = max(gpu, resident + work + _reserve(budget))
        host = max(host, hosted)
    return gpu, host


def _plain_bytes(layers, acts):
    """The model's peak of the whole decode: every activation on the GPU, each layer's working set whole."""
    peak = 0
    for i, layer in enumerate(layers):
        live = sum(a.bytes for a in acts.values() if a.made_by <= i <= a.last_use)
        out = acts[layer.output]
        work = (sum(acts[n].bytes for n in layer.inputs) * _ATTENTION_COPIES if layer.kind == "whole"
                else _slab_bytes(layer, acts, out.shape[-2]))
        peak = max(peak, live + work)
    return peak


class _BudgetTooSmall(ValueError):
    """A budget below the smallest working set; `least` is the smallest budget that works."""

    def __init__(self, least, message):
        super().__init__(message)
        self.least = least


def _make_plan(vae, shape, dtype, max_gpu_bytes, max_host_bytes, recompute=True, outside=0, layered=False):
    """The plan (see plan()); layered=True plans layer by layer even where the whole decode fits (the warm-up's)."""
    b = _layers(vae, tuple(shape), dtype)
    # What the decode's own allocations may take (at least 1 byte, so that a budget not above `outside` is refused
    # below with the smallest budget that works).
    budget = max(1, max_gpu_bytes - outside)
    layers, acts = b.layers, b.acts
    plain_bytes = _plain_bytes(layers, acts)
    if plain_bytes <= budget and not layered:
        for a in acts.values():
            a.where = "gpu"
        return Plan(max_gpu_bytes, True, plain_bytes, plain_bytes, 0, layers, acts, 0, outside)
    share = int(_SLAB_SHARE * budget)
    for layer in layers:
        if layer.kind == "whole":
            continue
        height = acts[layer.output].shape[-2]
        rows = height
        while rows > _MIN_ROWS and _slab_bytes(layer, acts, rows) > share:
            rows = max(_MIN_ROWS, rows // 2)
        layer.rows = rows
    # Placement: the latents and the output where they are given and wanted; the largest activations off the GPU
    # first (of equal size, those that can be recomputed), until the GPU's peak is under the budget: recomputed where
    # they can be (a resnet block's conv1 output: its convolution runs again for each slab of the block's out layer,
    # which costs less than copying the tensor out and back over PCIe), else to the host.
    movable = sorted((a for a in acts.values() if a.made_by >= 0 and a.name != layers[-1].output),
                     key=lambda a: (-a.bytes, not (recompute and a.recomputable)))
    gpu, host = _peaks(layers, acts, budget)
    for a in movable:
        if gpu <= budget:
            break
        if any(layers[i].kind == "whole" and a.name in (layers[i].inputs + [layers[i].output])
               for i in range(len(layers))):
            continue  # the attention's tensors stay on the GPU
        a.where = "recomputed" if recompute and a.recomputable else "host"
        gpu, host = _peaks(layers, acts, budget)
    # Then the slabs shrink where the GPU is still over; where that is not enough, a recomputed activation (whose
    # layer adds its working set to its reader's) goes to the host instead, the one whose reader works widest first.
    while True:
        while gpu > budget:
            widest = max((layer for layer in layers if layer.kind != "whole" and layer.rows > _MIN_ROWS),
                         key=lambda layer: _slab_bytes(layer, acts, layer.rows), default=None)
            if widest is None:
                break
            widest.rows = max(_MIN_ROWS, widest.rows // 2)
            gpu, host = _peaks(layers, acts, budget)
        recomputed = [a for a in acts.values() if a.where == "recomputed"]
        if gpu <= budget or not recomputed:
            break
        max(recomputed, key=lambda a: _slab_bytes(a.consumer, acts, a.consumer.rows)).where = "host"
        gpu, host = _peaks(layers, acts, budget)
    if gpu > budget:
        least = _smallest_budget(gpu - _reserve(budget)) + outside
        raise _BudgetTooSmall(
            least, f"gnsilu.bounded: max_gpu_bytes={max_gpu_bytes} is below what this decode needs with {_MIN_ROWS} "
            f"rows a slab and every activation it can move in host memory: max_gpu_bytes={least} "
            f"({least / (1 << 30):.2f} GiB) at least, besides the model's weights"
            + (f" ({outside} bytes of it the device's memory outside PyTorch's allocator: CUDA's context and "
               "libraries, other processes)" if outside else ""))
    # The room left: the first rows of host activations kept on the GPU (rows not copied out and back), the earliest
    # made first, each as many as keep the GPU's peak within the budget less _ROOM_PERCENT of it.
    room = budget - budget * _ROOM_PERCENT // 100
    hosted = sorted((a for a in movable if a.where == "host"), key=lambda a: a.made_by) if gpu <= room else []
    for a in hosted:
        low, high = 0, a.shape[-2] - 1  # rows kept: low fits; at least one row stays in host memory
        while low < high:
            a.gpu_rows = (low + high + 1) // 2
            if _peaks(layers, acts, budget)[0] <= room:
                low = a.gpu_rows
            else:
                high = a.gpu_rows - 1
        a.gpu_rows = low
        gpu, host = _peaks(layers, acts, budget)
    if max_host_bytes is not None and host > max_host_bytes:
        raise ValueError(f"gnsilu.bounded: this decode in max_gpu_bytes={max_gpu_bytes} needs {host} bytes "
                         f"({host / (1 << 30):.2f} GiB) of pinned host memory, above max_host_bytes={max_host_bytes}")
    slabs = sum(-(-acts[layer.output].shape[-2] // layer.rows) for layer in layers if layer.kind != "whole")
    return Plan(max_gpu_bytes, False, plain_bytes, gpu, host, layers, acts, slabs, outside)


def plan(vae, latents, max_gpu_bytes, *, max_host_bytes=None, recompute=True):
    """What decode(vae, latents, max_gpu_bytes) will do (a Plan), decided before any work: whether the whole decode
    fits, else each layer's slab height, where each activation lives and the pinned host bytes at the peak. latents: a
    tensor (or a torch.Size / tuple with the dtype of the vae's parameters). recompute=False keeps every activation
    that leaves the GPU in host memory (for a GPU whose convolutions are slower than its link). Raises ValueError,
    naming the argument, for a budget below the smallest working set or a host need above max_host_bytes, and for a
    model it cannot run layer by layer (naming the module). On CUDA, the device's memory outside PyTorch's allocator
    at this call is taken from the budget (Plan.outside_bytes), so a plan made before other work on the device may
    differ from decode()'s."""
    _check_bytes(max_gpu_bytes, "max_gpu_bytes")
    _check_bytes(max_host_bytes, "max_host_bytes", allow_none=True)
    if not isinstance(recompute, bool):
        raise ValueError(f"gnsilu.bounded: recompute must be True or False, got {recompute!r}")
    if isinstance(latents, torch.Tensor):
        shape, dtype, device = tuple(latents.shape), latents.dtype, latents.device
    else:
        parameter = next(vae.parameters())
        shape, dtype, device = tuple(latents), parameter.dtype, parameter.device
    return _make_plan(vae, shape, dtype, max_gpu_bytes, max_host_bytes, recompute, _outside_allocator_bytes(device))


def _outside_allocator_bytes(device):
    """The memory a CUDA device uses outside PyTorch's caching allocator (CUDA's context, the libraries' modules and
    handles, other processes), from cudaMemGetInfo: the budget counts it, so that the device's used memory stays
    within max_gpu_bytes besides the weights. 0 off CUDA."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return max(0, (total - free) - torch.cuda.memory_reserved(device))


# ---- the decode ------------------------------------------------------------------------------------------------------
class _Decode:
    """One layered decode: the activations as they are made (GPU tensors, or host tensors), their records.

    On a CUDA device, copies between host and GPU memory run on two streams of their own, so that they overlap the
    convolutions on the caller's stream: the next slab's input rows are fetched (H2D) while this slab is computed, and
    each slab of a host activation is copied out (D2H) while the next is made, across layers too. Ordering, row by
    row: a slab's fetched rows are used after an event of the fetch stream; a slab is copied out after the caller's
    stream has made it; host rows are fetched after the copies out of the slabs that wrote them (an event of the
    store stream a slab), and nothing else waits: a layer's first slabs read rows its predecessor copied out long
    before, while that layer's last slabs are still on their way. Tensors made on one stream and used on another are
    marked (record_stream), so that the caching allocator reuses their memory only after that use; and the host
    runs at most _SLABS_AHEAD slabs ahead of the GPU (it waits for an older slab's event), so that the memory held by
    slabs in flight stays within the plan's working set."""

    def __init__(self, p, device, memory_format, pin):
        self.plan = p
        self.device = device
        self.memory_format = memory_format
        self.pin = pin
        self.tensors = {}  # name -> the activation (of a host one, its rows from gpu_rows on, in host memory)
        self.kept_rows = {}  # name -> the first gpu_rows rows of a host activation, on the GPU
        self.merged = {}
        # (name, start, stop) -> [rows on the GPU, the event after which they are there (or None), used by this slab,
        # slabs that asked for them and have not ended]
        self.fetched = {}
        self.counts = {"fetched_ahead": 0, "fetched_late": 0, "fetched_unused": 0}
        self.timeline = []  # a dict a layer, with its events on the GPU (timeline(): their times, once all is done)
        self.h2d_bytes = 0  # host rows fetched so far
        self.stored = {}  # name -> [(first row, last row + 1, the store stream's event after their copy out)]
        self.in_flight = []  # an event a slab (after its copy out, or its compute): the host waits for the oldest
        cuda = device.type == "cuda"
        self.fetch_stream = torch.cuda.Stream(device) if cuda else None
        self.store_stream = torch.cuda.Stream(device) if cuda else None

    def _compute_stream(self):
        return torch.cuda.current_stream(self.device)

    def _after_stores(self, name, start, stop):
        """The current stream waits for the copies out of the slabs of `name` that wrote rows [start, stop) (the
        latest of them suffices: the store stream copies in order)."""
        latest = None
        for r0, r1, event in self.stored.get(name, ()):
            if r0 < stop and start < r1:
                latest = event
        if latest is not None:
            torch.cuda.current_stream(self.device).wait_event(latest)

    def _host_rows(self, name, start, stop):
        self._after_stores(name, start, stop)
        first = self.plan.activations[name].gpu_rows  # the host tensor's first row
        part = self.tensors[name][..., start - first:stop - first, :]  # one block of host memory, then the layout
        self.h2d_bytes += part.numel() * part.element_size()
        return part.to(self.device, non_blocking=self.pin).contiguous(memory_format=self.memory_format)

    def begin_layer(self):
        """Before a layer's first slab: fetched rows nobody asked for dropped."""
        self.counts["fetched_unused"] += sum(1 for entry in self.fetched.values() if not entry[2])
        self.fetched.clear()

    def end_slab(self):
        """After a slab: the fetched rows it used dropped, but those the next slab asked for too (the same window: the
        last slabs' halos clamped at the height, or clipped at a host activation's rows kept on the GPU)."""
        for key, entry in list(self.fetched.items()):
            if entry[2]:
                entry[2], entry[3] = False, entry[3] - 1
                if entry[3] <= 0:
                    del self.fetched[key]

    def slab_done(self, event):
        """After a slab is queued: its event kept, and the host waits for the slab _SLABS_AHEAD before it."""
        if event is None:
            return
        self.in_flight.append(event)
        if len(self.in_flight) > _SLABS_AHEAD:
            self.in_flight.pop(0).synchronize()

    def _windows(self, requests, windows):
        """The host rows that `requests` ([(name, lo, hi)]) read, into windows (name -> (start, stop), one window an
        activation: the union of its requests): a recomputed input's requests are those of its layer's run over the
        rows asked for."""
        for name, lo, hi in requests:
            a = self.plan.activations[name]
            start, stop = max(lo, 0), min(hi, a.shape[-2])
            if start >= stop:
                continue
            if a.where == "recomputed":
                self._windows(a.producer.run.needs(self, start, stop), windows)
            elif a.where == "host" and name in self.tensors:
                start = max(start, a.gpu_rows)  # the rows before are on the GPU
                if start >= stop:
                    continue
                w = windows.get(name)
                windows[name] = (start, stop) if w is None else (min(w[0], start), max(w[1], stop))
        return windows

    def prefetch(self, requests):
        """Fetches the host rows of `requests` ([(name, lo, hi)], a slab's run.needs) ahead of their use: one window
        an activation (a resnet block's input read for a recomputed conv1 and for the residual is fetched once)."""
        for name, (start, stop) in self._windows(requests, {}).items():
            key = (name, start, stop)
            if key in self.fetched:
                self.fetched[key][3] += 1
                continue
            if self.fetch_stream is None:  # on the CPU: now (the same copy the slab would make)
                self.fetched[key] = [self._host_rows(name, start, stop), None, False, 1]
                continue
            with torch.cuda.stream(self.fetch_stream):
                part = self._host_rows(name, start, stop)
                done = torch.cuda.Event()
                done.record(self.fetch_stream)
            part.record_stream(self._compute_stream())
            self.fetched[key] = [part, done, False, 1]

    def height(self, name):
        return self.plan.activations[name].shape[-2]

    def whole(self, name):
        t = self.tensors[name]
        a = self.plan.activations[name]
        if a.where == "host":
            self.h2d_bytes += t.numel() * t.element_size()
            self._after_stores(name, a.gpu_rows, a.shape[-2])
            t = t.to(self.device).contiguous(memory_format=self.memory_format)
            if a.gpu_rows:
                t = torch.cat([self.kept_rows[name], t], dim=-2).contiguous(memory_format=self.memory_format)
        return t

    def rows(self, name, lo, hi):
        a = self.plan.activations[name]
        start, stop = max(lo, 0), min(hi, a.shape[-2])
        if a.where == "recomputed":  # made again from its layer's inputs (its records were taken when it was made)
            return a.producer.run(self, start, stop), start, stop
        t = self.tensors[name]
        if a.where != "host":
            return t[..., start:stop, :], start, stop
        first = a.gpu_rows  # rows before it on the GPU, those from it in host memory
        if stop <= first:
            return self.kept_rows[name][..., start:stop, :], start, stop
        fetched = self._fetched_rows(name, max(start, first), stop)
        if start >= first:
            return fetched, start, stop
        joined = torch.cat([self.kept_rows[name][..., start:first, :], fetched], dim=-2)
        return joined.contiguous(memory_format=self.memory_format), start, stop

    def _fetched_rows(self, name, start, stop):
        """Host rows [start, stop) of `name` on the GPU: from a window fetched ahead, else fetched now."""
        for (n, s, e), entry in self.fetched.items():  # this slab's window comes before the next slab's
            if n == name and s <= start and stop <= e:
                part, done, used, _ = entry
                if not used:
                    entry[2] = True
                    self.counts["fetched_ahead"] += 1
                if done is not None:
                    self._compute_stream().wait_event(done)
                return part if (s, e) == (start, stop) else part[..., start - s:stop - s, :]
        self.counts["fetched_late"] += 1
        return self._host_rows(name, start, stop)

    def records(self, name):
        return self.merged[name]

    def allocate(self, a):
        if a.where == "recomputed":
            return None
        on_host = a.where == "host"
        try:
            if on_host:
                if a.gpu_rows:
                    self.kept_rows[a.name] = torch.empty(a.shape[:-2] + (a.gpu_rows, a.shape[-1]), dtype=a.dtype,
                                                        device=self.device, memory_format=self.memory_format)
                return _host_tensor(a.shape[:-2] + (a.shape[-2] - a.gpu_rows, a.shape[-1]), a.dtype, self.pin)
            return torch.empty(a.shape, dtype=a.dtype, device=self.device, memory_format=self.memory_format)
        except RuntimeError as e:
            where = "pinned host memory" if on_host else "GPU memory"
            raise MemoryError(f"gnsilu.bounded: allocating {a.name} ({a.bytes} bytes of {where}) failed: {e}") from e

    def store(self, a, out, r0, y):
        if a.groups:
            s = _api.group_stats(y, a.groups)
            self.merged[a.name] = s if a.name not in self.merged else self.merged[a.name] + s
        if a.where == "recomputed":  # its records only
            self.slab_done(self._event())
            return
        if a.where != "host":
            out[..., r0:r0 + y.shape[-2], :].copy_(y)
            self.slab_done(self._event())
            return
        first = a.gpu_rows
        if r0 < first:  # the slab's rows before `first` stay on the GPU
            kept = min(first - r0, y.shape[-2])
            self.kept_rows[a.name][..., r0:r0 + kept, :].copy_(y[..., :kept, :])
            y, r0 = y[..., kept:, :], r0 + kept
            if y.shape[-2] == 0:
                self.slab_done(self._event())
                return
        dst = out[..., r0 - first:r0 - first + y.shape[-2], :]
        # The slab in the host tensor's order on the GPU first: then one block to copy, on the store stream.
        y = torch.empty_strided(dst.shape, dst.stride(), dtype=y.dtype, device=y.device).copy_(y)
        self.timeline[-1]["d2h_bytes"] += y.numel() * y.element_size()
        if self.store_stream is None:
            dst.copy_(y)
            return
        self.store_stream.wait_stream(self._compute_stream())
        with torch.cuda.stream(self.store_stream):
            dst.copy_(y, non_blocking=self.pin)
            done = self._event(self.store_stream)
        y.record_stream(self.store_stream)
        self.stored.setdefault(a.name, []).append((r0, r0 + y.shape[-2], done))
        self.slab_done(done)

    def finish(self):
        """Waits for the copies out (the last layer's output may be in host memory)."""
        if self.store_stream is not None:
            self._compute_stream().wait_stream(self.store_stream)
            self.store_stream.synchronize()

    def _event(self, stream=None, timed=False):
        """An event recorded now on `stream` (default: the caller's stream); None on the CPU."""
        if self.store_stream is None:
            return None
        e = torch.cuda.Event(enable_timing=timed)
        e.record(stream if stream is not None else self._compute_stream())
        return e

    def run(self, layer, progress):
        a = self.plan.activations[layer.output]
        entry = {"layer": layer.name, "kind": layer.kind, "output": a.where, "slabs": 0, "h2d_bytes": 0,
                 "d2h_bytes": 0, "wall": time.perf_counter()}
        self.timeline.append(entry)
        h2d = self.h2d_bytes
        self.begin_layer()
        entry["start"] = self._event(timed=True)
        self._run(layer, a, progress, entry)
        entry["computed"] = self._event(timed=True)
        entry["stored"] = self._event(self.store_stream, timed=True) if entry["d2h_bytes"] else None
        entry["h2d_bytes"] = self.h2d_bytes - h2d
        entry["wall"] = time.perf_counter() - entry["wall"]

    def _run(self, layer, a, progress, entry):
        if layer.kind == "whole":
            y = layer.run(self)
            if a.groups:
                self.merged[a.name] = _api.group_stats(y, a.groups)
            if a.where != "gpu":
                entry["d2h_bytes"] = y.numel() * y.element_size()
            self.tensors[a.name] = y if a.where == "gpu" else y.to("cpu")
            return
        out = self.allocate(a)
        height = a.shape[-2]
        starts = list(range(0, height, layer.rows))
        self.prefetch(layer.run.needs(self, 0, min(height, layer.rows)))
        for k, r0 in enumerate(starts):
            r1 = min(height, r0 + layer.rows)
            if k + 1 < len(starts):  # the next slab's host rows, fetched while this one is computed
                self.prefetch(layer.run.needs(self, r1, min(height, r1 + layer.rows)))
            self.store(a, out, r0, layer.run(self, r0, r1))
            self.end_slab()
            entry["slabs"] += 1
            progress.update(1)
        self.tensors[a.name] = out

    def times(self):
        """The timeline with its events read (call after the decode's last synchronization): per layer, on the GPU,
        ms from the end of the layer before to its last slab (compute_ms: its kernels and any wait for fetched rows)
        and ms its copies out ran on after that (store_tail_ms, overlapping the layers after it); on the CPU the wall
        time (compute_ms)."""
        out = []
        for e in self.timeline:
            t = {k: e[k] for k in ("layer", "kind", "output", "slabs", "h2d_bytes", "d2h_bytes")}
            if e["start"] is not None:
                t["compute_ms"] = e["start"].elapsed_time(e["computed"])
                t["store_tail_ms"] = e["computed"].elapsed_time(e["stored"]) if e["stored"] is not None else 0.0
            else:
                t["compute_ms"], t["store_tail_ms"] = e["wall"] * 1e3, 0.0
            out.append(t)
        return out

    def release(self, index):
        for name, a in self.plan.activations.items():
            if a.last_use == index and name in self.tensors and name != self.plan.layers[-1].output:
                del self.tensors[name]
                self.kept_rows.pop(name, None)
                self.merged.pop(name, None)
                self.stored.pop(name, None)


def _host_tensor(shape, dtype, pin):
    """An activation in host memory, laid out with the height outermost after the batch ((N, H, the rest) in memory):
    a slab of rows is then one block per sample, which one copy moves at the link's speed (a row slab of an NCHW
    tensor is C pieces)."""
    order = [0, len(shape) - 2] + [d for d in range(1, len(shape)) if d != len(shape) - 2]
    storage = torch.empty([shape[d] for d in order], dtype=dtype, device="cpu", pin_memory=pin)
    inverse = [order.index(d) for d in range(len(shape))]
    return storage.permute(inverse)


@contextlib.contextmanager
def _whole_tensor(vae):
    """Within it, vae.decode() decodes the whole tensor: diffusers' spatial tiling (use_tiling) and HunyuanVideo's
    decoding by groups of frames (use_framewise_decoding, on by default: from 5 latent frames each group of frames
    would normalize with its own statistics) are off; the model's settings are restored after."""
    saved = {k: getattr(vae, k) for k in ("use_tiling", "use_framewise_decoding") if hasattr(vae, k)}
    try:
        for k in saved:
            setattr(vae, k, False)
        yield
    finally:
        for k, v in saved.items():
            setattr(vae, k, v)


@contextlib.contextmanager
def _frame_attention(vae):
    """Within it, a HunyuanVideoMidBlock3D decoder's attention runs frame by frame without its dense causal mask
    (gnsilu.chunked._hunyuan_mid_forward): the whole decode as the plan modelled it."""
    mid = getattr(getattr(vae, "decoder", None), "mid_block", None)
    if type(mid).__name__ != "HunyuanVideoMidBlock3D" or not _chunked._hunyuan_mid_plain(mid):
        yield
        return
    previous = vars(mid).get("forward")  # a forward patched on the instance (gnsilu.chunked.slabs), kept
    original = mid.forward
    mid.forward = lambda hidden_states: _chunked._hunyuan_mid_forward(mid, 0, original, hidden_states)
    try:
        yield
    finally:
        if previous is None:
            del mid.forward
        else:
            mid.forward = previous


@contextlib.contextmanager
def _progress(total, enabled):
    bar = None
    if enabled is not False and total > 0:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, desc="gnsilu.bounded.decode", unit="slab", delay=2.0, leave=False)
        except ImportError:
            bar = None

    class _Quiet:
        def update(self, n):
            pass
    try:
        yield bar if bar is not None else _Quiet()
    finally:
        if bar is not None:
            bar.close()


def decode(vae, latents, max_gpu_bytes, *, max_host_bytes=None, progress=None, recompute=True):
    """vae.decode(latents).sample computed within max_gpu_bytes of GPU memory besides the model's weights (see the
    module's text): the whole decode where it fits, else layer by layer with every GroupNorm over the whole tensor.
    Returns the decoded tensor (on the latents' device; in host memory if the plan kept the output there); a layered
    decode returns once the GPU has finished it (its timeline read: last_timeline()). progress:
    None shows a bar (tqdm, where installed) for decodes that last more than 2 s, False never. recompute: as plan()
    takes it. On a CUDA device the first layered decode of a model in a dtype and layout runs warm_up() first and
    plans again after it. Raises ValueError before any work for a budget or host need it cannot meet (plan(); after a
    warm-up, for one that what it loaded outside the allocator takes below the need), MemoryError if an allocation
    fails on the way (what was allocated is freed; the model is left as it was)."""
    p = plan(vae, latents, max_gpu_bytes, max_host_bytes=max_host_bytes, recompute=recompute)
    if not isinstance(latents, torch.Tensor):
        raise ValueError(f"gnsilu.bounded.decode: latents must be a torch.Tensor, got {type(latents).__name__}")
    if p.plain:
        with _whole_tensor(vae), _frame_attention(vae), torch.no_grad():
            out = vae.decode(latents)
        return out.sample if hasattr(out, "sample") else out[0]
    if warm_up(vae, latents):
        # What the warm-up loaded outside the allocator is outside now: planned again, so that the budget counts it.
        p = plan(vae, latents, max_gpu_bytes, max_host_bytes=max_host_bytes, recompute=recompute)
    d = _layered(p, latents, progress)
    if latents.is_cuda:
        _WARMED.setdefault(vae, set()).add(_warm_key(latents))
    _LAST_COUNTS.clear()
    _LAST_COUNTS.update(d.counts)
    _LAST_TIMELINE[:] = d.times_read
    return d.out


# Models a layered decode has run on, each with the (device, dtype, layout) it ran in (warm_up).
_WARMED = weakref.WeakKeyDictionary()


def warm_up(vae, latents):
    """Runs a layered decode of a few latent rows (1x4x4, its smallest plan: activations in host memory, slabs of two
    rows) once for each model, device, dtype and layout, so that what a first layered decode adds to the device's
    memory outside PyTorch's allocator (72 MiB on an H100, once a process) is there before a plan measures it. decode() calls it on a CUDA device before a layered decode (and plans again after it);
    a plan() made after it counts what decode() will find. Returns True where it ran, False where this model, device,
    dtype and layout had run a layered decode (or the latents are not on a CUDA device). Raises as plan() does for a
    model it cannot run layer by layer."""
    if not isinstance(latents, torch.Tensor):
        raise ValueError(f"gnsilu.bounded.warm_up: latents must be a torch.Tensor, got {type(latents).__name__}")
    key = _warm_key(latents)
    if not latents.is_cuda or key in _WARMED.get(vae, ()):
        return False
    _warm_up_decode(vae, latents)
    torch.cuda.current_stream(latents.device).synchronize()
    _WARMED.setdefault(vae, set()).add(key)
    return True


def _warm_key(latents):
    """What a warm-up holds for a model: the latents' device, dtype and layout."""
    return latents.device, latents.dtype, _layout(latents)


def _warm_up_decode(vae, latents):
    """The warm-up's decode: (its plan, its output) for the first four latent rows and columns of the first sample
    (two frames of a video), in the latents' layout, layer by layer at the smallest budget that works."""
    small = latents[:1]
    if small.dim() == 5:
        small = small[:, :, :2]
    small = small[..., :4, :4].contiguous(memory_format=_layout(latents))
    try:
        _make_plan(vae, small.shape, small.dtype, 1, None, layered=True)
        raise AssertionError("a 1-byte budget was planned")  # 1 byte holds no working set
    except _BudgetTooSmall as e:
        least = e.least
    p = _make_plan(vae, small.shape, small.dtype, least, None, layered=True)
    return p, _layered(p, small, False).out


def _layout(latents):
    """The layout of a layered decode's activations: the latents' for AutoencoderKL (its convolutions keep it);
    contiguous for HunyuanVideo, whose resnet blocks make their inputs contiguous."""
    if latents.dim() == 4 and latents.is_contiguous(memory_format=torch.channels_last) and not latents.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def _layered(p, latents, progress):
    """Runs plan p (layered) on latents; returns the _Decode: its output (d.out), counts and timeline read
    (d.times_read)."""
    d = _Decode(p, latents.device, _layout(latents), pin=latents.is_cuda)
    d.tensors["latents"] = latents
    first = p.activations["latents"]
    if first.groups:
        d.merged["latents"] = _api.group_stats(latents, first.groups)
    try:
        with torch.no_grad(), _progress(p.slabs, progress) as bar:
            for i, layer in enumerate(p.layers):
                d.run(layer, bar)
                d.release(i)
        d.finish()
        out = d.tensors[p.layers[-1].output]
        if out.device.type == "cpu" and latents.is_cuda:
            torch.cuda.current_stream(latents.device).synchronize()  # its last slabs were copied without waiting
        if latents.is_cuda:
            torch.cuda.current_stream(latents.device).synchronize()  # the timeline's events
        d.out = out
        d.times_read = d.times()
        return d
    finally:
        d.fetched.clear()
        d.stored.clear()
        d.in_flight.clear()
        d.tensors.clear()
        d.kept_rows.clear()
        d.merged.clear()


# What the last decode() that ran layer by layer did with host rows (for tests and benchmarks): rows fetched ahead of
# their slab (overlapped), fetched when the slab asked (not overlapped), fetched and not used.
_LAST_COUNTS = {}


def last_counts():
    """{"fetched_ahead", "fetched_late", "fetched_unused"} of the last layered decode (empty before one)."""
    return dict(_LAST_COUNTS)


# Where the last layered decode spent its time, a dict a layer (_Decode.times).
_LAST_TIMELINE = []


def last_timeline():
    """The last layered decode, a dict a layer in the plan's order: "layer", "kind", "output" (where it lived),
    "slabs", "h2d_bytes" (host rows fetched for it), "d2h_bytes" (copied out), and in ms: on the GPU "compute_ms"
    (from the end of the layer before to its last slab, waits for fetched rows included) and "store_tail_ms" (its
    copies out running on after its last slab, while the layers after it start); on the CPU "compute_ms" is the wall
    time and "store_tail_ms" 0. Empty before a layered decode."""
    return [dict(t) for t in _LAST_TIMELINE]
