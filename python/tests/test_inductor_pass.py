#!/usr/bin/env python3
"""gnsilu's graph pass for torch.compile (gnsilu.torch.inductor_pass, gnsilu/_inductor_pass.py) on CPU: what it
matches and replaces in small models compiled by Inductor's CPU backend (the pass told to take CPU tensors, where
gnsilu's ops run PyTorch's), the ops before and after, the numerics, its decisions and their log lines, the swap and
the pass together, its uuid and the cache keys. Needs PyTorch (skipped without).

    PYTHONPATH=python python3 python/tests/test_inductor_pass.py
"""
import contextlib
import os
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import function_tests  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
    import gnsilu.torch as gt
    from gnsilu import _inductor_pass as ip
except ImportError as error:
    torch = None
    MISSING = f"needs PyTorch ({type(error).__name__}: {error})"
    function_tests.dependencies_missing(__name__, "test_inductor_pass", MISSING)


def require():
    if torch is None:
        raise unittest.SkipTest(MISSING)


class Block(nn.Module):
    """conv -> GroupNorm -> SiLU -> replicate pad -> conv, then GroupNorm -> SiLU of that into a convolution, plus a
    plain GroupNorm of the input into a 1x1 convolution: the pass's three kinds of match and both moves of a
    convolution's bias, each read by a convolution (as in a VAE's resnet blocks)."""

    def __init__(self, channels=16, groups=4):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm1 = nn.GroupNorm(groups, channels)
        self.act = nn.SiLU()
        self.conv1 = nn.Conv2d(channels, channels, 3)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm3 = nn.GroupNorm(groups, channels, affine=False)
        self.conv3 = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        h = self.conv1(F.pad(self.act(self.norm1(self.conv0(x))), (1, 1, 1, 1), mode="replicate"))
        return self.conv2(F.silu(self.norm2(h))) + self.conv3(self.norm3(x))


class CapturingPass(ip.GnsiluPass if torch is not None else object):
    """gnsilu's pass that also keeps the call targets of each graph as it left it (it pickles as the pass does)."""

    def __init__(self):
        super().__init__()
        self.graphs = []
        self.biases = []  # of the last graph's convolutions: None, or "a bias"

    def __call__(self, graph):
        super().__call__(graph)
        calls = [n for n in graph.nodes if n.op == "call_function"]
        self.graphs.append([n.target for n in calls])
        self.biases = [None if n.args[2] is None else "a bias" for n in calls if n.target is torch.conv2d]
        return graph


@contextlib.contextmanager
def compiled_with_pass():
    """Inductor with gnsilu's pass (a CapturingPass) taking CPU tensors."""
    p = CapturingPass()
    torch._dynamo.reset()
    # The tests' tensors are small: MIN_BYTES off, except where a test sets it.
    with mock.patch.object(ip, "_DEVICE_TYPES", ("cpu",)), mock.patch.object(ip, "MIN_BYTES", 0), \
            torch._inductor.config.patch(pre_grad_custom_pass=p), torch.no_grad():
        yield p
    torch._dynamo.reset()


def gnsilu_ops(targets):
    """How many of the targets are gnsilu's ops (the packet Dynamo records, or an overload the pass inserts)."""
    ops = (torch.ops.gnsilu.group_norm, torch.ops.gnsilu.group_norm.default, torch.ops.gnsilu.group_norm_padded,
           torch.ops.gnsilu.group_norm_padded.default)
    return sum(1 for t in targets if any(t is op for op in ops))


def logged():
    """The pass's log lines while the block runs."""
    return ip.logged_decisions()


