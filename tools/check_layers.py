#!/usr/bin/env python3
"""Checks the library's include graph against its layers (ctest: test_layers).

Layers, lowest first: the public headers (include/gnsilu) and the kernels' shared headers (kernels/), then
src/base, cache, src/runtime, src/tuning, src/api. Library code writes every project include with its folder
("base/log.hpp", "cache/store.hpp", "kernels/gnsilu_params.cuh", "gnsilu/gnsilu.hpp"), every included file exists,
and no file includes a header of a layer above its own. Public headers include only public headers. (The kernels'
own files include each other by bare name: NVRTC compiles them from embedded copies.)

Usage: check_layers.py [REPOSITORY_ROOT] [--library libgnsilu.so]. Prints the layer-to-layer edges and exits 1 on any
violation. With --library: also that the shared library holds the runtime only, none of cache/transfer's functions
(export, import and merge, their JSON, base64 and atomic writes), read from its symbol table (nm -C).
"""
import collections
import pathlib
import re
import sys

# transfer (cache/transfer: export, import, merge) is outside libgnsilu.so: no library layer may include it.
RANKS = {"gnsilu": 0, "kernels": 0, "base": 1, "cache": 2, "runtime": 3, "tuning": 4, "api": 5, "transfer": 6}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(root, path):
    rel = path.relative_to(root).parts
    if rel[0] == "include":
        return "gnsilu"
    if rel[0] == "cache" and len(rel) > 2 and rel[1] == "transfer":
        return "transfer"
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


# Demangled names of cache/transfer's functions (and of the JSON library only it uses).
TRANSFER_SYMBOLS = re.compile(
    r"nlohmann|gnsilu::detail::(base64_encode|base64_decode|write_file_atomically)\b|"
    r"gnsilu::cache::(key_json|config_json|candidate_json|export_text|parse_export|better_measured|merge|merge_into|"
    r"bundle_of|read_bundle|write_export|take_mismatched)\(")


def transfer_symbols(library):
    """The symbols of cache/transfer in the library's symbol table (nm -C), or None when nm cannot read it."""
    import subprocess
    try:
        listing = subprocess.run(["nm", "-C", str(library)], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"FAIL nm -C {library}: {e}")
        return None
    return sorted({line.split(None, 2)[-1] for line in listing.splitlines() if TRANSFER_SYMBOLS.search(line)})


def main():
    args = sys.argv[1:]
    library = None
    if "--library" in args:
        i = args.index("--library")
        library = args[i + 1]
        del args[i:i + 2]
    root = pathlib.Path(args[0] if args else ".").resolve()
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
    if library is not None:
        found = transfer_symbols(library)
        if found is None:
            problems.append(f"{library}: no symbol table read")
        else:
            problems += [f"{library} holds cache/transfer's {name}" for name in found[:20]]
            print(f"{library}: {len(found)} symbols of cache/transfer")
    for p in problems:
        print("FAIL", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
