#!/usr/bin/env bash
# Installs every Debian package kiln's build, tests and tools use. Idempotent: when all are
# present it does nothing (no apt-get update).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache   # toolchain
  catch2                                     # tests
  nlohmann-json3-dev                         # JSON graph format, CLI --json
  clang-format                               # code formatting (.clang-format)
  llvm-16-dev                                # ORC JIT object loader, CPU code generation
  libclang-16-dev libclang-cpp16-dev clang-16  # in-process C++ kernel compiler
  libclang-rt-16-dev libomp-16-dev           # fuzz build (clang): libFuzzer, sanitizers, omp.h
  libdnnl-dev ocl-icd-opencl-dev             # oneDNN (its CMake config needs OpenCL headers)
  libonnx-dev libprotobuf-dev protobuf-compiler  # ONNX importer (libonnx 1.12, protobuf)
  libxxhash-dev                              # section checksums of AOT artifacts (XXH3)
  libpng-dev libturbojpeg0-dev               # kiln train --data folder: (PNG and JPEG decoding)
  libzip-dev                                 # kiln train --data npz: (NumPy .npz archives)
  libopenmpi-dev openmpi-bin                 # kiln train --ddp (data-parallel over MPI)
  python3-venv                               # the pinned Python environments (ONNX conformance, peers)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
