"""What gnsilu's Inductor pass would replace and keep in each decode of tools/bench_vae.py, without a GPU.

    python3 tools/pass_census.py [--cases flux-1024,hunyuan-video,...] [--dtype bfloat16] [--json FILE]
                                 [--expect flux-1024=30/0,cogvideox=0/37,...]

For each case: the model of bench_vae.py (seeded random weights, the latent the GPU rows use), its decode captured by
Dynamo (torch._dynamo.export, static shapes: the graph the pass sees under torch.compile, with fake values, so nothing
of the decode is computed), and gnsilu's pass run over that graph with CPU tensors allowed. Printed per case: the
pass's counts and its own time on the graph, each (verdict, match, reason) with how many GroupNorms got it, and the
input shapes. The decisions are the GPU's where the graph is: decide() reads shapes, strides, dtype and sizes only.
oneDNN is turned off so that a convolution's output keeps its input's memory format, as cuDNN's does (oneDNN may make
bf16 outputs channels-last).

--expect CASE=REPLACED/KEPT,...: exit 1 unless each named case's counts are those (ctest's test_pass_census_cpu: the
pass's decisions on diffusers' real graphs, against changes of the rule, of diffusers or of Dynamo).

Exit status: 0, or 1 when a case cannot be captured or an expectation fails; 77 without PyTorch or diffusers (ctest's
Skipped).
"""
import argparse
import collections
import json
import os
import re
import sys
import time
import types
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

DEFAULT_CASES = ("flux-1024,hunyuan-video,hunyuan-image,cogvideox,mochi,magvit,kvae-video,cosmos,svd,allegro")


def census(torch, bench_vae, inductor_pass, case, dtype, hunyuan_latent):
    """{"counts": the pass's counts, "decisions": [(verdict, match, reason, n)], "shapes": {shape: n}} for a case."""
    args = types.SimpleNamespace(device="cpu", full_size=True, hunyuan_latent=hunyuan_latent)
    vae, z = bench_vae.build(case, args, torch)
    vae, z = vae.to(dtype).eval(), z.to(dtype)
    extra = bench_vae.decode_kwargs(case, z)
    with torch.no_grad():
        gm, _ = torch._dynamo.export(lambda v: bench_vae.decode_with(case, vae, v, extra),
                                     assume_static_by_default=True)(z)
    p = inductor_pass.GnsiluPass()
    with inductor_pass.logged_decisions() as lines, mock.patch.object(inductor_pass, "_DEVICE_TYPES", ("cpu",)):
        start = time.perf_counter()
        p(gm.graph)
        pass_ms = (time.perf_counter() - start) * 1e3
    decisions, shapes = collections.Counter(), collections.Counter()
    for line in lines:
        m = re.match(r"gnsilu\.inductor: (replaced|kept) (.*?) of (\(.*?\)|\?)(?: \(\w+\))?: (.*)", line)
        if m is None:
            continue
        verdict, what, shape, why = m.groups()
        reason = re.sub(r", N MiB, \d+ groups?$", "", re.sub(r"\d+ MiB", "N MiB", why))
        reason = re.sub(r"strides \(.*", "strides in neither layout nor a frames order gnsilu takes", reason)
        decisions[(verdict, what, reason)] += 1
        shapes[shape] += 1
    return {"latent": list(z.shape), "counts": dict(p.counts), "pass_ms": pass_ms,
            "decisions": [list(k) + [n] for k, n in decisions.most_common()], "shapes": dict(shapes.most_common())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="bench_vae.py cases, comma-separated")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--hunyuan-latent", default="3,60,104", help="HunyuanVideo's latent T,H,W (as bench_vae.py)")
    ap.add_argument("--json", help="write the census here too")
    ap.add_argument("--expect", default="", help="CASE=REPLACED/KEPT,...: exit 1 unless each case's counts are those")
    args = ap.parse_args()
    expected = {}
    for item in [i for i in args.expect.split(",") if i]:
        case, _, counts = item.partition("=")
        replaced, _, kept = counts.partition("/")
        if not (case and replaced.isdigit() and kept.isdigit()):
            ap.error(f"--expect: {item!r} is not CASE=REPLACED/KEPT")
        expected[case] = (int(replaced), int(kept))
    try:
        import torch
        import diffusers  # noqa: F401
    except ImportError as e:
        print(f"pass_census: skipped ({e})")
        return 77
    import bench_vae
    import gnsilu.torch  # noqa: F401  (registers gnsilu's ops)
    from gnsilu import _inductor_pass
    torch.backends.mkldnn.enabled = False
    dtype = getattr(torch, args.dtype)
    out, status = {}, 0
    for case in [c for c in args.cases.split(",") if c]:
        try:
            row = census(torch, bench_vae, _inductor_pass, case, dtype, args.hunyuan_latent)
        except Exception as e:  # a case Dynamo cannot capture: said, and the others still run
            print(f"{case}: not captured: {type(e).__name__}: {str(e)[:300]}")
            status = 1
            continue
        out[case] = row
        c = row["counts"]
        print(f"{case} (latent {tuple(row['latent'])}): replaced {c['replaced']} (padded {c['padded']}, input bias "
              f"{c['input_bias']}), kept {c['kept']}; the pass took {row['pass_ms']:.1f} ms")
        for verdict, what, reason, n in row["decisions"]:
            print(f"  {n:4d}  {verdict:<8} {what:<48} {reason}")
        print("  shapes: " + ", ".join(f"{s} x{n}" for s, n in row["shapes"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    for case, (replaced, kept) in expected.items():
        got = out.get(case, {}).get("counts")
        if got is None or (got["replaced"], got["kept"]) != (replaced, kept):
            print(f"pass_census: {case}: expected {replaced} replaced and {kept} kept, got "
                  f"{'nothing' if got is None else str(got['replaced']) + ' and ' + str(got['kept'])}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
