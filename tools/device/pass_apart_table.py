"""The table of gpu_tests.sh's pass step run with GNSILU_PASS_APART=1: each mode of tools/bench_vae.py in a process of
its own wrote DIR/pass-MODE.json; this prints, for each case and layout, each mode's first call (the compile, with
Inductor's caches off), its ms a decode and what the pass replaced, then the first calls' ratio to the first mode's.

    python3 tools/device/pass_apart_table.py DIR MODE [MODE...]

Exits 1 when a mode's file is missing or unreadable (the step that should have written it failed).
"""
import json
import os
import sys


def main(argv):
    if len(argv) < 3:
        print("usage: python3 tools/device/pass_apart_table.py DIR MODE [MODE...]", file=sys.stderr)
        return 2
    out, modes = argv[1], argv[2:]
    rows, missing = {}, []
    for mode in modes:
        path = os.path.join(out, f"pass-{mode}.json")
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            missing.append(f"{path}: {e}")
            continue
        for r in data:
            rows.setdefault((r["case"], r["layout"]), {})[r["mode"]] = r
    print(f"{'case':<16} {'layout':<14} {'mode':<22} {'first call s':>12} {'vs ' + modes[0]:>10} {'ms':>9}  pass")
    for (case, layout), by_mode in sorted(rows.items()):
        first = by_mode.get(modes[0], {}).get("compile_s")
        for mode in modes:
            r = by_mode.get(mode)
            if r is None:
                continue
            s = r.get("compile_s")
            ratio = f"{s / first:10.2f}" if s and first else f"{'-':>10}"
            passed = r.get("pass") or {}
            what = (f"replaced {passed.get('replaced', 0)}, kept {passed.get('kept', 0)}"
                    if isinstance(passed, dict) and passed else "")
            shown = f"{s:12.1f}" if s is not None else f"{'-':>12}"
            print(f"{case:<16} {layout:<14} {mode:<22} {shown} {ratio} {r['ms']:9.2f}  {what}")
    for m in missing:
        print(f"pass_apart_table: missing {m}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
