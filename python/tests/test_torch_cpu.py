#!/usr/bin/env python3
"""CPU tests of gnsilu's PyTorch integration that need PyTorch (skipped without it; exit code 77 when run as a
script, which ctest reports as Skipped):

    GNSILU_LIBRARY=build/libgnsilu.so python3 python/tests/test_torch_cpu.py   (or: ctest -R test_python_torch_cpu)

- the operator torch.ops.gnsilu.group_norm: its schema, its fake (meta) implementation's shape, dtype and strides
  for both layouts and others, its CPU implementation (PyTorch's ops), torch.library.opcheck;
- torch.compile(fullgraph=True) of GroupNormSiLU, GroupNorm and swapped blocks with the op in the graph (the
  modules are told to take CPU tensors, on which the op runs PyTorch's ops), results equal to eager bit for bit;
- the swap's hand-off from GroupNormSiLU to its SiLU: SiLU applied exactly once, also to a shared nonlinearity used
  elsewhere, no tensor held after the block's call, a norm called outside its block, pickling and deepcopy;
- the fast path of the torch call (CUDA pretended, the C function replaced by a recorder): the problem it passes
  equals the checked path's, and what still takes the checked path;
- layout_of on tensors against torch's own is_contiguous(memory_format=...), the torch path of group_norm with CUDA
  pretended (the layout passed, copies, out checks), GroupNormSiLU, GroupNorm and swap_group_norm_silu on CPU
  tensors giving PyTorch's exact results;
- input_bias: every argument error names it (functions, regions, ops), the problem and the fast-path key carry it,
  the ops on CPU tensors are PyTorch's ops on x + b bit for bit (fake, opcheck, torch.compile), the CPU reference's
  regions with it, and the swap's bias move (a ResnetBlock2D-like block: conv1 without its bias, norm2 adding it;
  the original computation with temb, with autograd, outside the block; eager, compiled, copied; what is not moved).
"""
import collections
import contextlib
import copy
import io
import os
import sys
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
sys.path[:0] = [PYTHON_DIR, HERE]

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    torch = None

import gnsilu  # noqa: E402
from gnsilu import _api, _lib, _torch_adapter  # noqa: E402

if torch is not None:
    import gnsilu.torch as gt
    import toy_models
    from test_cpu import RecordedCall  # the stand-in for _lib.call that the C-call tests use

PROBLEM_FIELDS = [name for name, _ in _lib.Problem._fields_]
OP = "gnsilu::group_norm"  # how graph_ops records the operator


def graph_ops(recorded, methods=False):
    """A torch.compile backend that records the call_function targets of each graph it is given (and, with
    methods, the names of its call_method nodes: x.contiguous() is one)."""
    kinds = ("call_function", "call_method") if methods else ("call_function",)

    def backend(graph_module, example_inputs):
        recorded.extend(OP if node.target in (torch.ops.gnsilu.group_norm, torch.ops.gnsilu.group_norm.default)
                        else str(node.target)
                        for node in graph_module.graph.nodes if node.op in kinds)
        return graph_module
    return backend


@contextlib.contextmanager
def modules_take_cpu():
    """GroupNorm / GroupNormSiLU hand CPU tensors to the op (which runs PyTorch's ops on them)."""
    with mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)):
        yield


class HandOffBlock(nn.Module if torch is not None else object):
    """diffusers' ResnetBlock2D in miniature: one SiLU module shared by two norms and the time embedding."""

    def __init__(self, channels=16, groups=4):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.nonlinearity = nn.SiLU()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.attention_norm = nn.GroupNorm(groups, channels)

    def forward(self, x, temb):
        h = self.nonlinearity(self.norm1(x))
        h = self.conv(h)
        temb = self.nonlinearity(temb)
        h = h + temb[:, :, None, None]
        h = self.norm2(h)
        h = self.nonlinearity(h)
        return self.conv(h) + self.attention_norm(x)


class ViewsBlock(nn.Module if torch is not None else object):
    """Magvit's spatial GroupNorm in miniature: frames flattened into the batch, normed, put back by views, then SiLU."""

    def __init__(self, channels=16, groups=4):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.nonlinearity = nn.SiLU()

    def forward(self, x):
        batch = x.size(0)
        h = x.permute(0, 2, 1, 3, 4).flatten(0, 1)
        h = self.norm(h)
        h = h.unflatten(0, (batch, -1)).permute(0, 2, 1, 3, 4)
        h = self.nonlinearity(h)
        return h + self.nonlinearity(x)  # the shared SiLU then meets another tensor

@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestOperator(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)

    def test_schema_and_registration(self):
        op = torch.ops.gnsilu.group_norm.default
        schema = op._schema
        self.assertEqual(schema.name, "gnsilu::group_norm")
        self.assertEqual([a.name for a in schema.arguments],
                         ["x", "num_groups", "weight", "bias", "eps", "activation", "out_dtype", "input_bias"])
        for declared in ("Tensor x", "int num_groups", "Tensor? weight", "Tensor? bias", "float eps",
                         "str activation", "ScalarType? out_dtype", "Tensor? input_bias", "-> Tensor"):
            self.assertIn(declared, str(schema))
        self.assertEqual([a.default_value for a in schema.arguments[2:]], [None, None, 1e-6, "silu", None, None])
        padded = torch.ops.gnsilu.group_norm_padded.default._schema
        self.assertEqual((padded.arguments[-1].name, padded.arguments[-1].default_value), ("input_bias", None))
        self.assertEqual([str(r.type) for r in schema.returns], ["Tensor"])
        import importlib
        importlib.reload(gt)  # importing again keeps the one registration
        self.assertIs(torch.ops.gnsilu.group_norm.default, op)

    def test_fake_gives_shape_dtype_and_strides(self):
        cases = {
            "contiguous": torch.empty(2, 8, 4, 5),
            "channels_last": torch.empty(2, 8, 4, 5).to(memory_format=torch.channels_last),
            "channels_last_3d": torch.empty(2, 8, 2, 3, 4).to(memory_format=torch.channels_last_3d),
            "3-D channels-last": torch.empty(2, 6, 8).transpose(1, 2),
            "2-D": torch.empty(3, 8),
            "not dense": torch.empty(2, 8, 4, 10)[..., ::2],
        }
        from torch._subclasses.fake_tensor import FakeTensorMode
        for name, x in cases.items():
            for out_dtype in (None, torch.float16):
                with self.subTest(input=name, out_dtype=out_dtype):
                    expected = torch.empty_like(x, dtype=out_dtype or x.dtype)
                    with FakeTensorMode() as mode:
                        fake = mode.from_tensor(x)
                        y = torch.ops.gnsilu.group_norm(fake, 4, None, None, 1e-6, "silu", out_dtype)
                    self.assertEqual((y.shape, y.dtype, y.stride()), (x.shape, expected.dtype, expected.stride()))
                    meta = torch.ops.gnsilu.group_norm(x.to("meta"), 4, None, None, 1e-6, "none", out_dtype)
                    self.assertEqual(meta.stride(), expected.stride())
                    real = torch.ops.gnsilu.group_norm(x.normal_(), 4, None, None, 1e-6, "silu", out_dtype)
                    self.assertEqual((real.dtype, real.stride()), (expected.dtype, expected.stride()))

    def test_cpu_implementation_is_pytorch(self):
        x = torch.randn(2, 8, 4, 5).to(memory_format=torch.channels_last)
        weight, bias = torch.randn(8), torch.randn(8)
        y = torch.ops.gnsilu.group_norm(x, 4, weight, bias, 1e-5)  # the schema's defaults: silu
        self.assertTrue(torch.equal(y, F.silu(F.group_norm(x, 4, weight, bias, 1e-5))))
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last))
        plain = torch.ops.gnsilu.group_norm(x, 4, weight, bias, 1e-5, "none")
        self.assertTrue(torch.equal(plain, F.group_norm(x, 4, weight, bias, 1e-5)))
        with self.assertRaises(Exception) as caught:
            torch.ops.gnsilu.group_norm(x, 4, weight, bias, 1e-5, "relu")
        self.assertIn("activation", str(caught.exception))

    def test_opcheck(self):
        x = torch.randn(2, 8, 4, 5)
        samples = [(x, 4, torch.randn(8), torch.randn(8), 1e-5, "silu", None),
                   (x.to(memory_format=torch.channels_last), 2, None, None, 1e-6, "none", torch.float64),
                   (torch.randn(2, 6, 8).transpose(1, 2), 2, torch.randn(8), None, 1e-6, "silu", None)]
        for args in samples:
            with self.subTest(args=[a.shape if isinstance(a, torch.Tensor) else a for a in args]):
                result = torch.library.opcheck(torch.ops.gnsilu.group_norm.default, args)
                self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)

    def test_compile_fullgraph_keeps_the_op(self):
        gn = nn.GroupNorm(4, 16)
        with torch.no_grad():
            gn.weight.uniform_(0.5, 1.5)
            gn.bias.uniform_(-0.5, 0.5)
        for module, activation in ((gt.GroupNormSiLU.from_group_norm(gn), "silu"),
                                   (gt.GroupNorm.from_group_norm(gn), "none")):
            for layout in (torch.contiguous_format, torch.channels_last):
                with self.subTest(module=type(module).__name__, layout=layout), modules_take_cpu(), \
                        torch.no_grad():
                    torch._dynamo.reset()
                    x = torch.randn(2, 16, 6, 6).to(memory_format=layout)
                    ops = []
                    compiled = torch.compile(module, backend=graph_ops(ops), fullgraph=True)
                    y = compiled(x)
                    self.assertEqual(ops, [OP])
                    self.assertTrue(torch.equal(y, module(x)))
                    self.assertEqual(y.stride(), x.stride())
                    expected = F.group_norm(x, 4, gn.weight, gn.bias, gn.eps)
                    self.assertTrue(torch.equal(y, F.silu(expected) if activation == "silu" else expected))

    def test_compile_needs_grad_runs_pytorch(self):
        module = gt.GroupNormSiLU(4, 16)
        x = torch.randn(2, 16, 4, 4, requires_grad=True)
        with modules_take_cpu():
            torch._dynamo.reset()
            ops = []
            y = torch.compile(module, backend=graph_ops(ops), fullgraph=True)(x)
        self.assertNotIn(OP, ops)
        y.sum().backward()
        self.assertIsNotNone(x.grad)


class CausalConv(nn.Module if torch is not None else object):
    """diffusers' HunyuanVideoCausalConv3d in miniature: pad (replicate; time in front only), then convolve."""

    def __init__(self, channels, mode="replicate"):
        super().__init__()
        self.pad_mode = mode
        self.time_causal_padding = (1, 1, 1, 1, 2, 0)
        self.conv = nn.Conv3d(channels, channels, 3)

    def forward(self, hidden_states):
        hidden_states = F.pad(hidden_states, self.time_causal_padding, mode=self.pad_mode)
        return self.conv(hidden_states)


class ScaledCausalConv(CausalConv):
    """Pads, then does more than convolve: not a padded convolution (its pad is not gnsilu's to write)."""

    def forward(self, hidden_states):
        hidden_states = F.pad(hidden_states, self.time_causal_padding, mode=self.pad_mode)
        return self.conv(hidden_states) * 2


class CausalBlock(nn.Module if torch is not None else object):
    """HunyuanVideoResnetBlockCausal3D in miniature: norm -> SiLU -> causal conv, twice, with a dropout of p=0 in the
    second chain, one SiLU module for both."""

    def __init__(self, channels=16, groups=4, conv=CausalConv, mode="replicate"):
        super().__init__()
        self.nonlinearity = nn.SiLU()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = conv(channels, mode)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = conv(channels, mode)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.conv1(hidden_states)
        hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.conv2(hidden_states)
        return hidden_states + residual


