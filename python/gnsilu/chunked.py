"""Decoding in bounded memory with the full decode's GroupNorm: convolutions and upsamplers run in slabs of rows.

A VAE decode at video or large-image sizes runs out of memory in the transients between two GroupNorms (a padded
copy, an upsampled copy, a concatenation, the convolution's own workspace), not in the tensors it keeps. Tiling the
decode cuts those, but every tile then normalizes with its own statistics. Here the activations stay whole, so every
GroupNorm sees the whole tensor (gnsilu's exact statistics, or PyTorch's), and only the modules that make the large
transients run slab by slab along the height: each slab of output rows is computed from the input rows it needs
(a halo of the kernel's reach, padded as the module pads at the tensor's true edges) and written into one output
tensor. The output equals the whole decode's except where a convolution rounds differently on a smaller input
(cuDNN may choose another algorithm).

    with gnsilu.chunked.slabs(vae.decoder, max_bytes=256 << 20):
        video = vae.decode(latents).sample

Modules taken (everything else runs as before): nn.Conv2d and nn.Conv3d with stride 1 along the height, zero
padding given as integers; diffusers' HunyuanVideoCausalConv3d (replicate padding, causal in time), Upsample2D
(nearest x2 then a convolution) and HunyuanVideoUpsampleCausal3D (and gnsilu.torch's PaddedInputConv standing for a
HunyuanVideoCausalConv3d after the swap); and diffusers' ResnetBlock2D whose norms are
swapped GroupNormSiLU pairs (gnsilu.torch.swap_group_norm_silu) and which has no time embedding and no up- or
downsampling: its GroupNormSiLUs take their records over the whole input (gnsilu.group_stats) and normalize only
the rows each convolution slab reads (gnsilu.group_norm_apply, the whole call's bits), so the normalized tensors,
as large as the block's input, never exist whole (a conv1 whose bias the swap moved into norm2 adds it itself in
its slabs); HunyuanVideoResnetBlockCausal3D the same way, each slab of normalized rows padded as its causal
convolution pads (replicate: the normalized tensor's edge rows, the first frame). A module runs whole when its output
(a block: its input) is below max_bytes or its configuration is not one of these.

HunyuanVideoMidBlock3D's attention runs frame by frame (_frame_causal_attention): the causal mask it builds lets each
frame's queries see the keys of every frame up to its own, so each frame attends to that prefix of the keys with no
mask at all, and the dense mask (tokens x tokens: 6 GiB at 33x480x832, 120 GB at 720x1280 x 65 frames) is never made;
equal to the masked attention within rounding.
"""
import contextlib
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["slabs", "slab_rows"]


