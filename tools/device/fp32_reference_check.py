#!/usr/bin/env python3
"""Why bench_vae.py's float32 reference error reads NaN on the GPU: decodes a case in float32 (as bench_vae does for
its reference) with a forward hook on every module, and prints the first modules whose output holds NaN or Inf, the
output's largest magnitude, and the relative L2 error of a bf16 decode computed in float32 and in float64.

    GNSILU_LIBRARY=build/libgnsilu.so python3 tools/device/fp32_reference_check.py [--cases flux-512,mochi]
        [--device cuda|cpu] [--tf32 on|off|both]

--device cpu decodes bench_vae's full-size latents on the CPU (slow: minutes for flux-512).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/, for bench_vae
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))


def check(torch, bench_vae, case, device, tf32):
    # full_size: the latent bench_vae decodes on the GPU, also on the CPU
    args = argparse.Namespace(device=device, hunyuan_latent="3,40,64", full_size=True)
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    vae, latent = bench_vae.build(case, args, torch)
    first_bad = []

    def hook(name):
        def run(module, inputs, output):
            value = output[0] if isinstance(output, (tuple, list)) else getattr(output, "sample", output)
            if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                if len(first_bad) < 5:
                    inputs_finite = all(bool(torch.isfinite(i).all()) for i in inputs
                                        if torch.is_tensor(i) and i.is_floating_point())
                    first_bad.append(f"{name} ({type(module).__name__}): output nonfinite "
                                     f"{int((~torch.isfinite(value)).sum())} of {value.numel()}, inputs finite: "
                                     f"{inputs_finite}")
        return run

    handles = [m.register_forward_hook(hook(n)) for n, m in vae.named_modules() if n]
    with torch.inference_mode():
        exact = vae.decode(latent, **bench_vae.decode_kwargs(case, latent)).sample.float()
    for h in handles:
        h.remove()
    finite = bool(torch.isfinite(exact).all())
    print(f"{case:12} {device} tf32 {'on ' if tf32 else 'off'}: float32 decode finite {finite}, "
          f"max |y| {exact.abs().max().item():.3e}, shape {tuple(exact.shape)}", flush=True)
    for line in first_bad:
        print("    first nonfinite: " + line)
    if device == "cuda":
        run = vae.to(torch.bfloat16)
        with torch.inference_mode():
            out = run.decode(latent.to(torch.bfloat16), **bench_vae.decode_kwargs(case, latent)).sample.float()
        e32 = ((out - exact).norm() / exact.norm()).item()
        e64 = ((out.double() - exact.double()).norm() / exact.double().norm()).item()
        print(f"    bf16 decode against it: rel L2 {e32:.3e} in float32, {e64:.3e} in float64; bf16 finite "
              f"{bool(torch.isfinite(out).all())}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="flux-512,mochi")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tf32", default="both", choices=("on", "off", "both"))
    args = parser.parse_args()
    import torch
    import bench_vae
    for case in args.cases.split(","):
        for tf32 in {"on": [True], "off": [False], "both": [True, False]}[args.tf32]:
            check(torch, bench_vae, case, args.device, tf32)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
