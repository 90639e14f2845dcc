"""The input bias's cost on the GPU: a convolution's bias added by PyTorch (x + b, a pass of its own) then gnsilu,
against one gnsilu call given the bias (input_bias), next to gnsilu without a bias and a copy of x, on the Flux VAE
decoder's activations (bf16, 32 groups, both layouts).

    GNSILU_LIBRARY=build/libgnsilu.so python3 tools/bench_bias.py [--runs 20] [--layouts nchw,channels_last]
    GNSILU_LIBRARY=old/libgnsilu.so python3 tools/bench_bias.py --plain-only   # a library without input_bias

Each row: CUDA events around one call, L2 flushed (a 256 MiB write) before each, median of --runs, for each of
--inputs input sets drawn once (the median of their medians is printed). Columns (microseconds): gnsilu without a
bias; x + b then gnsilu (what a conv's bias costs today); gnsilu given input_bias; a copy of x (x read once, y written
once); the biased call against the copy. --plain-only times the first and the copy only (for a library of before
the input bias: the same script, before and after, in one device session).
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

from gpu_timing import median_us  # noqa: E402

# The Flux VAE decoder's GroupNorms at 1024x1024 (latent 128x128): the mid block and the four up blocks.
SHAPES = ((1, 512, 128, 128), (1, 512, 256, 256), (1, 512, 512, 512), (1, 256, 512, 512), (1, 256, 1024, 1024),
          (1, 128, 1024, 1024))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--inputs", type=int, default=3, help="input sets per row")
    parser.add_argument("--layouts", default="nchw,channels_last")
    parser.add_argument("--plain-only", action="store_true", help="gnsilu without a bias and the copy only")
    args = parser.parse_args()
    import torch
    import gnsilu
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"gnsilu {gnsilu.version()} from {gnsilu.library_path()}, {torch.cuda.get_device_name()}, bf16, 32 groups, "
          f"{args.inputs} input sets x {args.runs} runs")
    if args.plain_only:
        print("| shape | layout | gnsilu us | copy us | gnsilu / copy |")
        print("|---|---|---|---|---|")
    else:
        print("| shape | layout | gnsilu us | x + b, gnsilu us | gnsilu input_bias us | copy us | input_bias / copy |")
        print("|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for layout in args.layouts.split(","):
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            rows = []
            for k in range(args.inputs):
                torch.manual_seed(k)
                x = (torch.randn(shape, device="cuda") * 2 + 0.5).to(torch.bfloat16).contiguous(memory_format=fmt)
                w, b = torch.randn(shape[1], device="cuda"), torch.randn(shape[1], device="cuda")
                conv_bias = torch.randn(shape[1], device="cuda").to(torch.bfloat16)
                y = torch.empty_like(x)
                with torch.inference_mode():
                    plain = median_us(torch, lambda: gnsilu.group_norm_silu(x, 32, w, b), args.runs, flush)
                    copy = median_us(torch, lambda: y.copy_(x), args.runs, flush)
                    if args.plain_only:
                        rows.append((plain, copy))
                        continue
                    view = conv_bias.view(1, -1, 1, 1)
                    fused = gnsilu.group_norm_silu(x, 32, w, b, input_bias=conv_bias)
                    assert torch.equal(fused, gnsilu.group_norm_silu(x + view, 32, w, b)), "input_bias != x + b"
                    two = median_us(torch, lambda: gnsilu.group_norm_silu(x + view, 32, w, b), args.runs, flush)
                    one = median_us(torch, lambda: gnsilu.group_norm_silu(x, 32, w, b, input_bias=conv_bias),
                                    args.runs, flush)
                    rows.append((plain, two, one, copy))
            m = [statistics.median(column) for column in zip(*rows)]
            name = "x".join(map(str, shape))
            if args.plain_only:
                print(f"| {name} | {layout} | {m[0]:.1f} | {m[1]:.1f} | {m[0] / m[1]:.2f} |", flush=True)
            else:
                print(f"| {name} | {layout} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | {m[3]:.1f} | {m[2] / m[3]:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