def _rows_for(out_row_bytes, max_bytes):
    return max(1, int(max_bytes // max(1, out_row_bytes)))


def _pad_rows(x, top, bottom, mode):
    """x with `top` and `bottom` rows of padding along dim -2 (zeros, or the edge rows repeated)."""
    if top == 0 and bottom == 0:
        return x
    pad = [0, 0, top, bottom] + [0, 0] * (x.dim() - 4)
    if mode == "zeros":
        return F.pad(x, pad)
    return F.pad(x, pad, mode="replicate")


def _conv_plain(conv):
    """Whether conv is a stride-1 (along the height), integer zero-padded nn.Conv2d/3d that slabs can take."""
    return (isinstance(conv, (nn.Conv2d, nn.Conv3d)) and conv.padding_mode == "zeros"
            and not isinstance(conv.padding, str) and conv.stride[-2] == 1)


def _conv_slab(conv, slab):
    """conv (nn.Conv2d/3d) over a slab of rows that already holds the height's padding, with the module's own
    padding along the other dimensions."""
    padding = list(conv.padding)
    padding[-2] = 0
    fn = F.conv2d if isinstance(conv, nn.Conv2d) else F.conv3d
    return fn(slab, conv.weight, conv.bias, conv.stride, tuple(padding), conv.dilation, conv.groups)


def _conv_rows(conv, x, lo, hi, padding_h):
    """conv (nn.Conv2d/3d) over x's rows [lo, hi) of the height padded by `padding_h` zeros on each side (rows out
    of range are zeros), with the module's own padding along the other dimensions: output rows that [lo, hi)
    produce."""
    h = x.shape[-2]
    start, stop = max(lo, 0), min(hi, h)
    return _conv_slab(conv, _pad_rows(x[..., start:stop, :], start - lo, hi - stop, "zeros"))


def _reach(conv):
    """(padding, reach) of conv along the height: output row r reads padded input rows [r, r + reach]."""
    return conv.padding[-2], conv.dilation[-2] * (conv.kernel_size[-2] - 1)


def _into(out, rows_out, produce):
    """Fills out[..., r0:r1, :] slab by slab: produce(r0, r1) returns those output rows."""
    h = out.shape[-2]
    for r0 in range(0, h, rows_out):
        r1 = min(h, r0 + rows_out)
        out[..., r0:r1, :] = produce(r0, r1)
    return out


def _empty_like_rows(x, shape):
    memory_format = torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        memory_format = torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous():
        memory_format = torch.channels_last_3d
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=memory_format)


def _slabbed(x, h_out, produce, max_bytes, whole):
    """produce(r0, r1) (output rows [r0, r1)) over all h_out rows into one output, in slabs of at most max_bytes; or
    whole() when the output is no larger than max_bytes (or one row); whole=None: in slabs always."""
    first = produce(0, 1)  # output row 0: its shape and size give the others'
    row_bytes = first.numel() * first.element_size()
    if whole is not None and (row_bytes * h_out <= max_bytes or h_out <= 1):
        return whole()
    shape = list(first.shape)
    shape[-2] = h_out
    return _into(_empty_like_rows(x, shape), _rows_for(row_bytes, max_bytes), produce)


# ---- each module's slabs -----------------------------------------------------------------------------------------
def _whole(x):
    """Whether a call must run whole: autograd would need the slabs' graph (slabs write into one output)."""
    return torch.is_grad_enabled() and x.requires_grad


def _conv_forward(conv, max_bytes, original, x):
    if _whole(x):
        return original(x)
    kh, dh, ph = conv.kernel_size[-2], conv.dilation[-2], conv.padding[-2]
    reach = dh * (kh - 1)
    h_out = x.shape[-2] + 2 * ph - reach
    return _slabbed(x, h_out, lambda r0, r1: _conv_rows(conv, x, r0 - ph, r1 - ph + reach, ph), max_bytes,
                    lambda: original(x))


def _causal_rows(module, x, lo, hi, convolve=None):
    """HunyuanVideoCausalConv3d over rows [lo, hi) of x's height as the module pads it (replicate): its inner
    convolution module, or convolve(module, padded rows)."""
    pw, _, ph, _, pt, pt_back = module.time_causal_padding
    h = x.shape[-2]
    start, stop = max(lo, 0), min(hi, h)
    slab = x[..., start:stop, :]
    slab = F.pad(slab, (pw, pw, start - lo, hi - stop, pt, pt_back), mode=module.pad_mode)
    return module.conv(slab) if convolve is None else convolve(module, slab)


def _causal_plain(module):
    conv = module.conv
    return (module.pad_mode in ("replicate", "constant") and conv.stride[-2] == 1 and tuple(conv.padding) == (0, 0, 0)
            and module.time_causal_padding[2] == module.time_causal_padding[3])


def _causal_forward(module, max_bytes, original, x):
    if _whole(x):
        return original(x)
    conv = module.conv
    ph = module.time_causal_padding[2]
    reach = conv.dilation[-2] * (conv.kernel_size[-2] - 1)
    h_out = x.shape[-2] + 2 * ph - reach
    return _slabbed(x, h_out, lambda r0, r1: _causal_rows(module, x, r0 - ph, r1 - ph + reach), max_bytes,
                    lambda: original(x))


_CAUSAL_NAMES = ("time_causal_padding", "pad_mode", "conv")  # a PaddedInputConv standing for HunyuanVideoCausalConv3d


def _padded_input_plain(module):
    """gnsilu.torch's PaddedInputConv in place of a HunyuanVideoCausalConv3d (its attributes under the same names)."""
    return module._gnsilu_names == _CAUSAL_NAMES and _causal_plain(module)


def _padded_input_forward(module, max_bytes, original, x):
    """A PaddedInputConv as the causal convolution it stands for. Run whole, it takes the padded tensor gnsilu wrote
    for it; in slabs, each slab pads its own rows from x (the interior of that tensor), and the hand-off is let go."""
    try:
        return _causal_forward(module, max_bytes, original, x)
    finally:
        setattr(module, "_gnsilu_padded", None)


def _upsampled_rows(upsample, x, lo, hi, factor):
    """Rows [lo, hi) (clamped to the upsampled height) of upsample(x): the source rows they repeat, upsampled."""
    h_up = x.shape[-2] * factor
    lo, hi = max(lo, 0), min(hi, h_up)
    src_lo, src_hi = lo // factor, (hi + factor - 1) // factor
    up = upsample(x[..., src_lo:src_hi, :])
    return up[..., lo - src_lo * factor:hi - src_lo * factor, :], lo, hi


def _upsample2d_plain(module):
    conv = getattr(module, "conv", None)
    return (module.interpolate and module.use_conv and not module.use_conv_transpose and module.norm is None
            and getattr(module, "name", "conv") == "conv" and _conv_plain(conv))


def _upsample2d_forward(module, max_bytes, original, x, output_size=None, *args, **kwargs):
    if output_size is not None or args or kwargs or _whole(x):
        return original(x, output_size, *args, **kwargs)
    conv = module.conv
    kh, dh, ph = conv.kernel_size[-2], conv.dilation[-2], conv.padding[-2]
    reach = dh * (kh - 1)
    h_up = 2 * x.shape[-2]
    h_out = h_up + 2 * ph - reach
    upsample = functools.partial(F.interpolate, scale_factor=2.0, mode="nearest")

    def produce(r0, r1):
        lo, hi = r0 - ph, r1 - ph + reach
        rows, start, stop = _upsampled_rows(upsample, x, lo, hi, 2)
        return _conv_rows(conv, _pad_rows(rows, start - lo, hi - stop, "zeros"), 0, hi - lo, 0)

    return _slabbed(x, h_out, produce, max_bytes, lambda: original(x))


def _hunyuan_upsample(module, x):
    """HunyuanVideoUpsampleCausal3D's upsampling (its forward without the convolution), on a slab of rows."""
    frames = x.size(2)
    first, others = x.split((1, frames - 1), dim=2)
    first = F.interpolate(first.squeeze(2), scale_factor=module.upsample_factor[1:], mode="nearest").unsqueeze(2)
    if frames == 1:
        return first
    others = F.interpolate(others.contiguous(), scale_factor=module.upsample_factor, mode="nearest")
    return torch.cat((first, others), dim=2)


def _hunyuan_upsample_plain(module):
    factor = tuple(module.upsample_factor)
    return (len(factor) == 3 and float(factor[1]).is_integer() and _causal_plain(module.conv))


def _hunyuan_upsample_forward(module, max_bytes, original, x):
    if _whole(x):
        return original(x)
    causal = module.conv
    factor = int(module.upsample_factor[1])
    ph = causal.time_causal_padding[2]
    reach = causal.conv.dilation[-2] * (causal.conv.kernel_size[-2] - 1)
    h_up = factor * x.shape[-2]
    h_out = h_up + 2 * ph - reach
    pw, _, _, _, pt, pt_back = causal.time_causal_padding

    def produce(r0, r1):
        lo, hi = r0 - ph, r1 - ph + reach
        rows, start, stop = _upsampled_rows(functools.partial(_hunyuan_upsample, module), x, lo, hi, factor)
        rows = F.pad(rows, (pw, pw, start - lo, hi - stop, pt, pt_back), mode=causal.pad_mode)
        return causal.conv(rows)

    return _slabbed(x, h_out, produce, max_bytes, lambda: original(x))


def _resnet_plain(block):
    """Whether block (diffusers' ResnetBlock2D) is one whose every step slabs can run: no up- or downsampling, no
    time embedding, both norms swapped GroupNormSiLU pairs with the block's own SiLU (so the norm's output goes
    straight into the convolution that follows: python/gnsilu/_fusion.py proved it), plain convolutions."""
    from .torch import GroupNormSiLU
    norms = (block.norm1, block.norm2)
    return (block.upsample is None and block.downsample is None and block.time_emb_proj is None
            and block.time_embedding_norm in ("default", "group") and type(block.dropout) is nn.Dropout
            and all(isinstance(n, GroupNormSiLU) and any(a is block.nonlinearity for a in getattr(n, "_gnsilu_acts", ()))
                    for n in norms)
            and _conv_plain(block.conv1) and _conv_plain(block.conv2)
            and (block.conv_shortcut is None or _conv_plain(block.conv_shortcut)))


def _normalized_rows(t, stats, norm, lo, hi):
    """silu(group_norm(t)) of t's rows [lo, hi) with the whole tensor's records `stats` (gnsilu.group_norm_apply:
    the bits of norm(t) there), rows out of range zeros: the following convolution's zero padding."""
    from . import _api
    start, stop = max(lo, 0), min(hi, t.shape[-2])
    y = _api.group_norm_apply(t[..., start:stop, :], stats, norm.weight, norm.bias, norm.eps, "silu")
    return _pad_rows(y, start - lo, hi - stop, "zeros")


def _resnet_forward(block, max_bytes, original, input_tensor, temb=None, *args, **kwargs):
    """ResnetBlock2D.forward with no whole normalized tensor: each GroupNormSiLU's records are taken over its whole
    input (gnsilu.group_stats), then conv1 and conv2 run in slabs of rows whose input rows are normalized there
    (group_norm_apply), and the shortcut and the sum are done slab by slab into the output. Holds x, conv1's output
    and the output: the norm outputs (as large as x and conv1's output) never exist whole. Bits: the block's, as
    far as the convolutions round alike on slabs (group_norm_apply on a region gives the whole call's bits)."""
    from . import _api
    from . import torch as gnsilu_torch
    x = input_tensor
    if temb is not None or args or kwargs or _whole(x) or (block.dropout.training and block.dropout.p > 0) \
            or x.numel() * x.element_size() <= max_bytes or torch.is_autocast_enabled(x.device.type) \
            or gnsilu_torch._is_compiling() or not gnsilu_torch._gnsilu_takes(block.norm1, x):
        return original(input_tensor, temb, *args, **kwargs)
    conv1, conv2, shortcut = block.conv1, block.conv2, block.conv_shortcut
    ph1, reach1 = _reach(conv1)
    stats1 = _api.group_stats(x, block.norm1.num_groups)
    hidden = _slabbed(x, x.shape[-2] + 2 * ph1 - reach1, lambda r0, r1: _conv_slab(
        conv1, _normalized_rows(x, stats1, block.norm1, r0 - ph1, r1 - ph1 + reach1)), max_bytes, None)
    if not gnsilu_torch._gnsilu_takes(block.norm2, hidden):
        raise RuntimeError(f"gnsilu.chunked: {type(block).__name__}.norm2 would not run on gnsilu for conv1's output "
                           f"({hidden.dtype}, strides {hidden.stride()})")
    stats2 = _api.group_stats(hidden, block.norm2.num_groups)
    ph2, reach2 = _reach(conv2)
    ps, reach_s = _reach(shortcut) if shortcut is not None else (0, 0)

    def produce(r0, r1):
        h = _conv_slab(conv2, _normalized_rows(hidden, stats2, block.norm2, r0 - ph2, r1 - ph2 + reach2))
        if shortcut is None:
            residual = x[..., r0:r1, :]
        else:
            residual = _conv_rows(shortcut, x, r0 - ps, r1 - ps + reach_s, ps)
        return (residual + h) / block.output_scale_factor

    return _slabbed(x, hidden.shape[-2] + 2 * ph2 - reach2, produce, max_bytes, None)


def _causal_slab(causal, rows):
    """A causal convolution (HunyuanVideoCausalConv3d, or the PaddedInputConv standing for one) over rows that already
    hold its padding: its inner convolution's weights (F.conv3d), not that module's forward."""
    return _conv_slab(causal.conv, rows)


def _normalized_causal_rows(t, stats, norm, causal, lo, hi):
    """silu(group_norm(t)) of t's rows [lo, hi), as `causal` pads its input: the rows in range normalized with the
    whole tensor's records (the whole call's bits), then padded as the module pads (its mode: the edge rows of the
    normalized tensor where the slab reaches past them, the first frame before it in time, the width's border)."""
    from . import _api
    pw, _, _, _, pt, pt_back = causal.time_causal_padding
    start, stop = max(lo, 0), min(hi, t.shape[-2])
    y = _api.group_norm_apply(t[..., start:stop, :], stats, norm.weight, norm.bias, norm.eps, "silu")
    return F.pad(y, (pw, pw, start - lo, hi - stop, pt, pt_back), mode=causal.pad_mode)


def _causal_like(module):
    """A HunyuanVideoCausalConv3d that slabs can run (or the PaddedInputConv standing for one)."""
    from .torch import PaddedInputConv
    if isinstance(module, PaddedInputConv):
        return _padded_input_plain(module)
    return type(module).__name__ == "HunyuanVideoCausalConv3d" and _causal_plain(module)


def _hunyuan_resnet_plain(block):
    """Whether block (diffusers' HunyuanVideoResnetBlockCausal3D) is one whose every step slabs can run: both norms
    swapped GroupNormSiLU pairs with the block's own SiLU (so each norm's output goes straight into the causal
    convolution after it), plain causal convolutions."""
    from .torch import GroupNormSiLU
    norms = (block.norm1, block.norm2)
    return (isinstance(block.dropout, nn.Dropout)
            and all(isinstance(n, GroupNormSiLU)
                    and any(a is block.nonlinearity for a in getattr(n, "_gnsilu_acts", ())) for n in norms)
            and _causal_like(block.conv1) and _causal_like(block.conv2)
            and (block.conv_shortcut is None or _causal_like(block.conv_shortcut)))


def _hunyuan_resnet_forward(block, max_bytes, original, hidden_states):
    """HunyuanVideoResnetBlockCausal3D.forward with no whole normalized tensor, as _resnet_forward for 2-D blocks:
    each norm's records over its whole input, then conv1 and conv2 in slabs of rows whose input rows are normalized
    and padded there; the shortcut and the sum slab by slab. Holds x, conv1's output and the output."""
    from . import _api
    from . import torch as gnsilu_torch
    x = hidden_states
    if _whole(x) or (block.dropout.training and block.dropout.p > 0) or x.numel() * x.element_size() <= max_bytes \
            or torch.is_autocast_enabled(x.device.type) or gnsilu_torch._is_compiling():
        return original(hidden_states)
    x = x.contiguous()  # as the block's forward makes it
    if not gnsilu_torch._gnsilu_takes(block.norm1, x):
        return original(hidden_states)
    conv1, conv2, shortcut = block.conv1, block.conv2, block.conv_shortcut

    def reach(causal):
        return causal.time_causal_padding[2], causal.conv.dilation[-2] * (causal.conv.kernel_size[-2] - 1)

    ph1, reach1 = reach(conv1)
    stats1 = _api.group_stats(x, block.norm1.num_groups)
    hidden = _slabbed(x, x.shape[-2] + 2 * ph1 - reach1, lambda r0, r1: _causal_slab(
        conv1, _normalized_causal_rows(x, stats1, block.norm1, conv1, r0 - ph1, r1 - ph1 + reach1)), max_bytes, None)
    if not gnsilu_torch._gnsilu_takes(block.norm2, hidden):
        raise RuntimeError(f"gnsilu.chunked: {type(block).__name__}.norm2 would not run on gnsilu for conv1's output "
                           f"({hidden.dtype}, strides {hidden.stride()})")
    stats2 = _api.group_stats(hidden, block.norm2.num_groups)
    ph2, reach2 = reach(conv2)

    def produce(r0, r1):
        h = _causal_slab(conv2, _normalized_causal_rows(hidden, stats2, block.norm2, conv2, r0 - ph2,
                                                        r1 - ph2 + reach2))
        if shortcut is None:
            residual = x[..., r0:r1, :]
        else:
            ps, reach_s = reach(shortcut)
            residual = _causal_rows(shortcut, x, r0 - ps, r1 - ps + reach_s, _causal_slab)
        return h + residual

    return _slabbed(x, hidden.shape[-2] + 2 * ph2 - reach2, produce, max_bytes, None)


# ---- HunyuanVideo's mid-block attention without its dense mask ------------------------------------------------------
def _frame_attention_plain(attn):
    """Whether attn (diffusers' Attention in HunyuanVideoMidBlock3D) computes what _frame_causal_attention does:
    AttnProcessor2_0's self-attention with its group norm and residual, no other norms."""
    try:
        from diffusers.models.attention_processor import AttnProcessor2_0
    except ImportError:
        return False
    return (type(attn.processor) is AttnProcessor2_0 and attn.spatial_norm is None and attn.norm_q is None
            and attn.norm_k is None and not attn.is_cross_attention and isinstance(attn.to_out[0], nn.Linear))


def _frame_causal_attention(attn, tokens, frames):
    """attn(tokens, attention_mask=prepare_causal_attention_mask(frames, ...)) for tokens (B, frames x per frame, C),
    frame-major: what HunyuanVideoMidBlock3D computes, without the dense mask (B x N x N: 6 GiB at 33x480x832). The
    mask lets a query of frame f see every key of frames 0 to f, so each frame's queries attend to that prefix of the
    keys with no mask (one scaled_dot_product_attention a frame, which may then take a kernel that holds no score
    matrix). Equal to the masked attention within rounding (the same terms; -inf terms add exp(-inf) = 0)."""
    batch, count, _ = tokens.shape
    per_frame = count // frames
    residual = tokens
    normed = tokens if attn.group_norm is None else attn.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
    key, value = attn.to_k(normed), attn.to_v(normed)
    heads = attn.heads
    head_dim = key.shape[-1] // heads
    key = key.view(batch, -1, heads, head_dim).transpose(1, 2)
    value = value.view(batch, -1, heads, head_dim).transpose(1, 2)
    out = None
    for f in range(frames):
        lo, hi = f * per_frame, (f + 1) * per_frame
        query = attn.to_q(normed[:, lo:hi]).view(batch, -1, heads, head_dim).transpose(1, 2)
        part = F.scaled_dot_product_attention(query, key[:, :, :hi], value[:, :, :hi], dropout_p=0.0, is_causal=False)
        if out is None:
            out = part.new_empty((batch, heads, count, head_dim))
        out[:, :, lo:hi] = part
    hidden = out.transpose(1, 2).reshape(batch, -1, heads * head_dim).to(query.dtype)
    hidden = attn.to_out[1](attn.to_out[0](hidden))
    if attn.residual_connection:
        hidden = hidden + residual
    return hidden / attn.rescale_output_factor


def _attention_by_query_chunks(attn, hidden_states, score_bytes):
    """attn(hidden_states) for the self-attention of a (B, C, H, W) tensor (AttnProcessor2_0 with its group norm and
    residual, as _frame_attention_plain checks: AutoencoderKL's mid block), its queries taken in chunks whose scores
    hold at most about score_bytes. For CUDA tensors of 16 bits the scores are products of matrices kept in FP32
    (torch.bmm's out_dtype), scaled and put through softmax in FP32, then rounded to the tensor's dtype for the
    product with the values (FP32 sums): what a fused attention kernel computes, where PyTorch has none for heads wider
    than 256 (the Flux VAE's single head of 512: scaled_dot_product_attention then takes a kernel several times slower
    than these matrix products). Other tensors take the same steps in their own dtype. Equal to attn(hidden_states)
    within rounding."""
    batch, channels, height, width = hidden_states.shape
    residual = hidden_states
    tokens = hidden_states.reshape(batch, channels, height * width).transpose(1, 2)
    normed = tokens if attn.group_norm is None else attn.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
    heads = attn.heads
    head_dim = attn.to_k.out_features // heads

    def split(t):
        return t.reshape(batch, -1, heads, head_dim).transpose(1, 2).reshape(batch * heads, -1, head_dim)
    # Held at once, in copies of the input: q, k, v and the output, and a chunk's scores (the normalized tokens are
    # let go once q, k and v are made).
    q, k, v = split(attn.to_q(normed)), split(attn.to_k(normed)), split(attn.to_v(normed))
    del normed
    count = k.shape[1]
    scale = 1.0 / math.sqrt(head_dim)
    wide = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    # Bytes a row of queries takes: its scores and their softmax (FP32 for 16-bit tensors) and the rounded copy.
    per_row = batch * heads * count * (8 + q.element_size() if wide else 2 * q.element_size())
    rows = max(1, min(count, int(score_bytes) // per_row))
    kt = k.transpose(1, 2)
    out = torch.empty_like(q)
    # The scale in the product's epilogue where torch.baddbmm takes out_dtype and out= (one pass of the scores fewer).
    scaled = wide and _scaled_fp32_products_on(q.device.type, q.dtype)
    for lo in range(0, q.shape[1], rows):
        hi = min(q.shape[1], lo + rows)
        if scaled:
            scores = torch.empty((q.shape[0], hi - lo, count), dtype=torch.float32, device=q.device)
            torch.baddbmm(scores, q[:, lo:hi], kt, torch.float32, beta=0, alpha=scale, out=scores)
        else:
            scores = torch.bmm(q[:, lo:hi], kt, out_dtype=torch.float32) if wide else torch.bmm(q[:, lo:hi], kt)
            scores.mul_(scale)
        probs = torch.softmax(scores, -1)
        del scores
        out[:, lo:hi] = torch.bmm(probs.to(v.dtype), v)
        del probs
    del q, k, v, kt
    hidden = out.reshape(batch, heads, -1, head_dim).transpose(1, 2).reshape(batch, -1, heads * head_dim)
    del out
    hidden = attn.to_out[1](attn.to_out[0](hidden))
    hidden = hidden.transpose(-1, -2).reshape(batch, channels, height, width)
    if attn.residual_connection:
        hidden = hidden + residual
    return hidden / attn.rescale_output_factor


def _fp32_products(x):
    """Whether torch.bmm takes out_dtype=torch.float32 for x's dtype on x's device (recent PyTorch, on CUDA), as
    _attention_by_query_chunks needs for 16-bit tensors."""
    return _fp32_products_on(x.device.type, x.dtype)


@functools.lru_cache(maxsize=None)
def _scaled_fp32_products_on(device_type, dtype):
    """Whether torch.baddbmm(c, a, b, torch.float32, beta=0, alpha=s, out=c) gives s times the FP32 products of
    16-bit a and b (recent PyTorch, on CUDA): checked once a device type and dtype on a small exact case."""
    try:
        a = torch.arange(24, dtype=torch.float32, device=device_type).reshape(1, 3, 8).to(dtype)
        b = a.transpose(1, 2)
        c = torch.full((1, 3, 3), float("nan"), dtype=torch.float32, device=device_type)  # beta=0: never read
        torch.baddbmm(c, a, b, torch.float32, beta=0, alpha=0.125, out=c)
        return c.dtype == torch.float32 and torch.equal(c, torch.bmm(a.float(), b.float()) * 0.125)
    except (TypeError, RuntimeError, NotImplementedError):
        return False


@functools.lru_cache(maxsize=None)
def _fp32_products_on(device_type, dtype):
    try:
        a = torch.ones((1, 1, 8), dtype=dtype, device=device_type)
        return torch.bmm(a, a.transpose(1, 2), out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def _wide_heads(attn):
    """Whether attn's heads are wider than scaled_dot_product_attention's fused kernels take (256)."""
    return attn.to_k.out_features // attn.heads > 256


def _hunyuan_mid_plain(block):
    return all(a is None or _frame_attention_plain(a) for a in block.attentions)


def _hunyuan_mid_forward(block, max_bytes, original, hidden_states):
    """HunyuanVideoMidBlock3D.forward with its attentions frame by frame (_frame_causal_attention): no causal mask is
    made. Its resnets run as they are (their own forwards: slabs() may take them too)."""
    if torch.is_grad_enabled() and (block.gradient_checkpointing or hidden_states.requires_grad):
        return original(hidden_states)
    hidden_states = block.resnets[0](hidden_states)
    for attn, resnet in zip(block.attentions, block.resnets[1:]):
        if attn is not None:
            batch, channels, frames, height, width = hidden_states.shape
            tokens = hidden_states.permute(0, 2, 3, 4, 1).flatten(1, 3)
            tokens = _frame_causal_attention(attn, tokens, frames)
            hidden_states = tokens.unflatten(1, (frames, height, width)).permute(0, 4, 1, 2, 3)
        hidden_states = resnet(hidden_states)
    return hidden_states


def _kinds():
    """(class, plain(module), forward, submodules taken too) for each module kind slabs take; diffusers' kinds when
    it is installed. A kind whose slabs call its submodules on small inputs (an upsampler's convolution) leaves
    them their own forward; a resnet block's slabs call none of its submodules (F.conv2d on their weights), so they
    are taken too and serve the calls that the block hands to its own forward."""
    kinds = []
    try:
        from diffusers.models.resnet import ResnetBlock2D
        kinds.append((ResnetBlock2D, _resnet_plain, _resnet_forward, True))
    except ImportError:
        pass
    try:
        from diffusers.models.upsampling import Upsample2D
        kinds.append((Upsample2D, _upsample2d_plain, _upsample2d_forward, False))
    except ImportError:
        pass
    try:
        from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import (HunyuanVideoCausalConv3d,
                                                                                 HunyuanVideoMidBlock3D,
                                                                                 HunyuanVideoResnetBlockCausal3D,
                                                                                 HunyuanVideoUpsampleCausal3D)
        kinds.append((HunyuanVideoMidBlock3D, _hunyuan_mid_plain, _hunyuan_mid_forward, True))
        kinds.append((HunyuanVideoResnetBlockCausal3D, _hunyuan_resnet_plain, _hunyuan_resnet_forward, True))
        kinds.append((HunyuanVideoUpsampleCausal3D, _hunyuan_upsample_plain, _hunyuan_upsample_forward, False))
        kinds.append((HunyuanVideoCausalConv3d, _causal_plain, _causal_forward, False))
    except ImportError:
        pass
    from .torch import PaddedInputConv  # here: gnsilu.torch imports nothing of this module, but keep it lazy
    kinds.append((PaddedInputConv, _padded_input_plain, _padded_input_forward, False))
    kinds.append(((nn.Conv2d, nn.Conv3d), _conv_plain, _conv_forward, False))
    return kinds


def slab_rows(module):
    """Whether slabs() takes this module (and so runs it in slabs of rows when its output is large)."""
    return any(isinstance(module, cls) and plain(module) for cls, plain, _, _ in _kinds())


@contextlib.contextmanager
def slabs(module, max_bytes=256 << 20):
    """Within the block, every module under `module` that slab_rows() takes computes outputs larger than
    `max_bytes` in slabs of rows (each slab's output at most max_bytes, its transients in proportion); inputs that
    need a gradient run whole (the slabs are written into one output tensor). Restores the modules on exit."""
    if not (isinstance(max_bytes, int) and max_bytes > 0):
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    kinds = _kinds()
    patched = []
    inner = set()  # submodules of a module taken whose kind leaves them their own forward (_kinds)
    for m in module.modules():
        if id(m) in inner:
            continue
        for cls, plain, forward, submodules_taken in kinds:
            if isinstance(m, cls) and plain(m):
                original = m.forward
                m.forward = functools.partial(forward, m, max_bytes, original)
                patched.append(m)
                if not submodules_taken:
                    inner.update(id(c) for c in m.modules() if c is not m)
                break
    try:
        yield module
    finally:
        for m in patched:
            del m.forward  # the instance attribute: the class's forward again
