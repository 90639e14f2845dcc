#!/usr/bin/env python3
"""gnsilu.bounded on CPU: tiny seeded AutoencoderKL and AutoencoderKLHunyuanVideo models (diffusers), swapped by
gnsilu.torch, decoded in every GPU budget from one that fits the whole decode down to the smallest that works.
Needs PyTorch and diffusers (skipped without).

    PYTHONPATH=python python3 python/tests/test_bounded.py     (or pytest / unittest, as test_vae_swap.py)

On the CPU the "GPU" is the CPU: what is tested is the plan (placements, slab heights, the budget it meets, the
refusals) and the layered decode's arithmetic. The models' GroupNorms run on gnsilu's CPU reference (as the layered
decode's group_stats / group_norm_apply do) and PyTorch's native convolutions compute each output row alike on any
number of rows, so every budget must give the whole decode's bits. HunyuanVideo's whole decode is taken with its
attention frame by frame (gnsilu.chunked), as the layered decode runs it: the masked attention differs from it
within rounding (test_vae_swap.test_frame_causal_attention_without_the_mask).
"""
import contextlib
import os
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import function_tests  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from diffusers.models import autoencoders
    import gnsilu
    import gnsilu.bounded as gb
    import gnsilu.chunked as gc
    import gnsilu.torch as gt
    from function_tests import one_thread
    from test_vae_swap import TINY_2D, _hunyuan_config, _native_convolutions
except ImportError as error:
    torch = None
    MISSING = f"needs PyTorch and diffusers ({type(error).__name__}: {error})"
    function_tests.dependencies_missing(__name__, "test_bounded", MISSING)


def require():
    if torch is None:
        raise unittest.SkipTest(MISSING)


def _reference_op(x, num_groups, weight=None, bias=None, eps=1e-6, activation="silu", out_dtype=None,
                  input_bias=None):
    assert input_bias is None
    return gnsilu.group_norm_apply(x, gnsilu.group_stats(x, num_groups), weight, bias, eps, activation)


def _reference_padded(x, num_groups, weight, bias, eps, activation, pad, pad_mode, pad_value, out_dtype=None,
                      input_bias=None):
    y = _reference_op(x, num_groups, weight, bias, eps, activation, out_dtype, input_bias)
    return F.pad(y, pad, mode=pad_mode) if pad_mode == "replicate" else F.pad(y, pad, value=pad_value)


@contextlib.contextmanager
def cpu_reference():
    """The swapped modules on CPU tensors call gnsilu's CPU reference (whole and padded), and convolutions are
    PyTorch's native ones; one thread, no autograd."""
    with one_thread(), _native_convolutions(), mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), \
            mock.patch.object(gt, "_op_implementation", _reference_op), \
            mock.patch.object(gt, "_padded_implementation", _reference_padded), torch.no_grad():
        yield


def _models():
    """(name, swapped model, latents) for each model kind and layout."""
    torch.manual_seed(0)
    kl = autoencoders.AutoencoderKL(**dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)).eval()
    gt.swap_group_norm_silu(kl)
    torch.manual_seed(0)
    hv = autoencoders.AutoencoderKLHunyuanVideo(**_hunyuan_config()).eval()
    gt.swap_group_norm_silu(hv)
    torch.manual_seed(1)
    z2 = torch.randn(1, 4, 12, 10) * 2
    z3 = torch.randn(1, 4, 2, 9, 8) * 2
    models = [("AutoencoderKL", kl, z2), ("AutoencoderKL channels_last", kl, z2.contiguous(
        memory_format=torch.channels_last)), ("AutoencoderKLHunyuanVideo", hv, z3)]
    if hasattr(autoencoders, "AutoencoderKLFlux2"):  # its own class, AutoencoderKL's decoder (post_quant_conv on)
        torch.manual_seed(0)
        flux2 = autoencoders.AutoencoderKLFlux2(**dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1,
                                                       use_quant_conv=False)).eval()
        gt.swap_group_norm_silu(flux2)
        models.append(("AutoencoderKLFlux2", flux2, z2))
    return models


