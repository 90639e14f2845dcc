#!/usr/bin/env bash
# Runs the GPU test suite and the benchmarks on a machine with a GPU, from a build folder made elsewhere (the
# build travels; the tests are run directly because ctest's files hold the build machine's paths). Logs go
# under $OUT (default /tmp/gnsilu-gpu); a summary is printed last.
# Usage: gpu_tests.sh [build] [tests|system|sanitize|python|peers|bench|layouts|profile|wheel|decodes|decodes-large|
#                              pass|bench-compare OLD|finalize-compare|all]
# decodes, decodes-large and pass need diffusers: carry its wheel and importlib_metadata's in .whl/ (installed into
# /tmp/gnsilu-site). pass takes its cases from GNSILU_PASS_CASES (default flux-512,flux-1024,hunyuan-video), its modes
# from GNSILU_PASS_MODES (compile,compile+pass,compile+gnsilu; compile+pass+allreaders times the pass without its reader
# rule) and its layouts from GNSILU_PASS_LAYOUTS (nchw,channels_last); GNSILU_PASS_APART=1 runs each mode in a process
# of its own (compile times).
# Exit status: 1 when any step failed (a step that exits 77 counts as skipped, not failed), 2 for an unknown step.
set -u
build=${1:-build}
what=${2:-all}
case "$what" in
  tests|system|sanitize|python|peers|bench|layouts|profile|wheel|decodes|decodes-large|pass|bench-compare|finalize-compare|all) ;;
  *) echo "gpu_tests: unknown step '$what' (tests|system|sanitize|python|peers|bench|layouts|profile|wheel|decodes|decodes-large|pass|bench-compare|finalize-compare|all)" >&2
     exit 2;;
