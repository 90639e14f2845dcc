"""The padded output's cost on the GPU: GroupNorm+SiLU then F.pad (two calls, two passes over the output) against
one padded gnsilu call, next to a copy of the same bytes, on the activations of HunyuanVideo's decoder (bf16).

    GNSILU_LIBRARY=build/libgnsilu.so python3 tools/bench_padded.py [--runs 20] [--layouts nchw,channels_last]

Each row: CUDA events around one call, L2 flushed (a 256 MiB write) before each, median of --runs; the shapes' x
is drawn once. Columns (microseconds): gnsilu unpadded; gnsilu unpadded then F.pad (what the causal conv did); gnsilu
padded (one call); a copy of x into a padded-size tensor's interior (x read once, y written once: the floor of a
one-pass kernel that writes the interior only); the padded call against the copy.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

from gpu_timing import median_us  # noqa: E402

SHAPES = ((1, 512, 3, 40, 64), (1, 512, 5, 80, 128), (1, 256, 9, 160, 256), (1, 128, 9, 320, 512))
PAD = (1, 1, 1, 1, 2, 0)  # HunyuanVideoCausalConv3d with kernel 3: (W, W, H, H, T - 1, 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--layouts", default="nchw,channels_last")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F
    import gnsilu
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"gnsilu {gnsilu.version()} from {gnsilu.library_path()}, {torch.cuda.get_device_name()}, bf16, pad {PAD}")
    print("| shape | layout | gnsilu us | gnsilu + F.pad us | gnsilu padded us | copy us | padded / copy |")
    print("|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for layout in args.layouts.split(","):
            fmt = torch.channels_last_3d if layout == "channels_last" else torch.contiguous_format
            torch.manual_seed(0)
            x = torch.randn(shape, device="cuda").to(torch.bfloat16).contiguous(memory_format=fmt)
            w, b = torch.randn(shape[1], device="cuda"), torch.randn(shape[1], device="cuda")
            padded = gnsilu.group_norm(x, 32, w, b, pad=PAD, pad_mode="replicate")
            interior = padded[:, :, PAD[4]:, PAD[2]:-PAD[3], PAD[0]:-PAD[1]]
            assert torch.equal(F.pad(gnsilu.group_norm(x, 32, w, b), PAD, mode="replicate"), padded)
            with torch.inference_mode():
                plain = median_us(torch, lambda: gnsilu.group_norm(x, 32, w, b), args.runs, flush)
                two = median_us(torch, lambda: F.pad(gnsilu.group_norm(x, 32, w, b), PAD, mode="replicate"),
                                args.runs, flush)
                one = median_us(torch, lambda: gnsilu.group_norm(x, 32, w, b, pad=PAD, pad_mode="replicate"),
                                args.runs, flush)
                copy = median_us(torch, lambda: interior.copy_(x), args.runs, flush)
            print(f"| {'x'.join(map(str, shape))} | {layout} | {plain:.1f} | {two:.1f} | {one:.1f} | {copy:.1f} | "
                  f"{one / copy:.2f} |", flush=True)


if __name__ == "__main__":
    main()
