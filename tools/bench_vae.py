#!/usr/bin/env python3
"""The benchmark that counts: whole VAE decodes with diffusers' own classes, with and without gnsilu.

    GNSILU_LIBRARY=build/libgnsilu.so python3 tools/bench_vae.py [--cases flux-512,flux-1024,hunyuan-video]
        [--modes eager,eager+gnsilu,compile,compile+gnsilu] [--layouts nchw,channels_last] [--runs 10]
        [--no-profile] [--memory-breakdown] [--no-exact] [--dtype bfloat16] [--json results.json]
        [--max-gpu-bytes 8589934592] [--device-memory] [--exact-bounded] [--cap-bounded]

Models, built from config dicts with random weights (seeded; no model hub):
  flux-512, flux-1024  diffusers.AutoencoderKL with the Flux VAE configuration (block_out_channels 128/256/512/512,
                       2 layers a block, 16 latent channels, 32 groups, no quant convs) decoding a 1x16x64x64 /
                       1x16x128x128 latent to 512x512 / 1024x1024;
  hunyuan-video        diffusers.AutoencoderKLHunyuanVideo (its default configuration) decoding a 1x16x3x40x64
                       latent to 9 frames of 320x512 (--hunyuan-latent T,H,W for another clip).
Modes: eager; eager+gnsilu (gnsilu.torch.swap_group_norm_silu on a copy); compile (torch.compile of the decode);
compile+gnsilu (the swapped copy compiled: gnsilu's op stands in Inductor's graph); compile+pass (compiled with gnsilu's
Inductor pass, gnsilu.torch.enable_inductor_pass, no swap: the row prints what it replaced and kept;
compile+pass+allreaders: the pass without its reader rule, READER_RULE False); any of them with
+slabs (whole activations, convolutions and upsamplers in slabs of rows: gnsilu.chunked, --slab-bytes) or +tiled
(diffusers' enable_tiling); eager modes with +bounded (gnsilu.bounded.decode within --max-gpu-bytes besides the weights:
the row prints its plan's host bytes and slabs; +bounded+hostonly: nothing recomputed, recompute=False; +allhost: no
host activation keeps its first rows on the GPU; +unscaled: the chunked attention scales its scores in a pass of their
own, not in the product: each the planner or decoder as it was before that change, to time both in one run). Cases also
flux-2048, flux-4096 and flux-8192 (1x16x256x256, 1x16x512x512 and 1x16x1024x1024 latents), and the other diffusers VAEs
with GroupNorm in their default configurations (VIDEO_CASES): mochi (latent 1x12x3x32x32), magvit, kvae-video,
cogvideox, cosmos (1x16x3x32x32), svd (AutoencoderKLTemporalDecoder, 4x4x32x32 decoded as 4 frames), allegro
(1x4x4x32x32, through its decoder: its decode() runs only by tiles; no +tiled rows) and hunyuan-image (HunyuanImage
2.1's configuration, 1x64x64x64 to 2048x2048). MiniMax-H3 has no row: its GroupNorms are in its encoder; its decoder is
a transformer.
Layouts: nchw (contiguous) and channels_last (model and latent in torch.channels_last / channels_last_3d).
For each row: median ms of --runs decodes (CUDA events around each decode, after warm-up; the compile time of the
first call is printed apart, and for compiled rows the graphs Dynamo compiled and its graph breaks with their
most frequent reasons), peak memory allocated during the decodes, the relative L2 error against a float32
decode of the same weights (eager, NCHW, computed once; with --exact-bounded that float32 decode runs through
gnsilu.bounded in --max-gpu-bytes, for decodes whose float32 whole decode does not fit), with --device-memory the
device's used memory at its peak during the timed decodes (torch.cuda.mem_get_info every millisecond, from a thread:
what nvidia-smi shows, the CUDA context and every library's allocations included) and the allocator's reserved peak
(a budgeted decode on a large card leaves the caching allocator free to keep its cache: with --cap-bounded its +bounded
rows run with the allocator capped at what the process held before the row plus --max-gpu-bytes less the device's
memory outside the allocator, as on a card of that size), and unless --no-profile a kernel-time breakdown of one
decode from torch.profiler (ms a decode): convolutions, cuDNN's layout transposes, PyTorch / Inductor GroupNorm,
gnsilu, attention, matrix products, elementwise and other kernels, then the elementwise kernels that took the most
time, by short name (PyTorch's functor, e.g. CUDAFunctor_add for residual additions, or Inductor's fused kernel
kind), and the host calls that waited for the GPU during that decode (synchronizations, blocking copies: a decode
that makes them cannot queue its kernels ahead) and the host calls of most self time. L2 is not flushed between
decodes: a decode moves gigabytes, far beyond the 60 MB L2.
Needs PyTorch with CUDA and diffusers (on a machine without them, carry diffusers' and importlib_metadata's wheels).
--device cpu runs the same program on the CPU with tiny inputs (a check of the script, not a benchmark).
"""
import argparse
import contextlib
import copy
import json
import os
import re
import statistics
import sys
import time
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

