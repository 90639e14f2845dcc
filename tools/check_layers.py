#!/usr/bin/env python3
"""Checks the library's include graph against its layers (ctest: test_layers).

Layers, lowest first: the public headers (include/gnsilu) and the kernels' shared headers (kernels/), then
src/base, cache, src/runtime, src/tuning, src/api. Library code writes every project include with its folder
("base/log.hpp", "cache/store.hpp", "kernels/gnsilu_params.cuh", "gnsilu/gnsilu.hpp"), every included file exists,
and no file includes a header of a layer above its own. Public headers include only public headers. (The kernels'
own files include each other by bare name: NVRTC compiles them from embedded copies.)

Usage: check_layers.py [REPOSITORY_ROOT]. Prints the layer-to-layer edges and exits 1 on any violation.
"""
import collections
import pathlib
import re
import sys

RANKS = {"gnsilu": 0, "kernels": 0, "base": 1, "cache": 2, "runtime": 3, "tuning": 4, "api": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(root, path):
    rel = path.relative_to(root).parts
    if rel[0] == "include":
        return "gnsilu"
    if rel[0] in ("cache", "kernels"):
        return rel[0]
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    return None


def resolve(root, name):
    for base in (root / "include", root / "src", root):
        if (base / name).is_file():
            return base / name
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    files = [p for d in ("include", "src", "cache", "kernels") for p in sorted((root / d).rglob("*"))
             if p.suffix in (".h", ".hpp", ".cpp", ".cuh", ".cu")]
    problems = []
    edges = collections.Counter()
    for path in files:
        here = layer_of(root, path)
        if here is None or here not in RANKS:
            problems.append(f"{path.relative_to(root)}: not in a layer's folder")
            continue
        for name in INCLUDE.findall(path.read_text()):
            where = f"{path.relative_to(root)}: #include \"{name}\""
            if "/" not in name:
                if here == "kernels" and (path.parent / name).is_file():
                    continue
                problems.append(f"{where}: write the include with its folder")
                continue
            target = resolve(root, name)
            if target is None:
                problems.append(f"{where}: no such file")
                continue
            there = layer_of(root, target)
            if there not in RANKS:
                problems.append(f"{where}: includes a file outside the library's layers")
                continue
            if here == "gnsilu" and there != "gnsilu":
                problems.append(f"{where}: a public header includes an internal one")
            elif RANKS[there] > RANKS[here]:
                problems.append(f"{where}: {here} reaches up into {there}")
            if there != here:
                edges[(here, there)] += 1
    for (a, b), n in sorted(edges.items(), key=lambda e: (RANKS[e[0][0]], e[0])):
        print(f"{a:>8} -> {b:<8} {n:3} includes")
    print(f"{len(files)} files checked")
    for p in problems:
        print("FAIL", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
