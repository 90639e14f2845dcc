"""gnsilu-tune before and after a restructure: the same commands through two binaries, each on caches of its own,
compared by exit status and by output with what may rightly differ masked (numbers, hashes, paths, ages).

    python3 tools/device/compare_tune_cli.py OLD/gnsilu-tune NEW/gnsilu-tune [--work DIR] [--gpu]

Without --gpu the commands need no GPU (warm --compile-only for one architecture, list, show, export, import,
merge, prune, report and bad arguments); with it, warm tunes a small shape on the GPU first and verify re-times it.
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
    (re.compile(r"/[\w./-]*(cache|work|export|merged|report)[\w./-]*"), "<path>"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hash>"),
    (re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z?"), "<time>"),
    (re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?"), "<n>"),
]


def _masked(text, work):
    text = text.replace(work, "<work>")
    for pattern, word in _MASKS:
        text = pattern.sub(word, text)
    return text.splitlines()


def _json_shape(value):
    """A JSON document's structure: object keys and value types, lists by their first element's shape."""
    if isinstance(value, dict):
        return {k: _json_shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_json_shape(value[0])] if value else []
    return type(value).__name__


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