FLUX_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=1024,
                scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
                mid_block_add_attention=True)
# Other diffusers VAEs with GroupNorm (issue 25's table), default configurations: (class, latent shape).
VIDEO_CASES = {
    "mochi": ("AutoencoderKLMochi", (1, 12, 3, 32, 32)),
    "magvit": ("AutoencoderKLMagvit", (1, 16, 3, 32, 32)),
    "kvae-video": ("AutoencoderKLKVAEVideo", (1, 16, 3, 32, 32)),
    "cogvideox": ("AutoencoderKLCogVideoX", (1, 16, 3, 32, 32)),
    "cosmos": ("AutoencoderKLCosmos", (1, 16, 3, 32, 32)),
    "svd": ("AutoencoderKLTemporalDecoder", (4, 4, 32, 32)),
    # HunyuanImage 2.1's VAE (diffusers' conversion script's configuration): 32x spatial compression, a 1x64x64x64
    # latent decoded to 2048x2048.
    "hunyuan-image": ("AutoencoderKLHunyuanImage", (1, 64, 64, 64)),
    # Allegro's default configuration: a 1x4x4x32x32 latent through its decoder (its decode() runs only by tiles,
    # and returns the frames in another arrangement: no +tiled rows).
    "allegro": ("AutoencoderKLAllegro", (1, 4, 4, 32, 32)),
}
# Configurations for classes without defaults.
CASE_CONFIGS = {
    "hunyuan-image": dict(in_channels=3, out_channels=3, latent_channels=64,
                          block_out_channels=(128, 256, 512, 512, 1024, 1024), layers_per_block=2,
                          spatial_compression_ratio=32, sample_size=384, scaling_factor=0.75289,
                          downsample_match_channel=True, upsample_match_channel=True),
}
DECODE_KWARGS = {"svd": lambda latent: {"num_frames": latent.shape[0]}}  # decode(z, **kwargs)
# Cases decoded other than by model.decode(z, **kwargs).sample (they have no +tiled rows).
DIRECT_DECODERS = {"allegro": lambda model, z: model.decoder(z)}


def decode_kwargs(case, latent):
    """What a case's decode takes besides the latent (DECODE_KWARGS)."""
    return DECODE_KWARGS[case](latent) if case in DECODE_KWARGS else {}


def decode_with(case, model, value, extra):
    """The case's decode of a latent: model.decode(value, **extra).sample, or its DIRECT_DECODERS entry (main() runs
    no +tiled row for those)."""
    if case in DIRECT_DECODERS:
        return DIRECT_DECODERS[case](model, value)
    return model.decode(value, **extra).sample
CATEGORIES = ["conv", "transpose", "groupnorm", "gnsilu", "attention", "gemm", "elementwise", "other"]
# Kernel names (lower case) to categories, first match wins.
PATTERNS = [
    ("gnsilu", r"gnsilu"),
    ("transpose", r"nchwtonhwc|nhwctonchw|nchw2nhwc|nhwc2nchw|convert_?layout|transpose|tensor_?transform"),
    ("groupnorm", r"group_?norm|groupnorm|rowwisemoments|computefusedparams|compute_?fused|"
                  r"native_group_norm|welford"),
    ("attention", r"flash|fmha|attention|sdpa|softmax"),
    ("conv", r"conv|fprop|dgrad|implicit|winograd|xmma_fprop|cudnn"),
    ("gemm", r"gemm|cutlass|matmul|sm90_xmma|nvjet|cublas"),
    ("elementwise", r"elementwise|vectorized|triton_poi|triton_per|triton_red|unrolled|copy|fill|add|mul|silu|"
                    r"upsample|cat|pad|reduce"),
]


def classify(name):
    lower = name.lower()
    for category, pattern in PATTERNS:
        if re.search(pattern, lower):
            return category
    return "other"


