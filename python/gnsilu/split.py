"""A decode split by rows across the processes of a torch.distributed group, with the whole decode's GroupNorms.

Each rank decodes a band of the latent's rows. Every activation then stays split the same way (nearest upsampling
doubles a band), and the modules that look across rows get what they need from the others:
- a convolution (nn.Conv2d/Conv3d with stride 1 along the height, zero padding given as integers; diffusers'
  HunyuanVideoCausalConv3d, replicate padded) takes its halo rows from the neighbouring ranks (an all-gather of
  every band's edge rows), and pads as the module pads only at the tensor's true top and bottom;
- a GroupNorm (nn.GroupNorm, gnsilu.torch.GroupNorm, gnsilu.torch.GroupNormSiLU) adds up the exact statistics of
  every band (gnsilu.group_stats, then an all-reduce of the int64 records: exact, whatever the order) and
  normalizes its band with them (gnsilu.group_norm_apply): the bits of gnsilu's GroupNorm of the whole tensor
  (with the bias of a convolution that left it to the norm, swap_group_norm_silu's bias move, as input_bias);
- the modules given as `whole` (by default every `mid_block`: its attention sees every position, and HunyuanVideo's
  builds its causal mask from the whole shape) run on the whole tensor, gathered from the bands; each rank keeps
  its band of the result. At the latent's size that tensor is small.
Everything else (SiLU, residual sums, upsampling) is local to a band. The output equals the single-process decode
with gnsilu's GroupNorm except where a convolution rounds differently on a band than on the whole tensor.

    import torch.distributed as dist, gnsilu.split
    dist.init_process_group("nccl")                      # one process per GPU
    sample = gnsilu.split.decode(vae, latents)           # every rank: the whole decoded sample
    band = gnsilu.split.decode(vae, latents, gather=False)   # or only this rank's rows of it

Without a process group (group=None and torch.distributed not initialized) the same code runs as one rank: the
single-process decode with gnsilu's exact GroupNorm, which the split decode is compared against.
Supported: decoders whose mixing across rows is the modules above and nearest upsampling (diffusers'
AutoencoderKL and AutoencoderKLHunyuanVideo decoders). A convolution of another kind or stride along the height
raises an error naming it, rather than decode wrongly. GroupNorm inputs must be bfloat16, float16 or float32.
"""
import contextlib
import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import _api
from . import chunked as _chunked
from . import torch as _gt

__all__ = ["rows", "decode", "band_of", "gather_rows"]


def band_of(height, rank, world):
    """Rows [lo, hi) of a height-`height` tensor that rank `rank` of `world` holds: as even as possible."""
    if not (0 <= rank < world):
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return height * rank // world, height * (rank + 1) // world


class _Ranks:
    """The process group, or one rank alone; counts the modules being run whole (on gathered tensors)."""

    def __init__(self, group):
        import torch.distributed as dist
        self.dist = dist
        self.group = group
        self.alone = group is None and not (dist.is_available() and dist.is_initialized())
        self.world = 1 if self.alone else dist.get_world_size(group)
        self.rank = 0 if self.alone else dist.get_rank(group)
        self.whole = 0
        # gloo with CUDA tensors (several ranks on one GPU, where NCCL refuses): the collectives go through host
        # copies
        self.via_host = not self.alone and dist.get_backend(group) == "gloo"

    def all_gather(self, x):
        if self.alone:
            return [x]
        device = x.device
        x = x.to("cpu") if self.via_host else x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        self.dist.all_gather(parts, x, group=self.group)
        return [p.to(device) for p in parts]

    def all_reduce_stats(self, stats):
        if self.via_host and stats.device.type != "cpu":
            stats.copy_(_api.all_reduce_stats(stats.cpu(), self.group))
        else:
            _api.all_reduce_stats(stats, self.group)

    def heights(self, x):
        h = torch.tensor([x.shape[-2]], dtype=torch.int64, device=x.device)
        return [int(t.item()) for t in self.all_gather(h)]

    def gather_rows(self, x):
        """The whole tensor from every rank's band (concatenated along the height, rank order), and the heights."""
        heights = self.heights(x)
        if self.alone:
            return x, heights
        tallest = max(heights)
        padded = F.pad(x, [0, 0, 0, tallest - x.shape[-2]] + [0, 0] * (x.dim() - 4)) if x.shape[-2] < tallest else x
        parts = self.all_gather(padded)
        whole = torch.cat([p[..., :h, :] for p, h in zip(parts, heights)], dim=-2)
        return whole, heights

    def halo(self, x, top, bottom, name):
        """The `top` rows above this band (rank - 1's last) and the `bottom` rows below it (rank + 1's first); None
        at the tensor's true top and bottom."""
        if top == 0 and bottom == 0:
            return None, None
        if x.shape[-2] < max(top, bottom):
            raise ValueError(f"gnsilu.split: {name} needs {max(top, bottom)} rows of each neighbour, but this rank's "
                             f"band has {x.shape[-2]}: split into fewer ranks (or a taller latent)")
        edges = torch.cat((x[..., :bottom, :], x[..., x.shape[-2] - top:, :]), dim=-2)  # first rows, last rows
        parts = self.all_gather(edges)
        above = parts[self.rank - 1][..., bottom:, :] if self.rank > 0 else None
        below = parts[self.rank + 1][..., :bottom, :] if self.rank + 1 < self.world else None
        return above, below


