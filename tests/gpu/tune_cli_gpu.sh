#!/usr/bin/env bash
# GPU test of gnsilu-tune (issues: the CLI, several GPUs): warm with the Flux preset (both layouts, GroupNorm+SiLU
# and the attention's plain GroupNorm); a second process finds every key cached and compiles nothing; export,
# import for the other GPU (device 1 when there are two, else the same one into a fresh cache), warm there:
# nothing tuned, nothing compiled; verify, list, report.
# Usage: tune_cli_gpu.sh BUILD_DIR [OUT_DIR]. Exits 77 without a GPU, 1 on any failed check.
set -u
build=${1:-build}
out=${2:-$(mktemp -d)}
tune="$build/tools/gnsilu-tune"
mkdir -p "$out"
if ! nvidia-smi -L > /dev/null 2>&1; then echo "SKIPPED: no GPU"; exit 77; fi
gpus=$(nvidia-smi -L | wc -l)
other=$([ "$gpus" -ge 2 ] && echo 1 || echo 0)
work=$(mktemp -d)
failed=0
check() {  # description, python expression over j (the JSON document in file $2)
  if python3 -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if ($3) else 1)" "$2"; then
    echo "ok    $1"
  else
    echo "FAIL  $1"; failed=1
  fi
}
run() {  # name, command... (stdout to $out/name.json, stderr to $out/name.log)
  local name=$1; shift
  "$@" > "$out/$name.json" 2> "$out/$name.log"
  local rc=$?
  [ $rc -eq 0 ] || { echo "FAIL  $name exited $rc: $(tail -2 "$out/$name.log")"; failed=1; }
}
start=$(date +%s)
run warm1 "$tune" warm --preset flux --cache "$work/a.sqlite" --json
t1=$(( $(date +%s) - start ))
check "warm 1 on device 0: every key tuned or found, none failed ($t1 s)" "$out/warm1.json" \
  "j['summary']['failed'] == 0 and j['summary']['busy'] == 0 and j['summary']['tuned'] == j['summary']['keys'] > 0"
check "warm 1: keys in both layouts, and plain GroupNorm keys (the attention's) beside GroupNorm+SiLU ones" \
  "$out/warm1.json" \
  "{k['key']['layout'] for k in j['keys']} == {'nchw', 'nhwc'} and \
   {k['key']['activation'] for k in j['keys']} == {'silu', 'none'} and \
   len({json.dumps(k['key'], sort_keys=True) for k in j['keys']}) == len(j['keys'])"
run warm2 "$tune" warm --preset flux --cache "$work/a.sqlite" --json
check "warm 2 (a new process): every key cached, NVRTC ran 0 times" "$out/warm2.json" \
  "j['summary']['cached'] == j['summary']['keys'] and j['summary']['tuned'] == 0 and j['summary']['compiled'] == 0"
run export "$tune" export "$work/fleet.json" --cache "$work/a.sqlite" --json
check "export: entries and kernels" "$out/export.json" "j['entries'] > 0 and j['kernels'] > 0"
run import "$tune" import "$work/fleet.json" --cache "$work/b.sqlite" --device "$other" --json
check "import for device $other: every entry added, no conflict" "$out/import.json" \
  "j['added'] > 0 and not j['conflicts'] and j['skipped_mismatched']['entries'] == 0"
run warm3 "$tune" warm --preset flux --cache "$work/b.sqlite" --device "$other" --json
check "warm on device $other from the imported cache: nothing tuned, nothing compiled" "$out/warm3.json" \
  "j['summary']['cached'] == j['summary']['keys'] and j['summary']['tuned'] == 0 and j['summary']['compiled'] == 0"
run verify "$tune" verify --cache "$work/a.sqlite" --samples 10 --json
check "verify: every entry re-timed" "$out/verify.json" "j['failed'] == 0 and len(j['entries']) > 0"
check "verify: channels-last and plain GroupNorm entries re-timed too" "$out/verify.json" \
  "any(e['key']['layout'] == 'nhwc' for e in j['entries']) and any(e['key']['activation'] == 'none' for e in j['entries'])"
# Narrowed to one layout and activation: every key already cached by warm 1.
run warm4 "$tune" warm 1x512x128x128 --dtype bf16 --layout channels_last --activation none --cache "$work/a.sqlite" --json
check "warm nhwc none: one key, in that layout and activation, cached by warm 1" "$out/warm4.json" \
  "j['summary']['keys'] == 1 and j['summary']['cached'] == 1 and j['keys'][0]['key']['layout'] == 'nhwc' and j['keys'][0]['key']['activation'] == 'none' \
   and j['summary']['failed'] == 0"