def build(case, args, torch):
    """(vae, latent) for a case, float32 on args.device; weights seeded. Off CUDA the latents are tiny (a check of
    the script) unless args.full_size."""
    import diffusers
    torch.manual_seed(0)
    full = args.device == "cuda" or getattr(args, "full_size", False)
    if case.startswith("flux"):
        vae = diffusers.AutoencoderKL(**FLUX_VAE)
        side = {"flux-512": 64, "flux-1024": 128, "flux-2048": 256, "flux-4096": 512, "flux-8192": 1024}[case] \
            if full else 8
        shape = (1, 16, side, side)
    elif case == "hunyuan-video":
        vae = diffusers.AutoencoderKLHunyuanVideo()
        # The whole decode: diffusers decodes latents of more than 4 frames by groups of frames by default, each with
        # its own statistics (+tiled rows turn it back on with the spatial tiling).
        vae.use_framewise_decoding = False
        t, h, w = (int(v) for v in args.hunyuan_latent.split(",")) if full else (2, 8, 8)
        shape = (1, 16, t, h, w)
    elif case in VIDEO_CASES:
        class_name, shape = VIDEO_CASES[case]
        vae = getattr(diffusers, class_name)(**CASE_CONFIGS.get(case, {}))
        if not full:
            shape = shape[:2] + (2,) * (len(shape) - 4) + (8, 8)  # a check of the script: tiny
    else:
        raise SystemExit(f"bench_vae: unknown case {case!r}")
    generator = torch.Generator().manual_seed(1)
    latent = torch.randn(shape, generator=generator)
    return vae.eval().to(args.device), latent.to(args.device)


def in_layout(torch, value, layout):
    if layout == "nchw":
        return value.contiguous()
    return value.to(memory_format=torch.channels_last if value.dim() == 4 else torch.channels_last_3d)


def model_in_layout(torch, vae, layout):
    """The model with its 4-D parameters in channels_last and its 5-D ones in channels_last_3d (models such as
    CogVideoX and SVD's temporal decoder hold both, which one .to(memory_format=...) cannot convert)."""
    if layout == "nchw":
        return vae
    with torch.no_grad():
        for parameter in vae.parameters():
            if parameter.dim() in (4, 5):
                parameter.data = parameter.data.contiguous(
                    memory_format=torch.channels_last if parameter.dim() == 4 else torch.channels_last_3d)
    return vae


# A short name for an elementwise kernel: PyTorch's functor (CUDAFunctor_add, ...), an Inductor kernel's fused ops, or
# the kernel's own name without its template arguments.
SHORT_NAMES = re.compile(r"(CUDAFunctor_?\w+|\w+_functor\w*|\w+Functor\w*|triton_\w+?_fused_\w+|"
                         r"upsample\w*|CatArray\w*|copy\w*kernel\w*|fill\w*|memcpy\w*|memset\w*)", re.IGNORECASE)


def short_name(name):
    match = SHORT_NAMES.search(name)
    if match:
        return re.sub(r"_\d+$", "", match.group(1))  # Inductor's numbered kernels of one kind together
    return re.sub(r"<.*", "", name).split("(")[0].split()[-1][:48]


def breakdown(torch, decode, latent, top=8):
    """ms a decode by kernel category, from torch.profiler's CUDA kernel events of one decode; the `top` elementwise
    kernels by short name (where a residual addition, a copy or an upsample spends its time); the host calls in the
    decode that wait for the GPU, by name and count (synchronizations, blocking copies; the profile's own final
    synchronize not counted: a decode that makes them cannot queue its kernels ahead); and the 5 operators or runtime
    calls of most self time on the CPU (ms)."""
    from torch.profiler import ProfilerActivity, profile
    totals = dict.fromkeys(CATEGORIES, 0.0)
    elementwise = {}
    waits = {"cudaDeviceSynchronize": -1}  # breakdown's own synchronize, after the decode, not counted
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        decode(latent)
        torch.cuda.synchronize()
    for event in prof.events():
        name = event.name
        if str(getattr(event, "device_type", "")).endswith("CUDA"):  # kernels, copies and sets: events on the device
            category = classify(name)
            ms = event.time_range.elapsed_us() / 1e3  # us -> ms
            totals[category] += ms
            if category == "elementwise":
                key = short_name(name)
                elementwise[key] = elementwise.get(key, 0.0) + ms
        elif "Synchronize" in name or name in ("cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpyDtoH", "cuMemcpy"):
            waits[name] = waits.get(name, 0) + 1
    ranked = sorted(elementwise.items(), key=lambda kv: -kv[1])[:top]
    host = sorted(((a.key, a.self_cpu_time_total / 1e3) for a in prof.key_averages()), key=lambda kv: -kv[1])[:5]
    return (totals, [[k, v] for k, v in ranked], {k: v for k, v in waits.items() if v > 0},
            [[k, round(v, 2)] for k, v in host])


