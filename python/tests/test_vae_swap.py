#!/usr/bin/env python3
"""swap_group_norm_silu on diffusers' VAEs, on CPU: tiny seeded models of every VAE class in
diffusers.models.autoencoders that has nn.GroupNorm followed by SiLU. Needs PyTorch and diffusers (skipped without).

    PYTHONPATH=python python3 -m pytest python/tests/test_vae_swap.py
    PYTHONPATH=python python3 -m unittest python/tests/test_vae_swap.py    (load_tests: the same functions)
    PYTHONPATH=python python3 python/tests/test_vae_swap.py                (the same, with timings)

For each model: the output before the swap (contiguous input, and channels_last / channels_last_3d input for 4-D /
5-D models), the swap with return_counts=True against the exact counts read from diffusers' code (below, per
test), the state_dict unchanged (keys and values), every plain nn.GroupNorm replaced, a second swap replacing
nothing, and the output after the swap equal to the one before bit for bit (torch.equal): on CPU the swapped
modules run PyTorch's own F.silu(F.group_norm(...)), and the convolutions whose bias moved keep it (the move is for
CUDA tensors). The outputs of channels-last inputs are compared with the unswapped model's output for the same
input (convolutions need not give the same bits in both formats). Where biases moved, the model runs again with the
move on CPU tensors (as on the GPU: each moved conv without its bias, its norm adding it as input_bias, here
PyTorch's x + b): every moved bias handed over, the output within FP32 rounding of the model before the swap.

The counts are those of diffusers 0.42.1 with these configurations; another diffusers version may build other
blocks. Where a GroupNorm+SiLU pair in the code is not proven, the test says why.
The last test checks the rule of gnsilu/_fusion.py about code that __init__ leaves behind (lambdas, functions).
"""
import contextlib
import os
import sys
import unittest
import unittest.mock
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import function_tests  # noqa: E402
from function_tests import one_thread  # noqa: E402

try:
    import torch
    from torch import nn
    import torch.nn.functional as F
    from diffusers.models import autoencoders
    import gnsilu.torch as gt
except ImportError as error:  # not ModuleNotFoundError only: diffusers may fail to import for other reasons
    torch = None
    MISSING = f"needs PyTorch and diffusers ({type(error).__name__}: {error})"
    function_tests.dependencies_missing(__name__, "test_vae_swap", MISSING)

def require():
    if torch is None:
        raise unittest.SkipTest(MISSING)


def vae_class(name):
    cls = getattr(autoencoders, name, None)
    if cls is None:
        raise unittest.SkipTest(f"this diffusers has no {name}")
    return cls


def channels_last_of(x):
    return torch.channels_last if x.dim() == 4 else torch.channels_last_3d


def as_tuple(output):
    return output if isinstance(output, tuple) else (output,)


def count(model, cls, exact=True):
    return sum(1 for m in model.modules() if (type(m) is cls if exact else isinstance(m, cls)))


def sample_of(model, x):
    return model(x).sample


def check(name, config, x, pairs, plain, run=sample_of, channels_last=True, padded=0, moved=0):
    """The model autoencoders.<name>(**config), seeded; run(model, x): its output(s); pairs, plain, padded, moved: the
    expected SwapCounts. Returns the swapped model."""
    require()
    cls = vae_class(name)
    with one_thread():
        torch.manual_seed(0)
        return _check(cls(**config).eval(), x, run, pairs, plain, channels_last, padded, moved)


@contextlib.contextmanager
def biases_move_on_cpu():
    """The swapped modules take CPU tensors (the op runs PyTorch's ops on them) and the convolutions whose bias moved
    leave it to their norm there too (by default only on CUDA tensors, where gnsilu adds it)."""
    with unittest.mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), \
            unittest.mock.patch.object(gt, "_BIAS_DEVICE_TYPES", ("cpu",)):
        yield


def _check_moved(model, inputs, run, before, moved):
    """With the bias move on CPU tensors: every one of the `moved` convolutions hands its output without its bias to
    its norm, which adds the bias (PyTorch's x + b in x's dtype, then its group_norm): the output within FP32
    rounding of the model before the swap (conv(x) + b rounds once more than conv(x, b)); nothing held after."""
    convs = [m for m in model.modules() if isinstance(m, gt._BiasMovingConv)]
    assert len(convs) == moved, (len(convs), moved)
    assert all(type(m._gnsilu_norm) in gt._BIAS_NORMS for m in convs)
    handed = set()
    taken = gt._handed_bias

    def recording(norm, input):
        bias = taken(norm, input)
        if bias is not None:
            handed.add(id(norm))
        return bias
    with biases_move_on_cpu(), torch.no_grad(), unittest.mock.patch.object(gt, "_handed_bias", recording), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # PyTorch's ops for inputs in neither layout: expected
        for name, v in inputs.items():
            after = as_tuple(run(model, v))
            for a, b in zip(after, before[name]):
                error = _relative_l2(a, b)
                assert a.shape == b.shape and error < 1e-5, f"{name}: moved biases: relative L2 {error:.3g}"
    assert handed == {id(m._gnsilu_norm) for m in convs}, f"{len(handed)} of {moved} norms got their conv's bias"
    assert not any(m._gnsilu_move_bias for m in convs) and all(m._gnsilu_norm._gnsilu_biased is None for m in convs)


@contextlib.contextmanager
def counting_pads():
    """Counts calls of the padded op and of F.pad outside it (the model's code and gnsilu's PaddedInputConv alike; on
    CPU the op itself runs F.pad of the group norm)."""
    calls = {"F.pad": 0, "padded op": 0}
    pad, op = torch.nn.functional.pad, gt._padded_implementation
    inside = []

    def counted_pad(*args, **kwargs):
        calls["F.pad"] += 0 if inside else 1
        return pad(*args, **kwargs)

    def counted_op(*args, **kwargs):
        calls["padded op"] += 1
        inside.append(True)
        try:
            return op(*args, **kwargs)
        finally:
            inside.pop()
    with unittest.mock.patch.object(torch.nn.functional, "pad", counted_pad), \
            unittest.mock.patch.object(gt, "_padded_implementation", counted_op):
        yield calls


def _check_padded(model, inputs, run, before, padded):
    """With the swapped modules taking CPU tensors (the op then runs PyTorch's ops: F.pad of the group norm), each of
    the `padded` pairs writes its convolution's padded input and the convolution takes it instead of padding: one
    padded op and one F.pad fewer per pair, and the output bit for bit as before."""
    with unittest.mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), torch.no_grad():
        for name, v in inputs.items():
            with counting_pads() as taken:
                after = as_tuple(run(model, v))
            for a, b in zip(after, before[name]):
                assert a.shape == b.shape and torch.equal(a, b), f"{name}: padded output differs"
            with counting_pads() as plain_calls, unittest.mock.patch.object(gt, "_DEVICE_TYPES", ()):
                run(model, v)
            assert taken["padded op"] >= padded, (taken, padded)
            assert plain_calls["padded op"] == 0
            assert taken["F.pad"] == plain_calls["F.pad"] - taken["padded op"], (taken, plain_calls)
    for m in model.modules():
        if isinstance(m, gt.PaddedInputConv):
            assert getattr(m, "_gnsilu_padded") is None  # nothing held after a decode