"$tune" list --cache "$work/a.sqlite" > "$out/list.txt" 2>&1 || failed=1
grep -q "nhwc" "$out/list.txt" || { echo "FAIL  list shows no nhwc entry"; failed=1; }
"$tune" report "$out/report.html" --cache "$work/a.sqlite" > /dev/null 2>&1 || failed=1
"$tune" report "$out/report.svg" --cache "$work/a.sqlite" > /dev/null 2>&1 || failed=1
# A human-readable warm on a terminal-less pipe: plain progress lines.
"$tune" warm --preset flux --dtype bf16 --cache "$work/a.sqlite" > "$out/warm-text.txt" 2>&1 || failed=1
# Trust (issue 18): a group-writable copy of the warm cache gives its tuned entries but its kernels are compiled
# again, with one warning; GNSILU_CACHE_TRUST=any loads them; verify --kernels rebuilds every kernel identically.
cp "$work/a.sqlite" "$work/shared.sqlite"; chmod 664 "$work/shared.sqlite"
run warm-untrusted "$tune" warm --preset flux --cache "$work/shared.sqlite" --json
check "warm on a group-writable file: every key cached, nothing tuned, kernels compiled again" "$out/warm-untrusted.json" \
  "j['summary']['cached'] == j['summary']['keys'] and j['summary']['tuned'] == 0 and j['summary']['compiled'] > 0"
n=$(grep -c "its compiled kernels are not loaded" "$out/warm-untrusted.log")
[ "$n" -eq 1 ] && echo "ok    one trust warning" || { echo "FAIL  $n trust warnings"; failed=1; }
run warm-trust-any env GNSILU_CACHE_TRUST=any "$tune" warm --preset flux --cache "$work/shared.sqlite" --json
check "GNSILU_CACHE_TRUST=any: kernels loaded from the group-writable file, NVRTC ran 0 times" "$out/warm-trust-any.json" \
  "j['summary']['cached'] == j['summary']['keys'] and j['summary']['compiled'] == 0"
run verify-kernels "$tune" verify --kernels --cache "$work/a.sqlite" --json
check "verify --kernels: every cached kernel rebuilt byte for byte" "$out/verify-kernels.json" "True"
# Killed while tuning (issue 16): 20 warms of one shape on an empty file, each killed with SIGKILL after a random
# 0.1-1.5 s, then one warm that must tune every key at once (no wait for the dead processes' leases), and SIGINT
# of a warm that releases its leases (exit 130).
kill_cache="$work/killed.sqlite"
for i in $(seq 1 20); do
  "$tune" warm 4x256x256x256 --dtype fp16,bf16 --cache "$kill_cache" --quiet > /dev/null 2>&1 &
  pid=$!
  sleep "$(python3 -c 'import random; print(random.uniform(0.1, 1.5))')"
  kill -KILL "$pid" 2> /dev/null; wait "$pid" 2> /dev/null
done
python3 - "$kill_cache" <<'PY' || failed=1
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
ok = db.execute("PRAGMA integrity_check").fetchone()[0]
leases = db.execute("SELECT count(*) FROM leases").fetchone()[0]
entries = db.execute("SELECT count(*) FROM tuning").fetchone()[0]
print(f"after 20 kills: integrity_check {ok}, {leases} leases left by the dead, {entries} entries")
sys.exit(0 if ok == "ok" else 1)
PY
start=$(date +%s.%N)
run warm-after-kills "$tune" warm 4x256x256x256 --dtype fp16,bf16 --cache "$kill_cache" --no-wait --json
t_after=$(python3 -c "import time; print(round(time.time() - $start, 1))")
check "warm after 20 kills: every key tuned or found at once, none busy ($t_after s)" "$out/warm-after-kills.json" \
  "j['summary']['failed'] == 0 and j['summary'].get('busy', 0) == 0 and $t_after < 60"
"$tune" warm 2x512x256x256 --dtype fp16 --retune --cache "$work/sigint.sqlite" --quiet > /dev/null 2> "$out/sigint.txt" &
pid=$!
sleep 1.5; kill -INT "$pid"; wait "$pid"; code=$?
leases=$(python3 -c "import sqlite3; print(sqlite3.connect('$work/sigint.sqlite').execute('SELECT count(*) FROM leases').fetchone()[0])")
if [ "$code" -eq 130 ] && [ "$leases" -eq 0 ] && grep -q "interrupted (SIGINT)" "$out/sigint.txt"; then
  echo "ok    SIGINT of warm: exit 130, no lease left"
else
  echo "FAIL  SIGINT of warm: exit $code, $leases leases left"; failed=1
fi
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
v = json.load(open(f"{out}/verify.json"))
print(f"verify on {v['device']['name']}: {len(v['entries'])} entries, {v['drifted']} drifted beyond {v['tolerance']:.0%}")
w = json.load(open(f"{out}/warm1.json"))
print(f"{'key':<54} {'winner':<14} {'us':>8} {'default':>8} {'gain':>6}")
for k in w["keys"]:
    key = k["key"]
    c = k.get("winner", {})
    name = (f"cpg{key['channels_per_group']} {key['x_dtype']}>{key['y_dtype']} {key['layout']} {key['activation']} "
            f"{key['size_class']}")
    win = f"e{c.get('elems_per_load')} w{c.get('warps')} s{c.get('stages')} p{c.get('programs_per_sm')}"
    print(f"{name:<54} {win:<14} {k.get('best_us', 0):8.1f} {k.get('default_us', 0):8.1f} {k.get('speedup', 1):6.2f}")
PY
[ $failed -eq 0 ] && echo "tune_cli_gpu: PASSED" || echo "tune_cli_gpu: FAILED"
exit $failed
