#!/usr/bin/env bash
# kiln's binaries for a GPU machine that cannot build them (no LLVM 16 or oneDNN
# packages, no package registry) and takes at most 64 MiB of files:
#   scripts/gpu-bundle.sh [BUNDLE]        (default .gpu/bundle.tar.xz; build with scripts/build.sh)
# packs build/tools/kiln, build/tests/test_gpu, build/tests/kiln_onnx_conformance with the ONNX
# conformance cases (where scripts/onnx-conformance.sh generated them: 2.6 MB packed), every
# shared library they load except glibc's and libstdc++'s (the GPU machine's are as new or
# newer), and clang 16's resource headers.
# Two libraries that libLLVM and libxml2 load but kiln never calls into are replaced by stubs
# to fit the size: libz3 (the static analyzer's SMT solver; each function aborts, naming
# itself) and ICU's data (libicuuc needs the symbol at load time, not its 30 MB).
# On the GPU machine, `scripts/gpu-check.sh --bundle BUNDLE [OUT]` unpacks it and runs from it.
# The CUDA libraries are not packed: kiln dlopens the machine's own.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-.gpu/bundle.tar.xz}
build=${KILN_BUILD_DIR:-build}
bins=("$build/tools/kiln" "$build/tests/test_gpu" "$build/tests/kiln_onnx_conformance")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "gpu-bundle: $b is missing: run scripts/build.sh first" >&2; exit 2; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/clang"
cp "${bins[@]}" "$stage/bin/"
cases=$(scripts/onnx-conformance.sh --cases-dir)
if [[ -f $cases/cases.txt ]]; then
  cp -r "$cases" "$stage/onnx-cases"
else
  echo "gpu-bundle: no ONNX conformance cases (run scripts/onnx-conformance.sh once): not packed" >&2
fi
# kiln's Python package where it was built (KILN_PYTHON_EXECUTABLE): gpu-check.sh runs its CUDA
# test where the device machine's Python imports it.
libs_of=("${bins[@]}")
# The device machines' Python is not the build's (3.12 on the H100/H200 machines, 3.11 here): the
# extension is built again for each Python whose headers gpu-check.sh saved (its message says
# where they go: ~/.cache/kiln/gpu-python/SUFFIX/include, SUFFIX its EXT_SUFFIX without the dot).
if compgen -G "$build/python/kiln/_kiln*.so" >/dev/null; then
  for inc in "${KILN_GPU_PYTHON_DIR:-$HOME/.cache/kiln/gpu-python}"/*/include; do
    [[ -f $inc/Python.h ]] && tools/gpu/python-ext-for.sh "$inc" ".$(basename "$(dirname "$inc")")"
  done
fi
if compgen -G "$build/python/kiln/_kiln*.so" >/dev/null; then
  mkdir -p "$stage/python"
  cp -r "$build/python/kiln" "$stage/python/"
  libs_of+=("$build"/python/kiln/_kiln*.so)
fi
for lib in $(ldd "${libs_of[@]}" | awk '/=>/ {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so.* | libm.so.* | libstdc++.so.* | libgcc_s.so.*) ;;
    libz3.so.* | libicudata.so.*) ;;  # stubs below
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
llvm=$(dirname "$(ldd "${bins[0]}" | awk '/libLLVM/ {print $3}')")
resource=$(echo "$llvm/clang/"*)
cp -r "$resource/include" "$stage/clang/"
echo "$resource" >"$stage/clang-resource-dir"
echo "$PWD" >"$stage/source-root"

# The stubs, by the names and symbols the real libraries export to these binaries.
z3=$(ldd "${bins[0]}" | awk '/libz3/ {print $1}')
icu=$(ldd "${bins[0]}" | awk '/libicudata/ {print $1}')
{
  echo '#include <stdio.h>'
  echo '#include <stdlib.h>'
  objdump -T "$llvm/libLLVM-"*.so.* | awk '$NF ~ /^Z3_/ && /UND/ {print $NF}' | sort -u |
    while read -r f; do
      echo "void $f(void) { fputs(\"kiln GPU bundle: $f called (libz3 is a stub)\\n\", stderr); abort(); }"
    done
} >"$stage/z3.c"
cc -shared -fPIC -O1 -Wl,-soname,"$z3" -o "$stage/lib/$z3" "$stage/z3.c"
sym=$(objdump -T "$(ldd "${bins[0]}" | awk '/libicuuc/ {print $3}')" |
  awk '$NF ~ /^icudt[0-9]+_dat$/ {print $NF}')
echo "const char $sym[64] = {0};" >"$stage/icu.c"
cc -shared -fPIC -Wl,-soname,"$icu" -o "$stage/lib/$icu" "$stage/icu.c"
rm "$stage/z3.c" "$stage/icu.c"

mkdir -p "$(dirname "$bundle")"
tar -C "$stage" -cf - . | xz -9e -T2 >"$bundle.tmp"
mv "$bundle.tmp" "$bundle"
ls -la "$bundle"
