#!/usr/bin/env python3
"""GPU tests of the Python package (ctest label "gpu": exits 77, skipped, without PyTorch or a CUDA device).

    GNSILU_LIBRARY=build/libgnsilu.so python3 python/tests/test_gpu.py        (or: ctest -R test_python_gpu)

(a) gnsilu.group_norm_silu gives the same bits as the C API called directly through ctypes: bf16/fp16/fp32 x,
    every output dtype, several shapes (no spatial dimension to three), weight/bias of mixed dtypes or none; also
    in place, channels-last and non-dense x, another stream, CUDA graph capture, __cuda_array_interface__ and DLPack
    inputs;
(b) against float64 PyTorch on normal data: at most 1 ulp for 16-bit outputs (gnsilu aims at 0.5: correct
    rounding); float32 outputs at most 16 ulps where |y| >= 2^-6 (as the C++ reference tests: near a zero
    crossing a tiny float32 output carries the statistics' FP32 rounding), their numbers are printed;
(c) GroupNormSiLU against nn.GroupNorm + nn.SiLU, and its fallbacks (CPU, autograd, non-dense input, autocast)
    giving PyTorch's own results; swap_group_norm_silu on an nn.Sequential;
(d) a randomly initialised Flux-like VAE decoder (python/tests/toy_models.py; bf16, latent 1x16x64x64, output
    512x512), before and after swap_group_norm_silu: swaps, max abs and relative L2 difference (asserted below
    twice the bf16 decoder's own distance to float32), each one's distance to the same decoder in float32 (the
    swapped one no further); times (CUDA events, median);
(e) layouts and plain group_norm: for bf16/fp16/fp32, 4-D, 5-D and 3-D (N, C, L) channels-last tensors, with and
    without affine, activation "silu" and None, gnsilu.group_norm on the channels-last tensor gives the bits of its
    call on the same values in contiguous format, in x's format, without copying x, within 1 ulp (16-bit) of the
    float64 result and close to PyTorch's float32 F.silu(F.group_norm(...)) / F.group_norm; in place on
    channels-last; out in the other layout refused; a non-dense x copied; __cuda_array_interface__ arrays with
    NHWC strides;
(f) GroupNormSiLU and GroupNorm on channels-last input call gnsilu (the bits of gnsilu.group_norm's), and
    swap_group_norm_silu on the toy decoder in channels-last runs every norm through gnsilu, close to the model
    before the swap;
(g) the op torch.ops.gnsilu.group_norm: torch.library.opcheck on CUDA tensors (both layouts, one copied), its
    bits those of gnsilu.group_norm; torch.compile(fullgraph=True) of GroupNormSiLU and GroupNorm puts the op in
    the graph and gives the eager bits (Inductor); a swapped toy decoder compiles whole with every norm a gnsilu
    op, close to eager; CUDA graphs: torch.compile(mode="reduce-overhead") replays on new inputs, and an eager
    torch.cuda.graph capture of the swapped decoder replays correctly;
(ib) input_bias: for bf16/fp16/fp32, both layouts, small and large shapes, silu and none, the fast path, the padded
    call and op, region statistics, the strided orders and the op: the bits of the same call on PyTorch's x + b
    (with an Inf in x and -Inf/+Inf biases: NaN where that call has NaN); a swapped Flux-like toy decoder and a
    diffusers Flux-style AutoencoderKL with their conv1 biases moved into norm2, eager and compiled, within the
    swap's tolerance of the model before it.
Prints a summary table at the end.
"""
import contextlib
import copy
import ctypes
import os
import statistics
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import gnsilu  # noqa: E402  (after the path set-up)

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    torch = None
CUDA = torch is not None and torch.cuda.is_available()
if CUDA:
    import gnsilu.torch as gt
    import toy_models

SUMMARY = []  # (part, case, result) rows for the table printed at the end
FORMATS = {}  # dtype -> (significand bits with the hidden one, smallest normal exponent)
if torch is not None:
    FORMATS = {torch.bfloat16: (8, -126), torch.float16: (11, -14), torch.float32: (24, -126)}
    CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}


def shape_name(shape):
    """ "1x512x64x64", as the C++ tests and gnsilu-tune write shapes."""
    return "x".join(map(str, shape))


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def spacing(exact, dtype):
    """The ulp of the output dtype at each float64 value (subnormal spacing below the normal range)."""
    bits, min_exponent = FORMATS[dtype]
    _, exponent = torch.frexp(exact)
    exponent = torch.clamp(exponent - 1, min=min_exponent)
    return torch.ldexp(torch.ones_like(exact), exponent - (bits - 1))


def round_once(exact, dtype):
    """float64 values rounded to dtype once, to nearest even (torch's float64 -> bfloat16 goes through float32)."""
    quantum = spacing(exact, dtype)
    return (torch.round(exact / quantum) * quantum).to(dtype)


def precision(out, exact):
    """(fraction equal to the correctly rounded result, largest error in ulps) of out against float64 exact.

    For float32 outputs the largest error counts outputs with |y| >= 2^-6 only, as the C++ reference tests do: near
    a zero crossing of the pre-activation a tiny float32 output carries the FP32 rounding of the statistics (about
    2^-30 relative to the group's scale), which is many of its own ulps but no loss against a 16-bit output."""
    expected = round_once(exact, out.dtype)
    same = (out == expected) | (torch.isnan(out) & torch.isnan(expected))
    error = (out.double() - exact).abs() / spacing(exact, out.dtype)
    if out.dtype == torch.float32:
        error = error[exact.abs() >= 2.0 ** -6]
    return same.double().mean().item(), error.max().item()


def exact_result(x, groups, weight, bias, eps):
    w = None if weight is None else weight.double()
    b = None if bias is None else bias.double()
    return F.silu(F.group_norm(x.double(), groups, w, b, eps))


class DirectLibrary:
    """The C API through its own ctypes handle: what the package must reproduce bit for bit."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.gnsilu_group_norm_silu.restype = ctypes.c_int
        self.lib.gnsilu_group_norm_silu.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
            ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_double,
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.gnsilu_last_error.restype = ctypes.c_char_p

    def __call__(self, x, groups, weight, bias, eps, out_dtype):
        y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        shape = (ctypes.c_int64 * x.dim())(*x.shape)
        status = self.lib.gnsilu_group_norm_silu(
            x.data_ptr(), CODES[x.dtype], y.data_ptr(), CODES[out_dtype], shape, x.dim(), groups,
            None if weight is None else weight.data_ptr(), 0 if weight is None else CODES[weight.dtype],
            None if bias is None else bias.data_ptr(), 0 if bias is None else CODES[bias.dtype], eps, None, 0,
            torch.cuda.current_stream().cuda_stream)
        if status != 0:
            raise RuntimeError(self.lib.gnsilu_last_error().decode())
        return y


def same_bits(a, b):
    """The same values bit for bit, whatever the two tensors' memory formats (the logical tensors are compared)."""
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@contextlib.contextmanager
def counting_gnsilu_calls():
    """Counts the modules' calls into gnsilu, [checked path, fast path]: the op's implementation (their first call
    of a key; the padded op's every call) and the fast path's hits (the calls after it)."""
    counts = [0, 0]
    implementation, fast, padded = gt._op_implementation, gt._api.torch_fast_call, gt._padded_implementation

    def counted_implementation(*args, **kwargs):
        counts[0] += 1
        return implementation(*args, **kwargs)

    def counted_padded(*args, **kwargs):
        counts[0] += 1
        return padded(*args, **kwargs)

    def counted_fast(*args, **kwargs):
        result = fast(*args, **kwargs)
        counts[1] += result is not None
        return result

    with mock.patch.object(gt, "_op_implementation", counted_implementation), \
            mock.patch.object(gt, "_padded_implementation", counted_padded), \
            mock.patch.object(gt._api, "torch_fast_call", counted_fast):
        yield counts


def non_dense(x):
    """x's values in a tensor with gaps (every other element of a wider one): in neither layout."""
    wide = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    gappy = wide[..., ::2]
    gappy.copy_(x)
    return gappy


def channels_last(x):
    """x's values with the channel dimension innermost (torch.channels_last for 4-D, channels_last_3d for 5-D, and
    (N, C, L) with strides (L*C, 1, C) for 3-D)."""
    order = (0, *range(2, x.dim()), 1)
    inverse = (0, x.dim() - 1, *range(1, x.dim() - 1))
    return x.permute(order).contiguous().permute(inverse)


def parameters(channels, kind, generator):
    """weight, bias for a case: "fp32", "mixed" (bf16 weight, fp16 bias) or "none"."""
    if kind == "none":
        return None, None
    weight = 1 + 0.5 * torch.randn(channels, generator=generator, device="cuda")
    bias = 0.5 * torch.randn(channels, generator=generator, device="cuda")
    if kind == "mixed":
        return weight.to(torch.bfloat16), bias.to(torch.float16)
    return weight, bias


class CudaArray:
    """Exposes only a tensor's __cuda_array_interface__ (as CuPy or Numba would), its pointer moved by offset
    bytes (to make a misaligned one)."""

    def __init__(self, tensor, offset=0):
        interface = dict(tensor.__cuda_array_interface__)
        pointer, readonly = interface["data"]
        interface["data"] = (pointer + offset, readonly)
        self.__cuda_array_interface__ = interface