PADDED_OP = "gnsilu.group_norm_padded"  # how graph_ops records the padded operator


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestPaddedOutput(unittest.TestCase):
    """torch.ops.gnsilu.group_norm_padded, and GroupNorm -> SiLU -> pad -> conv written as one padded gnsilu call."""

    def setUp(self):
        torch.manual_seed(0)

    def test_op_is_f_pad_of_the_group_norm(self):
        weight, bias = torch.randn(8), torch.randn(8)
        from torch._subclasses.fake_tensor import FakeTensorMode
        for fmt, shape, pad in ((torch.contiguous_format, (2, 8, 3, 4, 5), (1, 1, 1, 1, 2, 0)),
                                (torch.channels_last_3d, (2, 8, 3, 4, 5), (1, 1, 1, 1, 2, 0)),
                                (torch.channels_last, (1, 8, 6, 7), (0, 2, 3, 1))):
            for mode in ("replicate", "constant"):
                with self.subTest(format=fmt, mode=mode):
                    x = torch.randn(*shape).to(memory_format=fmt)
                    y = torch.ops.gnsilu.group_norm_padded(x, 4, weight, bias, 1e-5, "silu", pad, mode, 0.5)
                    expected = F.silu(F.group_norm(x, 4, weight, bias, 1e-5))
                    expected = F.pad(expected, pad, mode=mode, value=0.5) if mode == "constant" else \
                        F.pad(expected, pad, mode=mode)
                    self.assertTrue(torch.equal(y, expected))
                    self.assertTrue(y.is_contiguous(memory_format=fmt))
                    with FakeTensorMode() as fake_mode:
                        fake = torch.ops.gnsilu.group_norm_padded(fake_mode.from_tensor(x), 4, None, None, 1e-5,
                                                                  "none", pad, mode, 0.0, torch.float16)
                    self.assertEqual((fake.shape, fake.stride(), fake.dtype), (y.shape, y.stride(), torch.float16))
                    result = torch.library.opcheck(torch.ops.gnsilu.group_norm_padded.default,
                                                   (x, 4, weight, bias, 1e-5, "silu", list(pad), mode, 0.5, None))
                    self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)
        with self.assertRaises(Exception) as caught:
            torch.ops.gnsilu.group_norm_padded(torch.randn(1, 8, 4, 4), 4, None, None, 1e-5, "silu", [1, 1],
                                               "reflect", 0.0)
        self.assertIn("pad_mode", str(caught.exception))

    def test_function_checks_the_widths(self):
        x = torch.randn(1, 8, 4, 4)
        with mock.patch.object(torch.Tensor, "is_cuda", True):  # the checks before the C call
            for pad in ((1,), (1, 1, 1, 1, 1, 1), (1, -1), "ab"):
                with self.subTest(pad=pad), self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                    gnsilu.group_norm(x, 4, pad=pad)
                self.assertIn("'pad'", str(caught.exception))
            with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                gnsilu.group_norm(x, 4, pad=(1, 1), pad_mode="reflect")
            self.assertIn("'pad_mode'", str(caught.exception))
            with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                gnsilu.group_norm(x, 4, pad=(1, 1), out=torch.empty(1, 8, 4, 4))
            self.assertIn("'out'", str(caught.exception))
            self.assertIn("padded shape (1, 8, 4, 6)", str(caught.exception))

    def test_swap_writes_the_padded_input_eager_and_compiled(self):
        block = CausalBlock().eval()
        x = torch.randn(1, 16, 3, 5, 6)
        formats = (torch.contiguous_format, torch.channels_last_3d)
        with torch.no_grad():
            expected = {fmt: block(x.to(memory_format=fmt)) for fmt in formats}
        keys = list(block.state_dict())
        self.assertEqual(gt.swap_group_norm_silu(block, return_counts=True), gt.SwapCounts(2, 0, 2))
        self.assertEqual(list(block.state_dict()), keys)
        self.assertIsInstance(block.conv1, gt.PaddedInputConv)
        self.assertIsInstance(block.dropout, nn.Dropout)
        self.assertEqual(block.conv1.time_causal_padding, (1, 1, 1, 1, 2, 0))
        for fmt in formats:
            v = x.to(memory_format=fmt)
            with modules_take_cpu(), torch.no_grad():
                self.assertTrue(torch.equal(block(v), expected[fmt]))
                self.assertIsNone(block.conv1._gnsilu_padded)
                self.assertIsNone(block.nonlinearity._gnsilu_handoff)
                torch._dynamo.reset()
                ops = []
                compiled = torch.compile(block, backend=graph_ops(ops), fullgraph=True)
                with self.subTest(format=fmt):
                    self.assertTrue(torch.equal(compiled(v), expected[fmt]))
                    self.assertEqual(ops.count(PADDED_OP), 2, ops)
                    self.assertFalse([op for op in ops if "pad" in op and op != PADDED_OP], ops)  # no pad left
                    self.assertFalse([op for op in ops if "silu" in op and not op.startswith("gnsilu.")], ops)
        with torch.no_grad():  # where gnsilu does not take the input (here: CPU), the convs pad as before
            self.assertTrue(torch.equal(block(x), expected[torch.contiguous_format]))

    def test_what_is_not_fused(self):
        x = torch.randn(1, 16, 3, 5, 6)
        for conv, mode, fuse_pad in ((ScaledCausalConv, "replicate", True), (CausalConv, "reflect", True),
                                     (CausalConv, "replicate", False)):
            with self.subTest(conv=conv.__name__, mode=mode, fuse_pad=fuse_pad):
                block = CausalBlock(conv=conv, mode=mode).eval()
                with torch.no_grad():
                    expected = block(x)
                counts = gt.swap_group_norm_silu(block, return_counts=True, fuse_pad=fuse_pad)
                self.assertEqual(counts, gt.SwapCounts(2, 0, 0))
                self.assertIs(type(block.conv1), conv)
                with modules_take_cpu(), torch.no_grad():
                    self.assertTrue(torch.equal(block(x), expected))


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestHandOff(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.block = HandOffBlock().eval()
        self.x, self.temb = torch.randn(2, 16, 8, 8), torch.randn(2, 16)
        with torch.no_grad():
            self.expected = self.block(self.x, self.temb)
        self.keys = list(self.block.state_dict())
        self.counts = gt.swap_group_norm_silu(self.block, return_counts=True)

    def test_swap_counts_and_keys(self):
        self.assertEqual(self.counts, gt.SwapCounts(2, 1))
        self.assertEqual(list(self.block.state_dict()), self.keys)
        self.assertEqual(self.block.norm1._gnsilu_acts, (self.block.nonlinearity,))
        self.assertNotIn("_gnsilu_acts", dict(self.block.norm1.named_children()))
        self.assertEqual(gt.swap_group_norm_silu(self.block, return_counts=True), gt.SwapCounts(0, 0))

    def test_silu_once_eager_and_compiled(self):
        with modules_take_cpu(), torch.no_grad():
            self.assertTrue(torch.equal(self.block(self.x, self.temb), self.expected))
            self.assertIsNone(self.block.nonlinearity._gnsilu_handoff)  # nothing held after the call
            for backend in ("eager", "aot_eager"):
                torch._dynamo.reset()
                ops = []
                compiled = torch.compile(self.block, backend=graph_ops(ops) if backend == "eager" else backend,
                                         fullgraph=True)
                with self.subTest(backend=backend):
                    self.assertTrue(torch.equal(compiled(self.x, self.temb), self.expected))
                    self.assertTrue(torch.equal(compiled(self.x, self.temb), self.expected))
                    self.assertIsNone(self.block.nonlinearity._gnsilu_handoff)
                if backend == "eager":  # three gnsilu calls; SiLU only on the time embedding
                    self.assertEqual(ops.count(OP), 3)
                    self.assertEqual(sum("silu" in op for op in ops if op != OP), 1)

    def test_views_between_norm_and_silu(self):
        torch.manual_seed(1)
        block = ViewsBlock().eval()
        x = torch.randn(2, 16, 3, 5, 4)
        with torch.no_grad():
            expected = block(x)
        self.assertEqual(gt.swap_group_norm_silu(block, return_counts=True), gt.SwapCounts(1, 0))
        for mode in (torch.no_grad, torch.inference_mode):  # inference mode: views keep no `_base`
            with self.subTest(mode=mode.__name__), modules_take_cpu(), mode():
                self.assertTrue(torch.equal(block(x), expected))
                torch._dynamo.reset()
                ops = []
                compiled = torch.compile(block, backend=graph_ops(ops), fullgraph=True)
                self.assertTrue(torch.equal(compiled(x), expected))
                self.assertIsNone(block.nonlinearity._gnsilu_handoff)
                self.assertEqual(ops.count(OP), 1)
                self.assertEqual(sum("silu" in op for op in ops if op != OP), 1)  # SiLU only on x itself

    def test_silu_function_pairs(self):
        """`F.silu(self.norm(x))`: the norm returns silu(group_norm(x)) marked (_SiLUApplied) and F.silu passes it
        through in eager mode; compiled, the graph holds gnsilu's plain group_norm and F.silu. A local name that
        shadows F, or F.silu with a keyword, is no pair."""
        torch.manual_seed(2)
        block = toy_models.FunctionalSiLU(16, 4).eval()
        x = torch.randn(2, 16, 5, 4)
        with torch.no_grad():
            expected = block(x)
        self.assertEqual(gt.swap_group_norm_silu(block, return_counts=True), gt.SwapCounts(1, 0))
        with modules_take_cpu(), torch.no_grad():
            self.assertIs(type(block.norm(x)), gt._SiLUApplied)
            y = block(x)
            self.assertIs(type(y), torch.Tensor)
            self.assertTrue(torch.equal(y, expected))
            with self.assertRaisesRegex(RuntimeError, "F.silu"):
                block.norm(x) * 2  # anything but F.silu: an error, never a wrong value
            torch._dynamo.reset()
            ops = []
            compiled = torch.compile(block, backend=graph_ops(ops), fullgraph=True)
            self.assertTrue(torch.equal(compiled(x), expected))
        self.assertEqual(ops.count(OP), 1)
        self.assertEqual(sum("silu" in op for op in ops if op != OP), 1)  # F.silu stays in the compiled graph
        with torch.no_grad():  # on the CPU without the test hook: PyTorch's group_norm, then F.silu
            self.assertIs(type(block.norm(x)), torch.Tensor)
            self.assertTrue(torch.equal(block(x), expected))
        for cls in (toy_models.ShadowedSiLU, toy_models.FunctionalSiLUInPlace):
            with self.subTest(cls=cls.__name__):
                other = cls(16, 4).eval()
                with torch.no_grad():
                    before = other(x)
                    self.assertEqual(gt.swap_group_norm_silu(other, return_counts=True), gt.SwapCounts(0, 1))
                    self.assertTrue(torch.equal(other(x), before))

    def test_norm_called_outside_the_block(self):
        with torch.no_grad():
            fused = self.block.norm1(self.x)  # silu(group_norm): the documented limit of the swap
            self.assertTrue(torch.equal(fused, F.silu(F.group_norm(self.x, 4, self.block.norm1.weight,
                                                                    self.block.norm1.bias, 1e-5))))
            # The SiLU's next input is another tensor: it applies SiLU (and forgets the hand-off).
            self.assertTrue(torch.equal(self.block.nonlinearity(self.temb), F.silu(self.temb)))
            self.assertIsNone(self.block.nonlinearity._gnsilu_handoff)
            self.assertTrue(torch.equal(self.block(self.x, self.temb), self.expected))

    def test_pickle_and_deepcopy(self):
        for name, clone in (("deepcopy", copy.deepcopy(self.block)), ("pickle", self.pickled())):
            with self.subTest(name), torch.no_grad():
                self.assertIs(clone.norm1._gnsilu_acts[0], clone.nonlinearity)
                self.assertTrue(torch.equal(clone(self.x, self.temb), self.expected))

    def pickled(self):
        buffer = io.BytesIO()
        torch.save(self.block, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    def test_toy_decoder_compiles_whole(self):
        decoder = toy_models.FluxLikeDecoder(latent_channels=4, block_out_channels=(16, 32), layers_per_block=1,
                                             groups=8).eval()
        z = torch.randn(1, 4, 8, 8)
        with torch.no_grad():
            expected = decoder(z)
            gt.swap_group_norm_silu(decoder)
            with modules_take_cpu():
                torch._dynamo.reset()
                ops = []
                got = torch.compile(decoder, backend=graph_ops(ops), fullgraph=True)(z)
        self.assertTrue(torch.equal(got, expected))
        norms = sum(isinstance(m, (nn.GroupNorm, gt.GroupNormSiLU)) for m in decoder.modules())
        self.assertEqual(ops.count(OP), norms)


class Recorder:
    """Stands for the C function gnsilu_group_norm of the fast path: records the problem's fields."""

    def __init__(self):
        self.problems = []

    def __call__(self, problem_ref, workspace, size, stream):
        problem = problem_ref._obj
        fields = {name: getattr(problem, name) for name in PROBLEM_FIELDS}
        fields["shape"] = [problem.shape[i] for i in range(problem.ndim)]
        fields["pad"] = [problem.pad[i] for i in range(problem.pad_count)]
        self.problems.append((fields, workspace, size, stream))
        return 0


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestFastPath(unittest.TestCase):
    @contextlib.contextmanager
    def pretend_cuda(self):
        """CPU tensors taken for CUDA ones; the checked path's C call and the fast path's C function recorded."""
        checked, fast = [], Recorder()

        def call(name, *args):
            problem = args[0]._obj
            fields = {field: getattr(problem, field) for field in PROBLEM_FIELDS}
            fields["shape"] = [problem.shape[i] for i in range(problem.ndim)]
            fields["pad"] = [problem.pad[i] for i in range(problem.pad_count)]
            checked.append(fields)

        library = types.SimpleNamespace(gnsilu_group_norm=fast)
        stream = types.SimpleNamespace(cuda_stream=0x5150)
        with mock.patch.object(torch.Tensor, "is_cuda", True), \
                mock.patch.object(torch.cuda, "device", lambda device: contextlib.nullcontext()), \
                mock.patch.object(torch.cuda, "current_stream", lambda device=None: stream), \
                mock.patch.object(torch.cuda, "current_device", lambda: None), \
                mock.patch.object(_torch_adapter, "_raw_stream", lambda torch: (lambda index: 0x5150)), \
                mock.patch.object(_torch_adapter, "_fast_calls", {}), \
                mock.patch.object(_lib, "call", call), mock.patch.object(_lib, "library", lambda: (library, "")):
            yield checked, fast

    def test_second_call_passes_the_same_problem(self):
        weight, bias = torch.randn(8), torch.randn(8).half()
        x = torch.randn(2, 8, 4, 5).bfloat16().to(memory_format=torch.channels_last)
        with self.pretend_cuda() as (checked, fast), torch.no_grad():
            first = gnsilu.group_norm(x, 4, weight, bias, eps=1e-5, activation=None)
            x2 = torch.randn_like(x)
            second = gnsilu.group_norm(x2, 4, weight, bias, eps=1e-5, activation=None)
        self.assertEqual(len(checked), 1)
        self.assertEqual(len(fast.problems), 1)
        fields, workspace, size, stream = fast.problems[0]
        self.assertEqual((workspace, size, stream), (None, 0, 0x5150))
        self.assertEqual((fields["x"], fields["y"]), (x2.data_ptr(), second.data_ptr()))
        self.assertEqual((fields["weight"], fields["bias"]), (weight.data_ptr(), bias.data_ptr()))
        for name in PROBLEM_FIELDS:
            if name not in ("x", "y", "weight", "bias"):
                self.assertEqual(fields[name], checked[0][name], name)
        self.assertEqual((second.stride(), second.dtype), (first.stride(), first.dtype))

    def test_what_takes_the_checked_path(self):
        weight = torch.randn(8)
        x = torch.randn(2, 8, 4, 5)
        with self.pretend_cuda() as (checked, fast):
            with torch.no_grad():
                gnsilu.group_norm(x, 4, weight)
                gnsilu.group_norm(x.to(memory_format=torch.channels_last), 4, weight)  # other strides
                gnsilu.group_norm(x, 2, weight)  # other groups
                gnsilu.group_norm(x, 4, weight, out_dtype=torch.float16)
                gnsilu.group_norm(x, 4, weight, out=torch.empty_like(x))  # with out: another key
                gnsilu.group_norm(x[..., ::2], 4, weight)  # copied: not cached
                gnsilu.group_norm(x[..., ::2], 4, weight)
            self.assertEqual((len(checked), len(fast.problems)), (7, 0))
            with self.assertRaises(gnsilu.InvalidArgumentError):  # grad mode, input requiring grad: refused
                gnsilu.group_norm(x.requires_grad_(), 4, weight)
            self.assertEqual(len(fast.problems), 0)
            with self.assertRaises(gnsilu.InvalidArgumentError):  # a bool is not a group count, also after 1
                gnsilu.group_norm(torch.randn(2, 8, 4, 5), True, weight)
            with torch.no_grad():
                gnsilu.group_norm(x, 4, weight)
            self.assertEqual(len(fast.problems), 1)

    def test_out_takes_the_fast_path_with_its_own_key(self):
        weight = torch.randn(8)
        x = torch.randn(2, 8, 4, 5).bfloat16()
        out, other = torch.empty_like(x), torch.empty_like(x)
        with self.pretend_cuda() as (checked, fast):
            with torch.no_grad():
                gnsilu.group_norm(x, 4, weight, out=out)
                returned = gnsilu.group_norm(x, 4, weight, out=other)  # same key: fast, into `other`
                gnsilu.group_norm(x, 4, weight, out=x)  # in place: a key of its own
                gnsilu.group_norm(x, 4, weight, out=x)
                gnsilu.group_norm(x, 4, weight, out=torch.empty_like(x, dtype=torch.float16))  # out's dtype: another
                with self.assertRaises(gnsilu.InvalidArgumentError):  # refused in Python, no key kept
                    gnsilu.group_norm(x, 4, weight, out=out.to(memory_format=torch.channels_last))
                with self.assertRaises(gnsilu.InvalidArgumentError):
                    gnsilu.group_norm(x, 4, weight, out=out.to(memory_format=torch.channels_last))
            self.assertIs(returned, other)
            self.assertEqual((len(checked), len(fast.problems)), (3, 2))
            self.assertEqual((fast.problems[0][0]["x"], fast.problems[0][0]["y"]), (x.data_ptr(), other.data_ptr()))
            self.assertEqual((fast.problems[1][0]["x"], fast.problems[1][0]["y"]), (x.data_ptr(), x.data_ptr()))
            with self.assertRaises(gnsilu.InvalidArgumentError):  # grad mode, out requiring grad: the checked path
                gnsilu.group_norm(x, 4, weight, out=torch.empty_like(x).requires_grad_())
            self.assertEqual(len(fast.problems), 2)

    def test_modules_use_the_fast_path(self):
        module = gt.GroupNormSiLU(4, 8)
        x = torch.randn(2, 8, 4, 5)
        with self.pretend_cuda() as (checked, fast), torch.no_grad():
            first = module(x)
            second = module(x)
        self.assertEqual((len(checked), len(fast.problems)), (1, 1))
        self.assertEqual(fast.problems[0][0]["activation"], _api.ACTIVATION_SILU)
        self.assertEqual(first.stride(), second.stride())
        with self.pretend_cuda() as (checked, fast):  # grad needed: PyTorch's ops, neither path
            y = module(x.requires_grad_())
        self.assertEqual((len(checked), len(fast.problems)), (0, 0))
        self.assertTrue(torch.equal(y, F.silu(F.group_norm(x, 4, module.weight, module.bias, module.eps))))


    def test_input_bias_has_a_key_of_its_own(self):
        """A call with input_bias and one without never share a key (the cached problem would drop or invent the
        bias); calls with input_bias take the fast path with this call's input_bias pointer."""
        weight = torch.randn(8)
        x = torch.randn(2, 8, 4, 5).bfloat16().to(memory_format=torch.channels_last)
        first, second = torch.randn(8).bfloat16(), torch.randn(8).bfloat16()
        with self.pretend_cuda() as (checked, fast), torch.no_grad():
            gnsilu.group_norm(x, 4, weight, input_bias=first)  # checked
            gnsilu.group_norm(x, 4, weight)  # no input bias: another key, checked
            gnsilu.group_norm(x, 4, weight, input_bias=second)  # fast, with `second`
            gnsilu.group_norm(x, 4, weight)  # fast, no input bias
            gnsilu.group_norm(x, 4, weight, input_bias=torch.randn(16).bfloat16()[::2])  # strided: copied, not fast
        self.assertEqual((len(checked), len(fast.problems)), (3, 2))
        self.assertEqual(checked[0]["input_bias"], first.data_ptr())
        self.assertIsNone(checked[1]["input_bias"])
        self.assertEqual(fast.problems[0][0]["input_bias"], second.data_ptr())
        self.assertIsNone(fast.problems[1][0]["input_bias"])
        for name in PROBLEM_FIELDS:
            if name not in ("x", "y", "input_bias"):
                self.assertEqual(fast.problems[0][0][name], checked[0][name], name)
        with self.pretend_cuda() as (checked, fast):
            with torch.no_grad():
                gnsilu.group_norm(x, 4, weight, input_bias=first)
            with self.assertRaises(gnsilu.InvalidArgumentError) as caught:  # grad mode: the checked path refuses
                gnsilu.group_norm(x, 4, weight, input_bias=first.clone().requires_grad_())
            self.assertIn("'input_bias'", str(caught.exception))
        self.assertEqual((len(checked), len(fast.problems)), (1, 0))


class TestDeclined(unittest.TestCase):
    """A swapped module that hands an input gnsilu would be expected to take to PyTorch says so once, naming itself
    and why (here CPU tensors stand in for CUDA ones: modules_take_cpu)."""

    def test_one_warning_per_module_with_its_name_and_reason(self):
        import warnings
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(4, 8, 1), nn.GroupNorm(2, 8), nn.SiLU(), nn.GroupNorm(4, 8))
        self.assertEqual(gt.swap_group_norm_silu(model, return_counts=True), gt.SwapCounts(1, 1))
        x = torch.randn(2, 8, 6, 5)
        strided = x.transpose(2, 3)  # (2, 8, 5, 6) in neither layout
        with modules_take_cpu(), torch.no_grad():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                y = model[1](strided)
                model[1](strided)  # the same module again: no second warning
                model[3](x)  # dense: gnsilu's path (here PyTorch's ops behind the op), nothing to say
                model[3].double()(x.double())
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        self.assertEqual(len(messages), 2, messages)
        self.assertIn("Sequential.1", messages[0])
        self.assertIn("neither layout", messages[0])
        self.assertIn("Sequential.3", messages[1])
        self.assertIn("torch.float64", messages[1])
        self.assertTrue(torch.equal(y, F.silu(F.group_norm(strided, 2, model[1].weight, model[1].bias, 1e-5))))
        # CPU tensors without modules_take_cpu, and inputs that need a gradient: PyTorch's documented choice, silent
        fresh = gt.GroupNorm(2, 8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fresh(strided)
            with modules_take_cpu():
                fresh(x.requires_grad_())
        self.assertEqual([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)], [])


# ---- layout_of on tensors, the torch path of group_norm, the modules and the swap on CPU tensors -----------------
class TestTorchOnCPU(unittest.TestCase):
    def setUp(self):
        import gnsilu.torch as gt
        import toy_models
        self.gt = gt
        self.models = toy_models
        torch.manual_seed(0)

    def test_cpu_tensor_is_refused_by_the_function(self):
        x = torch.randn(2, 64, 4, 4)
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            gnsilu.group_norm_silu(x, 32)
        self.assertIn("'x'", str(caught.exception))
        self.assertIn("CUDA", str(caught.exception))

    def test_group_norm_silu_module_falls_back_on_cpu(self):
        gn = nn.GroupNorm(8, 64, eps=1e-6)
        with torch.no_grad():
            gn.weight.uniform_(0.5, 1.5)
            gn.bias.uniform_(-0.5, 0.5)
        fused = self.gt.GroupNormSiLU.from_group_norm(gn)
        self.assertIs(fused.weight, gn.weight)
        self.assertEqual(list(fused.state_dict()), list(gn.state_dict()))
        x = torch.randn(2, 64, 5, 3, requires_grad=True)
        expected = F.silu(gn(x))
        got = fused(x)
        self.assertTrue(torch.equal(got, expected))
        got.sum().backward()  # the fallback keeps autograd
        self.assertIsNotNone(gn.weight.grad)
        fresh = self.gt.GroupNormSiLU(8, 64, eps=1e-6)
        fresh.load_state_dict(gn.state_dict())
        self.assertTrue(torch.equal(fresh(x), expected))
        self.assertEqual(repr(fresh), "GroupNormSiLU(8, 64, eps=1e-06, affine=True)")
        plain = self.gt.GroupNormSiLU(4, 64, affine=False)
        self.assertEqual(list(plain.state_dict()), [])
        self.assertTrue(torch.equal(plain(x), F.silu(F.group_norm(x, 4, eps=1e-5))))
        with self.assertRaises(ValueError):
            self.gt.GroupNormSiLU(3, 64)

    def test_swap_keeps_results_and_state(self):
        decoder = self.models.FluxLikeDecoder(block_out_channels=(32, 64, 64, 64), layers_per_block=1)
        head = self.models.sequential_head(32)
        others = nn.ModuleList([self.models.ResidualNorm(32), self.models.FunctionalSiLU(32)])
        keys = list(decoder.state_dict())
        latent = torch.randn(1, 16, 8, 8)
        features = torch.randn(1, 32, 6, 6)
        with torch.no_grad():
            expected = decoder(latent), head(features), [m(features) for m in others]
            self.assertEqual(self.gt.swap_group_norm_silu(decoder), self.models.expected_swaps(decoder))
            self.assertEqual(self.gt.swap_group_norm_silu(head), 1)
            self.assertEqual(self.gt.swap_group_norm_silu(others), 1)  # FunctionalSiLU's F.silu pair
            got = decoder(latent), head(features), [m(features) for m in others]
        self.assertEqual(list(decoder.state_dict()), keys)
        self.assertTrue(torch.equal(got[0], expected[0]))  # on CPU the swapped modules run the same ops
        self.assertTrue(torch.equal(got[1], expected[1]))
        self.assertIsInstance(head[1], nn.Identity)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got[2], expected[2])))
        attention = decoder.mid_block.attentions[0]
        self.assertIs(type(attention.group_norm), self.gt.GroupNorm)  # no SiLU follows: plain, not fused
        self.assertEqual(self.gt.swap_group_norm_silu(decoder), 0)

    def test_shared_nonlinearity_still_applies_to_other_tensors(self):
        block = self.models.ResnetBlock2D(32, 32, temb_channels=8)
        x, temb = torch.randn(2, 32, 4, 4), torch.randn(2, 8)
        with torch.no_grad():
            expected = block(x, temb)
            self.assertEqual(self.gt.swap_group_norm_silu(block), 2)
            self.assertTrue(torch.equal(block(x, temb), expected))

    def test_scale_shift_block_keeps_norm2(self):
        block = self.models.ResnetBlock2D(32, 32, temb_channels=8, time_embedding_norm="scale_shift")
        self.assertEqual(self.gt.swap_group_norm_silu(block), 1)
        self.assertIs(type(block.norm2), self.gt.GroupNorm)  # not fused: a plain gnsilu group_norm
        block = self.models.ResnetBlock2D(32, 32, temb_channels=8, time_embedding_norm="scale_shift")
        self.assertEqual(self.gt.swap_group_norm_silu(block, plain=False), 1)
        self.assertIs(type(block.norm2), nn.GroupNorm)

    def test_hooks_prevent_swaps(self):
        block = self.models.ResnetBlock2D(32, 32)
        block.norm1.register_forward_hook(lambda module, args, output: output * 2)
        self.assertEqual(self.gt.swap_group_norm_silu(block), 1)  # norm2 only
        self.assertIs(type(block.norm1), nn.GroupNorm)
        handle = nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
        try:
            self.assertEqual(self.gt.swap_group_norm_silu(self.models.sequential_head(32)), 0)
        finally:
            handle.remove()

    # -- layouts of torch tensors, and the torch path of group_norm with CUDA pretended --------------------------
    def test_layout_of_agrees_with_torch(self):
        import itertools
        formats = {4: torch.channels_last, 5: torch.channels_last_3d}
        shapes = [(2, 6, 4, 5), (1, 6, 1, 5), (2, 1, 4, 5), (2, 6, 1, 1), (1, 1, 1, 1), (3, 4, 1, 7), (2, 3, 4, 1, 5),
                  (2, 6, 2, 3, 4), (1, 4, 1, 1, 3), (2, 5, 7), (2, 1, 7), (1, 3, 2, 2, 2, 2)]
        checked = collections.Counter()
        for shape in shapes:
            ndim = len(shape)
            for order in itertools.permutations(range(ndim)):
                dense = torch.empty([shape[d] for d in order]).permute(_api._inverse(order))
                tensors = [dense]
                if shape[-1] > 1:
                    tensors.append(dense[..., :-1])  # a gap, for most orders
                if shape[0] > 1:
                    tensors.append(dense[:1].expand(shape))  # stride 0 along N
                for x in tensors:
                    if x.numel() == 0:
                        continue
                    if ndim in formats:  # torch's own rule
                        channels_last = x.is_contiguous(memory_format=formats[ndim])
                    else:  # the same rule from the definition: the (N, *spatial, C) view is contiguous
                        channels_last = x.permute(_api._channels_last_order(ndim)).is_contiguous()
                    expected = "channels_first" if x.is_contiguous() else "channels_last" if channels_last else None
                    with self.subTest(shape=tuple(x.shape), strides=x.stride()):
                        self.assertEqual(_api.layout_of(x.shape, x.stride()), expected)
                    checked[expected] += 1
        self.assertTrue(all(checked[k] > 20 for k in ("channels_first", "channels_last", None)), checked)
        # diffusers' attention: hidden_states (N, L, C) transposed to (N, C, L).
        self.assertEqual(gnsilu.layout_of(*(lambda t: (t.shape, t.stride()))(torch.empty(2, 77, 96).transpose(1, 2))),
                         "channels_last")

    def test_operands_keep_the_layout(self):
        operands = _api._torch_operands
        x = torch.randn(2, 8, 4, 5)
        cl = x.to(memory_format=torch.channels_last)
        same, y, layout = operands(torch, cl, None, torch.float16)
        self.assertIs(same, cl)
        self.assertEqual((layout, y.dtype, y.shape), ("channels_last", torch.float16, x.shape))
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last))
        same, y, layout = operands(torch, x, None, torch.float32)
        self.assertIs(same, x)
        self.assertTrue(y.is_contiguous())
        self.assertEqual(layout, "channels_first")
        five = torch.randn(2, 8, 3, 4, 5).to(memory_format=torch.channels_last_3d)
        same, y, layout = operands(torch, five, None, torch.float32)
        self.assertIs(same, five)
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        hidden = torch.randn(2, 77, 96).transpose(1, 2)  # (N, C, L) channels-last
        same, y, layout = operands(torch, hidden, None, torch.bfloat16)
        self.assertIs(same, hidden)
        self.assertEqual(layout, "channels_last")
        self.assertTrue(y.transpose(1, 2).is_contiguous())
        six = torch.randn(1, 4, 2, 3, 2, 2).permute(0, 5, 1, 2, 3, 4)  # channels innermost, rank 6
        same, y, layout = operands(torch, six, None, torch.float32)
        self.assertIs(same, six)
        self.assertEqual((layout, _api.layout_of(y.shape, y.stride())), ("channels_last", "channels_last"))

        gappy = torch.randn(2, 8, 4, 10)[..., ::2]
        copied, y, layout = operands(torch, gappy, None, torch.float32)
        self.assertIsNot(copied, gappy)
        self.assertTrue(copied.is_contiguous() and y.is_contiguous())
        self.assertTrue(torch.equal(copied, gappy))
        out = torch.empty(2, 8, 4, 5).to(memory_format=torch.channels_last)
        copied, y, layout = operands(torch, gappy, out, torch.float32)  # copied into out's layout
        self.assertIs(y, out)
        self.assertEqual(layout, "channels_last")
        self.assertTrue(copied.is_contiguous(memory_format=torch.channels_last))
        self.assertTrue(torch.equal(copied, gappy))
        other_order = torch.randn(2, 8, 5, 4).transpose(2, 3)  # dense, but W before H
        self.assertIsNot(operands(torch, other_order, None, torch.float32)[0], other_order)

        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            operands(torch, cl, torch.empty(2, 8, 4, 5), torch.float32)
        self.assertIn("'out': is channels-first (contiguous) but x is channels-last", str(caught.exception))
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            operands(torch, x, out, torch.float32)
        self.assertIn("'out': is channels-last but x is channels-first", str(caught.exception))
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            operands(torch, x, torch.empty(2, 8, 4, 10)[..., ::2], torch.float32)
        self.assertIn("'out': must be dense", str(caught.exception))
        # C = 1 is both: any dense out goes.
        one = torch.randn(2, 1, 4, 5).to(memory_format=torch.channels_last)
        self.assertEqual(operands(torch, one, torch.empty(2, 1, 4, 5), torch.float32)[2], "channels_first")

    @contextlib.contextmanager
    def pretend_cuda(self):
        """CPU tensors taken for CUDA ones by the torch path of group_norm, the C call recorded (not made)."""
        recorder = RecordedCall()
        stream = types.SimpleNamespace(cuda_stream=0x5150)
        with mock.patch.object(torch.Tensor, "is_cuda", True), \
                mock.patch.object(torch.cuda, "device", lambda device: contextlib.nullcontext()), \
                mock.patch.object(torch.cuda, "current_stream", lambda device=None: stream), \
                mock.patch.object(_lib, "call", recorder), mock.patch.object(_torch_adapter, "_FAST_LIMIT", 0):
            yield recorder

    def test_torch_path_with_cuda_pretended(self):
        weight, bias = torch.randn(8), torch.randn(8).half()
        x = torch.randn(2, 8, 4, 5).bfloat16().to(memory_format=torch.channels_last)
        with self.pretend_cuda() as recorder:
            y = gnsilu.group_norm(x, 4, weight, bias, eps=1e-5, activation=None)
        problem = recorder.problem
        self.assertEqual(recorder.calls[0][2], (None, 0, 0x5150))
        self.assertEqual(problem["x"], x.data_ptr())  # no copy
        self.assertEqual(problem["y"], y.data_ptr())
        self.assertEqual((problem["x_layout"], problem["y_layout"], problem["activation"]), (1, 1, 1))
        self.assertEqual((problem["x_dtype"], problem["y_dtype"], problem["weight_dtype"], problem["bias_dtype"]),
                         (1, 1, 3, 2))
        self.assertEqual((problem["weight"], problem["bias"]), (weight.data_ptr(), bias.data_ptr()))
        self.assertEqual((problem["shape"], problem["num_groups"], problem["eps"]), ([2, 8, 4, 5], 4, 1e-5))
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last))
        self.assertEqual((y.dtype, y.shape), (torch.bfloat16, x.shape))

        with self.pretend_cuda() as recorder:  # out_dtype: y float32 in x's format
            y = gnsilu.group_norm_silu(x, 4, out_dtype="float32")
        self.assertEqual((recorder.problem["y_dtype"], recorder.problem["activation"]), (3, 0))
        self.assertTrue(y.dtype == torch.float32 and y.is_contiguous(memory_format=torch.channels_last))

        with self.pretend_cuda() as recorder:  # in place
            self.assertIs(gnsilu.group_norm(x, 4, out=x), x)
        self.assertEqual((recorder.problem["x"], recorder.problem["y"], recorder.problem["x_layout"]),
                         (x.data_ptr(), x.data_ptr(), 1))

        gappy = torch.randn(2, 8, 4, 10)[..., ::2]
        with self.pretend_cuda() as recorder:  # copied first; y contiguous
            y = gnsilu.group_norm(gappy, 4)
        self.assertNotEqual(recorder.problem["x"], gappy.data_ptr())
        self.assertEqual(recorder.problem["x_layout"], 0)
        self.assertTrue(y.is_contiguous())

        hidden = torch.randn(2, 77, 96).transpose(1, 2)
        with self.pretend_cuda() as recorder:
            y = gnsilu.group_norm(hidden, 32, activation="none")
        self.assertEqual((recorder.problem["x"], recorder.problem["x_layout"], recorder.problem["shape"]),
                         (hidden.data_ptr(), 1, [2, 96, 77]))
        self.assertTrue(y.transpose(1, 2).is_contiguous())

        with self.pretend_cuda() as recorder:
            for call, name in ((lambda: gnsilu.group_norm(x, 4, out=torch.empty(2, 8, 4, 5).bfloat16()), "out"),
                               (lambda: gnsilu.group_norm(x, 4, activation="gelu"), "activation"),
                               (lambda: gnsilu.group_norm(x.float().requires_grad_(), 4), "x")):
                with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                    call()
                self.assertIn(f"'{name}'", str(caught.exception))
            self.assertEqual(recorder.calls, [])
            empty = torch.empty(0, 8, 4, 5).to(memory_format=torch.channels_last)
            self.assertEqual(gnsilu.group_norm(empty, 4).shape, empty.shape)
            self.assertEqual(recorder.calls, [])

    # -- gnsilu.torch.GroupNorm and the modules' use of gnsilu ---------------------------------------------------
    def test_group_norm_module_falls_back_on_cpu(self):
        gn = nn.GroupNorm(8, 64, eps=1e-6)
        with torch.no_grad():
            gn.weight.uniform_(0.5, 1.5)
            gn.bias.uniform_(-0.5, 0.5)
        ours = self.gt.GroupNorm.from_group_norm(gn)
        self.assertIsInstance(ours, nn.GroupNorm)
        self.assertIs(ours.weight, gn.weight)
        self.assertIs(ours.bias, gn.bias)
        self.assertEqual(list(ours.state_dict()), list(gn.state_dict()))
        self.assertEqual(repr(ours), repr(gn))
        x = torch.randn(2, 64, 5, 3, requires_grad=True)
        expected = gn(x)
        got = ours(x)
        self.assertTrue(torch.equal(got, expected))
        got.sum().backward()
        self.assertIsNotNone(gn.weight.grad)
        channels_last = x.detach().to(memory_format=torch.channels_last)
        self.assertTrue(torch.equal(ours(channels_last), gn(channels_last)))
        fresh = self.gt.GroupNorm(8, 64, eps=1e-6)
        fresh.load_state_dict(gn.state_dict())
        self.assertTrue(torch.equal(fresh(x), expected))
        plain = self.gt.GroupNorm(4, 64, affine=False)
        self.assertEqual(list(plain.state_dict()), [])
        self.assertTrue(torch.equal(plain(x), F.group_norm(x, 4, eps=1e-5)))
        self.assertFalse(self.gt.GroupNorm.from_group_norm(gn.eval()).training)
        with self.assertRaises(ValueError):
            self.gt.GroupNorm(3, 64)

    def test_modules_call_gnsilu_for_both_layouts(self):
        """With CUDA pretended, which inputs the modules hand to gnsilu (the C call recorded) and which to PyTorch."""
        gn = nn.GroupNorm(4, 8)
        inputs = {"contiguous": torch.randn(2, 8, 4, 5), "channels_last": torch.randn(2, 8, 4, 5).to(
                      memory_format=torch.channels_last), "3-D channels-last": torch.randn(2, 6, 8).transpose(1, 2),
                  "channels_last_3d": torch.randn(2, 8, 2, 3, 4).to(memory_format=torch.channels_last_3d)}
        for module, activation in ((self.gt.GroupNorm.from_group_norm(gn), 1),
                                   (self.gt.GroupNormSiLU.from_group_norm(gn), 0)):
            for name, x in inputs.items():
                with self.subTest(module=type(module).__name__, input=name), torch.no_grad():
                    with self.pretend_cuda() as recorder:
                        y = module(x)
                    problem = recorder.problem
                    self.assertEqual((problem["x"], problem["activation"]), (x.data_ptr(), activation))
                    self.assertEqual(problem["x_layout"], 0 if name == "contiguous" else 1)
                    self.assertEqual(_api.layout_of(y.shape, y.stride()), _api.layout_of(x.shape, x.stride()))
            gappy = torch.randn(2, 8, 4, 10)[..., ::2]
            with self.subTest(module=type(module).__name__, input="not dense"), torch.no_grad():
                with self.pretend_cuda() as recorder:
                    y = module(gappy)
                self.assertEqual(recorder.calls, [])  # PyTorch's ops
                expected = gn(gappy) if activation == 1 else F.silu(gn(gappy))
                self.assertTrue(torch.equal(y, expected))
            with self.subTest(module=type(module).__name__, input="requires grad"):
                with self.pretend_cuda() as recorder:
                    module(inputs["channels_last"])
                self.assertEqual(recorder.calls, [])

    # -- swap_group_norm_silu and the plain GroupNorms ------------------------------------------------------------
    def group_norms(self, model):
        return collections.Counter(type(m).__name__ for m in model.modules()
                                   if isinstance(m, (nn.GroupNorm, self.gt.GroupNormSiLU)))

    def test_swap_replaces_plain_group_norms(self):
        decoder = self.models.FluxLikeDecoder(block_out_channels=(32, 64, 64, 64), layers_per_block=1)
        keys = list(decoder.state_dict())
        parameters = {name: p for name, p in decoder.named_parameters()}
        latent = torch.randn(1, 16, 8, 8)
        with torch.no_grad():
            expected = decoder(latent)
            counts = self.gt.swap_group_norm_silu(decoder, return_counts=True)
            resnets = sum(isinstance(m, self.models.ResnetBlock2D) for m in decoder.modules())  # conv1 -> norm2 each
            self.assertEqual(counts, self.gt.SwapCounts(self.models.expected_swaps(decoder), 1, 0, resnets))
            self.assertEqual((counts.pairs, counts.plain, counts.padded, counts.biases_moved), tuple(counts))
            got = decoder(latent)
        self.assertTrue(torch.equal(got, expected))
        self.assertEqual(list(decoder.state_dict()), keys)
        self.assertTrue(all(p is parameters[name] for name, p in decoder.named_parameters()))
        self.assertIs(type(decoder.mid_block.attentions[0].group_norm), self.gt.GroupNorm)
        self.assertEqual(self.group_norms(decoder), {"_GroupNormSiLUBeforeSiLU": counts.pairs, "GroupNorm": 1})
        self.assertFalse(any(type(m) is nn.GroupNorm for m in decoder.modules()))
        self.assertEqual(self.gt.swap_group_norm_silu(decoder, return_counts=True), self.gt.SwapCounts(0, 0))  # idempotent
        self.assertEqual(self.gt.swap_group_norm_silu(decoder), 0)

        others = nn.ModuleList([self.models.ResidualNorm(32), self.models.FunctionalSiLU(32),
                                nn.Sequential(nn.GroupNorm(8, 32), nn.Conv2d(32, 32, 1)), nn.GroupNorm(8, 32)])
        features = torch.randn(2, 32, 6, 6)
        with torch.no_grad():
            expected = [m(features) for m in others]
            self.assertEqual(self.gt.swap_group_norm_silu(others, return_counts=True), self.gt.SwapCounts(1, 3))
            got = [m(features) for m in others]
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, expected)))
        for norm in (others[0].norm, others[2][0], others[3]):
            self.assertIs(type(norm), self.gt.GroupNorm)
        self.assertIs(type(others[1].norm), self.gt._GroupNormBeforeSiLUFunction)

        # plain=False: only the pairs, as before.
        decoder = self.models.FluxLikeDecoder(block_out_channels=(32, 64, 64, 64), layers_per_block=1)
        self.assertEqual(self.gt.swap_group_norm_silu(decoder, plain=False, return_counts=True),
                         self.gt.SwapCounts(self.models.expected_swaps(decoder), 0, 0, resnets))
        self.assertIs(type(decoder.mid_block.attentions[0].group_norm), nn.GroupNorm)
        self.assertEqual(self.gt.swap_group_norm_silu(decoder, return_counts=True), self.gt.SwapCounts(0, 1))

    def test_swap_of_plain_group_norms_keeps_the_rules(self):
        shared = nn.GroupNorm(8, 32)
        hooked = nn.GroupNorm(8, 32)
        hooked.register_forward_pre_hook(lambda module, args: None)
        own_forward = nn.GroupNorm(8, 32)
        own_forward.forward = lambda x: x
        subclass = type("MyGroupNorm", (nn.GroupNorm,), {})(8, 32)
        model = nn.ModuleDict({"a": nn.Sequential(shared, nn.Conv2d(32, 32, 1)), "b": shared, "hooked": hooked,
                               "own_forward": own_forward, "subclass": subclass})
        keys = list(model.state_dict())
        self.assertEqual(self.gt.swap_group_norm_silu(model, return_counts=True), self.gt.SwapCounts(0, 1))
        self.assertIs(type(model["b"]), self.gt.GroupNorm)
        self.assertIs(model["a"][0], model["b"])  # still one module
        self.assertIs(model["b"].weight, shared.weight)
        for name, cls in (("hooked", nn.GroupNorm), ("own_forward", nn.GroupNorm), ("subclass", type(subclass))):
            self.assertIs(type(model[name]), cls)
        self.assertEqual(list(model.state_dict()), keys)
        alone = nn.GroupNorm(8, 32)
        self.assertEqual(self.gt.swap_group_norm_silu(alone, return_counts=True), self.gt.SwapCounts(0, 0))  # not itself
        handle = nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
        try:
            model = nn.Sequential(nn.GroupNorm(8, 32), nn.SiLU(), nn.GroupNorm(8, 32))
            self.assertEqual(self.gt.swap_group_norm_silu(model, return_counts=True), self.gt.SwapCounts(0, 0))
            self.assertEqual(self.gt.swap_group_norm_silu(model), 0)
            self.assertTrue(all(type(m) in (nn.GroupNorm, nn.SiLU) for m in model))
        finally:
            handle.remove()

    def test_channels_last_decoder(self):
        """The toy decoder with channels-last weights and input: every GroupNorm gets a tensor gnsilu takes as it
        is (so on a GPU none falls back), most of them channels-last; the swap keeps its results."""
        decoder = self.models.FluxLikeDecoder(block_out_channels=(32, 64, 64, 64), layers_per_block=1)
        decoder = decoder.to(memory_format=torch.channels_last)
        latent = torch.randn(1, 16, 8, 8).to(memory_format=torch.channels_last)
        layouts = collections.Counter()
        handles = [m.register_forward_pre_hook(
            lambda module, args: layouts.update([_api.layout_of(args[0].shape, args[0].stride())]))
            for m in decoder.modules() if type(m) is nn.GroupNorm]
        with torch.no_grad():
            expected = decoder(latent)
        for handle in handles:
            handle.remove()
        self.assertNotIn(None, layouts)
        self.assertGreater(layouts["channels_last"], layouts["channels_first"], layouts)
        with torch.no_grad():
            self.gt.swap_group_norm_silu(decoder)
            self.assertTrue(torch.equal(decoder(latent), expected))


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestRegionsArguments(unittest.TestCase):
    """group_stats, merge_stats and group_norm_apply: what they refuse before any device work, and merging."""

    def test_refusals_name_the_argument(self):
        x = torch.randn(1, 8, 4, 4)
        for call, name in ((lambda: gnsilu.group_stats(x, 3), "'num_groups'"),
                           (lambda: gnsilu.group_stats([1, 2], 4), "'x'"),
                           (lambda: gnsilu.group_stats(x.double(), 4), "'x'"),
                           (lambda: gnsilu.group_norm_apply(x, torch.zeros(1, 4, 3, dtype=torch.int64)), "'stats'"),
                           (lambda: gnsilu.group_norm_apply(x, torch.zeros(1, 4, 32)), "'stats'"),
                           (lambda: gnsilu.group_norm_apply(x, torch.zeros(2, 4, 32, dtype=torch.int64)), "'stats'"),
                           (lambda: gnsilu.merge_stats(), "'stats'")):
            with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                call()
            self.assertIn(name, str(caught.exception))

    def test_tiles_merged_give_the_whole_tensor_on_the_cpu(self):
        # CPU tensors go to the library's CPU reference: the same records and bits as the GPU.
        torch.manual_seed(5)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for memory_format in (torch.contiguous_format, torch.channels_last):
                x = (torch.randn(2, 16, 12, 10) * 4 + 3).to(dtype).contiguous(memory_format=memory_format)
                w, b = torch.randn(16), torch.randn(16)
                own = gnsilu.group_stats(x, 4)
                whole = gnsilu.group_norm_apply(x, own, w, b)
                tiles = [x[:, :, :5, :3], x[:, :, :5, 3:], x[:, :, 5:, :], x[:, :, 12:, :]]  # views; the last empty
                merged = gnsilu.merge_stats(*[gnsilu.group_stats(t, 4) for t in reversed(tiles)])
                self.assertTrue(torch.equal(merged[..., 0], own[..., 0]))  # element counts
                y = gnsilu.group_norm_apply(x, merged, w, b)
                self.assertTrue(torch.equal(y, whole))
                part = gnsilu.group_norm_apply(tiles[1], merged, w, b)
                self.assertTrue(torch.equal(part, whole[:, :, :5, 3:]))
                # Against PyTorch's GroupNorm + SiLU in float64: close (gnsilu rounds once to the dtype).
                ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x.double(), 4, w.double(), b.double(),
                                                                              1e-6))
                self.assertLess((y.double() - ref).abs().max().item(), 0.02 * max(1.0, ref.abs().max().item()))

    def test_merge_is_integer_addition(self):
        a = torch.randint(-2**40, 2**40, (2, 4, gnsilu.STATS_WORDS), dtype=torch.int64)
        b = torch.randint(-2**40, 2**40, (2, 4, gnsilu.STATS_WORDS), dtype=torch.int64)
        c = torch.randint(-2**40, 2**40, (2, 4, gnsilu.STATS_WORDS), dtype=torch.int64)
        self.assertTrue(torch.equal(gnsilu.merge_stats(a, b, c), gnsilu.merge_stats(c, gnsilu.merge_stats(b, a))))
        self.assertTrue(torch.equal(gnsilu.merge_stats(a), a))
        with self.assertRaises(gnsilu.InvalidArgumentError):
            gnsilu.merge_stats(a, b[:1])