def test_matches_replaced_ops_gone_numerics_kept():
    """Every match of the block replaced: GroupNorm+SiLU+pad by the padded op (the pad gone), GroupNorm+SiLU by the
    op with activation "silu", the plain GroupNorm by activation "none"; both convolutions before a GroupNorm lose
    their bias to the op's input bias. No F.group_norm, F.silu or pad is left; the output is the block's within FP32
    rounding (the moved bias is added by the norm: one more rounding), in both layouts."""
    require()
    torch.manual_seed(0)
    block = Block().eval()
    for layout in (torch.contiguous_format, torch.channels_last):
        x = (torch.randn(2, 16, 10, 6) * 3 + 1).contiguous(memory_format=layout)
        with compiled_with_pass() as p, logged() as lines:
            y = torch.compile(block, fullgraph=True)(x)
            counts, after = dict(p.counts), p.graphs[0]
        assert counts == {"replaced": 3, "kept": 0, "padded": 1, "input_bias": 2}, counts
        assert F.group_norm not in after and F.silu not in after, after
        assert not any(t in ip._PADS for t in after), after
        assert after.count(torch.ops.gnsilu.group_norm.default) == 2, after
        assert after.count(torch.ops.gnsilu.group_norm_padded.default) == 1, after
        assert after.count(torch.conv2d) == 4
        assert p.biases == [None, None, "a bias", "a bias"], "a convolution kept the bias the op took"
        assert len([line for line in lines if line.startswith("gnsilu.inductor: replaced")]) == 3, lines
        with torch.no_grad():
            expected = block(x)
        error = ((y - expected).norm() / expected.norm()).item()
        assert error < 1e-6, f"{layout}: relative L2 {error:.3g}"


def test_decisions_follow_the_rule_and_say_why():
    """decide() on fake CUDA tensors: below MIN_BYTES kept in either layout; channels-last replaced from there;
    channel-major replaced below NCHW_MAX_BYTES with at least MIN_GROUPS groups, kept above or with one group; CPU
    tensors, float64 and tensors in neither layout kept; each with its reason. Through the pass: a kept match is
    logged and left as it was."""
    require()
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        big = torch.empty(4, 128, 1024, 1024, dtype=torch.bfloat16, device="cuda")  # 1 GiB
        small = torch.empty(1, 512, 64, 64, dtype=torch.float16, device="cuda")
        cases = [
            (big, 32, False, "MiB in channel-major layout"),
            (big.to(memory_format=torch.channels_last), 32, True, "channels-last"),
            (small, 32, True, "channel-major, 4 MiB, 32 groups"),
            (small, 1, False, "1 group"),
            (small.to(torch.float64), 32, False, "torch.float64"),
            (small.transpose(2, 3), 32, False, "neither layout"),
            (torch.empty(4, 64, 32, 32, dtype=torch.bfloat16, device="cuda"), 32, False, "512 KiB: below 1 MiB"),
            (torch.empty(4, 64, 32, 32, dtype=torch.bfloat16, device="cuda").to(memory_format=torch.channels_last),
             32, False, "512 KiB: below 1 MiB"),
            (torch.empty(1, 32, 8, 8, device="cpu"), 8, False, "on cpu"),
            # A (1, C, T, H, W) video's frames as a batch (a view: "channels first" order), from 16 MiB.
            (frames(torch.empty(1, 128, 8, 128, 128, dtype=torch.bfloat16, device="cuda")), 32, True,
             "channels first order"),
            (frames(torch.empty(1, 128, 2, 64, 64, dtype=torch.bfloat16, device="cuda")), 32, False,
             "nor in an order gnsilu._strided takes from 16 MiB"),
        ]
        for x, groups, replace, reason in cases:
            got, why = ip.decide(x, groups, "silu", False)
            assert got == replace and reason in why, (tuple(x.shape), x.dtype, groups, got, why)
        video = frames(torch.empty(1, 128, 8, 128, 128, dtype=torch.bfloat16, device="cuda"))
        got, why = ip.decide(video, 32, "silu", True)
        assert not got and "padded op takes no such input" in why, why
    torch.manual_seed(0)
    block = Block(groups=1).eval()  # one group: every match kept
    x = torch.randn(2, 16, 10, 6)
    with compiled_with_pass() as p, logged() as lines:
        y = torch.compile(block, fullgraph=True)(x)
        counts = dict(p.counts)
    assert counts == {"replaced": 0, "kept": 3, "padded": 0, "input_bias": 0}, counts
    assert p.graphs[0].count(F.group_norm) == 3
    kept = [line for line in lines if line.startswith("gnsilu.inductor: kept")]
    assert len(kept) == 3 and all("1 group in channel-major layout" in line for line in kept), lines
    with torch.no_grad():
        assert torch.equal(y, torch.compile(block)(x)) or ((y - block(x)).norm() / block(x).norm()) < 1e-6


