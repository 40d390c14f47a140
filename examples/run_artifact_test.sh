#!/usr/bin/env bash
# The embedding example: compile an artifact with `kiln`, run it with run_artifact (which links
# only kiln's runtime), and check that run_artifact needs neither Clang nor a frontend library.
set -euo pipefail
KILN=$1
EXAMPLE=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ldd "$EXAMPLE" | grep -E 'clang|onnx|protobuf|nvrtc'; then
  echo "FAIL: run_artifact links a compiler or frontend library (above)"
  exit 1
fi
"$KILN" compile mnist_cnn -o "$work/mnist_cnn.kiln" --cache-dir "$work/cache" >/dev/null
out=$("$EXAMPLE" "$work/mnist_cnn.kiln")
echo "$out"
grep -Eq '^%[^ ]+ : f32\[1,10\]  sum ' <<<"$out" || { echo "FAIL: unexpected output"; exit 1; }
# A damaged artifact is a clear error with exit code 2.
head -c 1000 "$work/mnist_cnn.kiln" >"$work/cut.kiln"
set +e
err=$("$EXAMPLE" "$work/cut.kiln" 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "truncated" <<<"$err" || { echo "FAIL: rc $rc: $err"; exit 1; }
echo "examples: run_artifact ok"