class TestStridedOrders(unittest.TestCase):
    """gnsilu._strided: inputs stored frames first or channels first (video decoders' views) normalized in place from
    merged piece records, with the contiguous call's bits (CPU tensors: the library's CPU reference)."""

    def setUp(self):
        from gnsilu import _strided
        patcher = mock.patch.object(_strided, "MIN_BYTES", 0)  # these small tensors stand for large ones
        patcher.start()
        self.addCleanup(patcher.stop)

    @staticmethod
    def _reference(x, groups, w, b, activation):
        dense = x.contiguous()
        return gnsilu.group_norm_apply(dense, gnsilu.group_stats(dense, groups), w, b, 1e-6, activation)

    def test_orders_give_the_contiguous_bits_with_x_strides(self):
        from gnsilu import _strided
        torch.manual_seed(11)
        cases = [
            # (N, T, C, H, W) memory seen as (N, C, T, H, W): frames first
            (lambda d: d.transpose(1, 2), (2, 3, 16, 5, 6), _strided.FRAMES_FIRST),
            (lambda d: d.transpose(1, 2), (1, 4, 32, 3, 7), _strided.FRAMES_FIRST),
            # the frames of a contiguous (1, C, T, H, W) video as a (T, C, H, W) batch: channels first
            (lambda d: d.transpose(1, 2)[0], (1, 16, 3, 5, 6), _strided.CHANNELS_FIRST),
            (lambda d: d.transpose(0, 1), (32, 4, 9, 2), _strided.CHANNELS_FIRST),
        ]
        for view, stored, order in cases:
            for dtype in (torch.bfloat16, torch.float32):
                for activation in ("silu", None):
                    dense = (torch.randn(stored) * 3 + 50).to(dtype)  # a large mean against the spread
                    x = view(dense)
                    channels = x.shape[1]
                    w, b = torch.randn(channels), torch.randn(channels).to(torch.bfloat16)
                    with self.subTest(stored=stored, order=order, dtype=dtype, activation=activation):
                        self.assertIsNone(gnsilu.layout_of(tuple(x.shape), x.stride()))
                        self.assertEqual(_strided.plan(x), order)
                        y = _strided.group_norm(torch, x, 4, w, b, 1e-6, activation)
                        self.assertEqual(y.stride(), x.stride())
                        expected = self._reference(x, 4, w, b, activation)
                        self.assertTrue(torch.equal(y, expected))  # NaN-free here: equal values are equal bits
                        out = torch.empty_like(x)
                        self.assertIs(_strided.group_norm(torch, x, 4, None, None, 1e-6, activation, out=out), out)
                        self.assertTrue(torch.equal(out, self._reference(x, 4, None, None, activation)))
                        ref = F.group_norm(x.double(), 4, w.double(), b.double(), 1e-6)
                        ref = F.silu(ref) if activation == "silu" else ref
                        self.assertLess((y.double() - ref).abs().max().item(), 0.05 * max(1.0, ref.abs().max().item()))

    def test_repeated_calls_take_the_fast_path(self):
        """A second call with the same key skips the checked path (its two C calls from the problems kept then) and
        gives the same bits; the per-plane weight of the channels-first order follows the weight: modified in place,
        or another tensor, the output follows. Grad mode with a weight that requires grad is still refused."""
        from gnsilu import _strided
        torch.manual_seed(12)
        cases = ((lambda d: d.transpose(1, 2), (2, 3, 16, 5, 6)), (lambda d: d.transpose(1, 2)[0], (1, 16, 3, 5, 6)))
        for view, stored in cases:
            x = view((torch.randn(stored) * 3 + 50).to(torch.bfloat16))
            w, b, ib = torch.randn(16), torch.randn(16), torch.randn(16).to(torch.bfloat16)
            _strided._fast_calls.clear()
            with self.subTest(stored=stored), mock.patch.object(_strided, "_checked", wraps=_strided._checked) as checked:
                first = _strided.group_norm(torch, x, 4, w, b, 1e-6, "silu", input_bias=ib)
                again = _strided.group_norm(torch, x, 4, w, b, 1e-6, "silu", input_bias=ib)
                self.assertEqual(checked.call_count, 1)  # the second call: the fast path
                self.assertEqual(again.stride(), x.stride())
                self.assertTrue(torch.equal(again, first))
                self.assertTrue(torch.equal(first, self._reference_with(x, ib, w, b)))
                x2 = view((torch.randn(stored) * 2 - 7).to(torch.bfloat16))  # same key, other values
                self.assertTrue(torch.equal(_strided.group_norm(torch, x2, 4, w, b, 1e-6, "silu", input_bias=ib),
                                            self._reference_with(x2, ib, w, b)))
                w.mul_(-2)  # in place: a new version
                self.assertTrue(torch.equal(_strided.group_norm(torch, x, 4, w, b, 1e-6, "silu", input_bias=ib),
                                            self._reference_with(x, ib, w, b)))
                w2 = torch.randn(16)  # another tensor, same key
                self.assertTrue(torch.equal(_strided.group_norm(torch, x, 4, w2, b, 1e-6, "silu", input_bias=ib),
                                            self._reference_with(x, ib, w2, b)))
                with torch.inference_mode():  # inference tensors keep no version: their planes are made anew
                    w3 = torch.randn(16)
                    for _ in range(2):
                        self.assertTrue(torch.equal(
                            _strided.group_norm(torch, x, 4, w3, b, 1e-6, "silu", input_bias=ib),
                            self._reference_with(x, ib, w3, b)))
                    w3.mul_(3)
                    self.assertTrue(torch.equal(_strided.group_norm(torch, x, 4, w3, b, 1e-6, "silu", input_bias=ib),
                                                self._reference_with(x, ib, w3, b)))
                self.assertEqual(checked.call_count, 1)
                with self.assertRaises(gnsilu.InvalidArgumentError):
                    _strided.group_norm(torch, x, 4, w.clone().requires_grad_(), b, 1e-6, "silu", input_bias=ib)

    def _reference_with(self, x, input_bias, w, b):
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return self._reference(x + input_bias.view(shape), 4, w, b, "silu")

    def test_what_it_takes_and_refuses(self):
        from gnsilu import _strided
        x = torch.randn(2, 8, 3, 4, 5)
        self.assertIsNone(_strided.plan(x.transpose(3, 4)))  # another order
        self.assertIsNone(_strided.plan(x[:, :, ::2]))  # not dense
        self.assertIsNone(_strided.plan(x[:1].transpose(1, 2)[:, :1].transpose(1, 2)))  # one frame: dense already
        framed = x.transpose(1, 2).contiguous().transpose(1, 2)
        with mock.patch.object(_strided, "MIN_BYTES", framed.numel() * framed.element_size() + 1):
            self.assertIsNone(_strided.plan(framed))  # smaller than MIN_BYTES: the copy (or PyTorch) instead
        self.assertEqual(_strided.plan(framed), _strided.FRAMES_FIRST)
        with self.assertRaises(ValueError):
            _strided.group_norm(torch, x, 4, None, None, 1e-6, "silu")
        framed = x.transpose(1, 2).contiguous().transpose(1, 2)
        for call, name in ((lambda: _strided.group_norm(torch, framed, 3, None, None, 1e-6, "silu"), "'num_groups'"),
                           (lambda: _strided.group_norm(torch, framed, 4, None, None, 1e-6, "silu",
                                                        out=torch.empty_like(x)), "'out'"),
                           (lambda: _strided.group_norm(torch, framed, 4, torch.ones(8, requires_grad=True), None,
                                                        1e-6, "silu"), "'weight'")):
            with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                call()
            self.assertIn(name, str(caught.exception))

    def test_modules_take_these_orders_without_a_warning(self):
        import warnings
        norm = gt.GroupNormSiLU(4, 16)
        framed = torch.randn(1, 3, 16, 5, 6).transpose(1, 2)
        with modules_take_cpu(), torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = norm(framed)
        self.assertEqual([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)], [])
        self.assertTrue(torch.equal(y, F.silu(F.group_norm(framed, 4, norm.weight, norm.bias, 1e-5))))

    def test_compiled_modules_take_these_orders_without_a_copy(self):
        """Under torch.compile the op takes the strided view itself (GroupNorm, GroupNormSiLU): no contiguous() (or
        clone) in the graph, the eager bits, the output in x's strides. FrameGroupNorm keeps its copy into frame order
        there (Inductor folds it into the producer): one contiguous() before the op, the eager bits."""
        torch.manual_seed(5)
        gn = nn.GroupNorm(4, 16)
        framed = (torch.randn(1, 3, 16, 5, 6) * 2 + 7).transpose(1, 2)  # (1, C, T, H, W) stored frames first
        video = torch.randn(1, 16, 3, 5, 6) * 2 + 7  # contiguous: its frames a batch stored channels first
        cases = [("GroupNormSiLU, frames first", gt.GroupNormSiLU.from_group_norm(gn), framed,
                  lambda x: F.silu(F.group_norm(x, 4, gn.weight, gn.bias, gn.eps)), 0),
                 ("GroupNorm, channels first", gt.GroupNorm.from_group_norm(gn), video.transpose(1, 2)[0],
                  lambda x: F.group_norm(x, 4, gn.weight, gn.bias, gn.eps), 0),
                 ("FrameGroupNorm, channels first", gt.FrameGroupNorm(gt.GroupNorm.from_group_norm(gn)), video,
                  lambda x: F.group_norm(x.transpose(1, 2).flatten(0, 1), 4, gn.weight, gn.bias, gn.eps)
                  .unflatten(0, (1, 3)).transpose(1, 2), 1)]
        for name, module, x, expected, copies in cases:
            with self.subTest(name), modules_take_cpu(), torch.no_grad():
                torch._dynamo.reset()
                calls = []
                y = torch.compile(module, backend=graph_ops(calls, methods=True), fullgraph=True)(x)
                self.assertEqual(calls.count(OP), 1, calls)
                self.assertEqual(len([c for c in calls if "contiguous" in c or "clone" in c]), copies, calls)
                self.assertTrue(torch.equal(y, expected(x)))
                self.assertTrue(torch.equal(y, module(x)))
                if not copies:
                    sized = [d for d in range(x.dim()) if x.shape[d] > 1]  # a size-1 dimension's stride: any
                    self.assertEqual([y.stride(d) for d in sized], [x.stride(d) for d in sized])