def frames(video):
    """A (N, C, T, H, W) video's frames as a batch, as Mochi's and Magvit's decoders view them for a per-frame
    GroupNorm: (N*T, C, H, W), a view where N = 1."""
    return video.permute(0, 2, 1, 3, 4).flatten(0, 1)


class FrameBlock(nn.Module):
    """A per-frame GroupNorm + SiLU then a 2-D convolution of each frame, on a video; with pad=True a replicate pad
    between them (the convolution then pads nothing itself)."""

    def __init__(self, channels=64, groups=8, pad=False):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.pad = pad
        self.conv = nn.Conv2d(channels, channels, 3, padding=0 if pad else 1)

    def forward(self, video):
        n, c, t, h, w = video.shape
        y = F.silu(self.norm(frames(video)))
        y = self.conv(F.pad(y, (1, 1, 1, 1), mode="replicate") if self.pad else y)
        return y.unflatten(0, (n, t)).permute(0, 2, 1, 3, 4)


def test_a_videos_frames_are_taken_as_the_model_views_them():
    """A per-frame GroupNorm of a (1, C, T, H, W) video's frames viewed as a batch (no copy: "channels first"
    order) of 16 MiB and more, read by a convolution: replaced by the op on that view. Below 16 MiB it is kept, and
    with a pad after it too (the padded op takes no such view, and Inductor computes the pad in its GroupNorm's
    kernel). The output is the block's within FP32 rounding."""
    require()
    torch.manual_seed(0)
    for size, pad, replaced in ((96, False, 1), (32, False, 0), (96, True, 0)):
        block = FrameBlock(pad=pad).eval()
        video = torch.randn(1, 64, 8, size, size) * 2 + 1  # 96: 18 MiB of float32
        with compiled_with_pass() as p, logged() as lines:
            y = torch.compile(block, fullgraph=True)(video)
            counts, after = dict(p.counts), p.graphs[0]
        assert counts["replaced"] == replaced and counts["kept"] == 1 - replaced, (size, pad, counts, lines)
        assert counts["padded"] == 0, counts
        assert any(t in ip._PADS for t in after) == pad, after  # a pad is still there
        if replaced:
            assert "channels first order" in lines[0], lines
            assert gnsilu_ops(after) == 1 and F.group_norm not in after, after
        elif pad:
            assert "its result goes to call_function pad" in lines[0], lines
        with torch.no_grad():
            expected = block(video)
        error = ((y - expected).norm() / expected.norm()).item()
        assert error < 1e-6, f"{size}: relative L2 {error:.3g}"


class ReaderBlock(nn.Module):
    """The matches the reader rule sorts, on one input (bias-free convolutions, so that no bias moves):
      a: GroupNorm -> x * scale + shift -> SiLU -> conv (a spatial norm, as CogVideoX's decoder has);
      b: GroupNorm -> SiLU -> + 1 -> conv (a pointwise op after the SiLU);
      c: a video's frames as a batch -> GroupNorm -> unflatten -> permute -> SiLU -> conv3d (Magvit's decoder);
      d: GroupNorm -> SiLU -> dropout (eval) -> replicate pad -> conv (HunyuanVideo's second norm)."""

    def __init__(self, channels=16, groups=4):
        super().__init__()
        self.norms = nn.ModuleList(nn.GroupNorm(groups, channels) for _ in range(4))
        self.convs = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1, bias=False) for _ in range(2))
        self.conv3d = nn.Conv3d(channels, channels, 3, padding=1, bias=False)
        self.conv_d = nn.Conv2d(channels, channels, 3, bias=False)
        self.drop = nn.Dropout(0.1)
        self.scale = nn.Parameter(torch.randn(1, channels, 1, 1))
        self.shift = nn.Parameter(torch.randn(1, channels, 1, 1))

    def forward(self, x, video):
        a = self.convs[0](F.silu(self.norms[0](x) * self.scale + self.shift))
        b = self.convs[1](F.silu(self.norms[1](x)) + 1)
        n, c, t, h, w = video.shape
        v = self.norms[2](frames(video)).unflatten(0, (n, t)).permute(0, 2, 1, 3, 4)
        v = self.conv3d(F.silu(v))
        d = self.conv_d(F.pad(self.drop(F.silu(self.norms[3](x))), (1, 1, 1, 1), mode="replicate"))
        return a + b + d, v


