#!/usr/bin/env python3
"""Checks that the documents say what is true: their links resolve and the README's examples build and run.

    python3 tools/check_docs.py links                      every relative link (and #anchor) of the documents resolves
                                                           to a file (and a heading); the documents written for users
                                                           name no work session
    python3 tools/check_docs.py snippets PREFIX WORKDIR    the README's C++, C and CMake blocks built, as one project,
                                                           against gnsilu installed in PREFIX (tools/test_install.sh)
    python3 tools/check_docs.py python                     the README's PyTorch block run on the CPU, on a tiny
                                                           diffusers AutoencoderKL (needs PyTorch and diffusers:
                                                           exit 77 without them)
    python3 tools/check_docs.py tune GNSILU_TUNE           every gnsilu-tune command of the README and docs/API.md
                                                           parsed by that binary (GNSILU_TUNE_PARSE_ONLY=1: nothing
                                                           runs, since they take a GPU or minutes of NVRTC)

Exit status 1 names every failure; 2 for bad usage.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md", "CONTRIBUTING.md", "python/README.md", "docs/API.md", "docs/DESIGN.md",
             "docs/EXACT_STATISTICS.md", "docs/PERFORMANCE.md"]
# Documents whose text names no work session: all of them.
CURRENT = DOCUMENTS
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SESSION = re.compile(r"\bsessions? \d+\b", re.IGNORECASE)


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def anchors(text):
    """GitHub's anchors of a Markdown text's headings: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in text.splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def check_links():
    failures = []
    links = 0
    for doc in DOCUMENTS:
        text = read(doc)
        # Links inside code blocks are code, not links.
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        for m in LINK.finditer(prose):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            links += 1
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(os.path.join(ROOT, resolved)):
                failures.append(f"{doc}: the link {target} names {resolved}, which does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(read(resolved)):
                failures.append(f"{doc}: the link {target}: {resolved} has no heading #{anchor}")
    for doc in CURRENT:
        for number, line in enumerate(read(doc).splitlines(), 1):
            if SESSION.search(line):
                failures.append(f"{doc}:{number}: names a work session: {line.strip()[:100]}")
    print(f"check_docs links: {links} relative links in {len(DOCUMENTS)} documents; {len(CURRENT)} documents "
          f"checked for work sessions named")
    return failures


def blocks(text, language):
    return [m.group(1) for m in re.finditer(r"```" + language + r"\n(.*?)```", text, flags=re.DOTALL)]


def split_includes(code):
    includes = [line for line in code.splitlines() if line.startswith("#include")]
    body = [line for line in code.splitlines() if not line.startswith("#include")]
    return "\n".join(includes), "\n".join(body)


def check_snippets(prefix, workdir):
    readme = read("README.md")
    cpp, c, cmake = blocks(readme, "cpp"), blocks(readme, "c"), blocks(readme, "cmake")
    if len(cpp) != 1 or len(c) != 1 or len(cmake) != 1:
        return [f"README.md: expected one cpp, one c and one cmake block, found {len(cpp)}, {len(c)}, {len(cmake)}"]
    os.makedirs(workdir, exist_ok=True)
    # The snippets use x, y, w, b (device pointers) and stream: parameters of a function each, built and linked (not
    # run: that needs a GPU).
    includes, body = split_includes(cpp[0])
    with open(os.path.join(workdir, "readme_cpp.cpp"), "w") as f:
        f.write(f"{includes}\n\nvoid readme_cpp(void* x, void* y, const void* w, const void* b, gnsilu_stream stream) "
                f"{{\n{body}\n}}\n\nint main() {{ return 0; }}\n")
    includes, body = split_includes(c[0])
    with open(os.path.join(workdir, "readme_c.c"), "w") as f:
        f.write(f"#include <stdio.h>\n{includes}\n\nvoid readme_c(void* x, void* y, gnsilu_stream stream);\n"
                f"void readme_c(void* x, void* y, gnsilu_stream stream) {{\n{body}\n}}\n")
    with open(os.path.join(workdir, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.20)\nproject(app LANGUAGES C CXX)\nset(CMAKE_CXX_STANDARD 20)\n"
                "set(CMAKE_C_STANDARD 11)\nadd_executable(app readme_cpp.cpp readme_c.c)\n"
                "target_compile_options(app PRIVATE -Wall -Werror -Wno-unused-variable)\n" + cmake[0])
    build = os.path.join(workdir, "build")
    for command in (["cmake", "-S", workdir, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}"],
                    ["cmake", "--build", build]):
        r = subprocess.run(command, capture_output=True, text=True)
        if r.returncode != 0:
            return [f"README.md's C, C++ and CMake blocks: {' '.join(command)} failed:\n{r.stdout}{r.stderr}"]
    print(f"check_docs snippets: README.md's C++, C and CMake blocks built against {prefix}")
    return []


def check_python():
    readme = read("README.md")
    code = blocks(readme, "python")
    if len(code) != 1:
        return [f"README.md: expected one python block, found {len(code)}"]
    try:
        import torch
        from diffusers import AutoencoderKL
    except ImportError as e:
        print(f"check_docs python: skipped: needs PyTorch and diffusers ({e})")
        sys.exit(77)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(32, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8).eval()
    latents = torch.randn(1, 4, 8, 8)
    names = {"vae": vae, "latents": latents, "model": vae}
    with torch.no_grad():
        exec(compile(code[0], "README.md (python block)", "exec"), names)
    image = names.get("image")
    if not isinstance(image, torch.Tensor) or tuple(image.shape) != (1, 3, 16, 16):
        return [f"README.md's python block: image is {type(image).__name__} "
                f"{tuple(image.shape) if isinstance(image, torch.Tensor) else ''}, not a 1x3x16x16 tensor"]
    print("check_docs python: README.md's PyTorch block ran on the CPU (a tiny AutoencoderKL)")
    return []


def tune_commands():
    """(document, command line) for every gnsilu-tune line of the README's and API.md's sh blocks; a line of
    alternatives ("gnsilu-tune list | show 3") gives each alternative."""
    commands = []
    for doc in ("README.md", "docs/API.md"):
        for block in blocks(read(doc), "sh"):
            for line in block.splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("gnsilu-tune "):
                    for alternative in line[len("gnsilu-tune "):].split(" | "):
                        commands.append((doc, alternative.split()))
    return commands


def check_tune(binary):
    import tempfile
    commands = tune_commands()
    if not any(doc == "README.md" for doc, _ in commands):
        return ["README.md: no gnsilu-tune command found in its sh blocks"]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("shapes.json", "fleet.json", "a.json"):  # files the commands name (only their existence checked)
            with open(os.path.join(tmp, name), "w") as f:
                f.write("{}\n")
        env = dict(os.environ, GNSILU_TUNE_PARSE_ONLY="1", GNSILU_CACHE=os.path.join(tmp, "cache.sqlite"))
        for doc, args in commands:
            r = subprocess.run([os.path.abspath(binary)] + args, cwd=tmp, env=env, capture_output=True, text=True)
            if r.returncode != 0 or "parsed, not run" not in r.stdout:
                failures.append(f"{doc}: 'gnsilu-tune {' '.join(args)}' is not a valid command line (exit status "
                                f"{r.returncode}): {(r.stdout + r.stderr).strip()[:300]}")
    print(f"check_docs tune: {len(commands)} gnsilu-tune commands of README.md and docs/API.md parsed by {binary}")
    return failures


def main(argv):
    if len(argv) >= 1 and argv[0] == "links":
        failures = check_links()
    elif len(argv) == 3 and argv[0] == "snippets":
        failures = check_snippets(argv[1], argv[2])
    elif len(argv) == 1 and argv[0] == "python":
        failures = check_python()
    elif len(argv) == 2 and argv[0] == "tune":
        failures = check_tune(argv[1])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for failure in failures:
        print(f"check_docs: FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