class BiasBlock(nn.Module if torch is not None else object):
    """diffusers' ResnetBlock2D in miniature as a VAE decoder runs it: norm1 -> SiLU -> conv1 -> (+ temb, when one is
    given) -> norm2 -> SiLU -> conv2, plus the input. conv1's output goes only to norm2 while temb is None."""

    def __init__(self, channels=16, groups=4):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.nonlinearity = nn.SiLU()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, temb=None):
        h = self.nonlinearity(self.norm1(x))
        h = self.conv1(h)
        if temb is not None:
            h = h + temb[:, :, None, None]
        h = self.norm2(h)
        h = self.nonlinearity(h)
        return self.conv2(h) + x


def moved_reference(block, x):
    """BiasBlock's computation with conv1's bias added as gnsilu's input_bias is: conv1(x, w, None) + b in x's dtype,
    then group_norm of that sum (PyTorch's ops, what the swapped block runs on the CPU)."""
    h = F.silu(F.group_norm(x, block.norm1.num_groups, block.norm1.weight, block.norm1.bias, block.norm1.eps))
    h = F.conv2d(h, block.conv1.weight, None, padding=1) + block.conv1.bias.view(1, -1, 1, 1)
    h = F.silu(F.group_norm(h, block.norm2.num_groups, block.norm2.weight, block.norm2.bias, block.norm2.eps))
    return block.conv2(h) + x