def test_what_reads_a_match_decides_and_silu_behind_views_or_dropout_matches():
    """Channel-major: a GroupNorm whose result goes to a pointwise op (a: its scale and shift; b: after its SiLU) is
    kept, with the reader named; the SiLU behind the view back to (N, C, T, H, W) is the GroupNorm's (c: replaced, the
    views kept on the op's result, no F.silu left); the pad behind an eval-mode dropout is absorbed (d: the padded
    op). Channels-last: a and b are replaced too (Inductor's channels-last GroupNorm is slower by more than the extra
    pass). With READER_RULE off, a and b are replaced in both layouts. Outputs within FP32 rounding of the block's."""
    require()
    torch.manual_seed(0)
    block = ReaderBlock().eval()
    video = torch.randn(1, 16, 4, 12, 10) * 2 + 1
    for layout, rule, expected_counts in ((torch.contiguous_format, True, {"replaced": 2, "kept": 2, "padded": 1}),
                                          (torch.channels_last, True, {"replaced": 4, "kept": 0, "padded": 1}),
                                          (torch.contiguous_format, False, {"replaced": 4, "kept": 0, "padded": 1})):
        x = (torch.randn(2, 16, 12, 10) * 3 - 1).contiguous(memory_format=layout)
        # The frames of a small video are kept below gnsilu._strided's MIN_BYTES: allow any size here.
        with compiled_with_pass() as p, logged() as lines, mock.patch.object(ip._strided, "MIN_BYTES", 0), \
                mock.patch.object(ip, "READER_RULE", rule):
            got = torch.compile(block, fullgraph=True)(x, video)
            counts, after = dict(p.counts), p.graphs[0]
        assert {k: counts[k] for k in expected_counts} == expected_counts, (layout, rule, counts, lines)
        kept = [line for line in lines if line.startswith("gnsilu.inductor: kept")]
        if counts["kept"]:
            assert any("its result goes to call_function mul" in line for line in kept), kept
            assert any("its result goes to call_function add" in line for line in kept), kept
        assert any("GroupNorm+SiLU (through 2 views)" in line and "replaced" in line for line in lines), lines
        assert any("GroupNorm+SiLU+pad" in line and "replaced" in line for line in lines), lines
        # a's (after its scale and shift, never the GroupNorm's) and, kept, b's: c's and d's are gone.
        assert after.count(F.silu) == (2 if counts["kept"] else 1), after
        assert not any(t in ip._PADS for t in after), after
        assert after.count(torch.ops.gnsilu.group_norm_padded.default) == 1, after
        with torch.no_grad():
            expected = block(x, video)
        for g, e in zip(got, expected):
            error = ((g - e).norm() / e.norm()).item()
            assert error < 1e-6, f"{layout} {rule}: relative L2 {error:.3g}"


def test_a_swapped_model_gets_no_second_replacement():
    """swap_group_norm_silu puts gnsilu's op in the graph where it proves a pair and for every plain GroupNorm; the
    pass then finds no GroupNorm to replace, and the graph holds exactly the swap's ops."""
    require()
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 16, 10, 6)
    counts = gt.swap_group_norm_silu(block, return_counts=True)
    with mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), compiled_with_pass() as p:
        torch.compile(block, fullgraph=True)(x)
        replaced, after = dict(p.counts), p.graphs[0]
    assert replaced["replaced"] == 0 and replaced["kept"] == 0, replaced
    assert gnsilu_ops(after) == counts.pairs + counts.plain, (after, counts)
    assert F.group_norm not in after


class ViewBlock(nn.Module):
    """GroupNorm -> .view(N, C, H * W) -> SiLU -> .view back -> conv."""

    def __init__(self, channels=16, groups=4):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x):
        n, c, h, w = x.shape
        return self.conv(F.silu(self.norm(x).view(n, c, h * w)).view(n, c, h, w))