def memory_breakdown(torch, model, decode, z):
    """Where one eager decode's memory goes (GiB), from hooks at every GroupNorm and on the mid block: the most
    memory held at a GroupNorm's entry, the mid block's peak, and the largest peak between two consecutive GroupNorm
    entries (the transients there), with the modules where each occurs."""
    from torch import nn
    import gnsilu.torch as gt
    gib = 2 ** 30
    state = {"last": "start", "held": (0.0, ""), "between": (0.0, ""), "mid": 0.0}

    def at_norm(name):
        def hook(module, inputs):
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() / gib
            peak = torch.cuda.max_memory_allocated() / gib
            if held > state["held"][0]:
                state["held"] = (held, name)
            if peak > state["between"][0]:
                state["between"] = (peak, f"{state['last']} -> {name}")
            state["last"] = name
            torch.cuda.reset_peak_memory_stats()
        return hook

    def mid_entry(module, inputs):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def mid_exit(module, inputs, output):
        torch.cuda.synchronize()
        state["mid"] = max(state["mid"], torch.cuda.max_memory_allocated() / gib)

    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.GroupNorm, gt.GroupNormSiLU)):
            hooks.append(m.register_forward_pre_hook(at_norm(name)))
        if name.endswith("decoder.mid_block") or name == "mid_block":
            hooks.append(m.register_forward_pre_hook(mid_entry))
            hooks.append(m.register_forward_hook(mid_exit))
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        decode(z)
        torch.cuda.synchronize()
        end_peak = torch.cuda.max_memory_allocated() / gib
        if end_peak > state["between"][0]:
            state["between"] = (end_peak, f"{state['last']} -> end")
    finally:
        for h in hooks:
            h.remove()
    return {"held_at_norm_gib": state["held"][0], "held_at": state["held"][1], "mid_block_peak_gib": state["mid"],
            "between_norms_peak_gib": state["between"][0], "between": state["between"][1]}


def run_row(torch, args, vae_run, latent, mode, layout, exact, case=None):
    import gnsilu.torch as gt
    model = copy.deepcopy(vae_run)
    swapped = None
    if "+gnsilu" in mode:
        swapped = gt.swap_group_norm_silu(model, return_counts=True, move_bias=args.move_bias)
    if "+tiled" in mode:
        model.enable_tiling()  # diffusers' own tiling: each tile normalizes with its own statistics
        if hasattr(model, "use_framewise_decoding"):
            model.use_framewise_decoding = True  # and HunyuanVideo's groups of frames, as diffusers has them
    model = model_in_layout(torch, model, layout)
    z = in_layout(torch, latent.to(getattr(torch, args.dtype)), layout)

    extra = decode_kwargs(case, latent)

    def plain_decode(value):
        if "+bounded" in mode:  # in a GPU budget, layer by layer (gnsilu.bounded)
            import gnsilu.bounded as gb
            return gb.decode(model, value, args.max_gpu_bytes, progress=False, recompute="+hostonly" not in mode)
        if "+slabs" in mode:  # whole activations, convolutions and upsamplers in slabs of rows (gnsilu.chunked)
            import gnsilu.chunked as gc
            with gc.slabs(model.decoder, max_bytes=args.slab_bytes):
                return decode_with(case, model, value, extra)
        return decode_with(case, model, value, extra)

    decode = plain_decode
    capped = "+bounded" in mode and args.cap_bounded and args.device == "cuda"
    if capped:
        # As on a card of that size: the caching allocator may hold what the caller holds now (weights, latents) plus
        # the budget less the device's memory outside the allocator (CUDA's context and libraries, which a card of
        # that size holds too), and must free its cache rather than grow beyond
        # (torch.cuda.set_per_process_memory_fraction).
        import gnsilu.bounded as gb
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        cap = torch.cuda.memory_allocated() + args.max_gpu_bytes - gb._outside_allocator_bytes(torch.device("cuda"))
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
    try:
        with _bounded_variant(mode):
            row = _timed_row(torch, args, model, z, mode, layout, exact, swapped, decode, plain_decode, extra, case)
        if capped:
            row["bounded"]["allocator_cap_gib"] = cap / 2**30
        return row
    finally:
        if capped:
            torch.cuda.synchronize()
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()


