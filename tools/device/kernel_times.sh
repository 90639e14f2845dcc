#!/usr/bin/env bash
# Kernel by kernel, two builds of gnsilu-bench side by side on the GPU machine: Nsight Compute's duration of every
# chunk_stats, finalize, apply and fused launch (caches flushed before each, as ncu does by default; clocks left
# alone), one process per shape so that each launch is known by its shape, and by the template arguments in its
# name for the dtype and the layout. For a change to one kernel ("the statistics pass may not get slower"), where a
# whole call's time would hide it.
#
#   bash tools/device/kernel_times.sh OLD_BENCH NEW_BENCH [OUT]
#
# Shapes: gnsilu-bench's default (Flux) shapes and its layouts preset; dtypes bf16 and fp16; both layouts; SiLU;
# one configuration (GNSILU_TUNE=off, the split default e16w4s2p8 unless GNSILU_KERNEL_TIMES_CONFIG names another,
# 3 repeats); GNSILU_KERNEL_TIMES_SHAPES replaces the shapes (space-separated). Prints a table (median microseconds
# per kernel, old and new, and their ratio) and writes OUT/kernel-times.json; Nsight Compute's CSVs go to OUT/ncu/.
# About 10 s a shape and build.
set -u
old=${1:?old gnsilu-bench}
new=${2:?new gnsilu-bench}
out=${3:-${OUT:-/tmp/gnsilu-kernel-times}}
mkdir -p "$out/ncu"
config=${GNSILU_KERNEL_TIMES_CONFIG:-e16w4s2p8}  # the split path's default (src/base/launch_config.cpp)
shapes=${GNSILU_KERNEL_TIMES_SHAPES:-"1x512x32x32 1x512x64x64 1x512x128x128 1x512x256x256 1x256x512x512 \
1x512x512x512 1x128x1024x1024 1x256x1024x1024 1x128x64x64 4x128x64x64 1x320x128x128 1x640x64x64 1x1280x64x64 \
4x320x128x128 4x512x256x256 1x1280x128x128 4x128x1024x1024 1x128x9x360x640 1x256x5x180x320"}
for who in old new; do
  bin=$([ "$who" = old ] && echo "$old" || echo "$new")
  export GNSILU_CACHE=/tmp/gnsilu-kernel-times-$who.sqlite
  for shape in $shapes; do
    GNSILU_TUNE=off timeout 120 ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum \
      --kernel-name regex:"chunk_stats|finalize|apply|fused" \
      "$bin" shapes --shapes "$shape" --dtypes bf16,fp16 --layouts nchw,nhwc --activations silu \
      --configs "$config" --repeats 3 > "$out/ncu/$who-$shape.csv" 2> "$out/ncu/$who-$shape.err" ||
      echo "kernel_times: $who $shape failed (see $out/ncu/$who-$shape.err)"
  done
done
python3 - "$out" "$config" <<'PY'
import csv, glob, json, os, re, statistics, sys
out = sys.argv[1]
# Only launches of the configuration asked for count: the library's own call and the default row run the default
# configuration, which may be another one (a branch whose default differed once mixed two configurations).
want = {k: v for k, v in re.findall(r"([ewsp])(\d+)", sys.argv[2])}
rows = {}
for path in sorted(glob.glob(f"{out}/ncu/*.csv")):
    who, shape = os.path.basename(path)[:-4].split("-", 1)
    lines = [l for l in open(path) if l.startswith('"')]
    case = None
    for r in csv.DictReader(lines):
        name = r.get("Kernel Name", "")
        kernel = next((k for k in ("chunk_stats", "finalize", "apply", "fused") if k in name), None)
        if kernel is None:
            continue
        args = re.search(r"<([^>]*)>", name)
        a = [x.strip() for x in args.group(1).split(",")] if args else []
        dtype = {"1": "bf16", "2": "fp16", "3": "fp32"}
        if kernel == "chunk_stats":   # <XT, WARPS, STAGES, LAYOUT>; finalize counts after a chunk_stats that does
            ours = a[1] == want["w"] and a[2] == want["s"]
            case = (dtype.get(a[0], a[0]), "nhwc" if a[3] == "1" else "nchw") if ours else None
        elif kernel in ("fused", "apply"):  # <XT, YT, WARPS, EPL, LAYOUT, ACT>
            ours = a[2] == want["w"] and a[3] == want["e"]
            case = (dtype.get(a[0], a[0]), "nhwc" if a[4] == "1" else "nchw") if ours else None
        if case is None:
            continue
        us = float(r["Metric Value"].replace(",", "")) / 1000.0  # ns (ncu may print thousands separators)
        rows.setdefault((shape, case[0], case[1], kernel), {}).setdefault(who, []).append(us)
table = []
print(f"{'shape':<18} {'dtype':<5} {'layout':<6} {'kernel':<12} {'old us':>9} {'new us':>9} {'new/old':>8}")
for key in sorted(rows):
    v = rows[key]
    o = statistics.median(v["old"]) if "old" in v else None
    n = statistics.median(v["new"]) if "new" in v else None
    ratio = n / o if o and n else None
    table.append({"shape": key[0], "dtype": key[1], "layout": key[2], "kernel": key[3], "old_us": o, "new_us": n,
                  "ratio": ratio, "old_runs": len(v.get("old", [])), "new_runs": len(v.get("new", []))})
    print(f"{key[0]:<18} {key[1]:<5} {key[2]:<6} {key[3]:<12} {o if o else float('nan'):9.1f} "
          f"{n if n else float('nan'):9.1f} {ratio if ratio else float('nan'):8.3f}")
# The statistics pass: chunk_stats + finalize (split path), per case.
print()
print(f"{'statistics pass (chunk_stats + finalize)':<44} {'old us':>9} {'new us':>9} {'new/old':>8}")
cases = sorted({(t["shape"], t["dtype"], t["layout"]) for t in table})
ratios = []
for c in cases:
    parts = [t for t in table if (t["shape"], t["dtype"], t["layout"]) == c and t["kernel"] in ("chunk_stats", "finalize")]
    if len(parts) != 2 or any(t["old_us"] is None or t["new_us"] is None for t in parts):
        continue
    o = sum(t["old_us"] for t in parts)
    n = sum(t["new_us"] for t in parts)
    ratios.append(n / o)
    print(f"{c[0]:<18} {c[1]:<5} {c[2]:<19} {o:9.1f} {n:9.1f} {n / o:8.3f}")
if ratios:
    print(f"{len(ratios)} cases: new/old median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")
json.dump(table, open(f"{out}/kernel-times.json", "w"), indent=1)
PY
