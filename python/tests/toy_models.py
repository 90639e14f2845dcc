"""Small PyTorch models for the tests of gnsilu.torch (needs torch).

FluxLikeDecoder is the shape of the Flux VAE decoder (diffusers' Decoder: conv_in, a mid block of two
ResnetBlock2D around an attention block, up blocks of three ResnetBlock2D with nearest upsampling and a conv,
conv_norm_out + conv_act + conv_out), written like diffusers' code so that swap_group_norm_silu meets the same
patterns there: `h = self.norm1(h)` then `h = self.nonlinearity(h)`, norm2 inside
`if self.time_embedding_norm == "default":`, and conv_norm_out in an if/else before conv_act. It is randomly
initialised: the point is the structure, not the weights.
"""
import torch
import torch.nn.functional as F
from torch import nn


class ResnetBlock2D(nn.Module):
    """diffusers.models.resnet.ResnetBlock2D, the parts a VAE uses (and a scale_shift branch it does not)."""

    def __init__(self, in_channels, out_channels, groups=32, eps=1e-6, temb_channels=None,
                 time_embedding_norm="default"):
        super().__init__()
        self.time_embedding_norm = time_embedding_norm
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=eps)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        factor = 2 if time_embedding_norm == "scale_shift" else 1
        self.time_emb_proj = nn.Linear(temb_channels, factor * out_channels) if temb_channels else None
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=eps)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nonlinearity = nn.SiLU()
        self.upsample = None
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, input_tensor, temb=None):
        hidden_states = input_tensor
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        if self.upsample is not None:
            input_tensor = self.upsample(input_tensor)
            hidden_states = self.upsample(hidden_states)
        hidden_states = self.conv1(hidden_states)
        if self.time_emb_proj is not None:
            temb = self.nonlinearity(temb)
            temb = self.time_emb_proj(temb)[:, :, None, None]
        if self.time_embedding_norm == "default":
            if temb is not None:
                hidden_states = hidden_states + temb
            hidden_states = self.norm2(hidden_states)
        elif self.time_embedding_norm == "scale_shift":
            time_scale, time_shift = torch.chunk(temb, 2, dim=1)
            hidden_states = self.norm2(hidden_states)
            hidden_states = hidden_states * (1 + time_scale) + time_shift
        else:
            hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.conv2(hidden_states)
        if self.conv_shortcut is not None:
            input_tensor = self.conv_shortcut(input_tensor)
        return input_tensor + hidden_states


class AttentionBlock(nn.Module):
    """Single-head self-attention over pixels with a GroupNorm that no SiLU follows (must not be swapped)."""

    def __init__(self, channels, groups=32, eps=1e-6):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=eps)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.Linear(channels, channels)
        self.nonlinearity = nn.SiLU()  # present but never applied to the norm's output

    def forward(self, hidden_states):
        residual = hidden_states
        n, c, h, w = hidden_states.shape
        hidden_states = self.group_norm(hidden_states)
        hidden_states = hidden_states.view(n, c, h * w).transpose(1, 2)
        q, k, v = self.to_q(hidden_states), self.to_k(hidden_states), self.to_v(hidden_states)
        hidden_states = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        hidden_states = self.to_out(hidden_states).transpose(1, 2).reshape(n, c, h, w)
        return hidden_states + residual


class Upsample2D(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, hidden_states):
        return self.conv(F.interpolate(hidden_states, scale_factor=2.0, mode="nearest"))


class UpDecoderBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, layers, add_upsample, groups=32):
        super().__init__()
        self.resnets = nn.ModuleList(
            [ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, groups) for i in range(layers)])
        self.upsamplers = nn.ModuleList([Upsample2D(out_channels)]) if add_upsample else None

    def forward(self, hidden_states):
        for resnet in self.resnets:
            hidden_states = resnet(hidden_states)
        if self.upsamplers is not None:
            for upsampler in self.upsamplers:
                hidden_states = upsampler(hidden_states)
        return hidden_states


class MidBlock2D(nn.Module):
    def __init__(self, channels, groups=32):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(channels, channels, groups) for _ in range(2)])
        self.attentions = nn.ModuleList([AttentionBlock(channels, groups)])

    def forward(self, hidden_states):
        hidden_states = self.resnets[0](hidden_states)
        hidden_states = self.attentions[0](hidden_states)
        return self.resnets[1](hidden_states)


class FluxLikeDecoder(nn.Module):
    """The Flux VAE's decoder has block_out_channels (128, 256, 512, 512) and 16 latent channels; tests pass
    smaller channel counts."""

    def __init__(self, latent_channels=16, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                 groups=32, out_channels=3):
        super().__init__()
        reversed_channels = list(reversed(block_out_channels))
        self.conv_in = nn.Conv2d(latent_channels, reversed_channels[0], 3, padding=1)
        self.mid_block = MidBlock2D(reversed_channels[0], groups)
        self.up_blocks = nn.ModuleList()
        previous = reversed_channels[0]
        for i, channels in enumerate(reversed_channels):
            last = i == len(reversed_channels) - 1
            self.up_blocks.append(UpDecoderBlock2D(previous, channels, layers_per_block + 1, not last, groups))
            previous = channels
        self.conv_norm_out = nn.GroupNorm(groups, reversed_channels[-1], eps=1e-6)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(reversed_channels[-1], out_channels, 3, padding=1)

    def forward(self, sample, latent_embeds=None):
        sample = self.conv_in(sample)
        sample = self.mid_block(sample)
        for up_block in self.up_blocks:
            sample = up_block(sample)
        if latent_embeds is None:
            sample = self.conv_norm_out(sample)
        else:
            sample = self.conv_norm_out(sample, latent_embeds)
        sample = self.conv_act(sample)
        return self.conv_out(sample)


def expected_swaps(decoder):
    """GroupNorm+SiLU pairs swap_group_norm_silu must find in a FluxLikeDecoder: two per ResnetBlock2D, and
    conv_norm_out. (A method of the decoder calling self.modules() would make its own code unprovable.)"""
    return 2 * sum(isinstance(m, ResnetBlock2D) for m in decoder.modules()) + 1


class ResidualNorm(nn.Module):
    """The norm's output feeds the SiLU and the residual: swapping would change the result."""

    def __init__(self, channels, groups=32):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.act = nn.SiLU()

    def forward(self, x):
        h = self.norm(x)
        return self.act(h) + h


class FunctionalSiLU(nn.Module):
    """GroupNorm then F.silu(...): a proven pair (the callee resolves to torch.nn.functional.silu through the
    module's globals); the swapped norm returns silu(group_norm(x)) marked for F.silu to pass through."""

    def __init__(self, channels, groups=32):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x):
        return F.silu(self.norm(x))


def sequential_head(channels, groups=32):
    """GroupNorm, SiLU, conv as an nn.Sequential (swap case a)."""
    return nn.Sequential(nn.GroupNorm(groups, channels), nn.SiLU(), nn.Conv2d(channels, 3, 3, padding=1))


class ShadowedSiLU(nn.Module):
    """GroupNorm then F.silu through a local `F`: names the method binds itself are not resolved, so no pair (a
    plain GroupNorm), even where the local is torch.nn.functional."""

    def __init__(self, channels, groups=32):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x):
        F = torch.nn.functional  # noqa: N806  (shadows the module's F)
        return F.silu(self.norm(x))


class FunctionalSiLUInPlace(nn.Module):
    """GroupNorm then F.silu(v, inplace=True): a keyword argument, no pair (a plain GroupNorm)."""

    def __init__(self, channels, groups=32):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x):
        v = self.norm(x)
        return torch.nn.functional.silu(v, inplace=True)
