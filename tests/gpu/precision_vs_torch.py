#!/usr/bin/env python3
"""GPU test (label "gpu"): gnsilu through its C API (ctypes) against PyTorch, both measured against float64.

For each case, on the same inputs: the fraction of outputs equal to the correctly rounded exact result and the
largest error in ulps of the output dtype, for gnsilu and for PyTorch's FP32 path
F.silu(F.group_norm(x.float(), G, w, b, eps)).to(dtype) (and, for information, PyTorch's native 16-bit path).
Asserts that gnsilu rounds at least as many outputs correctly as the FP32 path, with no larger maximum error.
Exits 77 (ctest: skipped) when torch, CUDA or the library is missing. GNSILU_LIBRARY names libgnsilu.so.
"""
import ctypes
import json
import os
import sys


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(77)


try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    skip(f"PyTorch is not installed ({e})")
if not torch.cuda.is_available():
    skip("PyTorch sees no CUDA device")

library_path = os.environ.get("GNSILU_LIBRARY", "libgnsilu.so")
try:
    lib = ctypes.CDLL(library_path)
except OSError as e:
    skip(f"cannot load {library_path}: {e}")

lib.gnsilu_group_norm_silu.restype = ctypes.c_int
lib.gnsilu_group_norm_silu.argtypes = [
    ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
    ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_void_p,
    ctypes.c_size_t, ctypes.c_void_p]
lib.gnsilu_last_error.restype = ctypes.c_char_p

CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}
FORMAT = {torch.bfloat16: (8, -126), torch.float16: (11, -14), torch.float32: (24, -126)}


def gnsilu(x, groups, w, b, eps, dtype):
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    shape = (ctypes.c_int64 * x.dim())(*x.shape)
    status = lib.gnsilu_group_norm_silu(
        x.data_ptr(), CODES[x.dtype], y.data_ptr(), CODES[dtype], shape, x.dim(), groups, w.data_ptr(),
        CODES[w.dtype], b.data_ptr(), CODES[b.dtype], eps, None, 0, torch.cuda.current_stream().cuda_stream)
    if status != 0:
        raise RuntimeError(lib.gnsilu_last_error().decode())
    return y


def correctly_rounded(v, dtype):
    """float64 v rounded once (nearest even) to dtype, exactly."""
    precision, emin = FORMAT[dtype]
    _, e = torch.frexp(v)
    e = torch.clamp(e - 1, min=emin)
    quantum = torch.ldexp(torch.ones_like(v), e - (precision - 1))
    return (torch.round(v / quantum) * quantum).to(dtype)


def ulps(v, dtype):
    precision, emin = FORMAT[dtype]
    _, e = torch.frexp(v)
    e = torch.clamp(e - 1, min=emin)
    return torch.ldexp(torch.ones_like(v), e - (precision - 1))


def score(out, exact, dtype):
    expected = correctly_rounded(exact, dtype)
    int_type = torch.int16 if dtype != torch.float32 else torch.int32
    same = (out.view(int_type) == expected.view(int_type)) | (torch.isnan(out) & torch.isnan(expected))
    finite = torch.isfinite(exact) & torch.isfinite(out)
    error = ((out.double() - exact).abs() / ulps(exact, dtype))[finite]
    return same.double().mean().item(), (error.max().item() if error.numel() else 0.0)


def make(kind, shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
    if kind == "mean 1000, spread 1":
        x = 1000 + x
    elif kind == "mean 1, spread 1e-3":
        x = 1 + 1e-3 * x
    elif kind == "mean 10, spread 0.1":
        x = 10 + 0.1 * x
    return x.to(dtype)


def main():
    eps = 1e-6
    cases = []
    for dtype in (torch.bfloat16, torch.float16):
        for kind in ("normal", "mean 1000, spread 1", "mean 1, spread 1e-3", "mean 10, spread 0.1"):
            for shape, groups in (((1, 512, 64, 64), 32), ((2, 128, 96, 96), 32), ((1, 64, 128, 128), 1)):
                cases.append((dtype, kind, shape, groups))
    rows = []
    failures = []
    for i, (dtype, kind, shape, groups) in enumerate(cases):
        x = make(kind, shape, dtype, 1000 + i)
        c = shape[1]
        g = torch.Generator(device="cuda").manual_seed(i)
        w = (1 + 0.5 * torch.randn(c, generator=g, device="cuda")).float()
        b = (0.5 * torch.randn(c, generator=g, device="cuda")).float()
        exact = F.silu(F.group_norm(x.double(), groups, w.double(), b.double(), eps))
        ours = gnsilu(x, groups, w, b, eps, dtype)
        again = gnsilu(x, groups, w, b, eps, dtype)
        torch.cuda.synchronize()
        fp32_path = F.silu(F.group_norm(x.float(), groups, w, b, eps)).to(dtype)
        native = F.silu(F.group_norm(x, groups, w.to(dtype), b.to(dtype), eps))
        r = {"dtype": str(dtype).replace("torch.", ""), "data": kind, "shape": "x".join(map(str, shape)), "groups": groups}
        r["gnsilu"], r["gnsilu_max_ulp"] = score(ours, exact, dtype)
        r["torch_fp32"], r["torch_fp32_max_ulp"] = score(fp32_path, exact, dtype)
        r["torch_native"], r["torch_native_max_ulp"] = score(native, exact, dtype)
        r["repeatable"] = bool(torch.equal(ours.view(torch.int16), again.view(torch.int16)))
        rows.append(r)
        if r["gnsilu"] < r["torch_fp32"] or r["gnsilu_max_ulp"] > max(r["torch_fp32_max_ulp"], 0.5) or not r["repeatable"]:
            failures.append(r)
    print(f"{'dtype':9} {'data':22} {'shape':14} {'G':>3} | {'gnsilu %':>9} {'max ulp':>7} | {'torch fp32 %':>12} {'max ulp':>7} | {'torch 16-bit %':>14} {'max ulp':>8}")
    for r in rows:
        print(f"{r['dtype']:9} {r['data']:22} {r['shape']:14} {r['groups']:>3} | {100 * r['gnsilu']:9.4f} {r['gnsilu_max_ulp']:7.3f} | "
              f"{100 * r['torch_fp32']:12.4f} {r['torch_fp32_max_ulp']:7.3f} | {100 * r['torch_native']:14.4f} {r['torch_native_max_ulp']:8.3f}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "precision_vs_torch.json"), "w") as f:
            json.dump(rows, f, indent=1)
    if failures:
        print(f"FAILED: {len(failures)} case(s) where gnsilu rounds fewer outputs correctly than PyTorch's FP32 path, "
              "has a larger maximum error, or is not repeatable:")
        for r in failures:
            print("  ", r)
        sys.exit(1)
    print(f"PASSED: {len(rows)} cases; gnsilu rounds at least as many outputs correctly as PyTorch's FP32 path, "
          "with no larger maximum error")


if __name__ == "__main__":
    main()