class DLPackOnly:
    """Exposes only a tensor's DLPack protocol (as JAX would)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestBitIdentity(unittest.TestCase):
    """(a) The package against the C API called directly."""

    @classmethod
    def setUpClass(cls):
        cls.direct = DirectLibrary(gnsilu.library_path())

    def test_dtypes_shapes_parameters(self):
        shapes = [((1, 512, 64, 64), 32), ((2, 128, 96, 96), 32), ((3, 64, 17, 5), 8), ((2, 96, 7), 3),
                  ((4, 32), 32), ((1, 64, 4, 6, 5), 16)]
        generator = torch.Generator(device="cuda").manual_seed(1)
        cases = 0
        for shape, groups in shapes:
            for x_dtype in (torch.bfloat16, torch.float16, torch.float32):
                x = (3 * torch.randn(shape, generator=generator, device="cuda") + 1).to(x_dtype)
                for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
                    for kind in ("fp32", "mixed", "none"):
                        weight, bias = parameters(shape[1], kind, generator)
                        with self.subTest(shape=shape, x=x_dtype, out=out_dtype, parameters=kind):
                            ours = gnsilu.group_norm_silu(x, groups, weight, bias, 1e-6, out_dtype=out_dtype)
                            self.assertTrue(same_bits(ours, self.direct(x, groups, weight, bias, 1e-6, out_dtype)))
                            cases += 1
        SUMMARY.append(("a", "package == C API (shapes x dtypes x parameters)", f"{cases} cases bit-identical"))

    def test_ways_of_calling(self):
        generator = torch.Generator(device="cuda").manual_seed(2)
        x = torch.randn(2, 64, 12, 10, generator=generator, device="cuda").to(torch.float16)
        weight, bias = parameters(64, "fp32", generator)
        expected = self.direct(x, 32, weight, bias, 1e-5, torch.float16)

        into = torch.empty_like(x)
        self.assertIs(gnsilu.group_norm_silu(x, 32, weight, bias, 1e-5, out=into), into)
        self.assertTrue(same_bits(into, expected))
        again = torch.full_like(x, float("nan"))  # the same key: the fast path, into this out
        self.assertIs(gnsilu.group_norm_silu(x, 32, weight, bias, 1e-5, out=again), again)
        self.assertTrue(same_bits(again, expected))
        for _ in range(2):  # in place: a key of its own, checked then fast
            in_place = x.clone()
            gnsilu.group_norm_silu(in_place, 32, weight, bias, 1e-5, out=in_place)
            self.assertTrue(same_bits(in_place, expected))
        strided = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels_last: taken as it is
        self.assertFalse(strided.is_contiguous())
        from_strided = gnsilu.group_norm_silu(strided, 32, weight, bias, 1e-5)
        self.assertTrue(same_bits(from_strided, expected))
        self.assertTrue(from_strided.is_contiguous(memory_format=torch.channels_last))
        gappy = non_dense(x)  # copied first, y contiguous
        self.assertTrue(torch.equal(gappy, x))
        from_gappy = gnsilu.group_norm_silu(gappy, 32, weight, bias, 1e-5)
        self.assertTrue(same_bits(from_gappy, expected))
        self.assertTrue(from_gappy.is_contiguous())

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            on_stream = gnsilu.group_norm_silu(x, 32, weight, bias, 1e-5)
        torch.cuda.current_stream().wait_stream(stream)
        self.assertTrue(same_bits(on_stream, expected))

        captured = torch.empty_like(x)
        gnsilu.group_norm_silu(x, 32, weight, bias, 1e-5, out=captured)  # compiled and tuned before capture
        graph = torch.cuda.CUDAGraph()
        captured.zero_()
        with torch.cuda.graph(graph):
            gnsilu.group_norm_silu(x, 32, weight, bias, 1e-5, out=captured)
        graph.replay()
        torch.cuda.synchronize()
        self.assertTrue(same_bits(captured, expected))

        interface_out = torch.empty_like(x)
        torch.cuda.synchronize()
        result = gnsilu.group_norm_silu(CudaArray(x), 32, CudaArray(weight), CudaArray(bias), 1e-5,
                                        out=CudaArray(interface_out), stream=torch.cuda.current_stream())
        self.assertIsInstance(result, CudaArray)
        self.assertTrue(same_bits(interface_out, expected))
        from_dlpack = gnsilu.group_norm_silu(DLPackOnly(x), 32, weight, bias, 1e-5)
        self.assertTrue(same_bits(from_dlpack, expected))
        SUMMARY.append(("a", "out=, in place, channels_last, non-dense, stream, CUDA graph, CAI, DLPack",
                        "bit-identical"))

    def test_errors_name_the_argument(self):
        x = torch.randn(2, 64, 4, 4, device="cuda")
        checks = [("x", lambda: gnsilu.group_norm_silu(x.cpu(), 32)),
                  ("x", lambda: gnsilu.group_norm_silu(x.double(), 32)),
                  ("num_groups", lambda: gnsilu.group_norm_silu(x, 24)),
                  ("weight", lambda: gnsilu.group_norm_silu(x, 32, torch.ones(64))),
                  ("weight", lambda: gnsilu.group_norm_silu(x, 32, torch.ones(32, device="cuda"))),
                  ("bias", lambda: gnsilu.group_norm_silu(x, 32, None, torch.ones(64, device="cuda").long())),
                  ("out", lambda: gnsilu.group_norm_silu(x, 32, out=torch.empty(2, 64, 4, 5, device="cuda"))),
                  ("x", lambda: gnsilu.group_norm_silu(x.requires_grad_(), 32)),
                  ("stream", lambda: gnsilu.group_norm_silu(x, 32, stream=0))]
        for name, call in checks:
            with self.subTest(argument=name):
                with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                    call()
                self.assertIn(f"'{name}'", str(caught.exception))
        x.requires_grad_(False)
        half = x.half()
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:  # found by the library, not by Python
            gnsilu.group_norm_silu(CudaArray(half, offset=1), 32, out=CudaArray(torch.empty_like(half)))
        self.assertIn("aligned", str(caught.exception))
        SUMMARY.append(("a", "argument errors", f"{len(checks) + 1} named"))


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestPrecision(unittest.TestCase):
    """(b) Against float64 PyTorch, on well-conditioned normal data."""

    def test_within_one_ulp(self):
        generator = torch.Generator(device="cuda").manual_seed(3)
        for shape, groups in (((1, 512, 64, 64), 32), ((2, 128, 96, 96), 32), ((1, 64, 128, 128), 1)):
            for x_dtype in (torch.bfloat16, torch.float16, torch.float32):
                x = torch.randn(shape, generator=generator, device="cuda").to(x_dtype)
                weight, bias = parameters(shape[1], "fp32", generator)
                exact = exact_result(x, groups, weight, bias, 1e-6)
                for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
                    ours = gnsilu.group_norm_silu(x, groups, weight, bias, 1e-6, out_dtype=out_dtype)
                    rounded, worst = precision(ours, exact)
                    bound = 1.0 if out_dtype != torch.float32 else 16.0  # float32: where |y| >= 2^-6
                    name = f"{shape_name(shape)} G={groups} {dtype_name(x_dtype)}->{dtype_name(out_dtype)}"
                    with self.subTest(case=name):
                        self.assertLessEqual(worst, bound)
                    SUMMARY.append(("b", name, f"{100 * rounded:.4f}% correctly rounded, max {worst:.3f} ulp"))


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestModule(unittest.TestCase):
    """(c) GroupNormSiLU against nn.GroupNorm + nn.SiLU, and its fallbacks."""

    def group_norm(self, channels, groups, dtype):
        module = nn.GroupNorm(groups, channels, eps=1e-6).cuda()
        with torch.no_grad():
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.5, 0.5)
        return module.to(dtype)

    def test_against_pytorch(self):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            reference = self.group_norm(256, 32, dtype)
            fused = gt.GroupNormSiLU.from_group_norm(reference)
            x = torch.randn(2, 256, 32, 32, device="cuda").to(dtype)
            with torch.inference_mode():
                with counting_gnsilu_calls() as calls:
                    ours = fused(x)
                self.assertEqual(sum(calls), 1)
                theirs = F.silu(reference(x))
            exact = exact_result(x, 32, reference.weight, reference.bias, 1e-6)
            _, ours_worst = precision(ours, exact)
            _, theirs_worst = precision(theirs, exact)
            self.assertEqual(ours.dtype, theirs.dtype)
            self.assertLessEqual(ours_worst, 1.0 if dtype != torch.float32 else 16.0)
            SUMMARY.append(("c", f"GroupNormSiLU {dtype_name(dtype)} vs nn.GroupNorm+SiLU",
                            f"max ulp gnsilu {ours_worst:.3f}, PyTorch {theirs_worst:.3f}"))

    def test_fallbacks_give_pytorch_results(self):
        reference = self.group_norm(64, 16, torch.float32)
        fused = gt.GroupNormSiLU.from_group_norm(reference)
        x = torch.randn(2, 64, 8, 8, device="cuda")
        with counting_gnsilu_calls() as calls:
            self.assertTrue(torch.equal(fused.cpu()(x.cpu()), F.silu(reference.cpu()(x.cpu()))))
            fused.cuda()
            reference.cuda()
            graph_input = x.clone().requires_grad_()
            out = fused(graph_input)
            self.assertTrue(torch.equal(out, F.silu(reference(graph_input))))
            out.sum().backward()
            self.assertIsNotNone(graph_input.grad)
            gappy = non_dense(x)  # PyTorch's ops
            with torch.no_grad():
                self.assertTrue(torch.equal(fused(gappy), F.silu(reference(gappy))))
            self.assertEqual(sum(calls), 0)
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                autocast_ours = fused(x.bfloat16())
                autocast_theirs = F.silu(reference(x.bfloat16()))
            self.assertEqual(sum(calls), 1)
        self.assertEqual(autocast_ours.dtype, autocast_theirs.dtype)
        SUMMARY.append(("c", "fallbacks: CPU, autograd, non-dense input", "PyTorch's results, bit for bit"))
        SUMMARY.append(("c", "autocast", f"output {dtype_name(autocast_ours.dtype)} like nn.GroupNorm"))

    def test_sequential_swap(self):
        head = toy_models.sequential_head(64).cuda().to(torch.bfloat16)
        x = torch.randn(1, 64, 32, 32, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            before = head(x)
            self.assertEqual(gt.swap_group_norm_silu(head), 1)
            after = head(x)
        self.assertIsInstance(head[0], gt.GroupNormSiLU)
        self.assertIsInstance(head[1], nn.Identity)
        difference = (after.float() - before.float()).norm() / before.float().norm()
        self.assertLess(difference.item(), 1e-2)
        SUMMARY.append(("c", "nn.Sequential swap", f"1 swap, relative L2 {difference.item():.2e}"))


def reference(x, groups, weight, bias, eps, activation, dtype):
    """PyTorch's group_norm (then SiLU for activation "silu") computed in `dtype` (float32 or float64)."""
    w = None if weight is None else weight.to(dtype)
    b = None if bias is None else bias.to(dtype)
    y = F.group_norm(x.to(dtype), groups, w, b, eps)
    return F.silu(y) if activation == "silu" else y


# Against PyTorch's float32 result: a few of the output dtype's half-ulps.
TOLERANCES = {}
if torch is not None:
    TOLERANCES = {torch.bfloat16: dict(rtol=1.6e-2, atol=2e-2), torch.float16: dict(rtol=2e-3, atol=2e-3),
                  torch.float32: dict(rtol=1e-4, atol=1e-4)}