esac
out=${OUT:-/tmp/gnsilu-gpu}
mkdir -p "$out"
mkdir -p /tmp/gnsilu-cache
export GNSILU_CACHE=/tmp/gnsilu-cache/cache.sqlite
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
summary=()
failed=0  # steps that failed (exit status neither 0 nor 77): the script's exit status is 1 if any did
record() {  # name, exit status
  local verdict=passed
  if [ "$2" -eq 77 ]; then verdict=SKIPPED; elif [ "$2" -ne 0 ]; then verdict=FAILED; failed=$((failed + 1)); fi
  summary+=("$(printf '%-34s exit %-3s %s' "$1" "$2" "$verdict")")
}
site=/tmp/gnsilu-site
install_diffusers() {  # the wheels carried in .whl/ (diffusers, importlib_metadata) into $site, once a machine
  if compgen -G ".whl/diffusers-*.whl" > /dev/null && [ ! -d "$site/diffusers" ]; then
    python3 -m pip install -q --no-deps --target "$site" .whl/*.whl > "$out/pip.log" 2>&1
  fi
}
step() {  # name, log, command...
  local name=$1 log=$2
  shift 2
  "$@" > "$out/$log" 2>&1
  local rc=$?
  record "$name" "$rc"
  return $rc
}
if [ "$what" = tests ] || [ "$what" = all ]; then
  step "test_gpu (C++, doctest)" test_gpu.log "$build/tests/test_gpu" \
    --test-case-exclude="a tensor of more than 2^31 elements*"
  step "test_gpu: 2^31 elements" test_gpu_large.log "$build/tests/test_gpu" \
    --test-case="a tensor of more than 2^31 elements*"
  step "precision_vs_torch.py" precision.log env GNSILU_LIBRARY="$build/libgnsilu.so" OUT="$out" \
    python3 tests/gpu/precision_vs_torch.py
  step "gnsilu-bench check" run.log "$build/tools/gnsilu-bench" check --shapes 1x128x1024x1024 --dtypes bf16 \
    --groups 32 --layouts nchw,nhwc
  grep -E "MESSAGE|ERROR|FAIL|test cases|assertions|Status" "$out/test_gpu.log" | cut -c1-300 | tail -40
  grep -E "MESSAGE|ERROR|FAIL|SKIPPED|test cases|Status" "$out/test_gpu_large.log" | cut -c1-300 | tail -5
  tail -3 "$out/precision.log"
  cat "$out/run.log"
fi
if [ "$what" = system ] || [ "$what" = all ]; then
  step "test_system (threads, contexts)" system.log "$build/tests/test_system" \
    --test-case-exclude="two GPUs in one process*"
  step "test_system: two GPUs" system_two_gpus.log "$build/tests/test_system" --test-case="two GPUs in one process*"
  step "test_soak (100,000 calls)" soak.log "$build/tests/test_soak"
  step "tune_cli_gpu.sh (gnsilu-tune)" tune_cli.log bash tests/gpu/tune_cli_gpu.sh "$build" "$out/tune-cli"
  grep -E "MESSAGE|ERROR|FAIL|device [0-9]|test cases|assertions|Status|SKIPPED" "$out/system.log" | cut -c1-300 | tail -40
  grep -E "MESSAGE|ERROR|FAIL|SKIPPED|test cases|Status" "$out/system_two_gpus.log" | cut -c1-300 | tail -5
  tail -2 "$out/soak.log"
  cat "$out/tune_cli.log"
fi
if [ "$what" = sanitize ]; then
  # compute-sanitizer's four tools over 2,000 random soak calls and test_gpu's in-place, workspace, graph and
  # bad-argument cases.
  for tool in memcheck racecheck initcheck synccheck; do
    step "compute-sanitizer $tool (soak)" "sanitize-$tool-soak.log" env GNSILU_SOAK_CALLS=2000 \
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/test_soak"
    step "compute-sanitizer $tool (test_gpu)" "sanitize-$tool-gpu.log" compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$build/tests/test_gpu" -tc="in place*,a call captured*,bad arguments*"
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|test cases" "$out/sanitize-$tool-soak.log" "$out/sanitize-$tool-gpu.log"
  done
fi
if [ "$what" = python ] || [ "$what" = all ]; then
  # Without tuning by default (GNSILU_TUNE=off: the launch defaults; the C++ tests and tune_cli_gpu.sh cover the
  # tuner): with tuning, a fresh machine took 324 s to reach TestInputBias and over 250 s more in it; without, the
  # classes from TestInputBias on took 111 s. Python's unittest takes class names after the file
  # (GNSILU_PYTHON_TESTS) to run a part of it.
  # diffusers' tests (TestBoundedDecode, the swapped VAEs) run where its wheel is carried in .whl/, else skip.
  install_diffusers
  step "python/tests/test_gpu.py" python.log env GNSILU_LIBRARY="$build/libgnsilu.so" PYTHONPATH="$site:python" \
    PYTHONUNBUFFERED=1 GNSILU_TUNE="${GNSILU_TUNE:-off}" python3 python/tests/test_gpu.py ${GNSILU_PYTHON_TESTS:-}
  tail -30 "$out/python.log"
fi
if [ "$what" = peers ]; then
  step "tools/bench_peers.py" peers.log env GNSILU_LIBRARY="$build/libgnsilu.so" PYTHONPATH=python \
    PYTHONUNBUFFERED=1 python3 tools/bench_peers.py --json "$out/peers.json"
  cat "$out/peers.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  rm -f /tmp/gnsilu-cache/cold.sqlite*
  cold=/tmp/gnsilu-cache/cold.sqlite
  {
    echo "--- cold start (empty cache file)"
    GNSILU_CACHE=$cold "$build/tools/gnsilu-bench" start --shape 1x128x1024x1024 --dtypes bf16
    echo "--- warm start (the same file, a new process)"
    GNSILU_CACHE=$cold "$build/tools/gnsilu-bench" start --shape 1x128x1024x1024 --dtypes bf16
    "$build/tools/gnsilu-bench" overhead
  } > "$out/start.log" 2>&1
  record "start and overhead" "$?"
  step "shapes" shapes.log "$build/tools/gnsilu-bench" shapes --json "$out/shapes.json"
  cat "$out/start.log"
  sed -n '/^shape/,$p' "$out/shapes.log"
fi
if [ "$what" = layouts ]; then
  # The layouts benchmark: every shape of the preset in both layouts and both 16-bit dtypes, in one process.
  step "gnsilu-bench layouts" layouts.log "$build/tools/gnsilu-bench" shapes --preset layouts --layouts nchw,nhwc \
    --dtypes "${GNSILU_BENCH_DTYPES:-bf16,fp16}" --json "$out/layouts.json"
  sed -n '/^shape (gnsilu/,$p' "$out/layouts.log"
fi
if [ "$what" = profile ]; then
  # Nsight Compute on the three kernels of one large call (no tuning, so that the first launches are the call's).
  GNSILU_TUNE=off ncu --clock-control none --kernel-name regex:"chunk_stats|finalize|apply" --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats \
    "$build/tools/gnsilu-bench" shapes --shapes 1x128x1024x1024 --dtypes bf16 --repeats 2 > "$out/ncu.log" 2>&1
  record "ncu" "$?"
  grep -E "chunk_stats|finalize|apply|Duration|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions  |Issue Slots Busy" "$out/ncu.log" | head -60
  mkdir -p /tmp/gnsilu-cubin && "$build/tools/gnsilu-bench" cubin --json /tmp/gnsilu-cubin > /dev/null 2>&1
  for f in /tmp/gnsilu-cubin/*.cubin; do cuobjdump -sass "$f"; done > "$out/sass.txt" 2>&1
  awk '/Function :/ {name=$3} /\/\*[0-9a-f]+\*\// {count[name]++} END {for (n in count) printf "%6d SASS instructions  %s\n", count[n], n}' "$out/sass.txt" | sort -k4
fi
if [ "$what" = wheel ]; then
  # The wheel that pip builds (python/tests/test_wheel.sh, GNSILU_WHEEL_DIR=build-wheel), installed into a folder of
  # its own next to the machine's PyTorch, used from outside the checkout with GNSILU_LIBRARY unset: its bundled
  # library runs.
  wheel=$(ls build-wheel/gnsilu-*.whl | head -1)
  wheel_site=$(mktemp -d)  # pip's --target, not a venv: this machine's PyTorch is not in a venv's view of site-packages
  python3 -m pip install -q --no-deps --no-index --target "$wheel_site" "$wheel"
  (cd /tmp && env -u GNSILU_LIBRARY PYTHONPATH="$wheel_site" python3 - > "$out/wheel.log" 2>&1 <<'PY'
import torch, gnsilu, gnsilu.torch as gt
print("library:", gnsilu.library_path())
import os; assert gnsilu.library_path() == os.path.join(os.path.dirname(gnsilu.__file__), "libgnsilu.so"), "not the bundled library"
x = torch.randn(2, 256, 64, 64, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, device="cuda"); b = torch.randn(256, device="cuda")
y = gnsilu.group_norm_silu(x, 32, w, b)
ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x.double(), 32, w.double(), b.double(), 1e-6))
err = (y.double() - ref).abs().max().item()
print("max abs error against float64:", err)
assert err < 0.05
m = gt.GroupNormSiLU(32, 256).cuda().to(torch.bfloat16)
with torch.no_grad():  # with autograd recording, the modules run PyTorch's ops (gnsilu has no backward)
    ycl = m(x.to(memory_format=torch.channels_last))
print("module (no grad), output channels_last:", ycl.is_contiguous(memory_format=torch.channels_last))
assert ycl.is_contiguous(memory_format=torch.channels_last)
print("wheel: PASSED")
PY
  )
  record "wheel from outside the checkout" "$?"
  cat "$out/wheel.log"
fi
if [ "$what" = decodes ] || [ "$what" = decodes-large ] || [ "$what" = pass ]; then
  install_diffusers
  vae=(env GNSILU_LIBRARY="$build/libgnsilu.so" PYTHONPATH="$site:python" PYTHONUNBUFFERED=1 python3 tools/bench_vae.py)
fi
if [ "$what" = decodes ]; then
  # Decodes in an 8 GiB GPU budget next to the whole decode and diffusers' tiling (python/README.md, gnsilu.bounded):
  # the allocator capped as on an 8 GiB card, the float32 reference (TF32 off) decoded in the same budget; the
  # bounded decode with its conv1 outputs recomputed and with everything on the host (+hostonly) in the same run;
  # GNSILU_DECODE_MODES picks other modes.
  decode_modes=eager+gnsilu+bounded,eager+gnsilu+bounded+hostonly,eager+gnsilu,eager+gnsilu+tiled
  for case in flux-4096 hunyuan-video; do
    step "bench_vae $case in 8 GiB" "decodes-$case.log" "${vae[@]}" --cases "$case" --hunyuan-latent 9,60,104 \
      --modes "${GNSILU_DECODE_MODES:-$decode_modes}" --layouts nchw \
      --runs 1 --warmup 1 \
      --max-gpu-bytes 8589934592 --device-memory --cap-bounded --exact-bounded --json "$out/decodes-$case.json"
    sed -n '/^| case/,$p' "$out/decodes-$case.log"
  done
fi
if [ "$what" = decodes-large ]; then
  # The decodes that fit no card whole: Flux 8192x8192 in 10 GiB, HunyuanVideo 65x720x1280 (latent 17x90x160) in
  # 16 GiB, once each (Flux's mid-block attention over a million latent tokens takes ~35 s), next to diffusers' tiling.
  step "bench_vae flux-8192 in 10 GiB" decodes-flux-8192.log "${vae[@]}" --cases flux-8192 \
    --modes eager+gnsilu+bounded --layouts nchw --runs 1 --warmup 0 --no-profile --no-exact \
    --max-gpu-bytes 10737418240 --device-memory --cap-bounded --json "$out/decodes-flux-8192.json"
  step "bench_vae hunyuan-video 65x720x1280 in 16 GiB" decodes-hunyuan-720p.log "${vae[@]}" --cases hunyuan-video \
    --hunyuan-latent 17,90,160 --modes eager+gnsilu+bounded,eager+gnsilu+tiled --layouts nchw --runs 1 --warmup 0 \
    --no-profile --no-exact --max-gpu-bytes 17179869184 --device-memory --cap-bounded \
    --json "$out/decodes-hunyuan-720p.json"
  grep -hE "^(flux|hunyuan)" "$out/decodes-flux-8192.log" "$out/decodes-hunyuan-720p.log" | cut -c1-400
fi
if [ "$what" = pass ]; then
  # torch.compile alone, with gnsilu's Inductor pass, and with the swap (gnsilu.torch.enable_inductor_pass).
  # Inductor's caches off, so that each row's first call is a whole compile (comparable between the rows). With
  # GNSILU_PASS_APART=1 each mode runs in a process of its own (no mode compiles after another in the same process,
  # whose in-memory state would shorten its first call), and a table of first-call seconds and ms a decode follows.
  pass_args=(--cases "${GNSILU_PASS_CASES:-flux-512,flux-1024,hunyuan-video}"
             --layouts "${GNSILU_PASS_LAYOUTS:-nchw,channels_last}" --runs 10 --no-exact --no-profile)
  modes=${GNSILU_PASS_MODES:-compile,compile+pass,compile+gnsilu}
  if [ -n "${GNSILU_PASS_APART:-}" ]; then
    for mode in ${modes//,/ }; do
      step "bench_vae $mode (a process of its own)" "pass-$mode.log" env TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 \
        "${vae[@]}" "${pass_args[@]}" --modes "$mode" --json "$out/pass-$mode.json"
    done
    python3 tools/device/pass_apart_table.py "$out" ${modes//,/ }
  else
    step "bench_vae $modes" pass.log env TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 "${vae[@]}" "${pass_args[@]}" \
      --modes "$modes" --json "$out/pass.json"
    sed -n '/^| case/,$p' "$out/pass.log"
  fi
fi
if [ "$what" = bench-compare ]; then
  # Speed before and after a change, in one run: the old gnsilu-bench ($3) and this build's, alternating,
  # GNSILU_COMPARE_ROUNDS rounds (2), each with its own cache file, over the layouts preset or the shapes in
  # GNSILU_COMPARE_SHAPES, in the dtypes of GNSILU_COMPARE_DTYPES (bf16) and the layouts of GNSILU_COMPARE_LAYOUTS
  # (nchw,nhwc). With GNSILU_COMPARE_CONFIGS (e16w4s2p8,e16w8s1p4,...) those split configurations are timed by hand
  # too, and compared one by one. Each time is taken as a ratio to the copy of the same bytes in the same process; the
  # table gives the median of the rounds.
  old=${3:?bench-compare needs the old gnsilu-bench}
  shapes=(--preset layouts)
  [ -n "${GNSILU_COMPARE_SHAPES:-}" ] && shapes=(--shapes "$GNSILU_COMPARE_SHAPES")
  configs=()
  [ -n "${GNSILU_COMPARE_CONFIGS:-}" ] && configs=(--paths split --configs "$GNSILU_COMPARE_CONFIGS")
  for round in $(seq "${GNSILU_COMPARE_ROUNDS:-2}"); do
    for who in before after; do
      bin=$([ "$who" = before ] && echo "$old" || echo "$build/tools/gnsilu-bench")
      GNSILU_CACHE=/tmp/gnsilu-cache/$who.sqlite "$bin" shapes "${shapes[@]}" "${configs[@]}" \
        --layouts "${GNSILU_COMPARE_LAYOUTS:-nchw,nhwc}" --dtypes "${GNSILU_COMPARE_DTYPES:-bf16}" \
        --json "$out/bench-$who-$round.json" > "$out/bench-$who-$round.log" 2>&1
      record "gnsilu-bench $who (round $round)" "$?"
    done
  done
  python3 - "$out" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
rows = {}  # (shape, layout, dtype, what) -> who -> [ratio to the copy]
for who in ("before", "after"):
    for f in sorted(glob.glob(f"{out}/bench-{who}-*.json")):
        for r in json.load(open(f)):
            key = (r["shape"], r["layout"], r["dtype"])
            copy = r["copy_us"]
            rows.setdefault(key + ("gnsilu",), {}).setdefault(who, []).append(r["gnsilu_us"] / copy)
            for c in r.get("candidates", []):
                rows.setdefault(key + (c["config"],), {}).setdefault(who, []).append(c["us"] / copy)
print(f"{'shape':<20} {'layout':<6} {'dtype':<5} {'what':<14} {'before/copy':>11} {'after/copy':>11} {'after/before':>12}")
by_what = {}
for key, v in sorted(rows.items(), key=lambda kv: str(kv[0])):
    if "before" in v and "after" in v:
        b, a = statistics.median(v["before"]), statistics.median(v["after"])
        by_what.setdefault((key[2], key[3]), []).append(a / b)
        print(f"{key[0]:<20} {key[1]:<6} {key[2]:<5} {key[3]:<14} {b:11.3f} {a:11.3f} {a / b:12.3f}")
for (dtype, what), ratios in sorted(by_what.items()):
    print(f"{dtype} {what}: {len(ratios)} rows, after/before median {statistics.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}")
PY
fi
if [ "$what" = finalize-compare ]; then
  # How finalize merges a group's records, in one run: the library's rule ("rule"), parts by two launches from
  # GNSILU_PARTS_FROM records ("launches", default 512) and parts by one launch with atomics ("atomic"), each in a
  # process of its own, alternating, GNSILU_COMPARE_ROUNDS rounds (2), untuned (e16 w4 s2 p8), over
  # GNSILU_COMPARE_SHAPES with GNSILU_COMPARE_GROUPS groups (default: 32 groups of 64, 256, 4096 and 16384 records;
  # for one group, GNSILU_COMPARE_GROUPS=1 GNSILU_COMPARE_SHAPES=1x1x4096x4096,1x64x1024x1024) in
  # GNSILU_COMPARE_DTYPES (bf16,fp16) and GNSILU_COMPARE_LAYOUTS (nchw,nhwc).
  # The table: each call's median ratio to the copy of the same bytes in the same process, and to the rule's.
  from=${GNSILU_PARTS_FROM:-512}
  for round in $(seq "${GNSILU_COMPARE_ROUNDS:-2}"); do
    for who in rule launches atomic; do
      forced=()
      [ "$who" = launches ] && forced=(--parts-from "$from")
      [ "$who" = atomic ] && forced=(--parts-from "$from" --finalize-atomic)
      GNSILU_TUNE=off GNSILU_CACHE=/tmp/gnsilu-cache/finalize-$who.sqlite "$build/tools/gnsilu-bench" shapes \
        --shapes "${GNSILU_COMPARE_SHAPES:-1x512x64x64,1x512x128x128,1x128x1024x1024,4x128x1024x1024,1x32x4096x4096}" \
        --groups "${GNSILU_COMPARE_GROUPS:-32}" --paths split --configs e16w4s2p8 "${forced[@]}" \
        --layouts "${GNSILU_COMPARE_LAYOUTS:-nchw,nhwc}" --dtypes "${GNSILU_COMPARE_DTYPES:-bf16,fp16}" \
        --json "$out/finalize-$who-$round.json" > "$out/finalize-$who-$round.log" 2>&1
      record "gnsilu-bench finalize $who (round $round)" "$?"
    done
  done
  python3 - "$out" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
whos = ("rule", "launches", "atomic")
rows = {}  # (shape, layout, dtype) -> who -> [(us, ratio to the copy)]
for who in whos:
    for f in sorted(glob.glob(f"{out}/finalize-{who}-*.json")):
        for r in json.load(open(f)):
            rows.setdefault((r["shape"], r["layout"], r["dtype"]), {}).setdefault(who, []).append(
                (r["gnsilu_us"], r["gnsilu_us"] / r["copy_us"]))
print(f"{'shape':<20} {'layout':<6} {'dtype':<5}" + "".join(f" {w + ' us':>12} {'/copy':>6}" for w in whos)
      + f" {'atomic/rule':>11}")
for key, v in sorted(rows.items(), key=lambda kv: str(kv[0])):
    if not all(w in v for w in whos):
        continue
    med = {w: (statistics.median(u for u, _ in v[w]), statistics.median(r for _, r in v[w])) for w in whos}
    print(f"{key[0]:<20} {key[1]:<6} {key[2]:<5}" + "".join(f" {med[w][0]:12.1f} {med[w][1]:6.3f}" for w in whos)
          + f" {med['atomic'][0] / med['rule'][0]:11.3f}")
PY
fi
printf '\n'
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
  echo "gpu_tests: $failed of ${#summary[@]} steps FAILED"
  exit 1
fi
echo "gpu_tests: ${#summary[@]} steps, none failed"