@contextlib.contextmanager
def biases_move_on_cpu():
    """The modules hand CPU tensors to the op (PyTorch's ops behind it), and moved convolutions leave their bias to
    their norm there too (by default only CUDA tensors do: where gnsilu adds it)."""
    with mock.patch.object(gt, "_DEVICE_TYPES", ("cpu",)), mock.patch.object(gt, "_BIAS_DEVICE_TYPES", ("cpu",)):
        yield


def graph_nodes(recorded):
    """A torch.compile backend recording (target, args) of each call_function node."""
    def backend(graph_module, example_inputs):
        recorded.extend((node.target, node.args) for node in graph_module.graph.nodes if node.op == "call_function")
        return graph_module
    return backend


def relative_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestInputBias(unittest.TestCase):
    """input_bias: the functions' checks and the problem they pass, the ops (CPU: PyTorch's ops on x + input_bias,
    bit for bit; fake; opcheck; torch.compile), and the swap's bias move (conv1 -> norm2) eager and compiled."""

    def setUp(self):
        torch.manual_seed(0)

    def assertNames(self, argument, call):
        with self.assertRaises(Exception) as caught:
            call()
        self.assertIn(f"'{argument}'", str(caught.exception))
        return str(caught.exception)

    def test_arguments_name_input_bias(self):
        x = torch.randn(2, 8, 4, 5).bfloat16()
        stats = torch.zeros(2, 4, gnsilu.STATS_WORDS, dtype=torch.int64)
        bad = [(torch.randn(8), "dtype torch.float32"), (torch.randn(7).bfloat16(), "(8,)"),
               (torch.randn(1, 8).bfloat16(), "(8,)"), ([0.0] * 8, "got list"),
               (torch.empty(8, dtype=torch.bfloat16, device="meta"), "meta")]
        calls = {"group_norm": lambda b: gnsilu.group_norm(x, 4, input_bias=b),
                 "group_norm_silu": lambda b: gnsilu.group_norm_silu(x, 4, input_bias=b),
                 "padded": lambda b: gnsilu.group_norm(x, 4, pad=(1, 1), input_bias=b),
                 "group_stats": lambda b: gnsilu.group_stats(x, 4, input_bias=b),
                 "group_norm_apply": lambda b: gnsilu.group_norm_apply(x, stats, input_bias=b),
                 "op": lambda b: torch.ops.gnsilu.group_norm(x, 4, None, None, 1e-6, "silu", None, b),
                 "padded op": lambda b: torch.ops.gnsilu.group_norm_padded(x, 4, None, None, 1e-6, "silu", [1, 1],
                                                                           "constant", 0.0, None, b)}
        recorder = RecordedCall()
        with mock.patch.object(_lib, "call", recorder):
            for name, call in calls.items():
                for value, words in bad:
                    if name.endswith("op") and words in ("got list", "meta"):
                        continue  # the dispatcher's own: a list is no Tensor?, a meta tensor runs the fake kernel
                    with self.subTest(call=name, input_bias=words):
                        # The functions refuse CPU tensors (the checks run first with CUDA pretended); group_stats
                        # and group_norm_apply take them (the CPU reference), the op runs PyTorch's ops on them.
                        pretend = mock.patch.object(torch.Tensor, "is_cuda", True) if name in (
                            "group_norm", "group_norm_silu", "padded") else contextlib.nullcontext()
                        with pretend:
                            self.assertIn(words, self.assertNames("input_bias", lambda: call(value)))
            with mock.patch.object(torch.Tensor, "is_cuda", True):
                message = self.assertNames("input_bias", lambda: gnsilu.group_norm(
                    x.float(), 4, input_bias=torch.randn(8, requires_grad=True)))
            self.assertIn("requires grad", message)
        self.assertEqual(recorder.calls, [])  # refused in Python, before any C call

    @contextlib.contextmanager
    def pretend_cuda(self):
        recorder = RecordedCall()
        stream = types.SimpleNamespace(cuda_stream=0x5150)
        with mock.patch.object(torch.Tensor, "is_cuda", True), \
                mock.patch.object(torch.cuda, "device", lambda device: contextlib.nullcontext()), \
                mock.patch.object(torch.cuda, "current_stream", lambda device=None: stream), \
                mock.patch.object(_lib, "call", recorder), mock.patch.object(_torch_adapter, "_FAST_LIMIT", 0):
            yield recorder

    def test_the_problem_carries_input_bias(self):
        x = torch.randn(2, 8, 4, 5).half().to(memory_format=torch.channels_last)
        b = torch.randn(8).half()
        with self.pretend_cuda() as recorder:
            gnsilu.group_norm(x, 4, input_bias=b)
            gnsilu.group_norm_silu(x, 4)
            gnsilu.group_norm(x, 4, pad=(1, 1, 0, 2), input_bias=b)
            strided = torch.randn(16).half()[::2]
            gnsilu.group_norm_silu(x, 4, input_bias=strided)  # made contiguous first, as weight and bias are
        problems = [fields for _, fields, _ in recorder.calls]
        self.assertEqual([p["input_bias"] for p in problems[:3]], [b.data_ptr(), None, b.data_ptr()])
        self.assertNotIn(problems[3]["input_bias"], (None, strided.data_ptr()))
        self.assertEqual((len(problems), problems[2]["pad_count"]), (4, 4))  # the padded call: one problem

    def test_op_on_the_cpu_is_pytorch_on_the_sum(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for fmt in (torch.contiguous_format, torch.channels_last):
                x = (torch.randn(2, 8, 4, 5) * 3).to(dtype).to(memory_format=fmt)
                weight, bias, input_bias = torch.randn(8), torch.randn(8), (torch.randn(8) * 4).to(dtype)
                total = x + input_bias.view(1, 8, 1, 1)  # PyTorch's sum in x's dtype
                with self.subTest(dtype=dtype, format=fmt):
                    y = torch.ops.gnsilu.group_norm(x, 4, weight.to(dtype), bias.to(dtype), 1e-5, "silu", None,
                                                    input_bias)
                    self.assertTrue(torch.equal(y, F.silu(F.group_norm(total, 4, weight.to(dtype), bias.to(dtype),
                                                                       1e-5))))
                    self.assertEqual(y.stride(), x.stride())
                    plain = torch.ops.gnsilu.group_norm(x, 4, None, None, 1e-6, "none", input_bias=input_bias)
                    self.assertTrue(torch.equal(plain, F.group_norm(total, 4, eps=1e-6)))
                    padded = torch.ops.gnsilu.group_norm_padded(x, 4, None, None, 1e-6, "silu", [1, 1, 2, 0],
                                                                "replicate", 0.0, None, input_bias)
                    expected = F.pad(F.silu(F.group_norm(total, 4, eps=1e-6)), [1, 1, 2, 0], mode="replicate")
                    self.assertTrue(torch.equal(padded, expected))
                    with FakeTensorMode() as mode:
                        fake = torch.ops.gnsilu.group_norm(mode.from_tensor(x), 4, None, None, 1e-6, "silu",
                                                           torch.float32, mode.from_tensor(input_bias))
                    self.assertEqual((fake.shape, fake.stride(), fake.dtype), (x.shape, x.stride(), torch.float32))
        x = torch.randn(2, 8, 4, 5)
        for args in ((x, 4, torch.randn(8), None, 1e-5, "silu", None, torch.randn(8)),
                     (x.to(memory_format=torch.channels_last), 2, None, None, 1e-6, "none", None, torch.randn(8))):
            result = torch.library.opcheck(torch.ops.gnsilu.group_norm.default, args)
            self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)
        result = torch.library.opcheck(torch.ops.gnsilu.group_norm_padded.default,
                                       (x, 4, None, None, 1e-6, "silu", [1, 1], "constant", 0.5, None, torch.randn(8)))
        self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)

    def test_op_with_input_bias_compiles(self):
        class Caller(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(8, 8, 3, padding=1)

            def forward(self, x):
                h = F.conv2d(x, self.conv.weight, None, padding=1)
                return torch.ops.gnsilu.group_norm(h, 4, None, None, 1e-6, "silu", None, self.conv.bias)

        caller = Caller().eval()
        x = torch.randn(2, 8, 6, 5)
        with torch.no_grad():
            expected = F.silu(F.group_norm(F.conv2d(x, caller.conv.weight, None, padding=1)
                                           + caller.conv.bias.view(1, 8, 1, 1), 4, eps=1e-6))
            self.assertTrue(torch.equal(caller(x), expected))
            for backend in ("eager", "aot_eager"):
                torch._dynamo.reset()
                ops = []
                compiled = torch.compile(caller, backend=graph_ops(ops) if backend == "eager" else backend,
                                         fullgraph=True)
                with self.subTest(backend=backend):
                    self.assertTrue(torch.equal(compiled(x), expected))
                if backend == "eager":
                    self.assertEqual(ops.count(OP), 1)

    def swapped_block(self, **options):
        """(the swapped BiasBlock, an unswapped copy, x, temb, the state_dict before the swap (cloned), its counts)."""
        block = BiasBlock().eval()
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(0, 0.3)
        original = copy.deepcopy(block)
        x, temb = torch.randn(2, 16, 7, 6), torch.randn(2, 16)
        state = {k: v.clone() for k, v in block.state_dict().items()}
        counts = gt.swap_group_norm_silu(block, return_counts=True, **options)
        return block, original, x, temb, state, counts

    def test_swap_moves_conv1_bias_into_norm2(self):
        block, original, x, temb, state, counts = self.swapped_block()
        self.assertEqual(counts, gt.SwapCounts(2, 0, 0, 1))
        self.assertIsInstance(block.conv1, nn.Conv2d)
        self.assertIsInstance(block.conv1, gt._BiasMovingConv)
        self.assertIs(type(block.conv2), nn.Conv2d)  # its output goes to the residual sum
        self.assertIs(block.conv1._gnsilu_norm, block.norm2)
        after = block.state_dict()
        self.assertEqual(list(after), list(state))  # conv1.bias is where it was, the same values
        self.assertTrue(all(torch.equal(after[k], v) for k, v in state.items()))
        self.assertEqual(gt.swap_group_norm_silu(block, return_counts=True), gt.SwapCounts(0, 0))
        calls = []
        implementation = gt._op_implementation

        def recording(*args, **kwargs):
            calls.append(kwargs.get("input_bias", args[7] if len(args) > 7 else None))
            return implementation(*args, **kwargs)
        for layout in (torch.contiguous_format, torch.channels_last):
            v = x.contiguous(memory_format=layout)
            with self.subTest(layout=layout), biases_move_on_cpu(), torch.no_grad(), \
                    mock.patch.object(gt, "_op_implementation", recording):
                calls.clear()
                y = block(v)
                self.assertEqual(len(calls), 2)
                self.assertIs(calls[1], block.conv1.bias)  # norm2 got conv1's bias as its input bias
                self.assertTrue(torch.equal(y, moved_reference(block, v)))
                self.assertLess(relative_l2(y, original(v)), 1e-5)  # conv1's own bias add rounds otherwise
                self.assertFalse(block.conv1._gnsilu_move_bias)  # nothing held after the block's call
                self.assertIsNone(block.norm2._gnsilu_biased)
                calls.clear()
                self.assertTrue(torch.equal(block(v, temb), original(v, temb)))  # temb: the original computation
                self.assertEqual(calls, [None, None])
                h = torch.randn(2, 16, 5, 5)
                self.assertTrue(torch.equal(block.conv1(h), F.conv2d(h, block.conv1.weight, block.conv1.bias,
                                                                      padding=1)))  # outside its block: its bias
        with torch.no_grad():  # CPU tensors without the test hooks: the block as it was, bit for bit
            self.assertTrue(torch.equal(block(x), original(x)))
        block.norm2 = copy.deepcopy(original.norm2)  # norm2 replaced after the swap: conv1 keeps its bias
        with biases_move_on_cpu(), torch.no_grad():
            self.assertTrue(torch.equal(block(x), original(x)))

    def test_swapped_block_compiles_with_the_moved_bias(self):
        block, original, x, temb, _, _ = self.swapped_block()
        with biases_move_on_cpu(), torch.no_grad():
            eager = block(x)
            before_temb = original(x, temb)
            for backend in ("eager", "aot_eager"):
                torch._dynamo.reset()
                nodes = []
                compiled = torch.compile(block, backend=graph_nodes(nodes) if backend == "eager" else backend,
                                         fullgraph=True)
                with self.subTest(backend=backend):
                    self.assertTrue(torch.equal(compiled(x), eager))
                    self.assertTrue(torch.equal(compiled(x, temb), before_temb))
                    self.assertFalse(block.conv1._gnsilu_move_bias)
                    self.assertIsNone(block.norm2._gnsilu_biased)
                if backend == "eager":
                    ops = [args for target, args in nodes if target in (torch.ops.gnsilu.group_norm,
                                                                        torch.ops.gnsilu.group_norm.default)]
                    convs = [args for target, args in nodes if "conv2d" in str(target)]
                    # Without temb: norm1, norm2 (with an input bias) and conv1 without its bias; with temb (its own
                    # graph): conv1 with its bias, norm2 without an input bias.
                    with_input_bias = [args for args in ops if len(args) > 7 and args[7] is not None]
                    self.assertEqual((len(ops), len(with_input_bias)), (4, 1), ops)
                    self.assertEqual(sum(args[2] is None for args in convs), 1, convs)

    def test_autograd_keeps_the_bias_in_the_conv(self):
        block, original, x, _, _, _ = self.swapped_block()
        with biases_move_on_cpu():
            y = block(x)  # grad mode, parameters that require grad: the original computation
        self.assertTrue(torch.equal(y, original(x)))
        y.sum().backward()
        self.assertIsNotNone(block.conv1.bias.grad)

    def test_copies_keep_their_own_move(self):
        block, _, x, _, _, _ = self.swapped_block()
        buffer = io.BytesIO()
        torch.save(block, buffer)
        buffer.seek(0)
        for name, clone in (("deepcopy", copy.deepcopy(block)), ("pickle", torch.load(buffer, weights_only=False))):
            with self.subTest(name), biases_move_on_cpu(), torch.no_grad():
                self.assertIs(clone.conv1._gnsilu_norm, clone.norm2)
                self.assertTrue(torch.equal(clone(x), moved_reference(clone, x)))
                self.assertFalse(block.conv1._gnsilu_move_bias)  # the original's conv untouched by the clone's hooks

    def test_what_is_not_moved(self):
        block, original, x, _, _, counts = self.swapped_block(move_bias=False)
        self.assertEqual(counts, gt.SwapCounts(2, 0, 0, 0))
        self.assertIs(type(block.conv1), nn.Conv2d)
        self.assertEqual((len(block._forward_pre_hooks), len(block._forward_hooks)), (0, 0))
        with biases_move_on_cpu(), torch.no_grad():
            self.assertTrue(torch.equal(block(x), original(x)))
        cases = {"no bias": lambda b: setattr(b, "conv1", nn.Conv2d(16, 16, 3, padding=1, bias=False)),
                 "shared conv": lambda b: setattr(b, "other", nn.ModuleList([b.conv1])),
                 "hooked conv": lambda b: b.conv1.register_forward_hook(lambda m, i, o: None),
                 "own forward": lambda b: setattr(b, "forward", b.forward)}
        for name, change in cases.items():
            with self.subTest(name):
                block = BiasBlock().eval()
                change(block)
                self.assertEqual(gt.swap_group_norm_silu(block, return_counts=True).biases_moved, 0)
        block = BiasBlock().eval()  # norm2 left a plain nn.GroupNorm (plain=False, no pair): not a gnsilu norm
        block.nonlinearity.register_forward_hook(lambda m, i, o: None)
        self.assertEqual(gt.swap_group_norm_silu(block, plain=False, return_counts=True), gt.SwapCounts(0, 0))
        # HandOffBlock's conv runs twice, ResnetBlock2D with a time embedding projection computes between conv1 and
        # norm2: nothing moves.
        self.assertEqual(gt.swap_group_norm_silu(HandOffBlock(), return_counts=True).biases_moved, 0)
        resnet = toy_models.ResnetBlock2D(32, 32, temb_channels=8)
        self.assertEqual(gt.swap_group_norm_silu(resnet, return_counts=True).biases_moved, 0)

    def test_regions_with_input_bias_on_the_cpu_reference(self):
        from test_cpu import library_takes_input_bias
        if not library_takes_input_bias():
            self.skipTest(f"{gnsilu.library_path()} predates input_bias (0.3): rebuild the library")
        from gnsilu import _strided
        torch.manual_seed(6)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for fmt in (torch.contiguous_format, torch.channels_last):
                x = (torch.randn(2, 16, 12, 10) * 3 + 1).to(dtype).contiguous(memory_format=fmt)
                b = (torch.randn(16) * 5).to(dtype)
                w, bias = torch.randn(16), torch.randn(16)
                total = x + b.view(1, 16, 1, 1)
                with self.subTest(dtype=dtype, format=fmt):
                    stats = gnsilu.group_stats(x, 4, input_bias=b)
                    self.assertTrue(torch.equal(stats, gnsilu.group_stats(total, 4)))
                    y = gnsilu.group_norm_apply(x, stats, w, bias, input_bias=b)
                    expected = gnsilu.group_norm_apply(total, stats, w, bias)
                    self.assertTrue(torch.equal(y, expected))
                    tiles = [x[:, :, :5], x[:, :, 5:], x[:, :, 12:]]  # views; the last empty
                    merged = gnsilu.merge_stats(*[gnsilu.group_stats(t, 4, input_bias=b) for t in tiles])
                    self.assertTrue(torch.equal(gnsilu.group_norm_apply(x, merged, w, bias, input_bias=b), y))
                    part = gnsilu.group_norm_apply(tiles[1], merged, w, bias, input_bias=b)
                    self.assertTrue(torch.equal(part, y[:, :, 5:]))
        with mock.patch.object(_strided, "MIN_BYTES", 0):
            for view, stored in ((lambda d: d.transpose(1, 2), (2, 3, 16, 5, 6)),
                                 (lambda d: d.transpose(1, 2)[0], (1, 16, 3, 5, 6))):
                x = view(torch.randn(stored).to(torch.bfloat16))
                b = torch.randn(16).to(torch.bfloat16)
                y = _strided.group_norm(torch, x, 4, None, None, 1e-6, "silu", input_bias=b)
                dense = x.contiguous() + b.view(1, 16, *([1] * (x.dim() - 2)))
                expected = gnsilu.group_norm_apply(dense, gnsilu.group_stats(dense, 4), None, None, 1e-6, "silu")
                self.assertTrue(torch.equal(y, expected))


def _rank_split_worker(rank, world, init_file, result_file):
    """One rank of TestRanks: its half of the rows, statistics merged over gloo, its half normalized."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(11)  # every rank draws the same whole tensor, then keeps its rows
        x = (torch.randn(2, 32, 17, 9) * 2 - 1).to(torch.bfloat16)
        w, b = torch.randn(32), torch.randn(32)
        rows = [(0, 8), (8, 17)][rank]
        part = x[:, :, rows[0]:rows[1], :]
        stats = gnsilu.all_reduce_stats(gnsilu.group_stats(part, 8))
        y = gnsilu.group_norm_apply(part, stats, w, b)
        parts = [torch.empty(0)] * world
        dist.all_gather_object(parts, y)
        if rank == 0:
            torch.save(torch.cat(parts, dim=2), result_file)
    finally:
        dist.destroy_process_group()


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestRanks(unittest.TestCase):
    """Two processes (gloo, CPU): each normalizes its half of a tensor with statistics merged by an all-reduce of the
    records; together they give the single-process bits."""

    def test_two_ranks_give_the_single_process_bits(self):
        import tempfile
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory() as d:
            init_file, result_file = os.path.join(d, "init"), os.path.join(d, "y.pt")
            mp.spawn(_rank_split_worker, args=(2, init_file, result_file), nprocs=2, join=True)
            y = torch.load(result_file)
        torch.manual_seed(11)
        x = (torch.randn(2, 32, 17, 9) * 2 - 1).to(torch.bfloat16)
        w, b = torch.randn(32), torch.randn(32)
        whole = gnsilu.group_norm_apply(x, gnsilu.group_stats(x, 8), w, b)
        self.assertTrue(torch.equal(y, whole))


if __name__ == "__main__":
    if torch is None:
        if os.environ.get("GNSILU_TEST_REQUIRE_TORCH") == "1":  # .ci/run installed it: missing is a failure
            print("test_torch_cpu: FAILED: GNSILU_TEST_REQUIRE_TORCH=1 but PyTorch does not import")
            sys.exit(1)
        print("test_torch_cpu: skipped: PyTorch is not installed")
        sys.exit(77)
    program = unittest.main(exit=False)
    result = program.result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped:
        print(f"test_torch_cpu: {len(result.skipped)} of {result.testsRun} tests skipped:")
        for test, reason in result.skipped:
            print(f"  {test.id()}: {reason}")
        if os.environ.get("GNSILU_TEST_REQUIRE_TORCH") == "1" or len(result.skipped) == result.testsRun:
            sys.exit(1 if os.environ.get("GNSILU_TEST_REQUIRE_TORCH") == "1" else 77)
    sys.exit(0)
