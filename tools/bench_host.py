"""Host time of one gnsilu call from Python on a resolved key: N calls queued back to back, per-call time printed.

    GNSILU_LIBRARY=build/libgnsilu.so python3 tools/bench_host.py [--calls 10000] [--shape 1,640,64,64]

The calls are queued in batches, each behind a sleep kernel (torch.cuda._sleep) longer than the batch takes to
queue, so that the GPU never catches up and the launch queue never fills: the wall clock of the loop is the host
time; the stream is synchronised between batches, outside the timing. Rows: gnsilu.group_norm_silu (the
function, without and with out=), GroupNormSiLU (the module, eager), the op torch.ops.gnsilu.group_norm through the dispatcher, and
PyTorch's F.silu(F.group_norm(...)) for comparison; in both layouts. Then the function's breakdown: its C call alone
(gnsilu_group_norm through ctypes with a problem built once: the library's host work and launches), the function
with that C call made a no-op (the Python around it, plus about 0.3 us of the swap that stubs it), and for scale
torch.empty_like(x) and one PyTorch elementwise kernel. Also the GPU time of one call (CUDA events)
to show that small activations were host-bound. Last, the op on inputs in neither layout that gnsilu._strided takes
(a video's frames as a batch, and frames first), against the checked path that every such call took before.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def _stubbed(entry, call):
    """call() with entry's C function replaced by a no-op for its duration: the Python around the C call."""
    def run():
        function, entry.function = entry.function, _noop
        try:
            return call()
        finally:
            entry.function = function
    return run


def _noop(*args):
    return 0


def _gpu_us(torch, call):
    """GPU time of one call (CUDA events over 100 calls), after 20 that resolve the key and fill the fast path."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / 100


def _host_us(torch, call, calls, batch):
    """Host time of one call, the median over batches of `batch` calls, each batch queued behind a sleep kernel
    longer than the batch takes to queue (100 us a call), so that the GPU never catches up and the launch queue never
    fills: the host time of the loop is what perf_counter measures. Synchronised between batches, not timed."""
    call()
    per_call = []
    for _ in range(max(1, calls // batch)):
        torch.cuda._sleep(int(batch * 100 * 2000))  # cycles, at about 2 GHz
        begin = time.perf_counter()
        for _ in range(batch):
            call()
        per_call.append((time.perf_counter() - begin) / batch * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=250, help="calls queued behind one sleep kernel")
    parser.add_argument("--shape", default="1,640,64,64")
    parser.add_argument("--groups", type=int, default=32)
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F
    import gnsilu
    import gnsilu.torch as gt
    from gnsilu import _lib, _torch_adapter
    if not torch.cuda.is_available():
        print("bench_host: no CUDA device")
        return 77
    shape = tuple(int(s) for s in args.shape.split(","))
    channels = shape[1]
    module = gt.GroupNormSiLU(args.groups, channels, eps=1e-6).cuda().to(torch.bfloat16)
    weight, bias = module.weight, module.bias
    print(f"gnsilu {gnsilu.version()}, PyTorch {torch.__version__}, {torch.cuda.get_device_name()}; x {shape} "
          f"bf16, G={args.groups}; {args.calls} queued calls in batches of "
          f"{args.batch}, median over the batches")
    print(f"{'layout':14} {'call':32} {'host us/call':>12} {'GPU us/call':>12}")
    for layout in ("contiguous", "channels_last"):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        if layout == "channels_last":
            x = x.to(memory_format=torch.channels_last)
        y_out = torch.empty_like(x)
        calls = {
            "gnsilu.group_norm_silu": lambda: gnsilu.group_norm_silu(x, args.groups, weight, bias, 1e-6),
            "gnsilu.group_norm_silu(out=y)": lambda: gnsilu.group_norm_silu(x, args.groups, weight, bias, 1e-6,
                                                                             out=y_out),
            "GroupNormSiLU (module)": lambda: module(x),
            "torch.ops.gnsilu.group_norm": lambda: torch.ops.gnsilu.group_norm(x, args.groups, weight, bias, 1e-6),
            "F.silu(F.group_norm) (PyTorch)": lambda: F.silu(F.group_norm(x, args.groups, weight, bias, 1e-6)),
        }
        # The breakdown of the function's time: its C call alone (a problem built once, the library's entry point
        # called through ctypes: the library's host work and its launches), the function with that C call replaced
        # by a no-op (the Python around it), and two PyTorch pieces for scale.
        with torch.inference_mode():
            gnsilu.group_norm_silu(x, args.groups, weight, bias, 1e-6)  # fills the fast path's entry
        entry = next(e for k, e in _torch_adapter._fast_calls.items() if k[1] == x.shape and k[2] == x.stride())
        y = torch.empty_like(x)
        problem = _lib.Problem.from_buffer_copy(entry.template)
        problem.x, problem.y, problem.weight, problem.bias = x.data_ptr(), y.data_ptr(), weight.data_ptr(), \
            bias.data_ptr()
        stream = torch.cuda.current_stream().cuda_stream
        calls["C call alone (ctypes, built once)"] = lambda: entry.function(ctypes.byref(problem), None, 0, stream)
        calls["function, C call a no-op"] = _stubbed(entry, lambda: gnsilu.group_norm_silu(x, args.groups, weight,
                                                                                              bias, 1e-6))
        calls["torch.empty_like(x) (PyTorch)"] = lambda: torch.empty_like(x)
        calls["y.add_(1) (one PyTorch kernel)"] = lambda: y.add_(1)
        with torch.inference_mode():
            for name, call in calls.items():
                print(f"{layout:14} {name:32} {_host_us(torch, call, args.calls, args.batch):12.2f} "
                      f"{_gpu_us(torch, call):12.2f}", flush=True)
    # Inputs in neither layout that gnsilu._strided takes without a copy (the frames of a video as a batch: Mochi's
    # and Magvit's per-frame GroupNorm; frames first: upsamplers' permutes), here small (MIN_BYTES lowered) since
    # the host's work does not depend on the size: the op (the fast path from the second call) against the checked
    # path every call took before. Five launches a call: batches of a fifth.
    from gnsilu import _strided
    _strided.MIN_BYTES = 0
    frames = 4
    spatial = tuple(max(1, s // 2) for s in shape[2:])
    strided = {"channels first": torch.randn((1, channels, frames) + spatial, device="cuda",
                                             dtype=torch.bfloat16).transpose(1, 2)[0],
               "frames first": torch.randn((1, frames, channels) + spatial, device="cuda",
                                           dtype=torch.bfloat16).transpose(1, 2)}
    for order, xs in strided.items():
        assert _strided.plan(xs) is not None
        calls = {"torch.ops.gnsilu.group_norm": lambda: torch.ops.gnsilu.group_norm(xs, args.groups, weight, bias,
                                                                                      1e-6),
                 "the checked path (every call)": lambda: _strided._checked(torch, xs, args.groups, weight, bias,
                                                                           1e-6, "silu", None, None,
                                                                           _strided.plan(xs), None)}
        with torch.inference_mode():
            for name, call in calls.items():
                print(f"{order:14} {name:32} {_host_us(torch, call, args.calls // 5, args.batch // 5):12.2f} "
                      f"{_gpu_us(torch, call):12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