@contextlib.contextmanager
def _bounded_variant(mode):
    """+bounded rows' +allhost (gnsilu.bounded keeps no host activation's first rows on the GPU: all its room left
    free) and +unscaled (gnsilu.chunked's attention scales its FP32 scores in a pass of their own)."""
    with contextlib.ExitStack() as stack:
        if "+bounded" in mode and "+allhost" in mode:
            import gnsilu.bounded as gb
            stack.enter_context(mock.patch.object(gb, "_ROOM_PERCENT", 100))
        if "+bounded" in mode and "+unscaled" in mode:
            import gnsilu.chunked as gc
            stack.enter_context(mock.patch.object(gc, "_scaled_fp32_products_on", lambda device_type, dtype: False))
        yield


def _timed_row(torch, args, model, z, mode, layout, exact, swapped, decode, plain_decode, extra, case):
    """run_row's decodes, timed, and its row (the model and z already in their layout)."""
    compile_s = None
    torch._dynamo.reset()
    dynamo_counters = None
    if mode.startswith("compile"):
        from torch._dynamo.utils import counters as dynamo_counters
        dynamo_counters.clear()
        decode = torch.compile(plain_decode, mode=args.compile_mode)
    with torch.inference_mode(), PassDecisions(torch, "+pass" in mode, "+allreaders" in mode) as decisions:
        begin = time.perf_counter()
        out = decode(z)
        if args.device == "cuda":
            torch.cuda.synchronize()
        first_s = time.perf_counter() - begin
        if mode.startswith("compile"):
            compile_s = first_s
        for _ in range(args.warmup):
            decode(z)
        times = []
        device_used = device_base = reserved = float("nan")
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            with DeviceMemoryPoller(torch, args.device_memory) as poller:
                for _ in range(args.runs):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    decode(z)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
            peak = torch.cuda.max_memory_allocated() / 2**30
            reserved = torch.cuda.max_memory_reserved() / 2**30
            device_used, device_base = poller.peak_gib, poller.base_gib
        else:
            for _ in range(args.runs):
                begin = time.perf_counter()
                decode(z)
                times.append((time.perf_counter() - begin) * 1e3)
            peak = float("nan")
        # gnsilu.bounded's timeline of the last timed decode (before the profiled one below).
        timeline = None
        if "+bounded" in mode:
            import gnsilu.bounded as gb
            timeline = gb.last_timeline()
        error = float("nan")
        if exact is not None:
            reference = exact.double()  # float64: the norms of large outputs without overflow or loss
            error = ((out.double() - reference).norm() / reference.norm()).item()
        # What Dynamo made of the decode (after the warm-up and the timed decodes): graph breaks and graphs compiled.
        # A decode that breaks into many graphs, or recompiles, pays host time between them.
        dynamo = None if dynamo_counters is None else {
            "graph_breaks": sum(dynamo_counters["graph_break"].values()),
            "graphs": dynamo_counters["stats"].get("unique_graphs", 0),
            "break_reasons": sorted(dynamo_counters["graph_break"].items(), key=lambda kv: -kv[1])[:3]}
        kernels, elementwise, waits, host_top = breakdown(torch, decode, z) \
            if args.profile and args.device == "cuda" else (None, None, None, None)
        memory = None
        if args.memory_breakdown and args.device == "cuda" and not mode.startswith("compile"):
            memory = memory_breakdown(torch, model, decode, z)
    bounded = None
    if "+bounded" in mode:
        import gnsilu.bounded as gb
        p = gb.plan(model, z, args.max_gpu_bytes, recompute="+hostonly" not in mode)
        bounded = {"plain": p.plain, "host_gib": p.host_bytes / 2**30, "slabs": p.slabs,
                   "model_gpu_gib": p.gpu_bytes / 2**30, "budget_gib": args.max_gpu_bytes / 2**30}
        if not p.plain and timeline:
            # Where the last timed decode spent its time, summed over its layers (gnsilu.bounded.last_timeline),
            # and the layers that took longest.
            total = {k: sum(t[k] for t in timeline) for k in ("compute_ms", "store_tail_ms")}
            bounded["timeline"] = {**total, "h2d_gib": sum(t["h2d_bytes"] for t in timeline) / 2**30,
                                   "d2h_gib": sum(t["d2h_bytes"] for t in timeline) / 2**30,
                                   "layers": timeline}
    weights = sum(t.numel() * t.element_size() for t in model.parameters()) / 2**30
    return {"mode": mode, "layout": layout, "ms": statistics.median(times), "peak_gib": peak,
            "reserved_gib": reserved, "device_used_gib": device_used, "device_base_gib": device_base,
            "weights_gib": weights, "bounded": bounded,
            "relative_l2": error, "out": out.float(), "compile_s": compile_s, "kernels_ms": kernels,
            "elementwise_top_ms": elementwise, "host_waits": waits, "host_top_ms": host_top,
            "dynamo": dynamo, "pass": decisions.summary(),
            "swapped": None if swapped is None else {"pairs": swapped.pairs, "plain": swapped.plain,
                                                     "padded": swapped.padded, "biases_moved": swapped.biases_moved},
            "output_shape": list(out.shape), "memory": memory}