def test_a_view_before_the_silu_is_taken_only_for_a_contiguous_input():
    """.view() needs strides that allow it, and the op's result has x's: for a contiguous x the SiLU behind the view
    is the op's (one op, no F.silu left); for a channels-last x the GroupNorm alone is replaced (the view then sees
    the op's channels-last result, which allows it here) and F.silu stays. Outputs within FP32 rounding."""
    require()
    torch.manual_seed(0)
    block = ViewBlock().eval()
    for layout, through in ((torch.contiguous_format, True), (torch.channels_last, False)):
        x = (torch.randn(2, 16, 8, 6) * 2 + 1).contiguous(memory_format=layout)
        with compiled_with_pass() as p, logged() as lines:
            got = torch.compile(block, fullgraph=True)(x)
            counts, after = dict(p.counts), p.graphs[0]
        assert counts["replaced"] == 1, (layout, counts, lines)
        assert ("(through 1 view)" in lines[0]) == through, (layout, lines)
        assert (F.silu in after) != through, (layout, after)
        with torch.no_grad():
            expected = block(x)
        error = ((got - expected).norm() / expected.norm()).item()
        assert error < 1e-6, f"{layout}: relative L2 {error:.3g}"


def test_uuid_names_the_code_and_the_rule_and_enabling_chains():
    require()
    p = gt.inductor_pass()
    assert p is gt.inductor_pass()
    first = p.uuid()
    assert first == p.uuid() and len(first) == 64
    with mock.patch.object(ip, "NCHW_MAX_BYTES", 1 << 20):
        assert p.uuid() != first
    with mock.patch.object(ip, "MIN_GROUPS", 4):
        assert p.uuid() != first
    with mock.patch.object(ip, "MIN_BYTES", 0):
        assert p.uuid() != first
    with mock.patch.object(ip, "READER_RULE", False):
        assert p.uuid() != first
    import torch._inductor.config as inductor_config
    with inductor_config.patch(pre_grad_custom_pass=None):
        assert gt.enable_inductor_pass() is p and inductor_config.pre_grad_custom_pass is p
        gt.enable_inductor_pass()
        assert inductor_config.pre_grad_custom_pass is p  # once
    seen = []

    def theirs(graph):
        seen.append(graph)
    with inductor_config.patch(pre_grad_custom_pass=theirs):
        gt.enable_inductor_pass()
        chained = inductor_config.pre_grad_custom_pass
        assert chained is not p and chained.first is theirs and chained.second is p
        gt.enable_inductor_pass()
        assert inductor_config.pre_grad_custom_pass is chained
        graph = torch.fx.Graph()
        graph.output(graph.placeholder("x"))
        chained(graph)
        assert seen == [graph]


def test_cache_keys_follow_the_decisions():
    """Inductor's FX graph cache (and AOT autograd's) key the graph as the pass left it: the same decisions hit the
    cache, other decisions (a rule that keeps every match) miss it and compile the graph without gnsilu's ops."""
    require()
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 16, 10, 6)
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}), \
            torch._inductor.config.patch(fx_graph_cache=True, fx_graph_remote_cache=False):
        results = []
        for min_groups in (2, 2, 8):  # replace, replace again, keep (4 groups < 8)
            counters.clear()
            with mock.patch.object(ip, "MIN_GROUPS", min_groups), compiled_with_pass() as p:
                out = torch.compile(block, fullgraph=True)(x)
                results.append((dict(p.counts), counters["inductor"]["fxgraph_cache_hit"], gnsilu_ops(p.graphs[0]),
                                out))
        (c1, hit1, ops1, y1), (c2, hit2, ops2, y2), (c3, hit3, ops3, y3) = results
        assert c1["replaced"] == 3 and c2["replaced"] == 3 and c3["kept"] == 3, (c1, c2, c3)
        assert hit1 == 0 and hit2 >= 1 and hit3 == 0, (hit1, hit2, hit3)
        assert ops1 == ops2 == 3 and ops3 == 0, (ops1, ops2, ops3)
        assert torch.equal(y1, y2)


def load_tests(loader, tests, pattern):
    return function_tests.load_tests_of(globals())


if __name__ == "__main__":
    sys.exit(function_tests.main(globals(), "test_inductor_pass", context=function_tests.one_thread))