def _with_rows(x, above, top, below, bottom, fill):
    """x with `top` rows above and `bottom` below: the neighbours' where given, else `fill` ("zeros": zero rows;
    None: nothing, the caller pads)."""
    parts = []
    if above is not None:
        parts.append(above.to(memory_format=torch.contiguous_format))
    elif top and fill == "zeros":
        parts.append(x.new_zeros(x.shape[:-2] + (top, x.shape[-1])))
    parts.append(x)
    if below is not None:
        parts.append(below.to(memory_format=torch.contiguous_format))
    elif bottom and fill == "zeros":
        parts.append(x.new_zeros(x.shape[:-2] + (bottom, x.shape[-1])))
    return torch.cat(parts, dim=-2) if len(parts) > 1 else x


# ---- each module on a band ---------------------------------------------------------------------------------------
def _conv_forward(conv, ranks, name, original, x):
    if ranks.whole:
        return original(x)
    if not _chunked._conv_plain(conv):
        raise ValueError(f"gnsilu.split: {name} ({conv}) is not a stride-1 (along the height), integer zero-padded "
                         "convolution: a band cannot compute it")
    ph, reach = _chunked._reach(conv)
    if reach == 0 and ph == 0:
        return original(x)
    top, bottom = ph, reach - ph
    above, below = ranks.halo(x, top, bottom, name)
    return _chunked._conv_slab(conv, _with_rows(x, above, top, below, bottom, "zeros"))


def _causal_forward(module, ranks, name, original, x):
    if ranks.whole:
        return original(x)
    conv = module.conv
    pw_left, pw_right, ph_top, ph_bottom, pt, pt_back = module.time_causal_padding
    if not _chunked._causal_plain(module) or _chunked._reach(conv)[1] != ph_top + ph_bottom:
        raise ValueError(f"gnsilu.split: {name} is not a stride-1 'same' causal convolution along the height")
    above, below = ranks.halo(x, ph_top, ph_bottom, name)
    slab = _with_rows(x, above, ph_top, below, ph_bottom, None)
    pad_top = 0 if above is not None else ph_top  # the module's own padding only at the true edges
    pad_bottom = 0 if below is not None else ph_bottom
    slab = F.pad(slab, (pw_left, pw_right, pad_top, pad_bottom, pt, pt_back), mode=module.pad_mode)
    return conv(slab)


def _norm_forward(module, ranks, activation, original, x):
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"gnsilu.split: GroupNorm inputs must be bfloat16, float16 or float32, got {x.dtype}")
    # A convolution whose bias the swap moved into this norm hands its output without the bias (where it ran its own
    # forward: a module run whole, or a convolution without halo rows): the bias goes into the records and the output.
    input_bias = _gt._handed_bias(module, x) if isinstance(module, (_gt.GroupNorm, _gt.GroupNormSiLU)) else None
    stats = _api.group_stats(x, module.num_groups, input_bias=input_bias)
    if not ranks.whole and not ranks.alone:
        ranks.all_reduce_stats(stats)
    y = _api.group_norm_apply(x, stats, module.weight, module.bias, module.eps, activation, input_bias=input_bias)
    return _gt._hand_on(module, y)  # handed on as the module's own forward hands it


def _frames_norm_forward(module, ranks, original, x):
    """A FrameGroupNormContiguous's band forward: each frame's statistics apart (the frames are a batch of images;
    their records merged across ranks), as its own forward computes them, the output contiguous; where the swap
    proved it goes straight into F.silu(...), silu applied and the output marked for F.silu to pass through."""
    silu_function = getattr(module, "_gnsilu_silu_function", False)
    activation = "silu" if silu_function else None
    name = type(module).__name__
    output = _gt._frames_forward(lambda frames: _norm_forward(module, ranks, activation, original, frames), x, name)
    output = output.contiguous()
    return _gt._handed_to_silu_function(output, True) if silu_function else output


def _whole_forward(module, ranks, original, x, *args, **kwargs):
    """module on the whole tensor, gathered from the bands; this rank's band of the result (same height)."""
    if ranks.whole:
        return original(x, *args, **kwargs)
    whole, heights = ranks.gather_rows(x)
    ranks.whole += 1
    try:
        out = original(whole, *args, **kwargs)
    finally:
        ranks.whole -= 1
    if out.shape[-2] != whole.shape[-2]:
        raise ValueError(f"gnsilu.split: a module run whole changed the height ({whole.shape[-2]} -> "
                         f"{out.shape[-2]}); only height-preserving modules may be run whole")
    lo = sum(heights[:ranks.rank])
    band = out[..., lo:lo + heights[ranks.rank], :]
    channels_last = out.dim() in (4, 5) and out.is_contiguous(
        memory_format=torch.channels_last if out.dim() == 4 else torch.channels_last_3d) and not out.is_contiguous()
    if channels_last:
        return band.contiguous(memory_format=torch.channels_last if out.dim() == 4 else torch.channels_last_3d)
    return band.contiguous()