class PassDecisions:
    """With `enabled`: gnsilu's Inductor pass set for the block (torch._inductor.config.pre_grad_custom_pass, the
    setting before it restored after), and its decisions (log lines of the logger "gnsilu.inductor") collected.
    all_readers: the pass's reader rule off for the block (gnsilu._inductor_pass.READER_RULE)."""

    def __init__(self, torch, enabled, all_readers=False):
        self.torch, self.enabled, self.all_readers, self.lines = torch, enabled, all_readers, []

    def __enter__(self):
        if self.enabled:
            import torch._inductor.config as inductor_config
            import gnsilu.torch as gt
            from gnsilu import _inductor_pass
            self.config, self.before = inductor_config, inductor_config.pre_grad_custom_pass
            self.rules, self.rule_before = _inductor_pass, _inductor_pass.READER_RULE
            _inductor_pass.READER_RULE = not self.all_readers
            inductor_config.pre_grad_custom_pass = None
            gt.enable_inductor_pass()
            self.logged = _inductor_pass.logged_decisions()
            self.lines = self.logged.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.config.pre_grad_custom_pass = self.before
            self.rules.READER_RULE = self.rule_before
            self.logged.__exit__(*exc)
        return False

    def summary(self):
        """None without the pass; else replaced and kept counts and each distinct decision with its count."""
        if not self.enabled:
            return None
        kinds = {}
        for line in self.lines:
            text = line.replace("gnsilu.inductor: ", "")
            kinds[text] = kinds.get(text, 0) + 1
        return {"replaced": sum(n for t, n in kinds.items() if t.startswith("replaced")),
                "kept": sum(n for t, n in kinds.items() if t.startswith("kept")),
                "decisions": sorted(kinds.items(), key=lambda kv: -kv[1])}