def _check(model, x, run, pairs, plain, channels_last, padded=0, moved=0):
    inputs = {"contiguous": x}
    if channels_last and x.dim() in (4, 5):
        inputs["channels_last"] = x.to(memory_format=channels_last_of(x))
    with torch.no_grad():
        before = {name: as_tuple(run(model, v)) for name, v in inputs.items()}
    state = model.state_dict()
    group_norms = count(model, nn.GroupNorm, exact=False)  # subclasses too (MiniMaxH3VideoGroupNorm)

    counts = gt.swap_group_norm_silu(model, return_counts=True)
    assert counts == gt.SwapCounts(pairs, plain, padded, moved), counts
    assert count(model, gt.PaddedInputConv) == padded
    assert counts.pairs + counts.plain == group_norms, (counts, group_norms)
    assert count(model, nn.GroupNorm) == 0  # no plain nn.GroupNorm left
    # A pair is a GroupNormSiLU, or a FrameGroupNormContiguous that returns silu(group_norm(x)) for F.silu.
    fused_plain = sum(1 for m in model.modules() if isinstance(m, gt.GroupNorm)
                      and getattr(m, "_gnsilu_silu_function", False))
    assert count(model, gt.GroupNormSiLU, exact=False) + fused_plain == pairs
    assert count(model, gt.GroupNorm, exact=False) - fused_plain == plain  # FrameGroupNormContiguous is one too
    after_state = model.state_dict()
    assert list(after_state) == list(state)
    assert all(torch.equal(after_state[k], v) for k, v in state.items())
    assert gt.swap_group_norm_silu(model, return_counts=True) == gt.SwapCounts(0, 0)

    # no_grad and inference_mode both (in inference mode PyTorch keeps no `_base` for views: the hand-off through
    # views must not depend on it).
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            for name, v in inputs.items():
                after = as_tuple(run(model, v))
                assert len(after) == len(before[name])
                for a, b in zip(after, before[name]):
                    assert a.shape == b.shape and torch.equal(a, b), f"{name}, {mode.__name__}: swapped output differs"
    if padded:
        _check_padded(model, inputs, run, before, padded)
    if moved:
        _check_moved(model, inputs, run, before, moved)
    return model


def randn(*shape):
    require()
    torch.manual_seed(1)
    return torch.randn(*shape)


# ---- the image VAEs built from diffusers' Encoder/Decoder (vae.py): ResnetBlock2D norm1/norm2 -> nonlinearity,
# ---- conv_norm_out -> conv_act. Each has 10 ResnetBlock2D + 2 conv_norm_out = 22 pairs, all proven; the 2 mid-block
# ---- attention group_norms (not followed by a SiLU) become plain GroupNorms. Each ResnetBlock2D (no time embedding
# ---- projection: `if self.time_emb_proj is not None:` decided) hands conv1's output to norm2 while temb is None:
# ---- 10 conv1 biases moved.
TINY_2D = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
               norm_num_groups=8, latent_channels=4)


def test_autoencoder_kl():
    config = dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)
    check("AutoencoderKL", config, randn(1, 3, 16, 16), pairs=22, plain=2, moved=10)


FLUX_LIKE = dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                 block_out_channels=(16, 32, 32, 32), layers_per_block=2, latent_channels=16, norm_num_groups=8,
                 use_quant_conv=False, use_post_quant_conv=False)  # Flux's VAE, its channels divided by 8


def test_flux_decoder_moves_every_resnet_bias():
    """A Flux-style AutoencoderKL: every ResnetBlock2D's conv1 bias moves into its norm2 (the decoder's 14: 2 in the
    mid block, 3 in each of 4 up blocks; the encoder's 10; 2 pairs each, and conv_norm_out's: 50 pairs), conv1.bias
    stays in the state_dict with its values, the decode with the move on CPU tensors is within FP32 rounding of the one
    before, and compiles whole with the move; move_bias=False moves nothing."""
    require()
    cls = vae_class("AutoencoderKL")
    latent = randn(1, 16, 4, 4)
    with one_thread(), torch.no_grad():
        torch.manual_seed(0)
        vae = cls(**FLUX_LIKE).eval()
        off = cls(**FLUX_LIKE).eval()
        off.load_state_dict(vae.state_dict())
        before = vae.decode(latent).sample
        state = {k: v.clone() for k, v in vae.state_dict().items()}
        resnets = [m for m in vae.decoder.modules() if type(m).__name__ == "ResnetBlock2D"]
        encoder_resnets = sum(type(m).__name__ == "ResnetBlock2D" for m in vae.encoder.modules())
        assert (len(resnets), encoder_resnets) == (14, 10)
        counts = gt.swap_group_norm_silu(vae, return_counts=True)
        assert counts == gt.SwapCounts(50, 2, 0, 24), counts
        assert all(isinstance(m.conv1, gt._BiasMovingConv) and m.conv1._gnsilu_norm is m.norm2 for m in resnets)
        assert all(type(m.conv2) is nn.Conv2d for m in resnets)
        after = vae.state_dict()
        assert list(after) == list(state) and all(torch.equal(after[k], v) for k, v in state.items())
        assert torch.equal(vae.decode(latent).sample, before)  # CPU tensors: the convolutions keep their bias
        with biases_move_on_cpu():
            moved = vae.decode(latent).sample
            # Compiled whole (fullgraph): the 14 convolutions without their bias, the 14 norm2 ops with it.
            torch._dynamo.reset()
            nodes = []

            def backend(graph_module, example_inputs):
                nodes.extend((n.target, n.args) for n in graph_module.graph.nodes if n.op == "call_function")
                return graph_module
            compiled = torch.compile(vae.decoder, backend=backend, fullgraph=True)(latent)
        assert torch.equal(compiled, moved)
        ops = [args for target, args in nodes if "gnsilu.group_norm" in str(target)]
        assert sum(len(args) > 7 and args[7] is not None for args in ops) == 14, ops
        assert sum("conv2d" in str(target) and args[2] is None for target, args in nodes) == 14
        error = _relative_l2(moved, before)
        assert error < 1e-5, f"the decode with its biases moved: relative L2 {error:.3g}"
        assert gt.swap_group_norm_silu(off, return_counts=True, move_bias=False) == gt.SwapCounts(50, 2, 0, 0)
        assert not any(isinstance(m, gt._BiasMovingConv) for m in off.modules())
        with biases_move_on_cpu():  # the norms through the op (PyTorch's ops on CPU), the convolutions as they were
            assert torch.equal(off.decode(latent).sample, before)


def test_asymmetric_autoencoder_kl():
    # MaskConditionDecoder instead of Decoder: the same pattern (conv_norm_out in an if/else before conv_act).
    config = dict(down_block_out_channels=(32, 64), up_block_out_channels=(32, 64),
                  down_block_types=TINY_2D["down_block_types"], up_block_types=TINY_2D["up_block_types"],
                  layers_per_down_block=1, layers_per_up_block=1, norm_num_groups=8, latent_channels=4)
    check("AsymmetricAutoencoderKL", config, randn(1, 3, 16, 16), pairs=22, plain=2, moved=10)


def test_autoencoder_kl_flux2():
    config = dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)
    check("AutoencoderKLFlux2", config, randn(1, 3, 16, 16), pairs=22, plain=2, moved=10)


def test_vq_model():
    config = dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1, num_vq_embeddings=16)
    check("VQModel", config, randn(1, 3, 16, 16), pairs=22, plain=2, moved=10)


def test_autoencoder_kl_temporal_decoder():
    # SVD: Encoder (4 ResnetBlock2D + conv_norm_out = 9 pairs) and TemporalDecoder (5 SpatioTemporalResBlock of a
    # ResnetBlock2D and a TemporalResnetBlock, 20 pairs, + conv_norm_out): 30, all proven; 2 attention norms plain.
    # TemporalDecoder and TemporalResnetBlock fix num_groups=32. Biases: the 9 ResnetBlock2D conv1 -> norm2 (while temb
    # is None) and the 5 TemporalResnetBlock conv1 (nn.Conv3d) -> norm2 (no condition: time_emb_proj is None): 14.
    config = dict(block_out_channels=(32, 64), down_block_types=TINY_2D["down_block_types"], layers_per_block=1,
                  latent_channels=4)
    check("AutoencoderKLTemporalDecoder", config, randn(2, 3, 16, 16), pairs=30, plain=2, moved=14,
          run=lambda model, x: model(x, num_frames=2).sample)


