#!/usr/bin/env python3
"""gnsilu against its peers: speed and precision of y = silu(group_norm(x, 32, w, b, 1e-6)) on one GPU.

    python3 tools/bench_peers.py [--quick] [--json FILE] [--runs N] [--dtypes bf16,fp16] [--batches 1,4]
                                 [--no-compile] [--layouts nchw,nhwc] [--preset flux|layouts] [--shapes NxCxHxW,...]

Needs PyTorch with a CUDA device (and Triton for torch.compile); gnsilu comes from python/ in this checkout
(libgnsilu.so: $GNSILU_LIBRARY, else build/). Each row is one activation of x. Two kinds of shape:
  - the inputs of the Flux VAE decoder's GroupNorms at a 1024x1024 output: 512x128x128, 512x256x256,
    512x512x512, 256x1024x1024 and 128x1024x1024;
  - small activations of 1, 4 and 16 MiB in 16 bits: 128x64x64, 256x64x128 and 128x256x256.
Each shape runs for N = 1 and 4, in bf16 and fp16. --preset layouts takes instead the layouts benchmark's
shapes (docs/PERFORMANCE.md: channel counts 128 to 1280 with 32 groups, N = 1 and 4, 4-D and 5-D video,
1 MiB to 1 GiB; N included, so --batches is ignored), --shapes any list. Each row runs in every layout of
--layouts (default both): nchw (contiguous) and nhwc (torch.channels_last, channels_last_3d for 5-D); every
method then gets x in that memory format (gnsilu takes channels-last tensors as they are and returns y in
x's format; PyTorch's ops and torch.compile run on the same channels-last tensors). These are timed:
  copy          y.copy_(x) into a preallocated y: the floor (read and write the same bytes once)
  gnsilu        gnsilu.group_norm_silu(x, 32, w, b, eps), tuned (its first call, untimed, tunes the shape)
  torch fp32    F.silu(F.group_norm(x.float(), 32, w, b, eps)).to(dtype): the usual mixed-precision path
  torch 16-bit  F.silu(F.group_norm(x, 32, w.to(dtype), b.to(dtype), eps)): PyTorch's native kernels
  compiled      torch.compile(dynamic=False) of the fp32 expression, warmed up (one recompile per shape)
Timing: CUDA events around the operation only, median of --runs runs. Before each run the L2 is flushed by writing
a 256 MiB buffer (outside the events), and x rotates among up to 8 distinct tensors (as many as fit in 4 GiB).
Precision: each method's output on the same x, compared with the float64 result (PyTorch in float64 on the GPU)
rounded once to the dtype. w and b are multiples of 1/64, so every path sees the same exact parameters.
torch's own float64 -> bfloat16/float16 cast goes through float32, rounding twice; it is not used for the
reference, and the JSON counts where it differs. A method that fails (out of memory, a compiler error) is left
out of its row with a note; out of memory while allocating the inputs skips the row.
The results are a Markdown table on stdout and, with --json, a JSON file (rewritten after each row, so that a run
cut short keeps its rows). The defaults (32 rows) take a few minutes on an H200, mostly torch.compile; --quick
runs 3 shapes, bf16, N = 1.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

GROUPS = 32
EPS = 1e-6
FLUSH_BYTES = 256 << 20
ROTATION_BYTES = 4 << 30
MAX_ROTATION = 8
FLUX_SHAPES = [(512, 128, 128), (512, 256, 256), (512, 512, 512), (256, 1024, 1024), (128, 1024, 1024)]
SMALL_SHAPES = [(128, 64, 64), (256, 64, 128), (128, 256, 256)]  # 1, 4 and 16 MiB at N = 1 in 16 bits
QUICK_SHAPES = [(512, 128, 128), (128, 1024, 1024), (256, 64, 128)]
# The layouts benchmark (tools/gnsilu_bench.cpp: kLayoutShapes), N included.
LAYOUT_SHAPES = [(1, 128, 64, 64), (1, 512, 64, 64), (4, 128, 64, 64), (1, 512, 128, 128), (1, 320, 128, 128),
                 (1, 640, 64, 64), (1, 1280, 64, 64), (1, 512, 256, 256), (4, 320, 128, 128), (1, 256, 512, 512),
                 (1, 128, 1024, 1024), (4, 512, 256, 256), (1, 1280, 128, 128), (1, 256, 1024, 1024),
                 (4, 128, 1024, 1024), (1, 128, 9, 360, 640), (1, 256, 5, 180, 320)]
METHODS = ["copy", "gnsilu", "torch fp32", "torch 16-bit", "compiled"]


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 shapes, bf16, N = 1")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--runs", type=int, default=21, help="timed runs per method (median; default 21)")
    parser.add_argument("--dtypes", default="bf16,fp16", help="comma-separated: bf16, fp16 (default both)")
    parser.add_argument("--batches", default="1,4", help="comma-separated N (default 1,4)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--layouts", default="nchw,nhwc", help="comma-separated: nchw, nhwc (default both)")
    parser.add_argument("--preset", choices=["flux", "layouts"], default="flux",
                        help="flux: the Flux VAE's and small shapes x --batches; layouts: the layouts benchmark")
    parser.add_argument("--shapes", help="comma-separated NxCx... shapes (N included), instead of a preset")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def import_gnsilu():
    try:
        import gnsilu
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
        import gnsilu
    return gnsilu


class Bench:
    def __init__(self, torch, gnsilu, args):
        self.torch = torch
        self.F = torch.nn.functional
        self.gnsilu = gnsilu
        self.runs = args.runs
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.formats = {torch.bfloat16: (8, -126), torch.float16: (11, -14)}
        self.generator = torch.Generator(device="cuda").manual_seed(0)
        self.compiled = {} if args.no_compile else self._compile_functions()

    def _compile_functions(self):
        import torch._dynamo
        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 1024))
        return {dtype: self.torch.compile(self._fp32_path(dtype), dynamic=False) for dtype in self.formats}

    def _fp32_path(self, dtype):
        F = self.F

        def fp32_path(x, w, b):
            return F.silu(F.group_norm(x.float(), GROUPS, w, b, EPS)).to(dtype)
        return fp32_path

    # ---- precision ----------------------------------------------------------------------------------------------
    def correctly_rounded(self, exact, dtype):
        """float64 values rounded once to dtype, to nearest even (exact: the scaled values are integers or
        halves in float64, and the result is representable, so the final cast is exact)."""
        torch = self.torch
        bits, min_exponent = self.formats[dtype]
        _, exponent = torch.frexp(exact)
        quantum = torch.ldexp(torch.ones_like(exact), torch.clamp(exponent - 1, min=min_exponent) - (bits - 1))
        return (torch.round(exact / quantum) * quantum).to(dtype)

    def precision(self, x, w, b, outputs):
        """({method: fraction of outputs equal to the correctly rounded result}, double-cast mismatches)."""
        F = self.F
        equal = dict.fromkeys(outputs, 0)
        double_cast = 0
        for i in range(x.shape[0]):  # one sample at a time: the float64 tensors are 4x the input
            exact = F.silu(F.group_norm(x[i:i + 1].double(), GROUPS, w.double(), b.double(), EPS))
            expected = self.correctly_rounded(exact, x.dtype)
            double_cast += (exact.to(x.dtype) != expected).sum().item()
            for name, out in outputs.items():
                equal[name] += (out[i:i + 1] == expected).sum().item()
            del exact, expected
        return {name: count / x.numel() for name, count in equal.items()}, double_cast

    # ---- timing -----------------------------------------------------------------------------------------------
    def time_us(self, function, inputs):
        torch = self.torch
        for x in inputs:  # warm-up: every input once (compiles, caches, allocator)
            function(x)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.runs)]
        for i in range(self.runs):
            x = inputs[i % len(inputs)]
            self.flush.zero_()
            starts[i].record()
            function(x)
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(1000.0 * s.elapsed_time(e) for s, e in zip(starts, ends))

    def out_of_memory(self, error):
        oom = (self.torch.cuda.OutOfMemoryError, self.gnsilu.OutOfMemoryError)
        return isinstance(error, oom) or "out of memory" in str(error).lower()

    def memory_format(self, shape, layout):
        torch = self.torch
        if layout == "nchw":
            return torch.contiguous_format
        return torch.channels_last_3d if len(shape) == 5 else torch.channels_last

    def row(self, shape, dtype, layout="nchw"):
        """Times and scores every method on one shape, dtype and layout."""
        torch, F, gnsilu = self.torch, self.F, self.gnsilu
        torch.cuda.empty_cache()  # the previous row's tensors are gone: give their memory back
        numel = 1
        for s in shape:
            numel *= s
        size = numel * torch.tensor([], dtype=dtype).element_size()
        row = {"shape": "x".join(map(str, shape)), "dtype": str(dtype).replace("torch.", ""), "layout": layout,
               "bytes": size, "time_us": {}, "ratio_to_copy": {}, "correctly_rounded": {}, "notes": []}
        form = self.memory_format(shape, layout)
        try:
            count = max(1, min(MAX_ROTATION, ROTATION_BYTES // size))
            inputs = [torch.randn(shape, dtype=dtype, device="cuda", generator=self.generator)
                      .contiguous(memory_format=form) for _ in range(count)]
            channels = shape[1]
            w = torch.clamp(torch.round(64 * (1 + 0.25 * torch.randn(channels, device="cuda",
                                                                     generator=self.generator))), -255, 255) / 64
            b = torch.clamp(torch.round(64 * 0.25 * torch.randn(channels, device="cuda", generator=self.generator)),
                            -255, 255) / 64
            w16, b16 = w.to(dtype), b.to(dtype)
            destination = torch.empty_like(inputs[0])  # the same memory format: copy_ moves the same bytes
        except Exception as e:
            if not self.out_of_memory(e):
                raise
            row["notes"].append("skipped: out of memory allocating the inputs")
            torch.cuda.empty_cache()
            return row
        row["rotation"] = count
        functions = {
            "copy": lambda x: destination.copy_(x),
            "gnsilu": lambda x: gnsilu.group_norm_silu(x, GROUPS, w, b, EPS),
            "torch fp32": lambda x: F.silu(F.group_norm(x.float(), GROUPS, w, b, EPS)).to(dtype),
            "torch 16-bit": lambda x: F.silu(F.group_norm(x, GROUPS, w16, b16, EPS)),
        }
        if dtype in self.compiled:
            compiled = self.compiled[dtype]
            functions["compiled"] = lambda x: compiled(x, w, b)
        outputs = {}
        for name, function in functions.items():
            try:
                if name != "copy":
                    outputs[name] = function(inputs[0])  # gnsilu: its first call tunes; compiled: compiles
                    torch.cuda.synchronize()
                    if name == "gnsilu" and not outputs[name].is_contiguous(memory_format=form):
                        row["notes"].append("gnsilu: y did not come back in x's memory format")
                row["time_us"][name] = self.time_us(function, inputs)
            except Exception as e:  # a method that fails (out of memory, a compiler error) leaves the others
                outputs.pop(name, None)
                reason = "out of memory" if self.out_of_memory(e) else f"{type(e).__name__}: {str(e).splitlines()[0]}"
                row["notes"].append(f"{name}: {reason}")
                torch.cuda.empty_cache()
        try:
            row["correctly_rounded"], row["double_cast_mismatches"] = self.precision(inputs[0], w, b, outputs)
        except Exception as e:
            if not self.out_of_memory(e):
                raise
            row["notes"].append("precision: out of memory")
        copy = row["time_us"].get("copy")
        if copy:
            row["ratio_to_copy"] = {name: t / copy for name, t in row["time_us"].items()}
        return row


def markdown(rows, methods):
    timed = [m for m in methods if m != "copy"]
    header = ["shape", "dtype", "layout", "copy us"] + [f"{m} us (/copy)" for m in timed] + \
             ["correctly rounded: " + " / ".join(timed)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = [row["shape"], row["dtype"], row.get("layout", "nchw")]
        copy = row["time_us"].get("copy")
        cells.append(f"{copy:.1f}" if copy else "-")
        for m in timed:
            t = row["time_us"].get(m)
            ratio = row["ratio_to_copy"].get(m)
            cells.append("-" if t is None else f"{t:.1f} ({ratio:.2f}x)" if ratio else f"{t:.1f}")
        rounded = row["correctly_rounded"]
        cells.append(" / ".join(f"{100 * rounded[m]:.4f}%" if m in rounded else "-" for m in timed))
        lines.append("| " + " | ".join(cells) + " |")
        if row["notes"]:
            lines.append("| " + f"{row['shape']} {row['dtype']} {row.get('layout', 'nchw')}: " +
                         "; ".join(row["notes"]) + " |" + " |" * (len(header) - 1))
    return "\n".join(lines)


def layout_table(rows):
    """Each shape's gnsilu ratio to the copy in nhwc next to nchw (rows measured in the same run)."""
    by_key = {}
    for row in rows:
        ratio = row["ratio_to_copy"].get("gnsilu")
        if ratio:
            by_key.setdefault((row["shape"], row["dtype"]), {})[row.get("layout", "nchw")] = ratio
    lines = ["| shape | dtype | gnsilu nchw /copy | gnsilu nhwc /copy | nhwc / nchw |", "| --- | --- | --- | --- | --- |"]
    for (shape, dtype), ratios in by_key.items():
        if "nchw" in ratios and "nhwc" in ratios:
            lines.append(f"| {shape} | {dtype} | {ratios['nchw']:.2f}x | {ratios['nhwc']:.2f}x | "
                         f"{ratios['nhwc'] / ratios['nchw']:.3f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def main():
    args = parse_arguments()
    try:
        import torch
    except ImportError:
        sys.exit("bench_peers: PyTorch is not installed")
    if not torch.cuda.is_available():
        sys.exit("bench_peers: PyTorch sees no CUDA device")
    gnsilu = import_gnsilu()
    gnsilu.check_device()
    names = {"bf16": torch.bfloat16, "fp16": torch.float16}
    layouts = [name.strip() for name in args.layouts.split(",")]
    if any(name not in ("nchw", "nhwc") for name in layouts):
        sys.exit(f"bench_peers: bad --layouts {args.layouts!r} (nchw, nhwc)")
    if args.quick:
        dtypes, batches, shapes = [torch.bfloat16], [1], QUICK_SHAPES
    else:
        try:
            dtypes = [names[d.strip()] for d in args.dtypes.split(",")]
            batches = [int(n) for n in args.batches.split(",")]
        except (KeyError, ValueError) as e:
            sys.exit(f"bench_peers: bad --dtypes or --batches ({e})")
        shapes = FLUX_SHAPES + SMALL_SHAPES
    full_shapes = None  # shapes with N, which ignore --batches
    if args.shapes:
        try:
            full_shapes = [tuple(int(d) for d in text.split("x")) for text in args.shapes.split(",")]
        except ValueError as e:
            sys.exit(f"bench_peers: bad --shapes ({e})")
    elif args.preset == "layouts" and not args.quick:
        full_shapes = LAYOUT_SHAPES
    if full_shapes is None:
        full_shapes = [(n,) + chw for n in batches for chw in shapes]
    bench = Bench(torch, gnsilu, args)
    methods = [m for m in METHODS if m != "compiled" or not args.no_compile]
    started = time.monotonic()
    rows = []
    device = torch.cuda.get_device_name()

    def write_json():  # after each row too, so that a run cut short keeps the rows it finished
        if not args.json:
            return
        try:
            import triton
            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "device": device, "torch": torch.__version__, "triton": triton_version,
                  "gnsilu": gnsilu.version(), "library": gnsilu.library_path(), "groups": GROUPS, "eps": EPS,
                  "runs": args.runs, "flush_bytes": FLUSH_BYTES, "methods": methods, "layouts": layouts,
                  "seconds": round(time.monotonic() - started, 1), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    with torch.inference_mode():
        for dtype in dtypes:
            for shape in full_shapes:
                for layout in layouts:
                    rows.append(bench.row(shape, dtype, layout))
                    print(f"[{time.monotonic() - started:6.1f} s] {rows[-1]['shape']} {rows[-1]['dtype']} {layout}",
                          file=sys.stderr, flush=True)
                    write_json()
    print(f"GroupNorm+SiLU, G={GROUPS}, eps={EPS}, on {device}: median of {args.runs} runs (CUDA events, L2 flushed); "
          f"gnsilu {gnsilu.version()}, PyTorch {torch.__version__}\n")
    print(markdown(rows, methods))
    table = layout_table(rows)
    if table:
        print("\ngnsilu in both layouts, ratio to the copy of the same bytes (the same run):\n")
        print(table)


if __name__ == "__main__":
    main()
