#!/usr/bin/env bash
# The Python environment of the PyTorch and diffusers CPU tests: a venv with tools/requirements-test.txt (torch,
# diffusers and what they pull in, pinned), outside the checkout so that fresh clones reuse it:
# ${GNSILU_PYTHON_ENV:-$HOME/.cache/gnsilu/python-env}. Made once (about 2 minutes and 5 GB from PyPI), remade when
# the requirements file changes (a stamp with its hash), otherwise left alone.
#
#   bash tools/python_env.sh            make or check it; says how long it took
#   bash tools/python_env.sh --print    print its python (after making it if needed), and nothing else on stdout
#   bash tools/python_env.sh --path     print where its python is or will be, and do nothing else
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${GNSILU_PYTHON_ENV:-$HOME/.cache/gnsilu/python-env}
requirements=$PWD/tools/requirements-test.txt
python=$env_dir/bin/python
if [ "${1:-}" = --path ]; then
  echo "$python"
  exit 0
fi
want=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp=$env_dir/.gnsilu-requirements
if [ ! -x "$python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  start=$SECONDS
  echo "python_env: making $env_dir from tools/requirements-test.txt (PyPI; about 2 minutes the first time)" >&2
  base=${GNSILU_BASE_PYTHON:-python3}
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  if ! "$base" -m venv "$env_dir" >&2; then
    echo "python_env: '$base -m venv' failed (Debian: apt-get install python3-venv; tools/setup.sh installs it)" >&2
    exit 1
  fi
  if ! "$python" -m pip install --quiet --no-input --disable-pip-version-check -r "$requirements" >&2; then
    echo "python_env: pip could not install tools/requirements-test.txt (network? PyPI?); GNSILU_TEST_TORCH=0 runs" \
         "the tests without PyTorch (they report Skipped)" >&2
    rm -rf "$env_dir"
    exit 1
  fi
  echo "$want" > "$stamp"
  echo "python_env: made in $((SECONDS - start)) s ($(du -sh "$env_dir" | cut -f1))" >&2
elif [ "${1:-}" != --print ]; then
  echo "python_env: $env_dir is up to date with tools/requirements-test.txt" >&2
fi
if [ "${1:-}" = --print ]; then echo "$python"; fi