def _whole(vae, z):
    """The whole decode, HunyuanVideo's attention frame by frame (as gnsilu.chunked runs it), over the whole tensor:
    HunyuanVideo's decoding by groups of frames (on by default from 5 latent frames) off, as the plain decode has it
    (the test of 6 latent frames checks that this differs from diffusers' default)."""
    # Every module whole; the mid block's attention by frames.
    with gb._whole_tensor(vae), gc.slabs(vae.decoder, max_bytes=1 << 40):
        return vae.decode(z).sample


def test_every_budget_gives_the_whole_decodes_bits():
    """From a budget that fits the whole decode (the plain decode) down to the smallest that works (one more byte
    less is refused): every layered decode equals the whole decode bit for bit, in the latents' layout; the plan's
    GPU peak is within the budget, activations move to the host as the budget shrinks, and slabs get smaller. Twice:
    as planned, and with no room left free (gnsilu.bounded._ROOM_PERCENT 0), so that host activations keep their first
    rows on the GPU at some budgets of these small models (slabs read rows from both)."""
    require()
    for room in (gb._ROOM_PERCENT, 0):
        with mock.patch.object(gb, "_ROOM_PERCENT", room):
            _every_budget(room)


def _every_budget(room):
    with cpu_reference():
        for name, vae, z in _models():
            whole = _whole(vae, z)
            top = gb.plan(vae, z, 1 << 40)
            assert top.plain and top.host_bytes == 0, name
            budget, seen_host, seen_recomputed, smallest, plans = top.plain_gpu_bytes, 0, 0, None, 0
            seen_partial = 0  # budgets whose plan keeps the first rows of a host activation on the GPU
            refused = None
            while True:
                try:
                    p = gb.plan(vae, z, budget)
                except ValueError as e:
                    assert "max_gpu_bytes" in str(e), e
                    if refused is not None:
                        break
                    # Then to the byte: the smallest budget that works, between this refused one and the last.
                    refused, working = budget, smallest
                    while working - refused > 1:
                        middle = (working + refused) // 2
                        try:
                            gb.plan(vae, z, middle)
                            working = middle
                        except ValueError:
                            refused = middle
                    budget = working
                    continue
                y = gb.decode(vae, z, budget, progress=False)
                assert torch.equal(y, whole), f"{name}, budget {budget}: relative L2 " \
                    f"{((y - whole).double().norm() / whole.double().norm()).item():.3g}"
                assert y.stride() == whole.stride(), f"{name}, budget {budget}: strides {y.stride()}"
                assert p.plain == (budget >= p.plain_gpu_bytes), (name, budget)
                if not p.plain:
                    assert p.gpu_bytes <= budget, (name, budget, p.gpu_bytes)
                    assert p.slabs >= len([layer for layer in p.layers if layer.kind != "whole"])
                    hosted = [a for a in p.activations.values() if a.where == "host"]
                    recomputed = [a for a in p.activations.values() if a.where == "recomputed"]
                    # Only a resnet block's conv1 output is recomputed (its out layer reads the block's input too).
                    assert all(a.name.endswith(".conv1") and a.recomputable for a in recomputed), (name, recomputed)
                    seen_recomputed += bool(recomputed)
                    counts = gb.last_counts()
                    # Every slab's host rows were fetched ahead (run.needs said what its run asked for), none late
                    # and none in vain.
                    assert counts["fetched_late"] == 0 and counts["fetched_unused"] == 0, (name, budget, counts)
                    partial = [a for a in hosted if a.gpu_rows]
                    seen_partial += bool(partial)
                    if hosted:
                        seen_host += 1
                        assert p.host_bytes >= max(a.host_bytes for a in hosted)
                        assert counts["fetched_ahead"] > 0, (name, budget, counts)
                    else:
                        assert p.host_bytes == 0
                        assert counts["fetched_ahead"] == 0, (name, budget, counts)
                    # The timeline: a row a layer in the plan's order, its slabs, and every byte copied out (each
                    # host activation that a layer makes, once) and fetched (host rows, halos included).
                    timeline = gb.last_timeline()
                    assert [t["layer"] for t in timeline] == [layer.name for layer in p.layers], name
                    assert sum(t["slabs"] for t in timeline) == p.slabs, (name, budget)
                    made = [a for a in hosted if a.name != "latents"]
                    # (of a host activation whose first rows stay on the GPU, the rest)
                    assert sum(t["d2h_bytes"] for t in timeline) == sum(a.host_bytes for a in made), (name, budget)
                    assert (sum(t["h2d_bytes"] for t in timeline) > 0) == bool(hosted), (name, budget)
                    assert all(t["store_tail_ms"] == 0 and t["compute_ms"] >= 0 for t in timeline), name
                smallest, plans = budget, plans + 1
                if refused is not None:
                    break  # the smallest budget that works has decoded
                budget = budget * 7 // 8 if budget > top.plain_gpu_bytes // 4 else budget - budget // 32
            assert plans >= 8 and seen_host >= 2 and seen_recomputed >= 1 and (seen_partial >= 1 or room), \
                (name, plans, seen_host, seen_recomputed, seen_partial)
            assert refused == smallest - 1, (refused, smallest)  # one byte less is refused
            try:
                gb.plan(vae, z, refused)
                raise AssertionError(f"{refused} was refused, then taken")
            except ValueError as e:  # and the refusal names the smallest budget
                assert f"max_gpu_bytes={smallest} (" in str(e), (smallest, str(e))
            floor = gb.plan(vae, z, smallest)
            print(f"  {name}, {room}% room: {plans} budgets from {top.plain_gpu_bytes} down to {smallest} bytes, every "
                  f"one the whole decode's bits ({seen_recomputed} of them recomputing activations, {seen_partial} "
                  f"keeping host activations' first rows on the GPU); at the smallest "
                  f"{floor.slabs} slabs, {floor.host_bytes} bytes on the host")