def test_autoencoder_kl_hunyuan_image():
    # HunyuanImageResnetBlock norm1/norm2 -> nonlinearity, norm_out -> nonlinearity: 22, all proven; the 2
    # HunyuanImageAttentionBlock norms are plain. num_groups is fixed at 32. Its 10 blocks do `x = self.conv1(x); x =
    # self.norm2(x)`: 10 biases moved, no condition.
    config = dict(in_channels=3, out_channels=3, latent_channels=32, block_out_channels=(32, 64), layers_per_block=1,
                  spatial_compression_ratio=2, sample_size=16)
    check("AutoencoderKLHunyuanImage", config, randn(1, 3, 16, 16), pairs=22, plain=2, moved=10)


def test_autoencoder_kl_kvae():
    # Encoder: 4 KVAEResnetBlock2D (norm1/norm2 -> nonlinearity, the other branch of `if zq is None` a two-argument
    # call) + norm_out = 9 pairs, proven. Decoder: its 13 GroupNorms sit in KVAEDecoderSpatialNorm2D, whose output
    # is norm_f * conv_y(zq) + conv_b(zq): no GroupNorm+SiLU pair, plain. num_groups is fixed at 32. Biases: the
    # encoder's 4 blocks, conv1 -> (`if temb is not None:` skipped) -> `if zq is None: h = self.norm2(h)` while temb
    # and zq are None; the decoder's norm2 are spatial norms, not gnsilu's.
    config = dict(channels=32, num_enc_blocks=1, num_dec_blocks=1, z_channels=4, ch_mult=(1, 2), sample_size=16)
    check("AutoencoderKLKVAE", config, randn(1, 3, 16, 16), pairs=9, plain=13, moved=4)


def test_consistency_decoder_vae():
    # Encoder: 9 pairs, proven. decoder_unet (UNet2DModel): 10 ResnetBlock2D norm1 -> nonlinearity proven; their
    # norm2 is followed by the scale_shift multiply-add (no pair, plain). UNet2DModel.conv_norm_out -> conv_act is a
    # pair in the code but not proven: UNet2DModel is a ModelMixin, whose __init__ is wrapped by register_to_config
    # (code outside the class source) and whose methods hand `self` on (self.modules(), save_pretrained(self), ...).
    # 20 pairs in the code, 19 proven; plain: 10 norm2 + conv_norm_out + the encoder's attention norm. Biases: the
    # encoder's 4 ResnetBlock2D; not the UNet's, whose scale_shift branch raises `if temb is None` before norm2.
    config = dict(encoder_block_out_channels=(32, 64), encoder_down_block_types=TINY_2D["down_block_types"],
                  encoder_layers_per_block=1, encoder_norm_num_groups=8, decoder_block_out_channels=(32, 64),
                  decoder_down_block_types=("ResnetDownsampleBlock2D",) * 2,
                  decoder_up_block_types=("ResnetUpsampleBlock2D",) * 2, decoder_layers_per_block=1,
                  decoder_norm_num_groups=8)
    check("ConsistencyDecoderVAE", config, randn(1, 3, 16, 16), pairs=19, plain=12, moved=4,
          run=lambda model, x: model(x, generator=torch.Generator().manual_seed(0)).sample)


def test_autoencoder_kl_ltx2_audio_group_norm():
    # norm_type="group" (the default is "pixel", no GroupNorm): LTX2AudioResnetBlock norm1/norm2 -> non_linearity,
    # norm_out -> non_linearity in encoder and decoder: 22, all proven (no attention blocks here).
    config = dict(base_channels=32, ch_mult=(1, 2), num_res_blocks=1, latent_channels=4, norm_type="group",
                  causality_axis="none", mel_bins=16, is_causal=False)
    check("AutoencoderKLLTX2Audio", config, randn(1, 2, 16, 16), pairs=22, plain=0)


