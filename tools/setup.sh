#!/usr/bin/env bash
# Installs what building gnsilu needs on Debian 12 (run as root; a no-op when everything is there), and the Debian
# packages named as arguments (tools/fuzz.sh: clang).
# The CUDA toolkit (NVRTC and headers, 12.0 or newer) is expected at /usr/local/cuda or on the PATH.
set -euo pipefail
# ccache: every build compiles through it (tools/steps.sh). python3-venv and python3-pip: the wheel test
# (python/tests/test_wheel.sh) and the PyTorch test environment (tools/python_env.sh) make venvs and pip-install
# into them; a stock Debian 12 python3 has neither.
packages=(cmake make g++ python3 python3-venv python3-pip ccache libsqlite3-dev nlohmann-json3-dev libsqlitecpp-dev
          libspdlog-dev libfmt-dev doctest-dev libcli11-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -e /usr/local/cuda/include/nvrtc.h ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "setup: the CUDA toolkit (NVRTC and headers) is missing: install it at /usr/local/cuda" >&2
  exit 1
fi