def in_channels_last_format(y):
    """Whether y lies channel dimension innermost, as torch's own memory formats say where they exist."""
    if y.dim() == 4:
        return y.is_contiguous(memory_format=torch.channels_last)
    if y.dim() == 5:
        return y.is_contiguous(memory_format=torch.channels_last_3d)
    return y.permute(0, *range(2, y.dim()), 1).is_contiguous()


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestLayouts(unittest.TestCase):
    """(e) Channels-last tensors and plain group_norm through gnsilu.group_norm."""

    def test_channels_last_gives_the_contiguous_bits(self):
        cases = [((2, 64, 12, 10), 32), ((1, 512, 32, 32), 32), ((3, 96, 17, 5), 8), ((2, 32, 4, 6, 5), 8),
                 ((1, 64, 3, 16, 16), 32), ((2, 96, 77), 3), ((1, 128, 4096), 32)]
        generator = torch.Generator(device="cuda").manual_seed(6)
        count, worst_ulps = 0, {}
        for shape, groups in cases:
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                x = (3 * torch.randn(shape, generator=generator, device="cuda") + 1).to(dtype)
                x_last = channels_last(x)
                self.assertEqual(gnsilu.layout_of(x_last.shape, x_last.stride()), "channels_last")
                for kind in ("fp32", "none"):
                    weight, bias = parameters(shape[1], kind, generator)
                    for activation in ("silu", None):
                        name = f"{shape_name(shape)} {dtype_name(dtype)} {kind} {activation}"
                        with self.subTest(case=name):
                            expected = gnsilu.group_norm(x, groups, weight, bias, 1e-6, activation=activation)
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                            allocated = torch.cuda.memory_allocated()
                            ours = gnsilu.group_norm(x_last, groups, weight, bias, 1e-6, activation=activation)
                            torch.cuda.synchronize()
                            extra = torch.cuda.max_memory_allocated() - allocated
                            self.assertTrue(expected.is_contiguous())
                            self.assertTrue(in_channels_last_format(ours))
                            self.assertTrue(same_bits(ours, expected))
                            # y was allocated, x was not copied (that would take as much again).
                            self.assertLess(extra, 2 * ours.numel() * ours.element_size())
                            exact = reference(x, groups, weight, bias, 1e-6, activation, torch.float64)
                            _, worst = precision(ours, exact)
                            self.assertLessEqual(worst, 1.0 if dtype != torch.float32 else 16.0)
                            torch.testing.assert_close(
                                ours.float(), reference(x, groups, weight, bias, 1e-6, activation, torch.float32),
                                **TOLERANCES[dtype])
                            key = (dtype_name(dtype), activation or "none")
                            worst_ulps[key] = max(worst_ulps.get(key, 0.0), worst)
                            count += 1
        SUMMARY.append(("e", "channels-last == contiguous (shapes x dtypes x affine x activation)",
                        f"{count} cases bit-identical, in channels-last format, x not copied"))
        for (dtype, activation), worst in sorted(worst_ulps.items()):
            SUMMARY.append(("e", f"channels-last {dtype} activation {activation} vs float64", f"max {worst:.3f} ulp"))

    def test_in_place_out_and_copies(self):
        generator = torch.Generator(device="cuda").manual_seed(7)
        x = torch.randn(2, 64, 12, 10, generator=generator, device="cuda").half()
        weight, bias = parameters(64, "mixed", generator)
        x_last = channels_last(x)
        for activation in ("silu", None):
            expected = gnsilu.group_norm(x, 32, weight, bias, 1e-5, activation=activation)
            in_place = x_last.clone()
            self.assertTrue(in_channels_last_format(in_place))
            self.assertIs(gnsilu.group_norm(in_place, 32, weight, bias, 1e-5, activation=activation, out=in_place),
                          in_place)
            self.assertTrue(same_bits(in_place, expected))
            into = torch.empty_like(x_last)
            gnsilu.group_norm(x_last, 32, weight, bias, 1e-5, activation=activation, out=into)
            self.assertTrue(same_bits(into, expected))
            # Not dense, or dense in another order: copied (into out's layout when out is given).
            into.zero_()
            gnsilu.group_norm(non_dense(x), 32, weight, bias, 1e-5, activation=activation, out=into)
            self.assertTrue(same_bits(into, expected))
            other_order = x.transpose(2, 3).contiguous().transpose(2, 3)
            self.assertIsNone(gnsilu.layout_of(other_order.shape, other_order.stride()))
            copied = gnsilu.group_norm(other_order, 32, weight, bias, 1e-5, activation=activation)
            self.assertTrue(copied.is_contiguous())
            self.assertTrue(same_bits(copied, expected))
            wide = gnsilu.group_norm(x_last, 32, weight, bias, 1e-5, activation=activation, out_dtype=torch.float32)
            self.assertTrue(in_channels_last_format(wide))
            self.assertTrue(same_bits(wide, gnsilu.group_norm(x, 32, weight, bias, 1e-5, activation=activation,
                                                              out_dtype=torch.float32)))
        for given, out in ((x_last, torch.empty_like(x)), (x, torch.empty_like(x_last)), (x, non_dense(x))):
            with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
                gnsilu.group_norm(given, 32, out=out)
            self.assertIn("'out'", str(caught.exception))
        SUMMARY.append(("e", "channels-last in place, out=, copies of non-dense x, out_dtype", "bit-identical"))

    def test_transposed_hidden_states(self):
        """diffusers' attention hands GroupNorm hidden_states.transpose(1, 2): (N, C, L), channel innermost."""
        hidden = torch.randn(2, 300, 128, device="cuda").bfloat16()
        x = hidden.transpose(1, 2)
        self.assertEqual(gnsilu.layout_of(x.shape, x.stride()), "channels_last")
        for activation in ("silu", None):
            ours = gnsilu.group_norm(x, 32, activation=activation)
            self.assertTrue(ours.transpose(1, 2).is_contiguous())
            self.assertTrue(same_bits(ours, gnsilu.group_norm(x.contiguous(), 32, activation=activation)))
        SUMMARY.append(("e", "(N, C, L) from transpose(1, 2)", "taken as it is, bit-identical"))

    def test_cuda_array_interface_nhwc(self):
        x = channels_last(torch.randn(2, 64, 12, 10, device="cuda").half())
        expected = gnsilu.group_norm(x.contiguous(), 32, activation=None)
        out = torch.empty_like(x)
        torch.cuda.synchronize()
        result = gnsilu.group_norm(CudaArray(x), 32, activation=None, out=CudaArray(out),
                                   stream=torch.cuda.current_stream())
        self.assertIsInstance(result, CudaArray)
        self.assertTrue(same_bits(out, expected))
        with self.assertRaises(gnsilu.InvalidArgumentError) as caught:
            gnsilu.group_norm(CudaArray(x), 32, out=CudaArray(torch.empty_like(x.contiguous())))
        self.assertIn("'out'", str(caught.exception))
        try:
            import cupy
        except ImportError:
            SUMMARY.append(("e", "__cuda_array_interface__ NHWC", "bit-identical (no CuPy: out= only)"))
            return
        allocated = gnsilu.group_norm(cupy.asarray(x), 32, activation=None)
        torch.cuda.synchronize()
        back = torch.as_tensor(allocated, device="cuda")
        self.assertTrue(in_channels_last_format(back))
        self.assertTrue(same_bits(back, expected))
        SUMMARY.append(("e", "__cuda_array_interface__ NHWC, out= and CuPy's result", "bit-identical"))


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestLayoutModules(unittest.TestCase):
    """(f) The modules and the swap on channels-last input."""

    def test_modules_call_gnsilu_on_channels_last(self):
        for dtype in (torch.bfloat16, torch.float32):
            gn = nn.GroupNorm(32, 256, eps=1e-6).cuda()
            with torch.no_grad():
                gn.weight.uniform_(0.5, 1.5)
                gn.bias.uniform_(-0.5, 0.5)
            gn = gn.to(dtype)
            inputs = {"channels_last": channels_last(torch.randn(2, 256, 16, 16, device="cuda").to(dtype)),
                      "(N, C, L) transposed": torch.randn(2, 300, 256, device="cuda").to(dtype).transpose(1, 2)}
            for name, x in inputs.items():
                with self.subTest(dtype=dtype, input=name), torch.inference_mode():
                    with counting_gnsilu_calls() as plain_calls:
                        plain = gt.GroupNorm.from_group_norm(gn)(x)
                    with counting_gnsilu_calls() as fused_calls:
                        fused = gt.GroupNormSiLU.from_group_norm(gn)(x)
                    self.assertEqual((sum(plain_calls), sum(fused_calls)), (1, 1))
                    self.assertTrue(same_bits(plain, gnsilu.group_norm(x, 32, gn.weight, gn.bias, 1e-6,
                                                                       activation=None)))
                    self.assertTrue(same_bits(fused, gnsilu.group_norm(x, 32, gn.weight, gn.bias, 1e-6)))
                    self.assertTrue(in_channels_last_format(plain) and in_channels_last_format(fused))
                    torch.testing.assert_close(plain.float(), gn(x).float(), **TOLERANCES[dtype])
                    torch.testing.assert_close(fused.float(), F.silu(gn(x)).float(), **TOLERANCES[dtype])
        SUMMARY.append(("f", "GroupNorm, GroupNormSiLU on channels-last", "gnsilu called, its bits"))

    def test_swap_on_a_channels_last_decoder(self):
        torch.manual_seed(8)
        decoder = toy_models.FluxLikeDecoder(block_out_channels=(64, 128, 128, 128), layers_per_block=1)
        decoder = decoder.cuda().eval().to(memory_format=torch.channels_last)
        float32 = copy.deepcopy(decoder)
        original = decoder.to(torch.bfloat16)
        swapped = copy.deepcopy(original)
        counts = gt.swap_group_norm_silu(swapped, return_counts=True)
        self.assertEqual((counts.pairs, counts.plain), (toy_models.expected_swaps(swapped), 1))
        latent = channels_last(torch.randn(1, 16, 32, 32, device="cuda"))
        layouts = []

        def recording(function, fast=False):
            def record(*args, **kwargs):
                x = args[1] if fast else args[0]  # torch_fast_call(torch, x, ...), group_norm(x, ...)
                result = function(*args, **kwargs)
                if result is not None or not fast:  # a fast call that ran (not a miss)
                    layouts.append(gnsilu.layout_of(x.shape, x.stride()))
                return result
            return record

        with torch.inference_mode():
            exact = float32(latent)
            before = original(latent.bfloat16())
            with mock.patch.object(gt, "group_norm", recording(gt.group_norm)), \
                    mock.patch.object(gt._api, "torch_fast_call", recording(gt._api.torch_fast_call, True)):
                after = swapped(latent.bfloat16())
        self.assertEqual(len(layouts), counts.pairs + counts.plain)  # every norm ran through gnsilu, once
        self.assertGreater(layouts.count("channels_last"), len(layouts) // 2, layouts)
        before, after = before.float(), after.float()
        relative = ((after - before).norm() / before.norm()).item()
        before_error = ((before - exact).norm() / exact.norm()).item()
        after_error = ((after - exact).norm() / exact.norm()).item()
        self.assertLess(relative, 2 * before_error)
        self.assertLessEqual(after_error, 1.25 * before_error + 1e-3)
        SUMMARY.append(("f", f"channels-last decoder: {counts.pairs} pairs + {counts.plain} plain",
                        f"{layouts.count('channels_last')}/{len(layouts)} norms channels-last; relative L2 "
                        f"{relative:.2e}; to float32 before {before_error:.2e}, after {after_error:.2e}"))


def graph_ops(recorded):
    """A torch.compile backend that records each graph's call_function targets (gnsilu's op as "gnsilu"), then
    runs the graph as it is (no Inductor)."""
    def backend(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op == "call_function":
                gnsilu_op = node.target in (torch.ops.gnsilu.group_norm, torch.ops.gnsilu.group_norm.default)
                recorded.append("gnsilu" if gnsilu_op else str(node.target))
        return graph_module
    return backend


def relative_l2(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestCompile(unittest.TestCase):
    """(g) The op torch.ops.gnsilu.group_norm: opcheck; torch.compile (fullgraph) of the modules and of a swapped
    decoder with the op in the graph and its bits; CUDA graphs through reduce-overhead and torch.cuda.graph."""

    def test_opcheck(self):
        torch.manual_seed(11)
        x = torch.randn(2, 64, 12, 10, device="cuda", dtype=torch.bfloat16)
        weight, bias = torch.randn(64, device="cuda"), torch.randn(64, device="cuda", dtype=torch.bfloat16)
        samples = [(x, 8, weight, bias, 1e-6, "silu", None),
                   (channels_last(x), 8, weight, bias, 1e-6, "none", torch.float32),
                   (x.float().transpose(2, 3), 4, None, None, 1e-5, "silu", None),  # neither layout: copied
                   (torch.randn(2, 32, 3, 4, 5, device="cuda", dtype=torch.float16).to(
                       memory_format=torch.channels_last_3d), 32, None, bias[:32], 1e-6, "silu", None)]
        for args in samples:
            with self.subTest(shape=tuple(args[0].shape), activation=args[5]):
                result = torch.library.opcheck(torch.ops.gnsilu.group_norm.default, args)
                self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)
                y = torch.ops.gnsilu.group_norm(*args)
                expected = gnsilu.group_norm(args[0], args[1], args[2], args[3], args[4],
                                             None if args[5] == "none" else "silu", out_dtype=args[6])
                self.assertTrue(same_bits(y, expected))
                self.assertEqual(y.stride(), torch.empty_like(args[0]).stride())
        SUMMARY.append(("g", "torch.library.opcheck, 4 samples", "passed; op bits = gnsilu.group_norm's"))

    def test_compiled_modules_give_the_eager_bits(self):
        torch.manual_seed(12)
        gn = nn.GroupNorm(32, 256, eps=1e-6).cuda().to(torch.bfloat16)
        with torch.no_grad():
            gn.weight.uniform_(0.5, 1.5)
            gn.bias.uniform_(-0.5, 0.5)
        rows = 0
        for module in (gt.GroupNormSiLU.from_group_norm(gn), gt.GroupNorm.from_group_norm(gn)):
            for layout in ("contiguous", "channels_last"):
                x = torch.randn(2, 256, 48, 40, device="cuda", dtype=torch.bfloat16)
                if layout == "channels_last":
                    x = channels_last(x)
                with self.subTest(module=type(module).__name__, layout=layout), torch.inference_mode():
                    torch._dynamo.reset()
                    ops = []
                    torch.compile(module, backend=graph_ops(ops), fullgraph=True)(x)
                    self.assertEqual(ops, ["gnsilu"])
                    torch._dynamo.reset()
                    compiled = torch.compile(module, fullgraph=True)  # Inductor
                    y = compiled(x)
                    eager = module(x)
                    self.assertTrue(same_bits(y, eager))
                    self.assertEqual(y.stride(), x.stride())
                    rows += 1
        SUMMARY.append(("g", "torch.compile(fullgraph) of GroupNormSiLU, GroupNorm", f"{rows}/4: the op in the graph, "
                                                                                     "eager bits"))

    def swapped_decoder(self, layout):
        torch.manual_seed(13)
        decoder = toy_models.FluxLikeDecoder(block_out_channels=(64, 128, 128, 128), layers_per_block=1)
        decoder = decoder.cuda().eval().to(torch.bfloat16)
        if layout == "channels_last":
            decoder = decoder.to(memory_format=torch.channels_last)
        swapped = copy.deepcopy(decoder)
        counts = gt.swap_group_norm_silu(swapped, return_counts=True)
        return decoder, swapped, counts

    def latent(self, layout, seed):
        generator = torch.Generator(device="cuda").manual_seed(seed)
        z = torch.randn(1, 16, 32, 32, device="cuda", generator=generator).bfloat16()
        return channels_last(z) if layout == "channels_last" else z

    def test_compiled_swapped_decoder(self):
        for layout in ("contiguous", "channels_last"):
            original, swapped, counts = self.swapped_decoder(layout)
            z = self.latent(layout, 1)
            with self.subTest(layout=layout), torch.inference_mode():
                before, eager = original(z), swapped(z)
                torch._dynamo.reset()
                ops = []
                torch.compile(swapped, backend=graph_ops(ops), fullgraph=True)(z)
                self.assertEqual(ops.count("gnsilu"), counts.pairs + counts.plain)
                self.assertFalse(any("group_norm" in op for op in ops if op != "gnsilu"), ops)
                torch._dynamo.reset()
                compiled = torch.compile(swapped, fullgraph=True)
                got = compiled(z)
                drift, noise = relative_l2(got, eager), relative_l2(eager, before)
                self.assertLess(drift, max(noise, 1e-2))
                SUMMARY.append(("g", f"compiled swapped decoder, {layout}", f"{ops.count('gnsilu')} gnsilu ops, "
                                f"no other GroupNorm; relative L2 to eager {drift:.2e} (eager swap vs PyTorch "
                                f"{noise:.2e})"))

    def test_cuda_graphs(self):
        for layout in ("contiguous", "channels_last"):
            original, swapped, counts = self.swapped_decoder(layout)
            with self.subTest(layout=layout), torch.inference_mode():
                torch._dynamo.reset()
                compiled = torch.compile(swapped, mode="reduce-overhead", fullgraph=True)
                default = torch.compile(swapped, fullgraph=True)  # the same graph without CUDA graphs
                worst = noise = 0.0
                for seed in range(2, 6):  # warm-up, recording, then replays with other inputs
                    z = self.latent(layout, seed)
                    got = compiled(z).clone()
                    worst = max(worst, relative_l2(got, default(z)))
                    noise = max(noise, relative_l2(swapped(z), original(z)))
                # Replays of the CUDA graphs give the graph's own results on each new input: what the compiled
                # graph gives without CUDA graphs, up to Inductor's choices between the two compilations, which
                # stay below the swap's own distance to PyTorch (the compiled test above: 1.9e-2 against 2.2e-2).
                self.assertLess(worst, max(noise, 1e-2))
                # Eager capture: the swapped model's gnsilu calls in a torch.cuda.graph, replayed on new input.
                static = self.latent(layout, 7)
                swapped(static)  # every key tuned and compiled before the capture
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    swapped(static)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = swapped(static)
                z = self.latent(layout, 8)
                static.copy_(z)
                graph.replay()
                replayed = relative_l2(out, swapped(z))
                self.assertLess(replayed, 1e-3)
                SUMMARY.append(("g", f"CUDA graphs, {layout}", f"reduce-overhead: 4 calls, worst relative L2 to "
                                f"the compiled graph without CUDA graphs {worst:.2e}; torch.cuda.graph replay {replayed:.2e}"))


def median_ms(function, runs):
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestDecoder(unittest.TestCase):
    """(d) A Flux-like VAE decoder before and after swap_group_norm_silu."""

    def test_decode(self):
        torch.manual_seed(4)
        decoder = toy_models.FluxLikeDecoder(block_out_channels=(64, 128, 256, 256)).cuda().eval()
        reference = copy.deepcopy(decoder)  # float32
        original = decoder.to(torch.bfloat16)
        swapped = copy.deepcopy(original)
        swaps = gt.swap_group_norm_silu(swapped)
        self.assertEqual(swaps, toy_models.expected_swaps(swapped))
        latent = torch.randn(1, 16, 64, 64, device="cuda")
        with torch.inference_mode():
            exact = reference(latent)
            before = original(latent.bfloat16())
            after = swapped(latent.bfloat16())
            before_ms = median_ms(lambda: original(latent.bfloat16()), 9)
            after_ms = median_ms(lambda: swapped(latent.bfloat16()), 9)
        before, after = before.float(), after.float()
        max_abs = (after - before).abs().max().item()
        relative = ((after - before).norm() / before.norm()).item()
        before_error = ((before - exact).norm() / exact.norm()).item()
        after_error = ((after - exact).norm() / exact.norm()).item()
        print(f"\nFlux-like decoder, bf16, latent 1x16x64x64 -> {tuple(after.shape)}: {swaps} swaps; "
              f"max |after - before| {max_abs:.3e}, relative L2 {relative:.3e}; relative L2 to float32: "
              f"before {before_error:.3e}, after {after_error:.3e}; median time {before_ms:.3f} ms -> "
              f"{after_ms:.3f} ms")
        # A random bf16 decoder is itself a few percent from its float32 run (bf16 activations and convolutions);
        # the swap must change the output by no more than that noise and must not move it away from float32.
        self.assertLess(relative, 2 * before_error)
        self.assertLessEqual(after_error, 1.25 * before_error + 1e-3)
        SUMMARY.append(("d", f"decoder: {swaps} swaps", f"max abs {max_abs:.2e}, relative L2 {relative:.2e}"))
        SUMMARY.append(("d", "decoder: relative L2 to float32", f"before {before_error:.2e}, after {after_error:.2e}"))
        SUMMARY.append(("d", "decoder: median time (9 runs)", f"{before_ms:.3f} ms -> {after_ms:.3f} ms"))


def main():
    if torch is None:
        print("SKIPPED: PyTorch is not installed")
        return 77
    if not CUDA:
        print("SKIPPED: PyTorch sees no CUDA device")
        return 77
    print(f"gnsilu {gnsilu.version()} from {gnsilu.library_path()}, PyTorch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    result = unittest.main(exit=False, verbosity=2).result
    width = max((len(case) for _, case, _ in SUMMARY), default=10)
    print(f"\n{'part':4}  {'case':{width}}  result")
    for part, case, outcome in SUMMARY:
        print(f"{part:4}  {case:{width}}  {outcome}")
    return 0 if result.wasSuccessful() else 1


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestRegions(unittest.TestCase):
    """Statistics of tiles merged, then applied: the whole call's bits, on tiles cut as views (copied by gnsilu)."""

    def test_tiles_merged_give_the_whole_call(self):
        torch.manual_seed(3)
        for dtype in (torch.bfloat16, torch.float16):
            for memory_format in (torch.contiguous_format, torch.channels_last):
                x = (torch.randn(2, 64, 48, 40, device="cuda") * 3 + 1).to(dtype).contiguous(memory_format=memory_format)
                w = torch.randn(64, device="cuda")
                b = torch.randn(64, device="cuda")
                whole = gnsilu.group_norm_silu(x, 16, w, b)
                tiles = [x[:, :, :20, :17], x[:, :, :20, 17:], x[:, :, 20:, :], x[:, :, 48:, :]]  # the last is empty
                merged = gnsilu.merge_stats(*[gnsilu.group_stats(t, 16) for t in tiles])
                y = gnsilu.group_norm_apply(x, merged, w, b)
                self.assertTrue(torch.equal(y.view(torch.int16), whole.view(torch.int16)))
                # A tile normalized with the merged statistics: its part of the whole output.
                t = gnsilu.group_norm_apply(tiles[1], merged, w, b)
                self.assertTrue(torch.equal(t.contiguous().view(torch.int16),
                                            whole[:, :, :20, 17:].contiguous().view(torch.int16)))



def _split_case():
    """A Flux-like decoder (bf16, swapped) and a latent whose rows two ranks split: the same in every process."""
    torch.manual_seed(5)
    decoder = toy_models.FluxLikeDecoder(block_out_channels=(64, 128, 128), layers_per_block=1).cuda().eval()
    decoder = decoder.to(torch.bfloat16)
    gt.swap_group_norm_silu(decoder)
    latent = torch.randn(1, 16, 24, 20, device="cuda", dtype=torch.bfloat16)
    return decoder, latent


def _norm_modules(decoder):
    return [(name, m) for name, m in decoder.named_modules()
            if isinstance(m, (nn.GroupNorm, gt.GroupNormSiLU)) and not name.startswith("mid_block")]


def _split_gpu_worker(rank, world, init_file, result_file):
    import torch.distributed as dist
    import gnsilu.split as gs
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    try:
        decoder, latent = _split_case()
        seen = {}
        hooks = [m.register_forward_hook(
            lambda m, i, o, _n=name: seen.__setitem__(_n, (i[0].cpu(), o.cpu()))) for name, m in _norm_modules(decoder)]
        lo, hi = gs.band_of(latent.shape[-2], rank, world)
        with torch.inference_mode(), gs.rows(decoder):
            band = decoder(latent[..., lo:hi, :].contiguous())
        for h in hooks:
            h.remove()
        everything = [None] * world
        dist.all_gather_object(everything, (band.cpu(), seen))
        if rank == 0:
            torch.save(everything, result_file)
    finally:
        dist.destroy_process_group()


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestSplitDecode(unittest.TestCase):
    """gnsilu.split: a decode split by rows across two processes on one GPU (gloo): every GroupNorm's output bands
    together are gnsilu's GroupNorm of the whole input, bit for bit; the decode is the single-process one but for
    the convolutions' rounding on bands."""

    def test_two_ranks_on_one_gpu(self):
        import tempfile
        import torch.multiprocessing as mp
        import gnsilu.split as gs
        with tempfile.TemporaryDirectory() as d:
            init_file, result_file = os.path.join(d, "init"), os.path.join(d, "result.pt")
            mp.spawn(_split_gpu_worker, args=(2, init_file, result_file), nprocs=2, join=True)
            everything = torch.load(result_file)
        decoder, latent = _split_case()
        with torch.inference_mode():
            single = decoder(latent)
            with gs.rows(decoder):  # one rank: the same code, no process group
                alone = decoder(latent)
        split = torch.cat([band for band, _ in everything], dim=-2).cuda()
        names = [name for name, _ in _norm_modules(decoder)]
        self.assertGreater(len(names), 8)
        modules = dict(decoder.named_modules())
        for name in names:
            x = torch.cat([seen[name][0] for _, seen in everything], dim=-2).cuda()
            y = torch.cat([seen[name][1] for _, seen in everything], dim=-2).cuda()
            with torch.inference_mode():
                whole = modules[name](x)  # gnsilu's GroupNorm (+ SiLU) of the whole tensor, in one call
            self.assertTrue(same_bits(y, whole), f"{name}: the bands' GroupNorm differs from the whole tensor's")
        error = relative_l2(split.float(), alone.float())
        single_error = relative_l2(alone.float(), single.float())
        print(f"\nsplit decode, 2 ranks on one GPU, bf16 {tuple(latent.shape)} -> {tuple(split.shape)}: "
              f"{len(names)} GroupNorms bit-identical to the whole tensor's; relative L2 to one rank {error:.2e} "
              f"(one rank against the plain swapped decoder: {single_error:.2e})")
        self.assertLess(error, 0.02)
        SUMMARY.append(("regions", "split decode, 2 ranks (gloo, one GPU)",
                        f"{len(names)} GroupNorms bit-identical; relative L2 {error:.2e}"))



@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestFrameGroupNorm(unittest.TestCase):
    """gnsilu.torch.FrameGroupNorm (Mochi's per-frame GroupNorm): gnsilu runs on it in both layouts (a view of a
    channels_last_3d input, one copy of a contiguous one), with the bits of gnsilu's call on the batch of frames."""

    def test_per_frame_bits_in_both_layouts(self):
        torch.manual_seed(6)
        norm = gt.GroupNormSiLU(8, 64).cuda()
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        module = gt.FrameGroupNorm(norm)
        x = (torch.randn(2, 64, 5, 24, 20, device="cuda") * 2 + 3).to(torch.bfloat16)
        frames = x.transpose(1, 2).reshape(10, 64, 24, 20)
        with torch.inference_mode():  # the parameters require grad: gnsilu's function refuses them in grad mode
            expected = gnsilu.group_norm_silu(frames, 8, norm.weight, norm.bias, norm.eps)
        expected = expected.unflatten(0, (2, 5)).transpose(1, 2)
        for memory_format in (torch.contiguous_format, torch.channels_last_3d):
            v = x.contiguous(memory_format=memory_format)
            with torch.inference_mode(), counting_gnsilu_calls() as calls:
                y = module(v)
                y_again = module(v)
            self.assertEqual(sum(calls), 2, f"{memory_format}: gnsilu did not run ({calls})")
            self.assertTrue(same_bits(y, expected), str(memory_format))
            self.assertTrue(same_bits(y_again, expected), str(memory_format))
        SUMMARY.append(("regions", "FrameGroupNorm (per frame), both layouts", "gnsilu ran; bits of the frames' call"))

    def test_strided_orders_in_place(self):
        """Inputs stored frames first, and the frames of a (1, C, T, H, W) video as a batch (channels first): gnsilu
        takes them without a copy (gnsilu._strided), with the bits of its call on the contiguous tensor, the
        output in x's strides; FrameGroupNorm with B = 1 takes that path in eager mode."""
        from gnsilu import _strided
        patcher = mock.patch.object(_strided, "MIN_BYTES", 0)  # small tensors standing for large ones
        patcher.start()
        self.addCleanup(patcher.stop)
        torch.manual_seed(7)
        norm = gt.GroupNormSiLU(8, 64).cuda()
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            video = (torch.randn(1, 64, 5, 24, 20, device="cuda") * 2 + 3).to(dtype)
            framed = torch.randn(2, 5, 64, 24, 20, device="cuda").to(dtype).transpose(1, 2)  # frames first
            batch = video.transpose(1, 2)[0]  # (5, 64, 24, 20), channels first
            for x, order in ((framed, _strided.FRAMES_FIRST), (batch, _strided.CHANNELS_FIRST)):
                self.assertEqual(_strided.plan(x), order)
                with torch.inference_mode(), counting_gnsilu_calls() as calls:
                    expected = gnsilu.group_norm_silu(x.contiguous(), 8, norm.weight, norm.bias, norm.eps)
                    y = norm(x)
                self.assertEqual(calls[0], 1, f"{order}: gnsilu did not run ({calls})")
                self.assertEqual(y.stride(), x.stride(), order)
                self.assertTrue(same_bits(y.contiguous(), expected), f"{order} {dtype}")
                with torch.inference_mode(), mock.patch.object(_strided, "_fast_call",
                                                               wraps=_strided._fast_call) as fast:
                    y_again = norm(x)  # the same key: the strided fast path
                self.assertEqual(fast.call_count, 1, f"{order}: the second call did not take the fast path")
                self.assertTrue(same_bits(y_again.contiguous(), expected), f"{order} {dtype}, fast path")
            module = gt.FrameGroupNorm(norm)
            with torch.inference_mode():
                frames = video.transpose(1, 2).reshape(5, 64, 24, 20)
                expected = gnsilu.group_norm_silu(frames, 8, norm.weight, norm.bias, norm.eps)
                y = module(video)
            self.assertTrue(same_bits(y.transpose(1, 2)[0].contiguous(), expected), f"FrameGroupNorm {dtype}")
        SUMMARY.append(("regions", "strided orders (frames first, channels first), no copy", "contiguous call's bits"))

    def test_strided_orders_compiled(self):
        """Under torch.compile (Inductor) the op receives the modules' strided inputs and takes them through
        gnsilu._strided (no copy into order): the eager bits, the output in x's strides. FrameGroupNorm compiled (it
        copies into frame order there): the eager bits."""
        from gnsilu import _strided
        patcher = mock.patch.object(_strided, "MIN_BYTES", 0)  # small tensors standing for large ones
        patcher.start()
        self.addCleanup(patcher.stop)
        torch.manual_seed(9)
        norm = gt.GroupNormSiLU(8, 64).cuda().to(torch.bfloat16)
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        video = (torch.randn(1, 64, 5, 24, 20, device="cuda") * 2 + 3).to(torch.bfloat16)
        framed = torch.randn(2, 5, 64, 24, 20, device="cuda").to(torch.bfloat16).transpose(1, 2)
        for name, module, x in (("GroupNormSiLU, frames first", norm, framed),
                                ("GroupNormSiLU, channels first", norm, video.transpose(1, 2)[0])):
            with torch.inference_mode():
                expected = module(x)
                torch._dynamo.reset()
                with mock.patch.object(_strided, "group_norm", wraps=_strided.group_norm) as strided_calls:
                    y = torch.compile(module, fullgraph=True)(x)
                    torch.cuda.synchronize()
            self.assertGreater(strided_calls.call_count, 0, f"{name}: the compiled op did not take the strided path")
            self.assertTrue(same_bits(y.contiguous(), expected.contiguous()), name)
            sized = [d for d in range(x.dim()) if x.shape[d] > 1]
            self.assertEqual([y.stride(d) for d in sized], [x.stride(d) for d in sized], name)
        frames = gt.FrameGroupNorm(norm)
        with torch.inference_mode():
            expected = frames(video)
            torch._dynamo.reset()
            y = torch.compile(frames, fullgraph=True)(video)
        self.assertTrue(same_bits(y.contiguous(), expected.contiguous()), "FrameGroupNorm compiled")
        SUMMARY.append(("regions", "strided orders under torch.compile", "eager bits, no copy"))

    def test_silu_function_pair(self):
        """A block written `F.silu(self.norm(x))` (Cosmos, MiniMax-H3): after the swap gnsilu runs once, SiLU
        included, F.silu passes its output through, and the block's output has gnsilu's group_norm_silu bits."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import toy_models
        torch.manual_seed(8)
        block = toy_models.FunctionalSiLU(64, 8).cuda().eval()
        x = (torch.randn(2, 64, 24, 20, device="cuda") * 2 + 3).to(torch.bfloat16)
        self.assertEqual(gt.swap_group_norm_silu(block, return_counts=True), gt.SwapCounts(1, 0))
        block = block.to(torch.bfloat16)
        with torch.inference_mode():
            expected = gnsilu.group_norm_silu(x, 8, block.norm.weight, block.norm.bias, block.norm.eps)
            for memory_format in (torch.contiguous_format, torch.channels_last):
                with counting_gnsilu_calls() as calls:
                    y = block(x.contiguous(memory_format=memory_format))
                self.assertEqual(sum(calls), 1, f"{memory_format}: gnsilu did not run ({calls})")
                self.assertIs(type(y), torch.Tensor)
                self.assertTrue(same_bits(y, expected), str(memory_format))
        SUMMARY.append(("regions", "F.silu(norm(x)) pair, both layouts", "one gnsilu call; group_norm_silu's bits"))

    def test_contiguous_per_frame_norm(self):
        """FrameGroupNormContiguous (diffusers' MiniMaxH3VideoGroupNorm swapped): gnsilu's plain GroupNorm of the
        frames, the output contiguous, the frames' call bits, in both input layouts."""
        torch.manual_seed(7)
        norm = gt.FrameGroupNormContiguous(8, 64).cuda()
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        x = (torch.randn(2, 64, 5, 24, 20, device="cuda") * 2 + 3).to(torch.bfloat16)
        with torch.inference_mode():
            frames = x.transpose(1, 2).reshape(10, 64, 24, 20)
            expected = gnsilu.group_norm(frames, 8, norm.weight, norm.bias, norm.eps, activation=None)
            expected = expected.unflatten(0, (2, 5)).transpose(1, 2)
            for memory_format in (torch.contiguous_format, torch.channels_last_3d):
                with counting_gnsilu_calls() as calls:
                    y = norm(x.contiguous(memory_format=memory_format))
                self.assertEqual(sum(calls), 1, f"{memory_format}: gnsilu did not run ({calls})")
                self.assertTrue(y.is_contiguous() and same_bits(y, expected), str(memory_format))
        SUMMARY.append(("regions", "FrameGroupNormContiguous, both layouts", "gnsilu ran; contiguous; the frames' bits"))



@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestPaddedOutput(unittest.TestCase):
    """A padded output: F.pad of gnsilu's own output bit for bit, from one call; and the HunyuanVideo-like causal block
    swapped with its pads fused gives the bits of the swap without them, eager and compiled."""

    def test_padded_call_is_f_pad_of_the_output(self):
        torch.manual_seed(11)
        for shape, pad in (((1, 128, 3, 40, 64), (1, 1, 1, 1, 2, 0)), ((2, 64, 5, 17, 33), (1, 1, 1, 1, 2, 0)),
                           ((1, 96, 30, 50), (1, 1, 1, 1)), ((1, 32, 4, 6, 8), (0, 3, 2, 0, 1, 5))):
            x = (torch.randn(*shape, device="cuda") * 3 + 100).to(torch.bfloat16)
            weight = torch.randn(shape[1], device="cuda")
            bias = torch.randn(shape[1], device="cuda")
            for fmt in (torch.contiguous_format, torch.channels_last if len(shape) == 4 else torch.channels_last_3d):
                for mode, value in (("replicate", 0.0), ("constant", 0.0), ("constant", -1.5)):
                    v = x.contiguous(memory_format=fmt)
                    with torch.no_grad():
                        plain = gnsilu.group_norm(v, 32, weight, bias)
                        expected = F.pad(plain, pad, mode="replicate") if mode == "replicate" else \
                            F.pad(plain, pad, mode="constant", value=value)
                        got = gnsilu.group_norm(v, 32, weight, bias, pad=pad, pad_mode=mode, pad_value=value)
                        op = torch.ops.gnsilu.group_norm_padded(v, 32, weight, bias, 1e-6, "silu", list(pad), mode,
                                                                value)
                    what = f"{shape_name(shape)} {fmt} {mode} {value}"
                    self.assertTrue(same_bits(got, expected), what)
                    self.assertTrue(same_bits(op, expected), what)
                    self.assertTrue(got.is_contiguous(memory_format=fmt), what)
        SUMMARY.append(("pad", "padded output = F.pad(output)", "bit for bit, 4 shapes, both layouts, 3 borders"))

    def test_causal_block_fused_pads(self):
        import test_torch_cpu
        torch.manual_seed(3)
        block = test_torch_cpu.CausalBlock(channels=128, groups=32).cuda().to(torch.bfloat16).eval()
        plain = copy.deepcopy(block)
        self.assertEqual(gt.swap_group_norm_silu(block, return_counts=True), gt.SwapCounts(2, 0, 2))
        self.assertEqual(gt.swap_group_norm_silu(plain, return_counts=True, fuse_pad=False), gt.SwapCounts(2, 0, 0))
        x = torch.randn(1, 128, 3, 40, 64, device="cuda", dtype=torch.bfloat16)
        for fmt in (torch.contiguous_format, torch.channels_last_3d):
            v = x.contiguous(memory_format=fmt)
            with torch.inference_mode():
                expected = plain(v)
                with counting_gnsilu_calls() as calls:
                    got = block(v)
                self.assertEqual(sum(calls), 2, f"{fmt}: {calls}")
                self.assertTrue(same_bits(got, expected), str(fmt))
                # Compiled, Inductor chooses the convolutions' input layouts itself (cuDNN's bits may change with
                # them): the decode is compared within bf16 rounding; a wrong border would be far off.
                torch._dynamo.reset()
                compiled = torch.compile(block, fullgraph=True)
                error = relative_l2(compiled(v), expected)
                self.assertLess(error, 1e-2, f"{fmt} compiled")
        SUMMARY.append(("pad", "causal block, pads fused", f"eager: the unfused swap's bits; compiled rel. L2 "
                                                           f"{error:.1e}"))

def with_input_bias(x, input_bias):
    """x + input_bias.view(1, C, 1, ...) as PyTorch adds them, in x's dtype: the tensor gnsilu normalizes when given
    input_bias."""
    return x + input_bias.view(1, -1, *([1] * (x.dim() - 2)))


def same_bits_or_nan(a, b):
    """same_bits, where NaN positions must be the same and a NaN's payload may differ (a NaN group's outputs)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.contiguous(), b.contiguous()
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and same_bits(a.masked_fill(nan, 0), b.masked_fill(nan, 0))


class SeededCuda:
    """A test case's seeded CUDA inputs and models (a mixin beside unittest.TestCase)."""

    device = "cuda"

    def generator(self, seed):
        return torch.Generator(device=self.device).manual_seed(seed)

    def randn(self, *shape, generator):
        return torch.randn(*shape, generator=generator, device=self.device)

    def small_flux_vae(self, seed):
        """A Flux-style diffusers AutoencoderKL (64-128 channels, 2 layers a block, 16 latent channels, 32 groups),
        float32, seeded, in eval mode on the device; the test skips without diffusers."""
        try:
            from diffusers import AutoencoderKL
        except ImportError:
            self.skipTest("diffusers is not installed")
        torch.manual_seed(seed)
        config = dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                      block_out_channels=(64, 128, 128, 128), layers_per_block=2, latent_channels=16,
                      norm_num_groups=32, use_quant_conv=False, use_post_quant_conv=False)
        return AutoencoderKL(**config).to(self.device).eval()


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestInputBias(SeededCuda, unittest.TestCase):
    """input_bias (a convolution's bias handed over): every call with it gives the bits of the same call on x +
    input_bias as PyTorch computes that sum in x's dtype; the swap's moved biases in a decoder."""

    def test_bits_equal_the_call_on_the_sum(self):
        # Small shapes (the fused path's without a bias: a biased call takes the split path) and large ones.
        shapes = [((2, 64, 12, 10), 32), ((3, 96, 7), 3), ((1, 64, 4, 6, 5), 16), ((4, 32), 8),
                  ((1, 512, 64, 64), 32), ((2, 128, 96, 96), 32), ((1, 64, 8, 64, 64), 32)]
        generator = self.generator(21)
        cases = 0
        for shape, groups in shapes:
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                x = (3 * self.randn(*shape, generator=generator) + 1).to(dtype)
                input_bias = (2 * self.randn(shape[1], generator=generator)).to(dtype)
                other = (2 * self.randn(shape[1], generator=generator)).to(dtype)
                weight = 1 + 0.5 * self.randn(shape[1], generator=generator)
                bias = 0.5 * self.randn(shape[1], generator=generator)
                layouts = {"contiguous": x, "channels_last": channels_last(x)} if x.dim() >= 3 else {"contiguous": x}
                for layout, v in layouts.items():
                    for activation in ("silu", None):
                        with self.subTest(shape=shape, dtype=dtype, layout=layout, activation=activation):
                            got = gnsilu.group_norm(v, groups, weight, bias, 1e-6, activation, input_bias=input_bias)
                            expected = gnsilu.group_norm(with_input_bias(v, input_bias), groups, weight, bias, 1e-6,
                                                         activation)
                            self.assertTrue(same_bits(got, expected))
                            self.assertEqual(got.stride(), torch.empty_like(v).stride())
                            # The same key again (the fast path) with another input bias, then without one.
                            again = gnsilu.group_norm(v, groups, weight, bias, 1e-6, activation, input_bias=other)
                            self.assertTrue(same_bits(again, gnsilu.group_norm(
                                with_input_bias(v, other), groups, weight, bias, 1e-6, activation)))
                            plain = gnsilu.group_norm(v, groups, weight, bias, 1e-6, activation)
                            self.assertFalse(same_bits(plain, got))
                            cases += 1
                    wide = gnsilu.group_norm_silu(v, groups, weight, bias, 1e-6, out_dtype=torch.float32,
                                                  input_bias=input_bias)
                    self.assertTrue(same_bits(wide, gnsilu.group_norm_silu(
                        with_input_bias(v, input_bias), groups, weight, bias, 1e-6, out_dtype=torch.float32)))
        SUMMARY.append(("ib", "input_bias == the call on x + b", f"{cases} cases bit-identical (small and large "
                                                                 "shapes, 3 dtypes, both layouts)"))

    def test_padded_regions_strided_and_the_ops(self):
        from gnsilu import _strided
        generator = self.generator(22)
        for shape, pad in (((1, 64, 3, 40, 64), (1, 1, 1, 1, 2, 0)), ((1, 96, 30, 50), (1, 1, 1, 1))):
            x = (3 * self.randn(*shape, generator=generator) + 100).to(torch.bfloat16)
            input_bias = (5 * self.randn(shape[1], generator=generator)).to(torch.bfloat16)
            weight, bias = self.randn(shape[1], generator=generator), self.randn(shape[1], generator=generator)
            for fmt in (torch.contiguous_format, torch.channels_last if len(shape) == 4 else torch.channels_last_3d):
                v = x.contiguous(memory_format=fmt)
                for mode in ("replicate", "constant"):
                    with self.subTest(shape=shape, format=fmt, mode=mode):
                        got = gnsilu.group_norm(v, 32, weight, bias, pad=pad, pad_mode=mode, input_bias=input_bias)
                        expected = gnsilu.group_norm(with_input_bias(v, input_bias), 32, weight, bias, pad=pad,
                                                     pad_mode=mode)
                        self.assertTrue(same_bits(got, expected))
                        op = torch.ops.gnsilu.group_norm_padded(v, 32, weight, bias, 1e-6, "silu", list(pad), mode,
                                                                0.0, None, input_bias)
                        self.assertTrue(same_bits(op, expected))
                unpadded = torch.ops.gnsilu.group_norm(v, 32, weight, bias, 1e-6, "silu", None, input_bias)
                self.assertTrue(same_bits(unpadded, gnsilu.group_norm(with_input_bias(v, input_bias), 32, weight,
                                                                      bias)))
        # Regions: records of tiles with the input bias, merged, applied with it: the whole call's bits.
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for fmt in (torch.contiguous_format, torch.channels_last):
                x = (3 * self.randn(2, 64, 48, 40, generator=generator) + 1).to(dtype).contiguous(memory_format=fmt)
                input_bias = (2 * self.randn(64, generator=generator)).to(dtype)
                w, b = self.randn(64, generator=generator), self.randn(64, generator=generator)
                with self.subTest(regions=dtype, format=fmt):
                    whole = gnsilu.group_norm_silu(with_input_bias(x, input_bias), 16, w, b)
                    tiles = [x[:, :, :20, :17], x[:, :, :20, 17:], x[:, :, 20:, :], x[:, :, 48:, :]]
                    merged = gnsilu.merge_stats(*[gnsilu.group_stats(t, 16, input_bias=input_bias) for t in tiles])
                    self.assertTrue(same_bits(gnsilu.group_norm_apply(x, merged, w, b, input_bias=input_bias), whole))
                    part = gnsilu.group_norm_apply(tiles[1], merged, w, b, input_bias=input_bias)
                    self.assertTrue(same_bits(part, whole[:, :, :20, 17:]))
        # The strided orders (gnsilu._strided: per-piece records with the input bias, plane biases for channels first).
        with mock.patch.object(_strided, "MIN_BYTES", 0):
            for view, stored in ((lambda d: d.transpose(1, 2), (2, 3, 64, 10, 12)),
                                 (lambda d: d.transpose(1, 2)[0], (1, 64, 3, 10, 12))):
                x = view((3 * self.randn(*stored, generator=generator) + 1).to(torch.bfloat16))
                input_bias = (2 * self.randn(64, generator=generator)).to(torch.bfloat16)
                with self.subTest(strided=_strided.plan(x)):
                    got = _strided.group_norm(torch, x, 16, None, None, 1e-6, "silu", input_bias=input_bias)
                    expected = gnsilu.group_norm_silu(with_input_bias(x, input_bias).contiguous(), 16)
                    self.assertTrue(same_bits(got.contiguous(), expected))
                    op = torch.ops.gnsilu.group_norm(x, 16, None, None, 1e-6, "silu", None, input_bias)
                    self.assertTrue(same_bits(op.contiguous(), expected))
        if self.device == "cuda":
            x = self.randn(2, 64, 12, 10, generator=generator).to(torch.bfloat16)
            samples = [(x, 8, None, None, 1e-6, "silu", None, x[0, :, 0, 0].clone()),
                       (channels_last(x), 8, None, None, 1e-6, "none", torch.float32, x[1, :, 0, 0].clone())]
            for args in samples:
                result = torch.library.opcheck(torch.ops.gnsilu.group_norm.default, args)
                self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)
        SUMMARY.append(("ib", "input_bias: padded, regions, strided orders, the ops", "bit-identical to x + b"))

    def test_nan_and_inf(self):
        """An Inf in x plus -Inf in its channel's input bias: NaN (in that group); +Inf biases a channel to Inf: the
        bits of the call on PyTorch's x + b, NaN where it has NaN."""
        generator = self.generator(23)
        for shape in ((2, 64, 12, 10), (1, 512, 64, 64)):  # fused, split
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                for layout in ("contiguous", "channels_last"):
                    x = self.randn(*shape, generator=generator).to(dtype)
                    x[0, 5, 3, 4] = float("inf")
                    input_bias = self.randn(shape[1], generator=generator).to(dtype)
                    input_bias[5] = float("-inf")  # inf + -inf: NaN in sample 0, group 2; -inf elsewhere in ch. 5
                    input_bias[40] = float("inf")
                    v = channels_last(x) if layout == "channels_last" else x
                    total = with_input_bias(v, input_bias)
                    with self.subTest(shape=shape, dtype=dtype, layout=layout):
                        self.assertTrue(torch.isnan(total).any())
                        for activation in ("silu", None):
                            got = gnsilu.group_norm(v, 32, activation=activation, input_bias=input_bias)
                            expected = gnsilu.group_norm(total, 32, activation=activation)
                            self.assertTrue(same_bits_or_nan(got, expected))
                            self.assertTrue(torch.isnan(got).any() and not torch.isnan(got).all())
        SUMMARY.append(("ib", "input_bias with Inf and NaN", "the bits of the call on x + b, NaN where it has NaN"))

    def decoders(self, layout, seed):
        """(float32 reference, bf16 original, swapped with biases moved, swapped without, counts, counts without)
        of a Flux-like toy decoder."""
        torch.manual_seed(seed)
        decoder = toy_models.FluxLikeDecoder(block_out_channels=(64, 128, 128, 128), layers_per_block=1)
        decoder = decoder.to(self.device).eval()
        if layout == "channels_last":
            decoder = decoder.to(memory_format=torch.channels_last)
        reference = copy.deepcopy(decoder)
        original = decoder.to(torch.bfloat16)
        moved, kept = copy.deepcopy(original), copy.deepcopy(original)
        counts = gt.swap_group_norm_silu(moved, return_counts=True)
        kept_counts = gt.swap_group_norm_silu(kept, return_counts=True, move_bias=False)
        return reference, original, moved, kept, counts, kept_counts

    def test_swapped_decoder_with_moved_biases(self):
        for layout in ("contiguous", "channels_last"):
            reference, original, moved, kept, counts, kept_counts = self.decoders(layout, 24)
            resnets = sum(isinstance(m, toy_models.ResnetBlock2D) for m in moved.modules())
            self.assertEqual(counts, (toy_models.expected_swaps(moved), 1, 0, resnets))
            self.assertEqual(kept_counts, (toy_models.expected_swaps(kept), 1, 0, 0))
            latent = self.randn(1, 16, 32, 32, generator=self.generator(25))
            if layout == "channels_last":
                latent = channels_last(latent)
            handed = []
            taken = gt._handed_bias

            def recording(norm, input):
                bias = taken(norm, input)
                handed.append(bias is not None)
                return bias
            with self.subTest(layout=layout), torch.inference_mode():
                exact = reference(latent)
                before = original(latent.bfloat16())
                without = kept(latent.bfloat16())
                with mock.patch.object(gt, "_handed_bias", recording):
                    after = moved(latent.bfloat16())
                self.assertEqual(sum(handed), resnets)  # every conv1 left its bias to its norm2, on gnsilu
                before, after, without = before.float(), after.float(), without.float()
                relative = relative_l2(after, before)
                to_without = relative_l2(after, without)
                before_error, after_error = relative_l2(before, exact.float()), relative_l2(after, exact.float())
                # The existing tolerance of the swap (TestDecoder): no further than the bf16 decoder's own noise.
                self.assertLess(relative, 2 * before_error)
                self.assertLess(to_without, 2 * before_error)
                self.assertLessEqual(after_error, 1.25 * before_error + 1e-3)
                if self.device == "cuda":
                    torch._dynamo.reset()
                    compiled = torch.compile(moved, fullgraph=True)(latent.bfloat16()).float()
                    drift = relative_l2(compiled, after)
                    self.assertLess(drift, max(relative, 1e-2))
                    eager_ms = median_ms(lambda: moved(latent.bfloat16()), 9)
                    kept_ms = median_ms(lambda: kept(latent.bfloat16()), 9)
                else:
                    drift = eager_ms = kept_ms = 0.0
                SUMMARY.append(("ib", f"decoder, {layout}: {resnets} conv1 biases moved",
                                f"relative L2 to PyTorch {relative:.2e}, to the swap without the move "
                                f"{to_without:.2e}; to float32 before {before_error:.2e}, after {after_error:.2e}; "
                                f"compiled drift "
                                f"{drift:.2e}; eager {kept_ms:.3f} ms -> {eager_ms:.3f} ms"))

    def test_diffusers_flux_vae_decode(self):
        vae = self.small_flux_vae(26)
        reference = copy.deepcopy(vae)
        original = vae.to(torch.bfloat16).to(memory_format=torch.channels_last)
        moved = copy.deepcopy(original)
        counts = gt.swap_group_norm_silu(moved, return_counts=True)
        decoder_resnets = [m for m in moved.decoder.modules() if type(m).__name__ == "ResnetBlock2D"]
        self.assertEqual(len(decoder_resnets), 14)
        self.assertTrue(all(isinstance(m.conv1, gt._BiasMovingConv) for m in decoder_resnets))
        self.assertEqual(counts.biases_moved, 24)  # and the encoder's 10
        latent = channels_last(self.randn(1, 16, 32, 32, generator=self.generator(27)))
        with torch.inference_mode():
            exact = reference.decode(latent).sample.float()
            before = original.decode(latent.bfloat16()).sample.float()
            after = moved.decode(latent.bfloat16()).sample.float()
        relative, before_error = relative_l2(after, before), relative_l2(before, exact)
        after_error = relative_l2(after, exact)
        self.assertLess(relative, 2 * before_error)
        self.assertLessEqual(after_error, 1.25 * before_error + 1e-3)
        SUMMARY.append(("ib", "diffusers Flux-style AutoencoderKL decode, 24 biases moved",
                        f"relative L2 {relative:.2e}; to float32 before {before_error:.2e}, after {after_error:.2e}"))


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestBoundedDecode(SeededCuda, unittest.TestCase):
    """gnsilu.bounded on the device (python/tests/test_bounded.py holds the CPU tests: plans, refusals, bits)."""

    def test_attention_by_query_chunks_within_rounding(self):
        """The mid block's attention with a head of 512 (the Flux VAE's), as gnsilu.bounded takes it on the device:
        queries in chunks of matrix products with FP32 scores and softmax (gnsilu.chunked._attention_by_query_chunks).
        In bf16 and fp16 its distance to the float64 attention is within 1.5x that of the module's own call
        (scaled_dot_product_attention), with one chunk and with several."""
        try:
            from diffusers.models.attention_processor import Attention
        except ImportError:
            self.skipTest("diffusers is not installed")
        import gnsilu.chunked as gc
        torch.manual_seed(30)
        attn = Attention(512, heads=1, dim_head=512, rescale_output_factor=1.0, eps=1e-6, norm_num_groups=32,
                         residual_connection=True, bias=True, upcast_softmax=True,
                         _from_deprecated_attn_block=True).to(self.device).eval()
        self.assertTrue(gc._frame_attention_plain(attn) and gc._wide_heads(attn))
        # gnsilu.bounded takes the chunks only where torch.bmm gives FP32 products of 16-bit matrices.
        self.assertTrue(gc._fp32_products(torch.ones(1, device=self.device, dtype=torch.bfloat16)))
        # and scales them in the product's epilogue where torch.baddbmm takes out_dtype and out= (else bmm, then a pass)
        for dtype in (torch.bfloat16, torch.float16):
            self.assertTrue(gc._scaled_fp32_products_on(self.device, dtype), f"{dtype}: baddbmm's scaled FP32 products")
        x = self.randn(1, 512, 48, 40, generator=self.generator(31)) * 2 + 0.5
        with torch.inference_mode():
            truth = attn.double()(x.double())
            for dtype in (torch.bfloat16, torch.float16):
                model, xd = attn.to(dtype), x.to(dtype)
                own = relative_l2(model(xd).double(), truth)
                tokens = 48 * 40
                for score_bytes in (tokens * tokens * 10, tokens * 10 * 100):  # one chunk; chunks of 100 rows
                    chunked = gc._attention_by_query_chunks(model, xd, score_bytes)
                    self.assertEqual(chunked.dtype, dtype)
                    error = relative_l2(chunked.double(), truth)
                    self.assertLessEqual(error, 1.5 * own, f"{dtype}, {score_bytes} bytes: {error:.3g} vs {own:.3g}")
                    SUMMARY.append(("bd", f"attention by query chunks, {dtype}, {score_bytes} score bytes",
                                    f"relative L2 to float64 {error:.2e} (the module's own {own:.2e})"))

    def test_bounded_decode_in_a_gpu_budget(self):
        """gnsilu.bounded on the device: a Flux-style AutoencoderKL (swapped, bf16, both layouts) decoded within
        budgets from a third of the whole decode's down to the smallest that works (at a fifth, host activations keep
        their first rows on the GPU; at a sixth and below, conv1 outputs are recomputed): within rounding of the whole
        decode, as near the float32 decode as the whole bf16 decode, every host row fetched ahead of its slab (the
        copy streams), and the allocator's peak within the budget plus the weights."""
        import gnsilu.bounded as gb
        vae = self.small_flux_vae(28)
        latent = self.randn(1, 16, 48, 48, generator=self.generator(29))
        with torch.inference_mode():
            exact = vae.decode(latent).sample.float()
        swapped = vae.to(torch.bfloat16)
        gt.swap_group_norm_silu(swapped)
        weights = sum(t.numel() * t.element_size() for t in swapped.parameters())
        for layout in ("nchw", "channels_last"):
            model, z = swapped, latent.bfloat16()
            if layout == "channels_last":
                model, z = swapped.to(memory_format=torch.channels_last), channels_last(z)
            with torch.inference_mode():
                whole = model.decode(z).sample.float()
            whole_error = relative_l2(whole, exact)
            recomputing = keeping = 0
            # On CUDA the budget counts the device's memory outside PyTorch's allocator (Plan.outside_bytes), which
            # grew by 72 MiB on an H100 in the first layered decode: the warm-up's (a layered decode of a 4x4 corner)
            # is run first, so that the plans below count it; it runs once a model, dtype and layout.
            if self.device == "cuda":
                self.assertTrue(gb.warm_up(model, z), layout)
                self.assertFalse(gb.warm_up(model, z), layout)
            for share in (3, 5, 6, None):
                # Each budget is taken above what is outside now.
                top = gb.plan(model, z, 1 << 40)
                try:
                    gb.plan(model, z, 1 << 10)
                    raise AssertionError("a 1 KiB budget was taken")
                except ValueError as e:
                    smallest = int(str(e).split("max_gpu_bytes=")[2].split(" ")[0])
                budget = smallest if share is None else max(smallest, top.outside_bytes + top.plain_gpu_bytes // share)
                p = gb.plan(model, z, budget)
                self.assertFalse(p.plain)
                recomputed = [a for a in p.activations.values() if a.where == "recomputed"]
                recomputing += bool(recomputed)
                kept = [a for a in p.activations.values() if a.gpu_rows]  # host activations' first rows on the GPU
                keeping += bool(kept)
                if self.device == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                with torch.inference_mode():
                    y = gb.decode(model, z, budget, progress=False)
                if self.device == "cuda":
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated() - base
                    # The activations the caller holds (latents, weights) are in `base`; the budget is besides them,
                    # and holds the memory outside the allocator as the plan found it.
                    self.assertLessEqual(peak, budget - p.outside_bytes,
                                         f"{layout}, budget {budget}: peak {peak}, outside {p.outside_bytes}")
                    # What the decode added outside the allocator after its plan (library handles, module loads):
                    # measured, for the plan's outside_bytes to be judged by (Plan's docstring).
                    after = gb._outside_allocator_bytes(torch.device(self.device))
                    SUMMARY.append(("bd", f"bounded decode, {layout}, budget {budget}: outside the allocator",
                                    f"planned {p.outside_bytes}, after the decode {after} "
                                    f"({(after - p.outside_bytes) / 2**20:+.1f} MiB)"))
                y = y.to(self.device).float()
                counts = gb.last_counts()
                self.assertEqual(counts["fetched_late"], 0, counts)
                self.assertEqual(counts["fetched_unused"], 0, counts)
                timeline = gb.last_timeline()
                self.assertEqual([t["layer"] for t in timeline], [layer.name for layer in p.layers])
                for t in timeline:  # the events were read: every time on the GPU's clock, none negative
                    self.assertTrue(t["compute_ms"] > 0, t)
                    self.assertGreaterEqual(t["store_tail_ms"], 0, t)
                to_whole, error = relative_l2(y, whole), relative_l2(y, exact)
                self.assertLess(to_whole, whole_error)
                self.assertLessEqual(error, 1.05 * whole_error + 1e-4)
                SUMMARY.append(("bd", f"bounded decode, {layout}, budget {budget} ({p.slabs} slabs, host "
                                      f"{p.host_bytes} bytes, {len(recomputed)} recomputed, {len(kept)} with rows kept "
                                      f"on the GPU, weights {weights})",
                                f"to the whole decode {to_whole:.2e}; to float32 {error:.2e} (whole {whole_error:.2e}); "
                                f"host rows fetched ahead {counts['fetched_ahead']}"))
            self.assertGreater(recomputing, 0, f"{layout}: no budget recomputed a resnet block's conv1 output")
            self.assertGreater(keeping, 0, f"{layout}: no budget kept a host activation's first rows on the GPU")


@unittest.skipUnless(CUDA, "PyTorch with a CUDA device is needed")
class TestInductorPass(unittest.TestCase):
    """gnsilu's graph pass (gnsilu.torch.enable_inductor_pass) in torch.compile on the device: each replaced
    GroupNorm's output bits equal gnsilu's eager call (plain, padded, after a convolution's bias), in both layouts;
    a block compiled with the pass within rounding of the block compiled without it.
    python/tests/test_inductor_pass.py holds the CPU tests (matches, decisions, cache keys)."""

    @staticmethod
    @contextlib.contextmanager
    def compiled_with_pass():
        from gnsilu import _inductor_pass as ip
        p = ip.GnsiluPass()
        torch._dynamo.reset()
        min_bytes, ip.MIN_BYTES = ip.MIN_BYTES, 0  # the cases' tensors are below it (under 1 MiB)
        try:
            with torch._inductor.config.patch(pre_grad_custom_pass=p), torch.no_grad():
                yield p
        finally:
            ip.MIN_BYTES = min_bytes
        torch._dynamo.reset()

    def test_replaced_group_norms_give_the_eager_bits(self):
        torch.manual_seed(31)
        weight = torch.rand(128, device="cuda") + 0.5
        bias = torch.randn(128, device="cuda") * 0.5
        conv = nn.Conv2d(64, 128, 3, padding=1).cuda().to(torch.bfloat16)

        def plain(x):
            return F.silu(F.group_norm(x, 32, weight, bias, 1e-6))

        def padded(x):
            return F.pad(F.silu(F.group_norm(x, 32, weight, bias, 1e-6)), (1, 1, 1, 1), mode="replicate")

        def no_affine(x):
            return F.group_norm(x, 32, None, None, 1e-5)

        def after_conv(h):
            return F.silu(F.group_norm(conv(h), 32, weight, bias, 1e-6))

        rows = 0
        for layout in ("contiguous", "channels_last"):
            x = (torch.randn(2, 128, 40, 36, device="cuda") * 2 + 3).bfloat16()
            h = torch.randn(2, 64, 40, 36, device="cuda").bfloat16()
            if layout == "channels_last":
                x, h = channels_last(x), channels_last(h)
            expected = {
                "plain": gnsilu.group_norm_silu(x, 32, weight, bias, 1e-6),
                "padded": F.pad(gnsilu.group_norm_silu(x, 32, weight, bias, 1e-6), (1, 1, 1, 1), mode="replicate"),
                "no_affine": gnsilu.group_norm(x, 32, None, None, 1e-5, None),
            }
            cases = (("plain", plain, x, {"replaced": 1, "padded": 0}),
                     ("padded", padded, x, {"replaced": 1, "padded": 1}),
                     ("no_affine", no_affine, x, {"replaced": 1, "padded": 0}))
            for name, f, arg, counts in cases:
                with self.subTest(layout=layout, case=name), self.compiled_with_pass() as p:
                    y = torch.compile(f, fullgraph=True)(arg)
                    self.assertEqual({k: p.counts[k] for k in counts}, counts, p.counts)
                    self.assertTrue(same_bits(y, expected[name]), f"{layout} {name}")
                    rows += 1
            with self.subTest(layout=layout, case="after a convolution's bias"), torch.no_grad():
                # The bits of gnsilu's op given the convolution without its bias and the bias as its input bias.
                with self.compiled_with_pass() as p:
                    y = torch.compile(after_conv, fullgraph=True)(h)
                    self.assertEqual(p.counts["input_bias"], 1, p.counts)
                c = F.conv2d(h, conv.weight, None, conv.stride, conv.padding)
                eager = torch.ops.gnsilu.group_norm(c, 32, weight, bias, 1e-6, "silu", None, conv.bias)
                self.assertTrue(same_bits(y, eager), layout)
                torch._dynamo.reset()
                unpassed = torch.compile(after_conv, fullgraph=True)(h)
                self.assertLess(relative_l2(y, unpassed), 1e-2)
                rows += 1
        SUMMARY.append(("ip", "Inductor pass: plain, padded, no affine, input bias; both layouts",
                        f"{rows}/8 compiled outputs with gnsilu's eager bits"))


if __name__ == "__main__":
    sys.exit(main())