class DeviceMemoryPoller:
    """With `enabled`: the device's used memory (total - free, torch.cuda.mem_get_info) at its peak, read every
    millisecond by a thread while the block runs, and before it what lies outside PyTorch's caching allocator
    (base_gib: CUDA's context, the libraries' handles and workspaces, other processes)."""

    def __init__(self, torch, enabled):
        self.torch, self.enabled, self.peak_gib, self.base_gib = torch, enabled, float("nan"), float("nan")

    def __enter__(self):
        if self.enabled:
            import threading
            self.stop = threading.Event()
            self.peak = 0
            free, total = self.torch.cuda.mem_get_info()
            self.base_gib = (total - free - self.torch.cuda.memory_reserved()) / 2**30

            def poll():
                while not self.stop.is_set():
                    free, total = self.torch.cuda.mem_get_info()
                    self.peak = max(self.peak, total - free)
                    self.stop.wait(0.001)
            self.thread = threading.Thread(target=poll, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.stop.set()
            self.thread.join()
            self.peak_gib = self.peak / 2**30
        return False


def write_json(path, rows):
    """The rows so far to `path`, replaced whole (written beside it, then renamed: never half a file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="flux-512,flux-1024,hunyuan-video")
    parser.add_argument("--modes", default="eager,eager+gnsilu,compile,compile+gnsilu")
    parser.add_argument("--layouts", default="nchw,channels_last")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="the decodes' dtype (float32 shows what a mode changes beyond 16-bit rounding)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--hunyuan-latent", default="3,40,64", help="T,H,W of the HunyuanVideo latent "
                        "(9,60,104: 33 frames of 480x832)")
    parser.add_argument("--max-gpu-bytes", type=int, default=8 << 30,
                        help="modes with +bounded: the GPU budget besides the weights (gnsilu.bounded.decode)")
    parser.add_argument("--device-memory", action="store_true",
                        help="poll the device's used memory during the timed decodes (a thread, every ms)")
    parser.add_argument("--cap-bounded", action="store_true",
                        help="modes with +bounded: PyTorch's caching allocator capped at what is held before the "
                             "row plus --max-gpu-bytes less the device's memory outside it (CUDA's context), as on a "
                             "card of that size (its cache freed, not grown)")
    parser.add_argument("--exact-bounded", action="store_true",
                        help="the float32 reference decoded by gnsilu.bounded within --max-gpu-bytes (swapped model)")
    parser.add_argument("--slab-bytes", type=int, default=512 << 20,
                        help="modes with +slabs: the largest slab output of a convolution or upsampler")
    parser.add_argument("--compile-mode", default=None, help="torch.compile's mode (default: its default)")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--no-move-bias", dest="move_bias", action="store_false",
                        help="+gnsilu rows: swap with move_bias=False (each convolution adds its own bias)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--json", help="write the rows there too (after each row, so a run cut short keeps them)")
    parser.add_argument("--memory-breakdown", action="store_true",
                        help="eager rows: one more decode with hooks at every GroupNorm and on the mid block (the "
                             "memory held at a GroupNorm's entry, the mid block's peak, the peak between two "
                             "GroupNorms)")
    parser.add_argument("--no-exact", dest="exact", action="store_false",
                        help="skip the float32 decode (its memory: twice the bf16 decode's); errors then against "
                             "the first row only")
    args = parser.parse_args()
    try:
        import torch
        import diffusers
    except ImportError as e:
        print(f"bench_vae: needs PyTorch and diffusers ({e}; on the GPU machine, carry diffusers' and "
              "importlib_metadata's wheels)")
        return 77
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_vae: no CUDA device")
        return 77
    import gnsilu
    modes = args.modes.split(",")
    layouts = args.layouts.split(",")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (a check, not a benchmark)"
    print(f"bench_vae: gnsilu {gnsilu.__version__}, PyTorch {torch.__version__}, diffusers {diffusers.__version__}, "
          f"{where}; {args.dtype}, median of {args.runs} decodes", flush=True)
    rows = []
    for case in args.cases.split(","):
        vae, latent = build(case, args, torch)
        exact = None
        if args.exact:  # float32 means float32: TF32 off in its convolutions and matrix products
            tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
            with torch.inference_mode():
                if args.exact_bounded:
                    import gnsilu.bounded as gb
                    import gnsilu.torch as gt
                    reference = copy.deepcopy(vae)
                    gt.swap_group_norm_silu(reference)
                    exact = gb.decode(reference, latent, args.max_gpu_bytes, progress=False).float().clone()
                    del reference
                else:
                    exact = decode_with(case, vae, latent, decode_kwargs(case, latent)).float().clone()
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
            if not bool(torch.isfinite(exact).all()):
                print(f"bench_vae: {case}: the float32 reference holds "
                      f"{int((~torch.isfinite(exact)).sum())} NaN or Inf of {exact.numel()}", flush=True)
        vae_run = vae.to(getattr(torch, args.dtype))  # the decodes' dtype (bf16 unless --dtype)
        if args.dtype == "float32":  # float32 means float32: no TF32 in the convolutions and matrix products
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        del vae
        first_out = None  # the case's first row's output: the others' "rel. L2 to the first row"
        for mode in modes:
            if "+tiled" in mode and case in DIRECT_DECODERS:
                print(f"bench_vae: {case}: no {mode} row (its tiled decode() returns another arrangement of the frames "
                      f"than its decoder; rows here time the decoder)", flush=True)
                continue
            for layout in layouts:
                try:
                    row = run_row(torch, args, vae_run, latent, mode, layout, exact, case)
                except ValueError as e:
                    if "+bounded" not in mode or "gnsilu.bounded" not in str(e):
                        raise
                    print(f"{case:14} {mode:15} {layout:14} refused: {e}", flush=True)  # a budget it cannot meet
                    continue
                out = row.pop("out")
                if first_out is None:
                    first_out = out
                row["relative_l2_to_first"] = ((out - first_out).norm() / first_out.norm()).item()
                del out
                row["case"] = case
                rows.append(row)
                kernels = row["kernels_ms"]
                detail = "" if kernels is None else "  " + " ".join(f"{k} {v:.2f}" for k, v in kernels.items())
                compiled = "" if row["compile_s"] is None else f"  first call {row['compile_s']:.1f} s"
                if row["dynamo"] is not None:
                    compiled += f"  graphs {row['dynamo']['graphs']}, graph breaks {row['dynamo']['graph_breaks']}"
                    if row["dynamo"]["break_reasons"]:
                        compiled += " (" + "; ".join(f"{n}x {reason[:80]}" for reason, n in
                                                     row["dynamo"]["break_reasons"]) + ")"
                swapped = "" if row["swapped"] is None else f"  swapped {row['swapped']['pairs']}+" \
                                                           f"{row['swapped']['plain']} " \
                                                           f"({row['swapped']['padded']} padded, " \
                                                           f"{row['swapped']['biases_moved']} conv biases moved)"
                memory = "" if row["memory"] is None else \
                    "  memory: held at a GroupNorm {held_at_norm_gib:.2f} GiB ({held_at}), mid block {mid_block_peak_gib:.2f}, " \
                    "between GroupNorms {between_norms_peak_gib:.2f} ({between})".format(**row["memory"])
                if row["host_waits"] is not None:
                    detail += "  host waits: " + (", ".join(f"{n} {k}" for k, n in row["host_waits"].items()) or
                                                  "none")
                    detail += "  host self ms: " + ", ".join(f"{k[:40]} {v:.2f}" for k, v in row["host_top_ms"])
                top = "" if not row["elementwise_top_ms"] else "  elementwise: " + ", ".join(
                    f"{name} {ms:.2f}" for name, ms in row["elementwise_top_ms"])
                if row["bounded"] is not None:
                    b = row["bounded"]
                    detail += (f"  bounded: {b['budget_gib']:.2f} GiB budget, "
                               + ("the whole decode" if b["plain"] else
                                  f"{b['slabs']} slabs, host {b['host_gib']:.2f} GiB, "
                                  f"model {b['model_gpu_gib']:.2f} GiB"))
                    if "allocator_cap_gib" in b:
                        detail += f", allocator capped at {b['allocator_cap_gib']:.2f} GiB"
                    if "timeline" in b:
                        t = b["timeline"]
                        slow = sorted(t["layers"], key=lambda x: -x["compute_ms"])[:3]
                        detail += (f"; layers: computing (waits for fetched rows included) {t['compute_ms']:.0f} ms, "
                                   f"copies out after their last slab {t['store_tail_ms']:.0f} ms (overlapping the "
                                   f"next layers); H2D {t['h2d_gib']:.2f} GiB, D2H {t['d2h_gib']:.2f} GiB; longest "
                                   + ", ".join(f"{x['layer']} {x['compute_ms']:.0f} ms" for x in slow))
                if row["pass"] is not None:
                    detail += f"  pass: replaced {row['pass']['replaced']}, kept {row['pass']['kept']}"
                    kept = [f"{n}x {t[5:90]}" for t, n in row["pass"]["decisions"] if t.startswith("kept")][:3]
                    if kept:
                        detail += " (" + "; ".join(kept) + ")"
                if row["device_used_gib"] == row["device_used_gib"]:  # not NaN
                    detail += (f"  device used {row['device_used_gib']:.2f} GiB ({row['device_base_gib']:.2f} outside "
                               f"PyTorch's allocator before the timed decodes), reserved {row['reserved_gib']:.2f}")
                detail += f"  weights {row['weights_gib']:.2f} GiB"
                print(f"{case:14} {mode:15} {layout:14} {row['ms']:9.2f} ms  peak {row['peak_gib']:6.2f} GiB  "
                      f"rel L2 {row['relative_l2']:.2e} (to the first row {row['relative_l2_to_first']:.2e}){swapped}"
                      f"{compiled}{detail}{memory}{top}", flush=True)
                if args.json:  # after every row: a run cut by a time limit keeps the rows it finished
                    write_json(args.json, rows)
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    if args.json:
        write_json(args.json, rows)
    print("\n| case | mode | layout | ms | peak GiB | rel. L2 to fp32 | rel. L2 to the first row | " +
          " | ".join(CATEGORIES) + " |")
    print("|" + "---|" * (7 + len(CATEGORIES)))
    for row in rows:
        kernels = row["kernels_ms"] or {}
        cells = " | ".join(f"{kernels[c]:.2f}" if c in kernels else "" for c in CATEGORIES)
        print(f"| {row['case']} | {row['mode']} | {row['layout']} | {row['ms']:.2f} | {row['peak_gib']:.2f} | "
              f"{row['relative_l2']:.2e} | {row['relative_l2_to_first']:.2e} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
