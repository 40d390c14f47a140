#!/usr/bin/env bash
# kiln's Python extension for another CPython than the build's, from that Python's headers:
#   tools/gpu/python-ext-for.sh INCLUDE_DIR EXT_SUFFIX      (e.g. .cpython-312-x86_64-linux-gnu.so)
# The device machines lent here run Python 3.12 and cannot build kiln; the build machine has
# 3.11 only. gpu-check.sh saves the device Python's headers when it cannot import the package
# (OUT/python-include.tar.gz); gpu-bundle.sh calls this for each saved Python. It reruns the
# build's own commands for kiln._kiln (nanobind and kiln_ext.cpp compiled against INCLUDE_DIR,
# then the same link against the build's kiln libraries) and writes
# build/python/kiln/_kiln${EXT_SUFFIX} beside the build's extension.
set -euo pipefail
cd "$(dirname "$0")/../.."
include=$(readlink -f "$1")
suffix=$2
[[ -f $include/Python.h ]] || { echo "python-ext-for: no Python.h in $include" >&2; exit 2; }
build=$(readlink -f "${KILN_BUILD_DIR:-build}")
cd "$build"
ext=$(ls python/kiln/_kiln.cpython-*.so 2>/dev/null | grep -v -- "$suffix" | head -1)
[[ -n $ext ]] || { echo "python-ext-for: no built extension in $build/python/kiln" >&2; exit 2; }
own=$(ninja -t commands "$ext" | grep -o -- '-I[^ ]*/include/python3\.[0-9]*' | head -1)
tag=python-${suffix//[^a-z0-9]/}
mkdir -p "$tag"
# Only the commands that build nanobind and the extension: the kiln libraries are the build's.
ninja -t commands "$ext" | grep -E 'python/CMakeFiles|libnanobind-static|_kiln\.cpython' |
  sed -e "s#$own#-I$include#g" -e "s#python/CMakeFiles/#$tag/CMakeFiles/#g" \
    -e "s#python/libnanobind-static.a#$tag/libnanobind-static.a#g" \
    -e "s#$ext#python/kiln/_kiln$suffix#g" -e 's#-MD -MT [^ ]* -MF [^ ]*##' |
  while read -r cmd; do
    out=$(grep -o -- '-o [^ ]*' <<<"$cmd" | head -1 | cut -c4- || true)
    [[ -n $out ]] && mkdir -p "$(dirname "$out")"
    bash -c "$cmd"
  done
echo "$build/python/kiln/_kiln$suffix"
