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
  equals the checked path's, and what still takes the checked path.
"""
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
from gnsilu import _api, _lib  # noqa: E402

if torch is not None:
    import gnsilu.torch as gt
    import toy_models

PROBLEM_FIELDS = [name for name, _ in _lib.Problem._fields_]
OP = "gnsilu::group_norm"  # how graph_ops records the operator


def graph_ops(recorded):
    """A torch.compile backend that records the call_function targets of each graph it is given."""
    def backend(graph_module, example_inputs):
        recorded.extend(OP if node.target in (torch.ops.gnsilu.group_norm, torch.ops.gnsilu.group_norm.default)
                        else str(node.target)
                        for node in graph_module.graph.nodes if node.op == "call_function")
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


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TestOperator(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)

    def test_schema_and_registration(self):
        op = torch.ops.gnsilu.group_norm.default
        schema = op._schema
        self.assertEqual(schema.name, "gnsilu::group_norm")
        self.assertEqual([a.name for a in schema.arguments],
                         ["x", "num_groups", "weight", "bias", "eps", "activation", "out_dtype"])
        for declared in ("Tensor x", "int num_groups", "Tensor? weight", "Tensor? bias", "float eps",
                         "str activation", "ScalarType? out_dtype", "-> Tensor"):
            self.assertIn(declared, str(schema))
        self.assertEqual([a.default_value for a in schema.arguments[2:]], [None, None, 1e-6, "silu", None])
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
            checked.append(fields)

        library = types.SimpleNamespace(gnsilu_group_norm=fast)
        stream = types.SimpleNamespace(cuda_stream=0x5150)
        with mock.patch.object(torch.Tensor, "is_cuda", True), \
                mock.patch.object(torch.cuda, "device", lambda device: contextlib.nullcontext()), \
                mock.patch.object(torch.cuda, "current_stream", lambda device=None: stream), \
                mock.patch.object(torch.cuda, "current_device", lambda: None), \
                mock.patch.object(_api, "_raw_stream", lambda torch: (lambda index: 0x5150)), \
                mock.patch.object(_api, "_fast_calls", {}), \
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
                gnsilu.group_norm(x, 4, weight, out=torch.empty_like(x))  # out is never fast
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


if __name__ == "__main__":
    if torch is None:
        print("test_torch_cpu: skipped: PyTorch is not installed")
        sys.exit(77)
    unittest.main()
