"""gnsilu-tune before and after a restructure: the same commands through two binaries, each on caches of its own,
compared by exit status and by output with what may rightly differ masked (numbers, hashes, paths, ages).

    python3 tools/device/compare_tune_cli.py OLD/gnsilu-tune NEW/gnsilu-tune [--work DIR] [--gpu]

Without --gpu the commands need no GPU (warm --compile-only for one architecture, list, show, export, import,
merge, prune, report and bad arguments, and the same over two written export files of entries of a kernel version
neither build has, with a conflict); with it, warm tunes a small shape on the GPU first and verify re-times it.
Prints a line per command (same / DIFFERS, and the first differing lines); exits 1 when any command differs.
"""
import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys

_MASKS = [
    (re.compile(r"stale \(prune removes\)|\bcurrent\b|\bstale\b"), "<state>"),  # each build's own kernel version
    (re.compile(r"/[\w./-]*(cache|work|export|merged|report)[\w./-]*"), "<path>"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hash>"),
    (re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z?"), "<time>"),
    (re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?"), "<n>"),  # signed: a drift's sign is a measurement's
]


def _masked(text, work):
    text = text.replace(work, "<work>")
    for pattern, word in _MASKS:
        text = pattern.sub(word, text)
    # Runs of blanks as one: a table's padding follows its numbers' widths (an entry's age, a drift), which differ
    # from run to run.
    return [re.sub(r"[ \t]+", " ", line) for line in text.splitlines()]


def _json_shape(value):
    """A JSON document's structure: object keys and value types, lists by their first element's shape."""
    if isinstance(value, dict):
        return {k: _json_shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_json_shape(value[0])] if value else []
    return type(value).__name__


def _seed(path, channels_per_group, warps, best_us):
    """An export file of two tuned entries (cpg `channels_per_group` and 32) of a kernel version neither build has,
    so that list, show, import and merge have entries, and a conflict, without a GPU."""
    def config(w):
        return {"elems_per_load": 16, "warps": w, "stages": 1, "programs_per_sm": 4}

    def entry(cpg, w, best):
        key = {"device": {"name": "NVIDIA H200", "arch": 90, "sms": 132, "memory_mib": 143771, "l2_kib": 61440},
               "code_version": "0123456789abcdef", "channels_per_group": cpg, "x_dtype": "bf16", "y_dtype": "bf16",
               "layout": "nhwc", "activation": "silu", "size_class": "dram-split"}
        return {"key": key, "winner": config(w), "default_us": 1.2 * best, "best_us": best, "noise_us": 0.01,
                "tuned_shape": f"1x{32 * cpg}x128x128 g32 split", "tuned_dims": [1, 32 * cpg, 128, 128],
                "tuned_groups": 32, "path": "split", "library_version": "0.2.0", "created_at": 1764633600,
                "candidates": [{"config": config(w), "median_us": best, "noise_us": 0.01, "samples": 9,
                                "status": "ok"},
                               {"config": config(8), "median_us": 1.2 * best, "noise_us": 0.02, "samples": 9,
                                "status": "ok"},
                               {"config": config(2), "median_us": 0, "noise_us": 0, "samples": 0,
                                "status": "wrong output"}]}
    doc = {"format": "gnsilu-cache-export", "format_version": 2, "library_version": "0.2.0",
           "tuning": [entry(channels_per_group, warps, best_us), entry(32, 4, 3.0)], "kernels": []}
    with open(path, "w") as f:
        json.dump(doc, f)


def _commands(gpu):
    """(name, arguments, whether stdout is one JSON document); {c} is the side's cache, {w} its work folder."""
    warm = (["warm", "1x128x64x64", "--dtype", "bf16", "--quiet"] if gpu else
            ["warm", "1x128x64x64", "--dtype", "bf16", "--compile-only", "--arch", "90", "--quiet"])
    commands = [
        ("warm", warm + ["--cache", "{c}"], False),
        ("warm --json", warm + ["--cache", "{c}", "--json"], True),
        ("list", ["list", "--cache", "{c}"], False),
        ("list --json", ["list", "--cache", "{c}", "--json"], True),
        ("show 1", ["show", "1", "--cache", "{c}"], False),
        ("show 1 --json", ["show", "1", "--cache", "{c}", "--json"], True),
        ("export", ["export", "{w}/export.json", "--cache", "{c}"], False),
        ("import", ["import", "{w}/export.json", "--cache", "{w}/imported.sqlite"], False),
        ("merge", ["merge", "{w}/merged.json", "{c}", "{w}/export.json"], False),
        ("prune --dry-run", ["prune", "--dry-run", "--cache", "{c}"], False),
        ("prune", ["prune", "--cache", "{c}"], False),
        ("report", ["report", "{w}/report.html", "--cache", "{c}"], False),
        ("import a seed (forced)", ["import", "{w}/seed1.json", "--force", "--cache", "{w}/seeded.sqlite"], False),
        ("import a conflicting seed", ["import", "{w}/seed2.json", "--force", "--cache", "{w}/seeded.sqlite"], False),
        ("import a seed --dry-run --json", ["import", "{w}/seed1.json", "--force", "--dry-run", "--json", "--cache",
                                            "{w}/seeded.sqlite"], True),
        ("list seeded", ["list", "--cache", "{w}/seeded.sqlite"], False),
        ("list seeded --json", ["list", "--cache", "{w}/seeded.sqlite", "--json"], True),
        ("show 1 seeded", ["show", "1", "--cache", "{w}/seeded.sqlite"], False),
        ("show 2 seeded", ["show", "2", "--cache", "{w}/seeded.sqlite"], False),
        ("show 2 seeded --json", ["show", "2", "--cache", "{w}/seeded.sqlite", "--json"], True),
        ("merge seeds", ["merge", "{w}/merged-seeds.json", "{w}/seed1.json", "{w}/seed2.json"], False),
        ("merge seeds into a cache", ["merge", "{w}/merged-seeds.sqlite", "{w}/seed2.json", "{w}/seed1.json"], False),
        ("export seeded", ["export", "{w}/seeded-export.json", "--cache", "{w}/seeded.sqlite"], False),
        ("report seeded", ["report", "{w}/seeded.svg", "--cache", "{w}/seeded.sqlite"], False),
        ("prune seeded --dry-run", ["prune", "--dry-run", "--cache", "{w}/seeded.sqlite"], False),
        ("prune seeded", ["prune", "--cache", "{w}/seeded.sqlite"], False),
        ("compile (bad architecture)", ["compile", "--arch", "12", "--cache", "{c}"], False),
        ("warm (bad shape)", ["warm", "1x7x0", "--cache", "{c}"], False),
        ("warm (unknown dtype)", ["warm", "1x128x64x64", "--dtype", "bf17", "--cache", "{c}"], False),
        ("show (not a number)", ["show", "nothing", "--cache", "{c}"], False),
        ("show (no such row)", ["show", "999", "--cache", "{c}"], False),
        ("import (missing file)", ["import", "{w}/missing.json", "--cache", "{c}"], False),
        ("list (not a cache)", ["list", "--cache", "{w}/export.json"], False),
        ("unknown subcommand", ["tune-everything"], False),
    ]
    if gpu:
        commands.insert(5, ("verify", ["verify", "--cache", "{c}"], False))
    return commands


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--work", default="/tmp/gnsilu-compare-cli")
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    sides = {}
    for side, binary in (("old", args.old), ("new", args.new)):
        work = os.path.join(args.work, side)
        os.makedirs(work)
        sides[side] = (os.path.abspath(binary), work, os.path.join(work, "cache.sqlite"))
        _seed(os.path.join(work, "seed1.json"), 4, 8, 2.0)
        _seed(os.path.join(work, "seed2.json"), 4, 16, 1.0)  # a conflict with seed1's cpg-4 entry
    differing = 0
    for name, arguments, is_json in _commands(args.gpu):
        results = {}
        for side, (binary, work, cache) in sides.items():
            argv = [binary] + [a.format(c=cache, w=work) for a in arguments]
            env = dict(os.environ, GNSILU_CACHE=cache, GNSILU_LOG_LEVEL="warn")
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            if is_json and done.returncode == 0:
                try:
                    out = json.dumps(_json_shape(json.loads(done.stdout)), indent=1).splitlines()
                except ValueError:
                    out = ["<not JSON>"] + _masked(done.stdout, work)
            else:
                out = _masked(done.stdout, work)
            results[side] = (done.returncode, out, _masked(done.stderr, work))
        (old_rc, old_out, old_err), (new_rc, new_out, new_err) = results["old"], results["new"]
        same = old_rc == new_rc and old_out == new_out and old_err == new_err
        print(f"{'same    ' if same else 'DIFFERS '} exit {old_rc} -> {new_rc}  {name}")
        if not same:
            differing += 1
            for label, a, b in (("stdout", old_out, new_out), ("stderr", old_err, new_err)):
                diff = list(difflib.unified_diff(a, b, "old", "new", n=0, lineterm=""))
                for line in diff[2:14]:
                    print(f"           {label}: {line[:150]}")
    print(f"{differing} of {len(_commands(args.gpu))} commands differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