def test_refusals_come_before_any_work_and_name_the_argument():
    require()
    with cpu_reference():
        name, vae, z = _models()[0]
        top = gb.plan(vae, z, 1 << 40)
        calls = []
        with mock.patch.object(gnsilu._api, "group_stats", side_effect=lambda *a, **k: calls.append(1)), \
                mock.patch.object(F, "conv2d", side_effect=lambda *a, **k: calls.append(1)):
            for budget in (1, 1000, top.plain_gpu_bytes // 20):
                try:
                    gb.decode(vae, z, budget)
                    raise AssertionError(f"budget {budget} was not refused")
                except ValueError as e:
                    assert f"max_gpu_bytes={budget}" in str(e) and "needs" in str(e), e
            middle = top.plain_gpu_bytes // 2
            p = gb.plan(vae, z, middle)
            if p.host_bytes:
                try:
                    gb.decode(vae, z, middle, max_host_bytes=p.host_bytes - 1)
                    raise AssertionError("a host need above max_host_bytes was not refused")
                except ValueError as e:
                    assert f"max_host_bytes={p.host_bytes - 1}" in str(e) and str(p.host_bytes) in str(e), e
            for wrong in (0, -5, 1.5, True, "8G", None):
                try:
                    gb.plan(vae, z, wrong)
                    raise AssertionError(f"max_gpu_bytes={wrong!r} was taken")
                except ValueError as e:
                    assert "max_gpu_bytes must be a positive int" in str(e), e
            try:
                gb.plan(vae, z, 1 << 30, max_host_bytes=0)
                raise AssertionError("max_host_bytes=0 was taken")
            except ValueError as e:
                assert "max_host_bytes must be a positive int" in str(e), e
        assert not calls, "a refused decode did some work"
        # A model it cannot run layer by layer is named, module and reason.
        torch.manual_seed(0)
        other = autoencoders.AutoencoderKL(**dict(TINY_2D, block_out_channels=(32, 64), layers_per_block=1)).eval()
        other.decoder.up_blocks[0].resnets[0].conv1 = torch.nn.Conv2d(64, 64, 3, stride=2, padding=1)
        try:
            gb.plan(other, z, 1000)
            raise AssertionError("an unsupported convolution was taken")
        except ValueError as e:
            assert "up_blocks.0.resnets.0.conv1" in str(e), e
        try:
            gb.plan(torch.nn.Linear(2, 2), z, 1000)
            raise AssertionError("a Linear was taken for a VAE")
        except ValueError as e:
            assert ("vae must be a diffusers AutoencoderKL, AutoencoderKLFlux2 or AutoencoderKLHunyuanVideo, got Linear"
                    in str(e)), e


def test_the_plan_says_what_goes_where_before_the_work():
    require()
    with cpu_reference():
        for name, vae, z in _models():
            top = gb.plan(vae, z, 1 << 40)
            p = gb.plan(vae, z, top.plain_gpu_bytes // 3)
            text = str(p)
            assert "layer by layer" in text and "host" in text and "rows a slab" in text, text
            hosted = [a for a in p.activations.values() if a.where == "host"]
            assert hosted, f"{name}: nothing on the host at a third of the whole decode's bytes"
            # The host peak is the largest sum of host activations alive at once (of each, the rows not kept on the
            # GPU).
            peak = max(sum(a.host_bytes for a in hosted if a.made_by <= i <= a.last_use) for i in range(len(p.layers)))
            assert p.host_bytes == peak, (p.host_bytes, peak)
            for a in hosted:
                assert 0 <= a.gpu_rows < a.shape[-2] and a.host_bytes == (a.shape[-2] - a.gpu_rows) * a.row_bytes, a
                assert (f"its first {a.gpu_rows} rows on the GPU" in text) == (a.gpu_rows > 0), (a.name, text)
            assert "whole decode (vae.decode)" in str(top)


def test_hunyuan_decodes_make_no_causal_mask_and_leave_the_model_as_it_was():
    require()
    from diffusers.models.autoencoders import autoencoder_kl_hunyuan_video as hv
    with cpu_reference():
        name, vae, z = _models()[2]
        whole = _whole(vae, z)
        top = gb.plan(vae, z, 1 << 40)
        with mock.patch.object(hv, "prepare_causal_attention_mask", side_effect=AssertionError("a mask was made")):
            for budget in (1 << 40, top.plain_gpu_bytes // 2):
                assert torch.equal(gb.decode(vae, z, budget, progress=False), whole), budget
        assert all("forward" not in vars(m) for m in vae.modules()), "a forward was left behind"
        # Inside slabs() (its patched mid-block forward): kept as it was.
        with gc.slabs(vae.decoder, max_bytes=1 << 40):
            patched = vars(vae.decoder.mid_block)["forward"]
            gb.decode(vae, z, 1 << 40, progress=False)
            assert vars(vae.decoder.mid_block)["forward"] is patched


def test_a_video_of_more_frames_than_diffusers_decodes_at_once_is_decoded_whole():
    """HunyuanVideo decodes latents of more than 4 frames by groups of frames by default (use_framewise_decoding), each
    group with its own statistics. gnsilu.bounded decodes the whole tensor at every budget, the plain decode included
    (the setting off for the call, then restored), and differs from diffusers' default there; so does spatial tiling
    turned on by the caller."""
    require()
    with cpu_reference():
        name, vae, _ = _models()[2]
        torch.manual_seed(2)
        z = torch.randn(1, 4, 6, 5, 4) * 2  # 6 latent frames: diffusers' default decodes them in groups
        assert vae.use_framewise_decoding and not vae.use_tiling
        whole = _whole(vae, z)
        by_groups = vae.decode(z).sample
        # (This tiny model upsamples time by 2, not 4: by groups it even gives another number of frames.)
        assert by_groups.shape != whole.shape or not torch.equal(by_groups, whole), "no groups of frames were decoded"
        top = gb.plan(vae, z, 1 << 40)
        for budget in (1 << 40, top.plain_gpu_bytes // 2):
            assert torch.equal(gb.decode(vae, z, budget, progress=False), whole), budget
        vae.enable_tiling(tile_sample_min_height=4, tile_sample_min_width=4, tile_sample_stride_height=2,
                          tile_sample_stride_width=2)
        try:
            assert torch.equal(gb.decode(vae, z, 1 << 40, progress=False), whole)
            assert vae.use_tiling and vae.use_framewise_decoding, "the model's settings were not restored"
        finally:
            vae.disable_tiling()


def test_recompute_false_keeps_every_moved_activation_on_the_host():
    """recompute=False: the same budget's plan with nothing recomputed (what leaves the GPU goes to the host), within
    the budget, the same bits; a recompute that is not a bool is refused naming it."""
    require()
    with cpu_reference():
        for name, vae, z in _models()[2:]:
            whole = _whole(vae, z)
            top = gb.plan(vae, z, 1 << 40)
            def recomputes(budget):
                try:
                    return any(a.where == "recomputed" for a in gb.plan(vae, z, budget).activations.values())
                except ValueError:  # below the smallest budget
                    return False
            budgets = [b for b in range(top.plain_gpu_bytes // 2, top.plain_gpu_bytes // 8, -top.plain_gpu_bytes // 64)
                       if recomputes(b)]
            assert budgets, f"{name}: no budget recomputes"
            with_recompute = gb.plan(vae, z, budgets[0])
            host_only = gb.plan(vae, z, budgets[0], recompute=False)
            assert not any(a.where == "recomputed" for a in host_only.activations.values()), name
            assert any(a.where == "host" for a in host_only.activations.values()), name
            assert with_recompute.gpu_bytes <= budgets[0] and host_only.gpu_bytes <= budgets[0], name
            y = gb.decode(vae, z, budgets[0], progress=False, recompute=False)
            assert torch.equal(y, whole), name
            try:
                gb.plan(vae, z, budgets[0], recompute="yes")
                raise AssertionError("recompute='yes' was taken")
            except ValueError as e:
                assert "recompute" in str(e), e


def test_a_failed_allocation_frees_what_it_took_and_the_next_decode_works():
    require()
    with cpu_reference():
        name, vae, z = _models()[0]
        whole = _whole(vae, z)
        budget = gb.plan(vae, z, 1 << 40).plain_gpu_bytes // 3
        empty = torch.empty
        made = []

        def failing(*args, **kwargs):  # the fifth activation the decode allocates
            if "memory_format" in kwargs:
                made.append(1)
                if len(made) == 5:
                    raise RuntimeError("CUDA error: out of memory (injected)")
            return empty(*args, **kwargs)
        with mock.patch.object(torch, "empty", failing):
            try:
                gb.decode(vae, z, budget, progress=False)
                raise AssertionError("the injected failure did not come out")
            except MemoryError as e:
                assert "gnsilu.bounded: allocating" in str(e) and "injected" in str(e), e
        assert torch.equal(gb.decode(vae, z, budget, progress=False), whole)


def test_progress_bar():
    """A tqdm bar over the plan's slabs (shown after 2 s), none with progress=False or for the plain decode."""
    require()
    try:
        import tqdm.auto
    except ImportError:
        raise unittest.SkipTest("tqdm is not installed")
    with cpu_reference():
        name, vae, z = _models()[0]
        budget = gb.plan(vae, z, 1 << 40).plain_gpu_bytes // 3
        p = gb.plan(vae, z, budget)
        bars = []
        real = tqdm.auto.tqdm

        def recording(*args, **kwargs):
            bar = real(*args, **kwargs)
            bars.append((kwargs, bar))
            return bar
        with mock.patch.object(tqdm.auto, "tqdm", recording):
            gb.decode(vae, z, budget)
            assert len(bars) == 1 and bars[0][0]["total"] == p.slabs and bars[0][0]["delay"] == 2.0, bars
            assert bars[0][1].n == p.slabs
            gb.decode(vae, z, budget, progress=False)
            gb.decode(vae, z, 1 << 40)
            assert len(bars) == 1, "a bar with progress=False, or for the plain decode"


def test_memory_outside_the_allocator_is_taken_from_the_budget():
    """On CUDA the plan counts the device's memory outside PyTorch's allocator (CUDA's context, libraries) within
    max_gpu_bytes: a budget B with D bytes outside plans as B - D with none, the smallest budget it names grows by
    D, and a budget not above D is refused with the smallest that works. Here the device's measure is mocked (CPU
    tensors)."""
    require()
    with cpu_reference():
        name, vae, z = _models()[0]
        top = gb.plan(vae, z, 1 << 40)
        assert top.outside_bytes == 0
        budget, outside = top.plain_gpu_bytes // 2, top.plain_gpu_bytes // 16
        plain = gb.plan(vae, z, budget - outside)
        with mock.patch.object(gb, "_outside_allocator_bytes", return_value=outside):
            p = gb.plan(vae, z, budget)
            assert p.outside_bytes == outside and p.max_gpu_bytes == budget
            assert "CUDA's own" in str(p), str(p)
            assert (p.gpu_bytes, p.host_bytes, p.slabs) == (plain.gpu_bytes, plain.host_bytes, plain.slabs)
            assert [a.where for a in p.activations.values()] == [a.where for a in plain.activations.values()]
            assert [layer.rows for layer in p.layers] == [layer.rows for layer in plain.layers]
            # The whole decode fits only where it fits besides the outside bytes.
            assert not gb.plan(vae, z, top.plain_gpu_bytes + outside - 1).plain
            assert gb.plan(vae, z, top.plain_gpu_bytes + outside).plain
            for small in (outside, outside // 2):
                try:
                    gb.plan(vae, z, small)
                    raise AssertionError(f"max_gpu_bytes={small} with {outside} bytes outside was taken")
                except ValueError as e:
                    assert f"max_gpu_bytes={small} is below" in str(e) and f"{outside} bytes of it" in str(e), e
        smallest = []
        for extra in (0, outside):
            with mock.patch.object(gb, "_outside_allocator_bytes", return_value=extra):
                try:
                    gb.plan(vae, z, outside + 1000)
                    raise AssertionError("a budget 1000 bytes above the outside bytes was taken")
                except ValueError as e:
                    smallest.append(int(str(e).split("max_gpu_bytes=")[2].split(" ")[0]))
        assert smallest[1] == smallest[0] + outside, smallest
        with mock.patch.object(gb, "_outside_allocator_bytes", return_value=outside):
            assert not gb.plan(vae, z, smallest[1]).plain
            try:
                gb.plan(vae, z, smallest[1] - 1)
                raise AssertionError("a budget below the smallest named was taken")
            except ValueError:
                pass


def test_the_warm_up_decodes_a_corner_layer_by_layer_and_decode_plans_again_after_it():
    """warm_up() does nothing off CUDA (False); its decode of the latents' first 4x4 rows and columns (two frames of
    a video) runs layer by layer at the smallest budget, activations in host memory, and gives that corner's whole
    decode within rounding, in the latents' layout. decode() plans again after a warm-up that ran: the outside bytes the
    warm-up added are counted, so that a budget they leave too small is refused (mocked: CPU tensors)."""
    require()
    with cpu_reference():
        for name, vae, z in _models():
            assert gb.warm_up(vae, z) is False, name
            p, y = gb._warm_up_decode(vae, z)
            small = z[:1, :, :2] if z.dim() == 5 else z[:1]
            small = small[..., :4, :4].contiguous(memory_format=gb._layout(z))
            assert not p.plain and p.slabs > 0, name
            assert any(a.where == "host" for a in p.activations.values()), name
            whole = _whole(vae, small)
            # Within a convolution's rounding: oneDNN's convolutions of these 4x4 corners do not all round as on
            # two-row slabs (1.3e-6 against outputs up to 1.2, float32), unlike the larger decodes above.
            assert (y - whole).abs().max() <= 1e-5 * whole.abs().max(), name
            assert y.is_contiguous(memory_format=gb._layout(z)), name
        try:
            gb.warm_up(vae, (1, 4, 8, 8))
            raise AssertionError("a tuple was taken for latents")
        except ValueError as e:
            assert "latents" in str(e), e
        name, vae, z = _models()[0]
        top = gb.plan(vae, z, 1 << 40)
        budget = top.plain_gpu_bytes // 2
        assert not gb.plan(vae, z, budget).plain
        outside = [0]

        def warm(vae_, latents_):
            outside[0] = budget  # what a warm-up loaded: the whole budget, outside the allocator now
            return True
        with mock.patch.object(gb, "_outside_allocator_bytes", side_effect=lambda device: outside[0]), \
                mock.patch.object(gb, "warm_up", side_effect=warm):
            try:
                gb.decode(vae, z, budget, progress=False)
                raise AssertionError("the plan made before the warm-up was kept")
            except ValueError as e:
                assert f"max_gpu_bytes={budget} is below" in str(e) and f"{budget} bytes of it" in str(e), e
            outside[0] = 0
            with mock.patch.object(gb, "warm_up", return_value=False):  # no warm-up ran: the first plan is kept
                assert torch.equal(gb.decode(vae, z, budget, progress=False), _whole(vae, z))


def load_tests(loader, tests, pattern):
    return function_tests.load_tests_of(globals())


if __name__ == "__main__":
    sys.exit(function_tests.main(globals(), "test_bounded"))