# ---- video VAEs (5-D input) ------------------------------------------------------------------------------------
def test_autoencoder_kl_hunyuan_video():
    # HunyuanVideoResnetBlockCausal3D norm1/norm2 -> nonlinearity, conv_norm_out -> conv_act: 22, all proven; 2
    # attention norms plain.
    config = dict(block_out_channels=(32, 64), down_block_types=("HunyuanVideoDownBlock3D",) * 2,
                  up_block_types=("HunyuanVideoUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                  latent_channels=4, spatial_compression_ratio=2, temporal_compression_ratio=4)
    check("AutoencoderKLHunyuanVideo", config, randn(1, 3, 5, 16, 16), pairs=22, plain=2, padded=22)


def test_autoencoder_kl_cogvideox():
    # Encoder: 4 CogVideoXResnetBlock3D (`if zq is not None:` a three-argument norm call, else `h = self.norm1(h)`,
    # then `h = self.nonlinearity(h)`) + norm_out = 9 pairs, proven. Decoder: its 13 GroupNorms sit in
    # CogVideoXSpatialNorm3D (norm_f * conv_y + conv_b before the SiLU): no pair, plain.
    config = dict(block_out_channels=(32, 64), down_block_types=("CogVideoXDownBlock3D",) * 2,
                  up_block_types=("CogVideoXUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                  latent_channels=4, temporal_compression_ratio=2)
    check("AutoencoderKLCogVideoX", config, randn(1, 3, 5, 16, 16), pairs=9, plain=13)


def test_autoencoder_kl_allegro():
    # 48 pairs in nn.Sequential (AllegroTemporalConvLayer: GroupNorm, SiLU, ...), 20 in ResnetBlock2D and the 2
    # conv_norm_out -> conv_act: 70, all proven; 2 attention norms plain; the 10 ResnetBlock2D conv1 biases moved (the
    # temporal layers' convolutions end their nn.Sequential). AutoencoderKLAllegro encodes and decodes
    # only by tiles (NotImplementedError otherwise), so this runs its encoder and decoder directly.
    config = dict(block_out_channels=(32, 64), down_block_types=("AllegroDownBlock3D",) * 2,
                  up_block_types=("AllegroUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                  latent_channels=4, temporal_downsample_blocks=(True, False),
                  temporal_upsample_blocks=(False, True), sample_size=16)
    z = randn(1, 4, 2, 8, 8)
    check("AutoencoderKLAllegro", config, randn(1, 3, 4, 16, 16), pairs=70, plain=2, moved=10,
          run=lambda model, x: (model.encoder(x), model.decoder(z)))


MAGVIT = dict(block_out_channels=(32, 64), down_block_types=["SpatialDownBlock3D", "SpatialTemporalDownBlock3D"],
              up_block_types=["SpatialUpBlock3D", "SpatialTemporalUpBlock3D"], layers_per_block=1,
              norm_num_groups=8, latent_channels=4)


def test_autoencoder_kl_magvit():
    # spatial_group_norm=True (the default): every norm sits in `h = h.permute(...).flatten(0, 1); h = self.norm(h);
    # h = h.unflatten(...).permute(...)` before the SiLU: 18 pairs in the code (16 in EasyAnimateResidualBlock3D, 2
    # conv_norm_out), all proven: only views (unflatten, permute) lie between norm and SiLU, and the swapped SiLU
    # passes a view of the handed tensor through (SiLU commutes with views).
    check("AutoencoderKLMagvit", MAGVIT, randn(1, 3, 5, 16, 16), pairs=18, plain=0)


def test_autoencoder_kl_magvit_without_spatial_group_norm():
    # spatial_group_norm=False: `if self.spatial_group_norm:` is decided by each block's setting, and the else
    # branch `h = self.norm1(h)` goes on to `h = self.nonlinearity(h)`. The decoder's EasyAnimateMidBlock3d is built
    # without the setting (diffusers leaves its default, True), so its block keeps the reshaping branch, proven
    # through its views as above: all 18.
    config = dict(MAGVIT, spatial_group_norm=False)
    check("AutoencoderKLMagvit", config, randn(1, 3, 5, 16, 16), pairs=18, plain=0)


def test_autoencoder_kl_mochi():
    # All 21 GroupNorms (MochiResnetBlock3D norm1/norm2 and the encoder's norm_out) sit inside
    # MochiChunkedGroupNorm3D (per-frame GroupNorm in chunks: permute, split, cat, permute), each followed by the
    # block's nonlinearity: the wrappers become gnsilu.torch.FrameGroupNorm (one call over all frames), and all 21
    # are proven pairs (block.norm1 -> block.nonlinearity, as in ResnetBlock2D). (in_channels=15: the 3 video
    # channels after Mochi's Fourier features.)
    config = dict(in_channels=15, encoder_block_out_channels=(32,) * 4, decoder_block_out_channels=(32,) * 4,
                  latent_channels=4, layers_per_block=(1,) * 5, temporal_expansions=(1, 1, 1),
                  spatial_expansions=(2, 1, 1), add_attention_block=(False,) * 5)
    model = check("AutoencoderKLMochi", config, randn(1, 3, 3, 8, 8), pairs=21, plain=0)
    frame_norms = [m for m in model.modules() if type(m) is gt.FrameGroupNorm]
    assert len(frame_norms) == 21 and all(type(m.norm_layer) is gt.GroupNormSiLU for m in frame_norms)
    assert not any(type(m).__name__ == "MochiChunkedGroupNorm3D" for m in model.modules())


def test_frame_group_norm_plain_and_batches():
    """A Mochi wrapper that no SiLU follows (in a ModuleList, as the attention norms are) becomes a FrameGroupNorm
    around a plain GroupNorm; per-frame results equal the wrapper's for batches of several videos, in both
    layouts, and with more frames than its chunk."""
    require()
    try:
        from diffusers.models.autoencoders.autoencoder_kl_mochi import MochiChunkedGroupNorm3D
    except ImportError:
        raise unittest.SkipTest("this diffusers has no MochiChunkedGroupNorm3D")
    with one_thread():
        torch.manual_seed(2)
        holder = nn.ModuleList([MochiChunkedGroupNorm3D(num_channels=16, num_groups=4, chunk_size=3)])
        nn.init.normal_(holder[0].norm_layer.weight)
        nn.init.normal_(holder[0].norm_layer.bias)
        x = torch.randn(2, 16, 7, 5, 6) * 3 + 1
        with torch.no_grad():
            before = [holder[0](v) for v in (x, x.to(memory_format=torch.channels_last_3d))]
        counts = gt.swap_group_norm_silu(holder, return_counts=True)
        assert counts == gt.SwapCounts(0, 1), counts
        assert type(holder[0]) is gt.FrameGroupNorm and type(holder[0].norm_layer) is gt.GroupNorm
        with torch.no_grad():
            after = [holder[0](v) for v in (x, x.to(memory_format=torch.channels_last_3d))]
        for a, b in zip(after, before):
            assert a.shape == b.shape and torch.equal(a, b)
        try:
            holder[0](x[0])
            raise AssertionError("a 4-D input accepted")
        except ValueError as e:
            assert "5-D" in str(e)


def test_autoencoder_kl_cosmos():
    # CosmosResnetBlock3d norm1/norm2 (14) and the 2 norm_out: 16 pairs in the code, all proven: each GroupNorm
    # sits in CosmosCausalGroupNorm (num_groups=1: permute, flatten, norm, unflatten, permute), and `v =
    # self.norm1(v)` is followed by `v = F.silu(v)`, whose callee resolves through the module's globals to
    # torch.nn.functional.silu. The wrappers with num_groups=1 become FrameGroupNorm (their frames in one gnsilu
    # call, the key `norm.weight` kept) returning silu(group_norm(x)) for F.silu to pass through; the others'
    # GroupNorm sees the whole tensor. The 4 attention norms are plain.
    config = dict(latent_channels=4, encoder_block_out_channels=(32, 64), decode_block_out_channels=(32, 64),
                  attention_resolutions=(), resolution=32, num_layers=1, patch_size=1, spatial_compression_ratio=2,
                  temporal_compression_ratio=1, latents_mean=None, latents_std=None)
    x = randn(1, 3, 3, 16, 16)
    model = check("AutoencoderKLCosmos", config, x, pairs=16, plain=4)
    frames = [m for m in model.modules() if type(m) is gt.FrameGroupNorm]
    assert frames and all(type(m.norm_layer) in (gt.GroupNorm, gt.GroupNormSiLU) and "norm" in m._modules
                          for m in frames), frames
    assert not any(type(m).__name__ == "CosmosCausalGroupNorm" and m.num_groups == 1 for m in model.modules())
    _check_silu_function_pairs(model, x, lambda model, x: model(x).sample, 16)


def test_autoencoder_kl_kvae_video():
    # Encoder: 4 KVAECachedResnetBlock3D norm1/norm2 + norm_out = 9 pairs in the code, none proven: each GroupNorm
    # sits in KVAECachedGroupNorm (no SiLU there) and the SiLU is F.silu(h) / nonlinearity(h) = F.silu. Decoder:
    # 13 GroupNorms in KVAECachedSpatialNorm3D (multiply-add before the SiLU): no pairs. num_groups is fixed at 32.
    config = dict(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=4, temporal_compress_times=2)
    check("AutoencoderKLKVAEVideo", config, randn(1, 3, 3, 16, 16), pairs=0, plain=22)


def test_autoencoder_kl_minimax_h3():
    # The encoder's 5 norms (2 MiniMaxH3VideoResnetBlock3d x norm1/norm2, norm_out) are MiniMaxH3VideoGroupNorm, a
    # subclass of nn.GroupNorm with its own forward (per frame, through permute/view), each followed by F.silu(...):
    # 5 pairs in the code, all proven (`F.silu(self.norm1(h))`); each becomes a FrameGroupNormContiguous (gnsilu's
    # GroupNorm of the frames, the parameters and keys of the subclass) returning silu(group_norm(x)) for F.silu to
    # pass through. The decoder is a ViT without GroupNorm; only the encoder runs here, on 2 frames.
    config = dict(latent_channels=4, block_out_channels=(32, 64), layers_per_block=1,
                  spatial_downsample_factors=(2, 1), temporal_downsample_factors=(1, 1), norm_num_groups=8,
                  decoder_num_layers=1, decoder_num_attention_heads=2, decoder_attention_head_dim=16,
                  latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4, clip_length=1)
    x = randn(1, 3, 2, 16, 16)
    run = lambda model, x: model.encode(x).latent_dist.mode()  # noqa: E731
    model = check("AutoencoderKLMiniMaxH3", config, x, pairs=5, plain=0, run=run)
    assert count(model, gt.FrameGroupNormContiguous) == 5
    _check_silu_function_pairs(model, x, run, 5)


def _check_silu_function_pairs(model, x, run, pairs):
    """With the modules taking CPU tensors (the op then runs PyTorch's ops: silu(group_norm(x)) in one call), each
    of `pairs` norms proven to go straight into F.silu returns its output with SiLU applied and F.silu passes it
    through: the outputs are the unswapped model's (as check() compared them), and F.silu passes through as many
    tensors as the fused norms are called (MiniMax-H3 encodes its frames in clips: each norm runs more than once).
    A use other than F.silu raises."""
    from unittest import mock
    fused = [m for m in model.modules() if getattr(m, "_gnsilu_silu_function", False)
             or type(m).__name__ == "_GroupNormBeforeSiLUFunction"]
    assert len(fused) == pairs, (len(fused), pairs)
    with one_thread(), torch.no_grad():
        expected = as_tuple(run(model, x))
    passed = [0]
    function = gt._SiLUApplied.__torch_function__.__func__

    def counted(cls, func, types, args=(), kwargs=None):
        passed[0] += func is torch.nn.functional.silu
        return function(cls, func, types, args, kwargs)
    with one_thread(), torch.no_grad(), mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), \
            mock.patch.object(gt._SiLUApplied, "__torch_function__", classmethod(counted)):
        calls = [0]
        hooks = [m.register_forward_hook(lambda *args: calls.__setitem__(0, calls[0] + 1)) for m in fused]
        got = as_tuple(run(model, x))
        for hook in hooks:
            hook.remove()
        assert calls[0] >= pairs and passed[0] == calls[0], \
            f"F.silu passed {passed[0]} tensors through in {calls[0]} calls of the {pairs} fused norms"
        for a, b in zip(got, expected):
            assert type(a) is torch.Tensor and torch.equal(a, b)
        norm = fused[0]
        if isinstance(norm, gt.FrameGroupNorm):
            marked = norm(torch.randn(1, norm.norm_layer.num_channels, 2, 4, 4))
        elif isinstance(norm, gt.FrameGroupNormContiguous):
            marked = norm(torch.randn(1, norm.num_channels, 2, 4, 4))
        else:
            marked = norm(torch.randn(1, norm.num_channels, 4, 4))
        assert type(marked) is gt._SiLUApplied
        try:
            marked + 1
            raise AssertionError("a use other than F.silu accepted")
        except RuntimeError as e:
            assert "F.silu" in str(e), e


# ---- the proof: code that __init__ leaves behind -------------------------------------------------------------------
def _blocks_with_code_left_behind():
    """Blocks whose __init__ leaves code that runs later: (class, expected pairs, expected plain)."""
    class _LambdaInInit(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)
            self.act = nn.SiLU()
            self.helper = lambda x: self.norm(x)  # looks self.norm up when called, after a swap

        def forward(self, x):
            y = self.helper(x)
            x = self.norm(x)
            x = self.act(x)
            return x + y

    class _AliasInInit(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)
            self.act = nn.SiLU()
            me = self

            def helper(x):
                return me.norm(x)
            self.helper = helper

        def forward(self, x):
            y = self.helper(x)
            x = self.norm(x)
            x = self.act(x)
            return x + y

    class _ComposedLambdaInInit(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)
            self.act = nn.SiLU()
            self.helper = lambda x: self.act(self.norm(x))  # a proven use, wherever it is written
            self.scale = lambda x: x * 2  # code left behind that does not reach the norm

        def forward(self, x):
            y = self.helper(x)
            x = self.norm(x)
            x = self.act(x)
            return self.scale(x) + y

    return (_LambdaInInit, 0, 1), (_AliasInInit, 0, 1), (_ComposedLambdaInInit, 1, 0)


def test_code_left_behind_by_init_is_examined():
    require()
    x = randn(2, 4, 3, 3)
    for cls, pairs, plain in _blocks_with_code_left_behind():
        torch.manual_seed(0)
        block = cls()
        with torch.no_grad(), one_thread():
            before = block(x)
            assert gt.swap_group_norm_silu(block, return_counts=True) == gt.SwapCounts(pairs, plain), cls.__name__
            assert torch.equal(block(x), before), cls.__name__


# ---- decoding in slabs of rows (gnsilu.chunked): the whole decode's output, with every GroupNorm over the whole
# ---- tensor; the slabs are forced small (max_bytes) so that every module taken runs in several slabs.
def _slab_decode(name, config, latent, expected_kinds, layout=None, swap=False):
    require()
    import gnsilu.chunked as gc
    cls = vae_class(name)
    with one_thread():
        torch.manual_seed(0)
        vae = cls(**config).eval().double()  # FP64: the slabs' rounding differences stay near 1e-16
        if swap:
            gt.swap_group_norm_silu(vae)
        latent = latent.double()
        if layout is not None:
            latent = latent.contiguous(memory_format=layout)
        calls = {}
        with torch.no_grad():
            whole = vae.decode(latent).sample
            taken = [m for m in vae.decoder.modules() if gc.slab_rows(m)]
            kinds = sorted({type(m).__name__ for m in taken})
            assert set(expected_kinds) <= set(kinds), kinds
            slab_count = [0]
            into = gc._into

            def counting_into(out, rows, produce):  # every slab a module writes
                def counted_produce(r0, r1):
                    slab_count[0] += 1
                    return produce(r0, r1)
                return into(out, rows, counted_produce)
            gc._into = counting_into
            with gc.slabs(vae.decoder, max_bytes=2048):
                patched = [m for m in taken if "forward" in vars(m)]  # the others run inside a patched one
                for m in patched:  # count the calls of each patched module (its forward is now the slab forward)
                    forward = m.forward

                    def counted(*args, _f=forward, _m=m, **kwargs):
                        calls[type(_m).__name__] = calls.get(type(_m).__name__, 0) + 1
                        return _f(*args, **kwargs)
                    m.forward = counted
                sliced = vae.decode(latent).sample
            gc._into = into
            assert all("forward" not in vars(m) for m in taken), "slabs() left a patched forward behind"
            again = vae.decode(latent).sample
        assert torch.equal(again, whole)
        error = ((sliced.double() - whole.double()).norm() / whole.double().norm()).item()
        # A wrong halo or edge padding shows as an error near 1; convolutions over slabs round differently (in
        # FP64, by about 1e-16 a layer).
        assert error < 1e-12, f"{name}: relative L2 {error:.3g} between the slab decode and the whole one"
        assert calls, "no module ran in slabs"
        assert slab_count[0] > 2 * sum(calls.values()), f"only {slab_count[0]} slabs in {calls}: the slab path did not run"
        print(f"  {name}: {len(patched)} modules patched ({', '.join(kinds)}; calls {calls}, {slab_count[0]} slabs), "
              f"relative L2 to the "
              f"whole decode {error:.2e}, equal bit for bit: {torch.equal(sliced, whole)}")


def test_slabs_autoencoder_kl():
    config = dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)
    _slab_decode("AutoencoderKL", config, randn(1, 4, 12, 10), ["Conv2d", "Upsample2D"])
    _slab_decode("AutoencoderKL", config, randn(1, 4, 12, 10), ["Conv2d", "Upsample2D"], torch.channels_last)


def test_slabs_hunyuan_video():
    config = dict(block_out_channels=(32, 64), down_block_types=("HunyuanVideoDownBlock3D",) * 2,
                  up_block_types=("HunyuanVideoUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                  latent_channels=4, spatial_compression_ratio=2, temporal_compression_ratio=4)
    _slab_decode("AutoencoderKLHunyuanVideo", config, randn(1, 4, 2, 9, 8),
                 ["HunyuanVideoCausalConv3d", "HunyuanVideoUpsampleCausal3D"])


def test_slabs_hunyuan_video_swapped():
    """After the swap the causal convolutions fed by a GroupNorm+SiLU pair are PaddedInputConvs: slabs take them as the
    causal convolutions they stand for."""
    config = dict(block_out_channels=(32, 64), down_block_types=("HunyuanVideoDownBlock3D",) * 2,
                  up_block_types=("HunyuanVideoUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                  latent_channels=4, spatial_compression_ratio=2, temporal_compression_ratio=4)
    _slab_decode("AutoencoderKLHunyuanVideo", config, randn(1, 4, 2, 9, 8),
                 ["HunyuanVideoCausalConv3d", "HunyuanVideoUpsampleCausal3D", "PaddedInputConv"], swap=True)


def test_slabs_resnet_blocks_without_whole_norm_outputs():
    """A swapped AutoencoderKL: its ResnetBlock2Ds run conv1 and conv2 in slabs whose input rows are normalized with
    the whole tensor's records (gnsilu.chunked._resnet_forward), so no whole normalized tensor is made. On the CPU
    the modules' gnsilu calls go to the CPU reference here (as the slabs' group_stats / group_norm_apply do), and
    PyTorch's native convolutions compute each output row alike on a slab: each block's output has the block's
    bits, in both layouts, with and without a shortcut convolution. The whole decode in slabs is within FP32
    rounding of the whole decode (the other modules' slabs, convolutions on fewer rows, are not bit for bit on the
    CPU: 1e-6 with or without the blocks' slabs)."""
    require()
    from unittest import mock
    import gnsilu
    import gnsilu.chunked as gc

    def reference_op(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None):
        return gnsilu.group_norm_apply(x, gnsilu.group_stats(x, num_groups), weight, bias, eps, activation)

    config = dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)
    with one_thread(), _native_convolutions(), mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), \
            mock.patch.object(gt, "_op_implementation", reference_op), torch.no_grad():
        torch.manual_seed(0)
        vae = vae_class("AutoencoderKL")(**config).eval()
        assert gt.swap_group_norm_silu(vae) > 0
        resnets = [m for m in vae.decoder.modules() if type(m).__name__ == "ResnetBlock2D"]
        assert resnets and all(gc.slab_rows(m) for m in resnets), "the swapped resnet blocks are not taken"
        assert any(m.conv_shortcut is not None for m in resnets) and any(m.conv_shortcut is None for m in resnets)
        for layout in (torch.contiguous_format, torch.channels_last):
            for block in resnets:
                x = (torch.randn(1, block.in_channels, 12, 7) * 2 + 1).contiguous(memory_format=layout)
                whole = block(x, None)
                stats_calls = [0]
                group_stats = gnsilu._api.group_stats

                def counted_stats(*args, **kwargs):
                    stats_calls[0] += 1
                    return group_stats(*args, **kwargs)
                with mock.patch.object(gnsilu._api, "group_stats", counted_stats), \
                        gc.slabs(block, max_bytes=4 * block.out_channels * x.shape[-1] * 4):  # 4 rows a slab
                    # (3 slabs of 4 rows: PyTorch's CPU convolution of channels-last inputs rounds outputs of 1 or
                    # 2 rows differently, 1e-7 apart)
                    sliced = block(x, None)
                assert stats_calls[0] == 2, f"the blocks' slab path did not run ({stats_calls[0]} group_stats)"
                assert "forward" not in vars(block), "slabs() left a forward behind"
                assert torch.equal(sliced, whole), \
                    f"{layout}, shortcut {block.conv_shortcut is not None}: relative L2 {_relative_l2(sliced, whole):.3g}"
            latent = randn(1, 4, 12, 10).contiguous(memory_format=layout)
            whole = vae.decode(latent).sample
            with _counted(gc, "_resnet_forward") as ran, gc.slabs(vae.decoder, max_bytes=2048):
                sliced = vae.decode(latent).sample
            with gc.slabs(vae.decoder, max_bytes=1 << 30):  # room for everything: the modules' own forwards
                roomy = vae.decode(latent).sample
            assert ran[0] == len(resnets), (ran, len(resnets))
            assert torch.equal(roomy, whole)
            error = _relative_l2(sliced, whole)
            assert error < 1e-5, f"{layout}: the decode in slabs against the whole one: relative L2 {error:.3g}"
            print(f"  resnet blocks in slabs ({layout}): {len(resnets)} blocks with their bits; the decode within "
                  f"{error:.1e}")


# ---- a decode split by rows across ranks (gnsilu.split): two or three gloo processes against one ------------------
def _hunyuan_config():
    return dict(block_out_channels=(32, 64), down_block_types=("HunyuanVideoDownBlock3D",) * 2,
                up_block_types=("HunyuanVideoUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                latent_channels=4, spatial_compression_ratio=2, temporal_compression_ratio=4)


def test_frame_causal_attention_without_the_mask():
    """HunyuanVideoMidBlock3D under slabs(): its attention runs frame by frame (each frame's queries against the keys of
    the frames up to it) and never builds the dense causal mask; the output equals the block's own within FP64
    rounding, for one and several heads, one and two samples, one and several frames."""
    require()
    from unittest import mock
    from diffusers.models.autoencoders import autoencoder_kl_hunyuan_video as hv
    import gnsilu.chunked as gc
    with one_thread(), torch.no_grad():
        for head_dim, batch, frames in ((64, 1, 3), (16, 2, 3), (64, 2, 1), (32, 1, 5)):
            torch.manual_seed(0)
            block = hv.HunyuanVideoMidBlock3D(64, resnet_groups=8, attention_head_dim=head_dim).eval().double()
            assert gc.slab_rows(block), "the mid block is not taken"
            x = torch.randn(batch, 64, frames, 4, 5, dtype=torch.float64) * 3 + 1
            whole = block(x)
            no_mask = mock.patch.object(hv, "prepare_causal_attention_mask",
                                        side_effect=AssertionError("a mask was made"))
            with no_mask, \
                    gc.slabs(block, max_bytes=1 << 30):
                framed = block(x)
            assert "forward" not in vars(block), "slabs() left a forward behind"
            error = _relative_l2(framed, whole)
            assert error < 1e-13, f"heads {64 // head_dim}, batch {batch}, frames {frames}: relative L2 {error:.3g}"
            # A causal mask that let a frame see the next one would not be caught by the whole output alone if the
            # last frame dominated: each frame's output is compared too.
            for f in range(frames):
                assert _relative_l2(framed[:, :, f], whole[:, :, f]) < 1e-13, f"frame {f}"


def test_attention_by_query_chunks():
    """The mid block attention of AutoencoderKL (diffusers' Attention: one head as wide as the channels, its group
    norm, the residual) computed with its queries in chunks of matrix products (gnsilu.chunked's
    _attention_by_query_chunks, which gnsilu.bounded takes on CUDA for heads wider than 256) equals the module's own
    call within FP64 rounding, for chunks of one row, of several and of all, one and two samples, one and two heads."""
    require()
    from diffusers.models.attention_processor import Attention
    import gnsilu.chunked as gc
    with one_thread(), torch.no_grad():
        for channels, heads, batch in ((64, 1, 1), (64, 2, 2), (32, 1, 2)):
            torch.manual_seed(0)
            attn = Attention(channels, heads=heads, dim_head=channels // heads, rescale_output_factor=1.0, eps=1e-6,
                             norm_num_groups=8, residual_connection=True, bias=True, upcast_softmax=True,
                             _from_deprecated_attn_block=True).eval().double()
            assert gc._frame_attention_plain(attn) and not gc._wide_heads(attn)
            x = torch.randn(batch, channels, 5, 7, dtype=torch.float64) * 2 + 0.5
            whole = attn(x)
            per_row = batch * heads * 35 * 16  # the function's bytes a query row (FP64 scores and softmax)
            for rows in (1, 3, 35):
                chunked = gc._attention_by_query_chunks(attn, x, rows * per_row)
                error = _relative_l2(chunked, whole)
                assert chunked.shape == whole.shape and error < 1e-14, (channels, heads, batch, rows, error)
        wide = Attention(512, heads=1, dim_head=512, norm_num_groups=32, residual_connection=True,
                         _from_deprecated_attn_block=True)
        assert gc._wide_heads(wide), "a head of 512 is not taken for wide"


def test_slabs_hunyuan_resnet_blocks_without_whole_norm_outputs():
    """A swapped AutoencoderKLHunyuanVideo: its HunyuanVideoResnetBlockCausal3Ds run conv1 and conv2 in slabs whose
    input rows are normalized with the whole tensor's records and padded as the causal convolution pads (replicate:
    the normalized tensor's edge rows, the first frame), so no whole normalized tensor is made. On the CPU with
    gnsilu's CPU reference for the norms (whole and padded) and PyTorch's native convolutions, each block's output
    has the block's bits, with and without a shortcut convolution; the decode in slabs is within FP32 rounding of the
    whole decode."""
    require()
    from unittest import mock
    import gnsilu
    import gnsilu.chunked as gc

    def reference_op(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None,
                     input_bias=None):
        assert input_bias is None
        return gnsilu.group_norm_apply(x, gnsilu.group_stats(x, num_groups), weight, bias, eps, activation)

    def reference_padded(x, num_groups, weight, bias, eps, activation, pad, pad_mode, pad_value, out_dtype=None,
                         input_bias=None):
        y = reference_op(x, num_groups, weight, bias, eps, activation, out_dtype, input_bias)
        return F.pad(y, pad, mode=pad_mode) if pad_mode == "replicate" else F.pad(y, pad, value=pad_value)

    with one_thread(), _native_convolutions(), mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), \
            mock.patch.object(gt, "_op_implementation", reference_op), \
            mock.patch.object(gt, "_padded_implementation", reference_padded), torch.no_grad():
        torch.manual_seed(0)
        vae = vae_class("AutoencoderKLHunyuanVideo")(**_hunyuan_config()).eval()
        assert gt.swap_group_norm_silu(vae) > 0
        resnets = [m for m in vae.decoder.modules() if type(m).__name__ == "HunyuanVideoResnetBlockCausal3D"]
        assert resnets and all(gc.slab_rows(m) for m in resnets), "the swapped resnet blocks are not taken"
        assert any(m.conv_shortcut is not None for m in resnets) and any(m.conv_shortcut is None for m in resnets)
        for block in resnets:
            x = torch.randn(1, block.norm1.num_channels, 3, 12, 7) * 2 + 1
            whole = block(x)
            stats_calls = [0]
            group_stats = gnsilu._api.group_stats

            def counted_stats(*args, **kwargs):
                stats_calls[0] += 1
                return group_stats(*args, **kwargs)
            out_channels = block.conv2.conv.out_channels
            with mock.patch.object(gnsilu._api, "group_stats", counted_stats), \
                    gc.slabs(block, max_bytes=4 * out_channels * 3 * x.shape[-1] * 4):  # 4 rows a slab
                sliced = block(x)
            assert stats_calls[0] == 2, f"the block's slab path did not run ({stats_calls[0]} group_stats)"
            assert "forward" not in vars(block), "slabs() left a forward behind"
            assert torch.equal(sliced, whole), \
                f"shortcut {block.conv_shortcut is not None}: relative L2 {_relative_l2(sliced, whole):.3g}"
        latent = randn(1, 4, 2, 9, 8)
        whole = vae.decode(latent).sample
        with _counted(gc, "_hunyuan_resnet_forward") as ran, gc.slabs(vae.decoder, max_bytes=2048):
            sliced = vae.decode(latent).sample
        assert ran[0] == len(resnets), (ran, len(resnets))
        error = _relative_l2(sliced, whole)
        assert error < 1e-5, f"the decode in slabs against the whole one: relative L2 {error:.3g}"
        print(f"  HunyuanVideo resnet blocks in slabs: {len(resnets)} blocks with their bits; the decode within "
              f"{error:.1e}")


@contextlib.contextmanager
def _counted(owner, name):
    """owner.<name> replaced by a wrapper that counts its calls: ran[0] in the list it yields."""
    ran = [0]
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        ran[0] += 1
        return original(*args, **kwargs)
    with unittest.mock.patch.object(owner, name, counted):
        yield ran


def _relative_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _split_model(name, config, swap):
    torch.manual_seed(0)
    vae = vae_class(name)(**config).eval()  # FP32: gnsilu's GroupNorm takes bf16, fp16 and fp32
    if swap:
        gt.swap_group_norm_silu(vae)
    return vae


@contextlib.contextmanager
def _native_convolutions():
    """PyTorch's own CPU convolutions (oneDNN off): they compute each output the same way whatever the number of
    rows, so a band's convolution has the whole tensor's bits (oneDNN picks its algorithm by shape: 1e-6 apart)."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


def _split_worker(rank, world, init_file, result_file, name, config, swap, latent):
    import torch.distributed as dist
    import gnsilu.split as gs
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    try:
        vae = _split_model(name, config, swap)
        with _native_convolutions():
            band = gs.decode(vae, latent, gather=False)
            sample = gs.decode(vae, latent)
        # The mid block split too (its attention sees only the band): not the whole decode, which the test must see.
        split_mid = gs.decode(vae, latent, whole=[])
        bands = [torch.empty(0)] * world
        dist.all_gather_object(bands, band)
        if rank == 0:
            torch.save(dict(sample=sample, bands=bands, split_mid=split_mid), result_file)
    finally:
        dist.destroy_process_group()


def _split_decode(name, config, latent, world, swap):
    require()
    import tempfile
    import torch.multiprocessing as mp
    import gnsilu.split as gs
    with tempfile.TemporaryDirectory() as d:
        init_file, result_file = os.path.join(d, "init"), os.path.join(d, "result.pt")
        mp.spawn(_split_worker, args=(world, init_file, result_file, name, config, swap, latent), nprocs=world,
                 join=True)
        result = torch.load(result_file)
    with one_thread():
        vae = _split_model(name, config, swap)
        with _native_convolutions():
            single = gs.decode(vae, latent)  # one rank: the same code, no process group
        assert all("forward" not in vars(m) for m in vae.modules()), "split.rows() left a patched forward behind"
        with torch.no_grad():
            plain = vae.decode(latent).sample  # PyTorch's GroupNorm (on the CPU the swapped modules run PyTorch's)
    sample = result["sample"]
    assert sample.shape == single.shape == plain.shape, (sample.shape, single.shape, plain.shape)
    # Every rank's band is its rows of the sample: the output rows of its latent rows.
    scale = sample.shape[-2] // latent.shape[-2]
    for rank, band in enumerate(result["bands"]):
        lo, hi = gs.band_of(latent.shape[-2], rank, world)
        assert torch.equal(band, sample[..., scale * lo:scale * hi, :]), f"rank {rank}'s band"
    # The split decode's bits are the single-process decode's: every GroupNorm's statistics merged exactly, every
    # convolution computed from the same rows (halos from the neighbours, the module's padding at the true edges).
    assert torch.equal(sample, single), \
        f"{name}, {world} ranks against one: relative L2 {_relative_l2(sample, single):.3g}"
    plain_error = _relative_l2(single, plain)
    assert plain_error <= 1e-4, f"{name}: gnsilu's exact GroupNorm against PyTorch's: relative L2 {plain_error:.3g}"
    mid_error = _relative_l2(result["split_mid"], single)
    assert mid_error > 1e-3, f"{name}: the mid block split by rows should not decode the same ({mid_error:.3g})"


def test_split_rows_autoencoder_kl():
    """Three ranks (the middle one with halos on both sides), the GroupNorm+SiLU pairs swapped."""
    config = dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)
    _split_decode("AutoencoderKL", config, randn(1, 4, 12, 10), 3, swap=True)


def test_split_rows_hunyuan_video():
    """Two ranks, plain nn.GroupNorm, causal 3-D convolutions padded by replication at the true edges."""
    config = dict(block_out_channels=(32, 64), down_block_types=("HunyuanVideoDownBlock3D",) * 2,
                  up_block_types=("HunyuanVideoUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                  latent_channels=4, spatial_compression_ratio=2, temporal_compression_ratio=4)
    _split_decode("AutoencoderKLHunyuanVideo", config, randn(1, 4, 2, 9, 8), 2, swap=False)


def test_split_rows_hunyuan_video_swapped():
    """Two ranks, the pairs swapped: the convolutions fed by them are PaddedInputConvs, which take halos as the causal
    convolutions they stand for."""
    config = dict(block_out_channels=(32, 64), down_block_types=("HunyuanVideoDownBlock3D",) * 2,
                  up_block_types=("HunyuanVideoUpBlock3D",) * 2, layers_per_block=1, norm_num_groups=8,
                  latent_channels=4, spatial_compression_ratio=2, temporal_compression_ratio=4)
    _split_decode("AutoencoderKLHunyuanVideo", config, randn(1, 4, 2, 9, 8), 2, swap=True)


def test_split_rows_silu_function_pair():
    """A norm proven to go straight into F.silu(...) (swapped for one that returns silu(group_norm(x)) marked for
    F.silu to pass through): within gnsilu.split.rows its band forward marks its output too, so SiLU runs once."""
    require()
    import gnsilu.split as gs
    from toy_models import FunctionalSiLU
    torch.manual_seed(3)
    model = FunctionalSiLU(64, 32).eval()
    x = torch.randn(1, 64, 6, 5)
    with one_thread(), torch.no_grad():
        expected = model(x)  # PyTorch's GroupNorm, then F.silu
    gt.swap_group_norm_silu(model)
    assert type(model.norm).__name__ == "_GroupNormBeforeSiLUFunction", type(model.norm)
    with one_thread(), torch.no_grad(), gs.rows(model):
        got = model(x)  # the band forward: gnsilu's exact statistics and apply (one rank)
    assert type(got) is torch.Tensor, type(got)
    error = _relative_l2(got, expected)
    assert error < 1e-5, f"relative L2 {error:.3g} (SiLU applied twice: about 0.26 here)"


def test_split_rows_frame_group_norm_contiguous():
    """A FrameGroupNormContiguous (MiniMaxH3VideoGroupNorm's swap: GroupNorm of each frame apart) within
    gnsilu.split.rows: its band forward takes each frame's statistics apart, as its own forward does, not the whole
    5-D tensor's (an nn.GroupNorm subclass, it had been taken for a plain GroupNorm), and gives a contiguous output.
    The frames differ in mean and spread, so statistics over all frames are far off (one rank; CPU)."""
    require()
    import gnsilu.split as gs
    torch.manual_seed(5)
    norm = nn.GroupNorm(8, 32)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    frames = torch.tensor([0.0, 3.0, -2.0]).view(1, 1, 3, 1, 1), torch.tensor([1.0, 0.2, 5.0]).view(1, 1, 3, 1, 1)
    x = torch.randn(2, 32, 3, 8, 6) * frames[1] + frames[0]
    with torch.no_grad():
        expected = F.group_norm(x.transpose(1, 2).flatten(0, 1), 8, norm.weight, norm.bias, norm.eps)
        expected = expected.unflatten(0, (2, 3)).transpose(1, 2)
    model = nn.Sequential(gt.FrameGroupNormContiguous.from_group_norm(norm)).eval()
    with one_thread(), torch.no_grad():
        plain = model(x)  # its own forward
    with one_thread(), torch.no_grad(), gs.rows(model):
        got = model(x)  # the band forward (one rank)
    assert got.is_contiguous() and got.shape == x.shape
    for name, y in (("forward", plain), ("band forward", got)):
        error = _relative_l2(y, expected)
        assert error < 1e-5, f"{name}: relative L2 {error:.3g} to per-frame statistics"
    whole = F.group_norm(x, 8, norm.weight, norm.bias, norm.eps)
    assert _relative_l2(whole, expected) > 0.1  # the frames' statistics do differ


def test_split_and_slabs_with_moved_biases():
    """gnsilu.split (one rank: the same code without a process group) and gnsilu.chunked on a swapped AutoencoderKL
    with the bias move on CPU tensors. split runs the mid block whole: its ResnetBlock2D's conv1 hands its output
    without the bias to norm2's band forward, whose records and output take the bias (group_stats and
    group_norm_apply with input_bias); elsewhere the band convolutions add their bias. Both decodes are within FP32
    rounding of the decode without the move; nothing is held after them."""
    require()
    import gnsilu
    import gnsilu.chunked as gc
    import gnsilu.split as gs
    sys.path.insert(0, HERE)
    from test_cpu import library_takes_input_bias
    if not library_takes_input_bias():
        raise unittest.SkipTest(f"{gnsilu.library_path()} predates input_bias (0.3): rebuild the library")
    config = dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)
    latent = randn(1, 4, 12, 10)
    with one_thread(), _native_convolutions(), torch.no_grad():
        vae = _split_model("AutoencoderKL", config, swap=True)
        plain_split = gs.decode(vae, latent)
        plain_slabs = vae.decode(latent).sample
        with_bias = []
        group_stats = gnsilu._api.group_stats

        def counted(x, num_groups, *, input_bias=None):
            with_bias.append(input_bias is not None)
            return group_stats(x, num_groups, input_bias=input_bias)
        with biases_move_on_cpu(), unittest.mock.patch.object(gnsilu._api, "group_stats", counted):
            split = gs.decode(vae, latent)
            assert sum(with_bias) == 2, with_bias  # the mid block's two ResnetBlock2D
            with gc.slabs(vae.decoder, max_bytes=2048):
                sliced = vae.decode(latent).sample
    for name, got, expected in (("split", split, plain_split), ("slabs", sliced, plain_slabs)):
        error = _relative_l2(got, expected)
        assert error < 1e-5, f"{name} with moved biases: relative L2 {error:.3g}"
    convs = [m for m in vae.modules() if isinstance(m, gt._BiasMovingConv)]
    assert len(convs) == 10 and not any(m._gnsilu_move_bias or m._gnsilu_norm._gnsilu_biased is not None
                                        for m in convs)
    assert all("forward" not in vars(m) for m in vae.modules())


def test_split_rows_errors():
    require()
    import gnsilu.split as gs
    assert gs.band_of(10, 0, 3) == (0, 3) and gs.band_of(10, 2, 3) == (6, 10)
    try:
        gs.band_of(10, 3, 3)
        raise AssertionError("rank 3 of 3 accepted")
    except ValueError as e:
        assert "rank 3" in str(e)
    strided = nn.Sequential(nn.Conv2d(4, 4, 3, stride=2, padding=1))
    with one_thread(), torch.no_grad(), gs.rows(strided):
        try:
            strided(torch.randn(1, 4, 8, 8))
            raise AssertionError("a stride-2 convolution accepted")
        except ValueError as e:
            assert "0" in str(e) and "stride-1" in str(e), e
    assert "forward" not in vars(strided[0])
    norm = nn.GroupNorm(2, 4).double()
    with gs.rows(norm):
        try:
            norm(torch.randn(1, 4, 3, 3, dtype=torch.float64))
            raise AssertionError("a float64 GroupNorm accepted")
        except ValueError as e:
            assert "float64" in str(e)


def load_tests(loader, tests, pattern):
    return function_tests.load_tests_of(globals())


if __name__ == "__main__":
    sys.exit(function_tests.main(globals(), "test_vae_swap", require_note=' (the pinned diffusers should have every class)'))