def _padded_input_forward(module, ranks, name, original):
    if module._gnsilu_names != _chunked._CAUSAL_NAMES:
        raise ValueError(f"gnsilu.split: {name} pads its input before its convolution in a way gnsilu.split does not "
                         "know (only HunyuanVideoCausalConv3d's)")
    return functools.partial(_causal_forward, module, ranks, name, original)


def _kinds():
    """(class, forward maker) for the module kinds a band computes itself; diffusers' where it is installed."""
    kinds = []
    try:
        from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoCausalConv3d
        kinds.append((HunyuanVideoCausalConv3d, lambda m, r, n, o: functools.partial(_causal_forward, m, r, n, o)))
    except ImportError:
        pass
    # After the swap a HunyuanVideoCausalConv3d may be a PaddedInputConv (its attributes under the same names): its band
    # takes halo rows as the causal convolution's does (the norms' band forwards hand it no padded tensor).
    kinds.append((_gt.PaddedInputConv, _padded_input_forward))
    kinds.append((_gt.GroupNormSiLU, lambda m, r, n, o: functools.partial(_norm_forward, m, r, "silu", o)))
    # Before nn.GroupNorm, whose subclass it is: its statistics are per frame, not over the whole 5-D tensor.
    kinds.append((_gt.FrameGroupNormContiguous, lambda m, r, n, o: functools.partial(_frames_norm_forward, m, r, o)))
    kinds.append((nn.GroupNorm, lambda m, r, n, o: functools.partial(_norm_forward, m, r, None, o)))
    kinds.append(((nn.Conv2d, nn.Conv3d), lambda m, r, n, o: functools.partial(_conv_forward, m, r, n, o)))
    return kinds


@contextlib.contextmanager
def rows(module, group=None, whole=None):
    """Within the block, module (a decoder) computes on this rank's band of rows of its input, as the module
    docstring says; `whole`: the submodules to run on the whole tensor (default: every `mid_block` under module).
    Restores the modules on exit."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    ranks = _Ranks(group)
    if whole is None:
        whole = [m.mid_block for m in module.modules() if isinstance(getattr(m, "mid_block", None), nn.Module)]
    whole = list(whole)
    patched = []
    try:
        for m in whole:
            m.forward = functools.partial(_whole_forward, m, ranks, m.forward)
            patched.append(m)
        kinds = _kinds()
        inside = set()  # the modules a patched one calls itself (a causal convolution's nn.Conv3d): left as they are
        for name, m in module.named_modules():
            if id(m) in inside or any(m is w for w in whole):
                continue
            for cls, make in kinds:
                if isinstance(m, cls):
                    m.forward = make(m, ranks, name or type(m).__name__, m.forward)
                    patched.append(m)
                    inside.update(id(c) for c in m.modules() if c is not m)
                    break
        yield ranks
    finally:
        for m in patched:
            del m.forward  # the instance attribute: the class's forward again


def gather_rows(x, group=None):
    """The whole tensor from every rank's band of rows (torch.distributed all-gather; x itself without a group)."""
    return _Ranks(group).gather_rows(x)[0]


def decode(vae, latents, group=None, gather=True, whole=None):
    """vae's decoded sample of `latents` (B, C, [T,] H, W), split by rows of H across the ranks of `group` (every
    rank passes the same whole latents; each decodes band_of(H, rank, world)): the whole sample on every rank, or
    with gather=False this rank's band of its rows (the output rows of its latent rows). A diffusers AutoencoderKL or
    AutoencoderKLHunyuanVideo (its decoder and post_quant_conv), in inference mode. `whole`: as rows()."""
    ranks = _Ranks(group)
    height = latents.shape[-2]
    if height < ranks.world:
        raise ValueError(f"gnsilu.split.decode: the latent has {height} rows, fewer than the {ranks.world} ranks")
    lo, hi = band_of(height, ranks.rank, ranks.world)
    z = latents[..., lo:hi, :]
    if latents.dim() == 4 and latents.is_contiguous(memory_format=torch.channels_last) and not latents.is_contiguous():
        z = z.contiguous(memory_format=torch.channels_last)
    else:
        z = z.contiguous()
    with torch.no_grad(), rows(vae, group, whole):
        post = getattr(vae, "post_quant_conv", None)
        if post is not None:
            z = post(z)
        band = vae.decoder(z)
    return gather_rows(band, group) if gather else band
