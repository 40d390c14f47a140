#!/usr/bin/env bash
# End-to-end tests of the `kiln` tool: results, exit codes, error messages and files left
# behind. Usage: cli_tests.sh KILN_BINARY TESTS_DIR (the source tree's tests/) TAMPER_ARTIFACT
set -u
KILN=$1
TESTS_DIR=$(cd "$2" && pwd)
TAMPER=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
pass=0
fail=0

# check NAME EXPECTED_EXIT PATTERN -- COMMAND...: runs COMMAND, checks its exit code and that
# stdout+stderr contain PATTERN (a grep -E regex; empty: no check).
check() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: $name: exit $rc, expected $want"; echo "$out" | head -5 | sed 's/^/    /'
    fail=$((fail + 1)); return
  fi
  if [ -n "$pattern" ] && ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: $name: output lacks /$pattern/"; echo "$out" | head -5 | sed 's/^/    /'
    fail=$((fail + 1)); return
  fi
  pass=$((pass + 1))
}
# absent NAME FILE...: none of the files exist.
absent() {
  local name=$1; shift
  for f in "$@"; do
    if [ -e "$f" ]; then echo "FAIL: $name: $f was left behind"; fail=$((fail + 1)); return; fi
  done
  pass=$((pass + 1))
}

# ---- Happy paths.
check "help" 0 "usage: kiln COMMAND" -- "$KILN" --help
check "help keeps long command names whole" 0 "  bench-kernels +Bandwidth" -- "$KILN" --help
check "info resnet50 --json" 0 '"parameters": 25557032' -- "$KILN" info resnet50 --json
check "info resnet50 GMAC" 0 '"gmacs_per_sample": 4\.0[89]' -- "$KILN" info resnet50 --json
check "info mnist_cnn" 0 "1,199,882 trainable" -- "$KILN" info mnist_cnn
check "dump" 0 "= conv2d\(%input" -- "$KILN" dump mnist_cnn
check "run eager" 0 "ran mlp eagerly" -- "$KILN" run mlp --eager --batch 2
check "run --json" 0 '"all_finite": true' -- "$KILN" run mnist_cnn --eager --json
check "run writes output" 0 "wrote y.npy" -- "$KILN" run mlp --eager --output y.npy
check "export" 0 "wrote" -- "$KILN" export mlp -o mlp.json --seed 3
check "export writes weights" 0 "" -- test -s mlp.safetensors
check "run exported json" 0 "ran mlp.json eagerly" -- "$KILN" run mlp.json --eager
# The exported model computes what the zoo model computes on the same input.
"$KILN" run mlp --eager --seed 3 --output ref.npy >/dev/null 2>&1
"$KILN" run mlp.json --eager --seed 3 --output got.npy >/dev/null 2>&1
check "exported model matches zoo model" 0 "" -- cmp ref.npy got.npy

# A model file may not reach outside its directory through a symlink.
mkdir -p linked outside
cp mlp.safetensors outside/w.safetensors
sed 's/"mlp.safetensors"/"w.safetensors"/' mlp.json >linked/model.json
ln -s "$PWD/outside/w.safetensors" linked/w.safetensors
check "symlinked weights outside the model's directory" 2 "outside the JSON file's directory" -- \
  "$KILN" run linked/model.json --eager

# ---- Bad input: exit code 2, a message naming the culprit, no partial output.
check "unknown command" 2 "unknown command 'frobnicate'" -- "$KILN" frobnicate
check "unknown option" 2 "unknown option --bogus" -- "$KILN" info mlp --bogus
check "bad --batch" 2 "--batch expects an integer" -- "$KILN" info mlp --batch many
check "unknown zoo model" 2 "resnet50" -- "$KILN" info resnet51
check "missing file" 2 "nope\.json" -- "$KILN" info nope.json
printf '{"format": "kiln-graph", "version": 1, "name": ' > bad.json
check "truncated json" 2 "bad\.json" -- "$KILN" info bad.json
printf 'this is not json' > bad2.json
check "invalid json" 2 "bad2\.json" -- "$KILN" info bad2.json
sed 's/"op":"relu"/"op":"relu_six"/' mlp.json > unknown_op.json
cp mlp.safetensors unknown_op.safetensors
check "unknown op" 2 "relu_six" -- "$KILN" info unknown_op.json
sed 's/"op":"relu",/"op":"relu","attributes":{"alpha":{"float":1.0}},/' mlp.json > bad_attr.json
cp mlp.safetensors bad_attr.safetensors
check "unknown attribute" 2 "alpha" -- "$KILN" info bad_attr.json
"$KILN" export mnist_cnn -o cnn.json >/dev/null 2>&1
sed 's/"kernel":{"ints":\[2,2\]}/"kernel":{"string":"2x2"}/' cnn.json > bad_kind.json
cp cnn.safetensors bad_kind.safetensors
check "wrong attribute type" 2 "kernel.*ints" -- "$KILN" info bad_kind.json
sed 's/"mlp\.safetensors"/"noweights.safetensors"/' mlp.json > noweights.json
check "missing weights file" 2 "noweights\.safetensors" -- "$KILN" info noweights.json
sed 's/"mlp\.safetensors"/"trunc.safetensors"/' mlp.json > trunc.json
head -c 1000 mlp.safetensors > trunc.safetensors
check "truncated safetensors" 2 "trunc\.safetensors" -- "$KILN" run trunc.json --eager
check "wrong input shape" 2 "input 'input' expects f32\[1,784\].*f32\[1,10\]" -- \
  "$KILN" run mlp --eager --input y.npy --output never.npy
absent "no output after failed run" never.npy
head -c 60 y.npy > trunc.npy
check "truncated npy" 2 "trunc\.npy" -- "$KILN" run mlp --eager --input trunc.npy --output never.npy
absent "no output after bad input file" never.npy
check "missing input file" 2 "missing\.npy" -- "$KILN" run mlp --eager --input missing.npy
check "too many inputs" 2 "has 1 inputs, got 2" -- "$KILN" run mlp --eager --input y.npy --input y.npy
check "output count" 2 "has 1 outputs, got 2" -- "$KILN" run mlp --eager --output a.npy --output b.npy
check "export to missing dir" 2 "no_such_dir" -- "$KILN" export mlp -o no_such_dir/m.json
absent "no partial export" no_such_dir/m.json no_such_dir/m.safetensors
check "export wrong extension" 2 "must be a \.json" -- "$KILN" export mlp -o m.txt
check "run compiled" 0 "ran mlp compiled" -- "$KILN" run mlp --cache-dir cache
"$KILN" run mlp --seed 4 --output c.npy --cache-dir cache >/dev/null 2>&1
"$KILN" run mlp --seed 4 --eager --output e.npy >/dev/null 2>&1
check "compiled output saved" 0 "" -- test -s c.npy
check "compile report" 0 "generated kernels" -- "$KILN" compile mnist_cnn --cache-dir cache
check "compile explain fusion" 0 "rejected fusions" -- "$KILN" compile bert_layer --explain-fusion --cache-dir cache
check "compile explain cache" 0 "cache kiln_module0: hit" -- "$KILN" compile mnist_cnn --explain-cache --cache-dir cache
check "compile --json" 0 '"generated_kernels"' -- "$KILN" compile mlp --json --cache-dir cache
check "emit kernels" 0 "" -- "$KILN" compile mnist_cnn --emit-kernels kernels --cache-dir cache
check "emitted kernel files" 0 "" -- test -s kernels/kiln_k0.cpp
check "emitted cuda files" 0 "" -- test -s kernels/kiln_k0.cu
check "explain algos (autotuned)" 0 "algo node 'conv1'.*timed:" -- "$KILN" compile mnist_cnn --explain-algos --cache-dir cache2
check "explain algos (cached)" 0 "algo node 'conv1'.*cached:" -- "$KILN" compile mnist_cnn --explain-algos --cache-dir cache2
check "explain algos (heuristic)" 0 "heuristic" -- "$KILN" compile mnist_cnn --explain-algos --no-autotune --cache-dir cache
check "resnet conversions" 0 '"layout_conversions": 1' -- "$KILN" compile resnet18 --json --no-autotune --cache-dir cache
check "dump-after" 0 "// after dce" -- "$KILN" compile mlp --dump-after dce --cache-dir cache
check "unknown pass" 2 "unknown pass 'fold-all'" -- "$KILN" compile mlp --disable-pass fold-all
check "bench" 0 "speedup" -- "$KILN" bench mlp --runs 3 --warmup 1
check "bench --json" 0 '"compile_cold_ms"' -- "$KILN" bench mnist_cnn --runs 2 --warmup 0 --json
check "bad --runs" 2 "--runs must be between" -- "$KILN" bench mlp --runs 0
check "bench --only compiled" 0 "compiled alone, 3 runs: median [0-9.]+ ms" -- \
  "$KILN" bench mnist_cnn --runs 3 --warmup 0 --only compiled
check "bench --only eager --json" 0 '"eager": \{' -- \
  "$KILN" bench mlp --runs 2 --warmup 0 --only eager --json
check "bad --only" 2 "--only takes eager or compiled, got 'both'" -- "$KILN" bench mlp --only both
check "profile" 0 "conv2d\+relu +library" -- "$KILN" profile mnist_cnn --runs 2 --no-peak
check "profile --trace" 0 "trace: trace.json \([0-9]+ events" -- \
  "$KILN" profile mnist_cnn --runs 2 --warmup 0 --no-peak --trace trace.json
# One complete event per executed step: 2 runs of eager's nodes and of the compiled plan's steps.
check "profile trace events" 0 "^ok$" -- python3 -c '
import json, subprocess, sys
t = json.load(open("trace.json"))
x = [e for e in t["traceEvents"] if e["ph"] == "X"]
j = json.loads(subprocess.run([sys.argv[1], "profile", "mnist_cnn", "--runs", "2", "--no-peak",
                               "--json"], capture_output=True, text=True).stdout)
want = sum(2 * r["calls_per_run"] for side in ("eager", "compiled") for r in j[side]["ops"])
print("ok" if len(x) == round(want) and all(e["dur"] >= 0 for e in x) else f"{len(x)} != {want}")
' "$KILN"
check "profile --trace into a missing directory" 2 "does not exist" -- \
  "$KILN" profile mlp --runs 1 --no-peak --trace nowhere/trace.json
check "bench-kernels --peak" 0 "fp32 FMA [0-9.]+ GFLOP/s.*" -- \
  "$KILN" bench-kernels --peak --rows 64 --cols 64 --runs 2
check "missing onnx file" 2 "model\.onnx" -- "$KILN" info model.onnx

# ---- ONNX models with a symbolic batch dim ("N"), from the fuzz seeds.
ONNX_CNN=$TESTS_DIR/fuzz/corpus/onnx/cnn.onnx
# A .npy of f32 zeros: npy_zeros FILE "3, 2, 8, 8" ELEMENTS (a version 1.0 header, 128 bytes).
npy_zeros() {
  local header="{'descr': '<f4', 'fortran_order': False, 'shape': ($2), }"
  header=$(printf '%-117s' "$header")
  { printf '\x93NUMPY\x01\x00\x76\x00'; printf '%s\n' "$header"; head -c $(($3 * 4)) /dev/zero; } >"$1"
}
npy_zeros x3.npy "3, 2, 8, 8" 384
npy_zeros x3bad.npy "3, 2, 9, 8" 432
check "onnx info --batch" 0 "input +%x : f32\[3,2,8,8\]" -- "$KILN" info "$ONNX_CNN" --batch 3
check "onnx dump keeps dim names" 0 "%x : f32\[N=1,2,8,8\]" -- "$KILN" dump "$ONNX_CNN"
check "onnx run, symbolic batch from the input" 0 "%p : f32\[3,3\]" -- \
  "$KILN" run "$ONNX_CNN" --input x3.npy --cache-dir cache
check "onnx run eager, symbolic batch" 0 "%p : f32\[3,3\]" -- "$KILN" run "$ONNX_CNN" --eager --input x3.npy
check "onnx run, static dim changed" 2 "dim 2 is fixed at 8 by the model, got 9" -- \
  "$KILN" run "$ONNX_CNN" --eager --input x3bad.npy
check "onnx bench" 0 "speedup" -- "$KILN" bench "$ONNX_CNN" --runs 2 --warmup 0 --cache-dir cache
# Integer and boolean graph inputs: random within --int-range (default [0, 10)), or .npy files.
TOKENS=$TESTS_DIR/data/onnx/token_embedding.onnx
check "run, random int64 and bool inputs" 0 "%y : f32\[2,3,4\]" -- \
  "$KILN" run "$TOKENS"
check "run eager, --int-range" 0 "input 0 \(i64\[2,3\]\) drawn from \[2, 4\)" -- \
  "$KILN" run "$TOKENS" --eager --int-range 2:4
check "run, --int-range past the table" 2 "index 1[0-9] .*out of range for dim 0 of size 10" -- \
  "$KILN" run "$TOKENS" --int-range 10:20
check "run, bad --int-range" 2 "--int-range expects LO:HI" -- "$KILN" run "$TOKENS" --int-range 3:3
check "bench, integer inputs" 0 "speedup" -- "$KILN" bench "$TOKENS" --runs 2 --warmup 0 --cache-dir cache

# ---- A model run in stages: y = x[x > 0] (NonZero), z = y[y > 0.5] (Compress); the sizes
# come from the values. x = [[1, -1, 0.25, 2], [2, 0, -1, 1]] as little-endian f32.
MASKED=$TESTS_DIR/data/onnx/masked_select.onnx
{ printf '\x93NUMPY\x01\x00\x76\x00'; printf '%-117s\n' "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }"
  printf '\x00\x00\x80\x3f\x00\x00\x80\xbf\x00\x00\x80\x3e\x00\x00\x00\x40'
  printf '\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x80\xbf\x00\x00\x80\x3f'; } >mask.npy
npy_zeros mask0.npy "3, 4" 12
check "run in stages" 0 "%y : f32\[5\].*mean 1\.25" -- "$KILN" run "$MASKED" --input mask.npy --cache-dir cache
check "run in stages, the second size" 0 "%z : f32\[4\].*mean 1\.5" -- \
  "$KILN" run "$MASKED" --input mask.npy --cache-dir cache
check "run in stages eagerly" 0 "stage at node 1, size of where = 5" -- "$KILN" run "$MASKED" --eager --input mask.npy
check "run in stages, nothing selected" 0 "%z : f32\[0\]" -- "$KILN" run "$MASKED" --input mask0.npy --cache-dir cache
check "run in stages, seeded input" 0 "%y : f32\[[0-4]\]" -- "$KILN" run "$MASKED" --eager

# ---- Ahead-of-time artifacts.
check "compile -o artifact" 0 "wrote mnist\.kiln" -- "$KILN" compile mnist_cnn -o mnist.kiln --cache-dir cache
check "inspect" 0 "format version 2" -- "$KILN" inspect mnist.kiln
check "inspect --json" 0 '"name": "weights"' -- "$KILN" inspect mnist.kiln --json
check "run artifact" 0 "ran mnist\.kiln from the artifact" -- "$KILN" run mnist.kiln --output ya.npy
# The same algorithms as the artifact: compile autotuned them into this cache.
"$KILN" run mnist_cnn --autotune --output yc.npy --cache-dir cache >/dev/null 2>&1
check "artifact output equals compiled output" 0 "" -- cmp ya.npy yc.npy
check "bench artifact" 0 "loaded in .* ms \(.* of it preparing library calls, (0\.0[1-9]|0\.[1-9]|[1-9])[0-9.]* the warm-up run\)" -- \
  "$KILN" bench mnist.kiln --runs 2 --warmup 0
check "bench artifact --no-warmup" 0 "library calls, 0\.00 the warm-up run" -- \
  "$KILN" bench mnist.kiln --runs 2 --warmup 0 --no-warmup
check "compile --shapes" 0 "wrote cnn5\.kiln" -- \
  "$KILN" compile "$ONNX_CNN" --shapes x=5x2x8x8 -o cnn5.kiln --cache-dir cache
check "artifact keeps dim names" 0 "%x : f32\[N=5,2,8,8\]" -- "$KILN" inspect cnn5.kiln
check "artifact input shape checked" 2 "input 'x'.*f32\[5,2,8,8\].*f32\[3,2,8,8\]" -- \
  "$KILN" run cnn5.kiln --input x3.npy
check "--shapes static dim" 2 "dim 1 is fixed at 2 by the model, got 3" -- \
  "$KILN" compile "$ONNX_CNN" --shapes x=5x3x8x8 -o never.kiln
absent "no artifact on error" never.kiln
check "artifact wrong extension" 2 "ends in \.kiln" -- "$KILN" compile mlp -o mlp.bin
head -c 5000 mnist.kiln >cut.kiln
check "truncated artifact" 2 "truncated" -- "$KILN" run cut.kiln
check "not an artifact" 2 "not a kiln artifact" -- "$KILN" inspect y.npy
check "artifact --eager" 2 "needs the model" -- "$KILN" run mnist.kiln --eager
# Tampered and resealed (the checksums are not signatures): the object check refuses it.
check "tamper a resealed artifact" 0 "" -- "$TAMPER" mnist.kiln tampered.kiln
check "a malformed object in a resealed artifact" 2 "object 'kiln_module0' is malformed.*relocation" -- \
  "$KILN" run tampered.kiln --no-recompile
check "a malformed object, inspected" 0 "format version" -- "$KILN" inspect tampered.kiln
# A compile killed with SIGKILL leaves its temporary; the next write into the directory
# removes it (its process is gone).
mkdir -p killed
"$KILN" compile resnet50 -o killed/r.kiln --cache-dir cache >/dev/null 2>&1 &
victim=$!
# Up to 60 s for the temporary to appear (a loaded CI machine, ctest -j2 beside the training and
# Python tests, took more than 10 s), watched with shell builtins alone and killed at once: the
# temporary lives only while the artifact is written and synced (tens of ms for resnet50's 100
# MB), which a poll every 50 ms through ls missed (stale 0 after the kill, seen in CI). It spins
# (a builtin `read -t` waits 4 ms at the least) for the compile's second or so.
shopt -s nullglob dotglob
SECONDS=0
while ((SECONDS < 60)) && kill -0 $victim 2>/dev/null; do
  temps=(killed/*tmp*)
  ((${#temps[@]})) && break
done
kill -9 $victim 2>/dev/null; wait $victim 2>/dev/null
shopt -u nullglob dotglob
stale=$(ls -A killed | grep -c tmp)
check "compile -o after a killed compile" 0 "wrote killed/m\.kiln" -- \
  "$KILN" compile mnist_cnn -o killed/m.kiln --cache-dir cache
leftover=$(ls -A killed | grep -c tmp)
if [ "$stale" -ge 1 ] && [ "$leftover" -eq 0 ]; then pass=$((pass + 1)); else
  echo "FAIL: stale temporary files: $stale after the kill, $leftover after the next compile"
  fail=$((fail + 1))
fi
head -c 40 mnist.kiln >short.kiln
check "artifact cut inside its header" 2 "truncated: 40 bytes, fewer than its 64-byte header" -- \
  "$KILN" inspect short.kiln
check "compile --target-cpu x86-64-v3" 0 "wrote v3\.kiln" -- \
  "$KILN" compile mnist_cnn --target-cpu x86-64-v3 -o v3.kiln --cache-dir cache
check "inspect portable artifact" 0 "x86-64-v3" -- "$KILN" inspect v3.kiln
check "run portable artifact" 0 "ran v3\.kiln from the artifact" -- "$KILN" run v3.kiln
check "KILN_TARGET_CPU" 0 "code for CPU x86-64-v2" -- \
  env KILN_TARGET_CPU=x86-64-v2 "$KILN" compile mnist_cnn --cache-dir cache
# --device: the CUDA backend's kernels on the emu device match the CPU's output line; without a
# GPU, --device cuda is one line and exit code 2 (skipped on a machine that has one).
cpu_line=$("$KILN" run mnist_cnn --cache-dir cache 2>&1 | grep "first:")
check "run --device emu" 0 "${cpu_line//./\\.}" -- "$KILN" run mnist_cnn --device emu --cache-dir cache
check "run --device emu --eager" 0 "ran mnist_cnn eagerly" -- "$KILN" run mnist_cnn --device emu --eager
check "emu memory exhausted" 2 "out of device memory: allocating .* of 16\.0 MiB in use on the emu device" -- \
  env KILN_EMU_MEMORY_MB=16 "$KILN" run resnet50 --device emu --cache-dir cache
check "info --device emu" 0 "libraries   the CPU's library" -- "$KILN" info --device emu
check "run --device emu --precision tf32" 0 "first:" -- \
  "$KILN" run mnist_cnn --device emu --precision tf32 --cache-dir cache
check "--precision tf32 on the CPU" 2 "backend 'cpu' has no TF32 arithmetic" -- \
  "$KILN" run mlp --precision tf32
check "run --device emu --precision bf16" 0 "first:" -- \
  "$KILN" run mnist_cnn --device emu --precision bf16 --cache-dir cache
check "run --device emu --precision fp16 --eager" 0 "ran mnist_cnn eagerly" -- \
  "$KILN" run mnist_cnn --device emu --precision fp16 --eager --cache-dir cache
check "--precision bf16 on the CPU (converted)" 0 "first:" -- \
  "$KILN" run mlp --precision bf16 --cache-dir cache
check "compile --precision bf16 on the CPU says what it converts" 0 "operands widened to f32" -- \
  "$KILN" compile mlp --precision bf16 --verbose --cache-dir cache
check "unknown --precision" 2 "unknown precision 'fp8' \(fp32, tf32, bf16 or fp16\)" -- \
  "$KILN" run mlp --device emu --precision fp8
check "unknown --device" 2 "unknown device 'tpu' \(devices: cpu, cuda, emu\)" -- \
  "$KILN" run mlp --device tpu
# No CUDA library is a dependency of the binary: the driver, NVRTC, nvJitLink, cuBLASLt and cuDNN
# are all dlopen'ed, so kiln starts (and runs on the CPU) on machines without them.
if command -v readelf >/dev/null 2>&1; then
  needed=$(readelf -d "$KILN" | grep NEEDED | grep -Ei "cuda|nvrtc|nvjitlink|cublas|cudnn|nccl")
  check "kiln links no CUDA library" 0 "" -- test -z "$needed"
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  check "--device cuda without a GPU" 2 "^kiln run: error: no CUDA device: .*\)$" -- \
    "$KILN" run mlp --device cuda
  # The toolkit's stub libcuda: every driver function kiln uses resolves, cuInit refuses.
  for stub in /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/lib/stubs/libcuda.so; do
    if [ -e "$stub" ]; then
      mkdir -p stubcuda && ln -sf "$stub" stubcuda/libcuda.so.1
      check "--device cuda with the stub driver" 2 "failed to initialize \(CUDA_ERROR_STUB_LIBRARY" -- \
        env LD_LIBRARY_PATH="$PWD/stubcuda" "$KILN" run mlp --device cuda
      break
    fi
  done
  lines=$("$KILN" run mlp --device cuda 2>&1 | wc -l)
  check "--device cuda without a GPU: one line" 0 "" -- test "$lines" -eq 1
fi
# --emit-kernels writes self-contained .cu files: nvcc compiles each alone (resnet18, bert_layer).
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
if [ -x "$NVCC" ]; then
  for m in resnet18 bert_layer; do
    check "compile $m --emit-kernels" 0 "" -- "$KILN" compile $m --device emu --emit-kernels "cu_$m" --cache-dir cache
    check "$m .cu files compile alone with nvcc" 0 "" -- \
      "$NVCC" -ptx -arch=compute_90 -odir "cu_$m" "cu_$m"/*.cu
    check "$m .cu files: one PTX each" 0 "" -- \
      test "$(ls "cu_$m"/*.ptx | wc -l)" -eq "$(ls "cu_$m"/*.cu | wc -l)"
  done
fi
check "unknown --target-cpu" 2 "unknown target CPU 'pentium-9000'.*x86-64-v3" -- \
  "$KILN" compile mlp --target-cpu pentium-9000 -o bad.kiln
absent "no artifact for an unknown target" bad.kiln
check "unknown host CPU still compiles" 0 "code for CPU x86-64" -- \
  env KILN_SIMULATE_HOST_CPU=generic "$KILN" compile mnist_cnn --cache-dir cache


# ---- Serving and resource limits.
check "bench --concurrency" 0 "p99 ms" -- \
  "$KILN" bench mnist_cnn --concurrency 1,2 --duration 0.3 --cache-dir cache
check "bench artifact --concurrency --json" 0 '"p99_ms"' -- \
  "$KILN" bench mnist.kiln --concurrency 3 --duration 0.3 --json
check "bad --concurrency" 2 "--concurrency expects client counts" -- \
  "$KILN" bench mlp --concurrency 0
check "bad --duration" 2 "--duration expects seconds" -- \
  "$KILN" bench mlp --concurrency 1 --duration soon
check "--max-memory too small" 2 "the model needs .*weights 4\.8 MB.*more than the memory limit of 1\.0 MB" -- \
  "$KILN" run mnist_cnn --max-memory 1M --cache-dir cache
check "--max-memory on an artifact" 2 "more than the memory limit of 2\.0 MB" -- \
  "$KILN" run mnist.kiln --max-memory 2M
check "--max-memory enough" 0 "ran mnist_cnn compiled" -- \
  "$KILN" run mnist_cnn --max-memory 1G --cache-dir cache
check "bad --max-memory" 2 "--max-memory expects a size" -- "$KILN" run mlp --max-memory lots
check "--max-memory eager, activations" 2 "node 'conv2'.*past the limit of" -- \
  "$KILN" run mnist_cnn --eager --max-memory 5M
check "--max-memory eager, weights" 2 "weights \(4799528 bytes\) alone exceed the memory limit" -- \
  "$KILN" run mnist_cnn --eager --max-memory 4M
check "--max-memory eager, enough" 0 "ran mnist_cnn eagerly" -- \
  "$KILN" run mnist_cnn --eager --max-memory 20M

# ---- An unusable kernel cache directory: compiled anyway, one warning.
echo x >notadir
out=$("$KILN" compile resnet18 --autotune --cache-dir notadir 2>&1)
rc=$?
warnings=$(grep -c "warning: kernel cache" <<<"$out")
if [ "$rc" -eq 0 ] && [ "$warnings" -eq 1 ]; then pass=$((pass + 1)); else
  echo "FAIL: unusable cache dir: exit $rc, $warnings warnings (want 0, 1)"; echo "$out" | head -5
  fail=$((fail + 1))
fi

# ---- Training.
check "train mlp" 0 "loss 2\.[0-9]+ -> 0\." -- "$KILN" train mlp --steps 30 --batch 32 --cache-dir cache
check "train --json" 0 '"samples_per_s"' -- "$KILN" train mlp --steps 3 --batch 8 --eager --json
check "train --no-dropout --profile" 0 "profile of one step" -- "$KILN" train mnist_cnn --steps 2 --batch 8 --eager --no-dropout --profile
check "train bad optimizer" 2 "--optimizer must be sgd or adam" -- "$KILN" train mlp --optimizer rmsprop
check "train non-classifier" 2 "trains classifiers.*f32\[1,128,768\]" -- "$KILN" train bert_layer --steps 1 --batch 1
# A batch of NaN: the loss is NaN, an error unless allowed.
npy_header() {
  local header="{'descr': '$2', 'fortran_order': False, 'shape': ($3), }"
  header=$(printf '%-117s' "$header")
  { printf '\x93NUMPY\x01\x00\x76\x00'; printf '%s\n' "$header"; } >"$1"
}
npy_header xnan.npy '<f4' "8, 784"
printf '\x00\x00\xc0\x7f%.0s' $(seq $((8 * 784))) >>xnan.npy
npy_header ynan.npy '<i8' "8,"
head -c 64 /dev/zero >>ynan.npy
check "train on NaN data stops" 2 "training step 1: the loss is nan.*--allow-nonfinite" -- \
  "$KILN" train mlp --steps 3 --batch 8 --data xnan.npy --labels ynan.npy --cache-dir cache
check "train --allow-nonfinite" 0 "loss nan" -- "$KILN" train mlp --steps 3 --batch 8 \
  --data xnan.npy --labels ynan.npy --allow-nonfinite --cache-dir cache
check "train eager on NaN data stops" 2 "the loss is nan" -- \
  "$KILN" train mlp --steps 3 --batch 8 --data xnan.npy --labels ynan.npy --eager
check "train --device emu --precision bf16" 0 "loss 2\.[0-9]+ -> 2\." -- \
  "$KILN" train mlp --device emu --precision bf16 --steps 2 --batch 8 --cache-dir cache
check "train --precision fp16 (dynamic loss scaling)" 0 "fp16 loss scaling: [0-9]+ step\(s\) skipped" -- \
  "$KILN" train mlp --precision fp16 --steps 3 --batch 8 --cache-dir cache
check "train labels without data" 2 "--labels goes with --data x.npy" -- "$KILN" train mlp --labels y.npy
# --data: IDX files (a tiny MNIST-shaped set: 70 images of 28x28, labels 0-9) and its errors.
idx() {  # idx FILE TYPE_RANK DIMS... : an IDX header then bytes i % 256
  local file=$1 rank=$2; shift 2
  local n=1
  { printf '\x00\x00\x08'; printf "\\x$(printf %02x "$rank")"
    for d in "$@"; do printf "\\x$(printf %02x $((d >> 24 & 255)))\\x$(printf %02x $((d >> 16 & 255)))\\x$(printf %02x $((d >> 8 & 255)))\\x$(printf %02x $((d & 255)))"; n=$((n * d)); done
    python3 -c "import sys; sys.stdout.buffer.write(bytes(i % ${mod:-256} for i in range($n)))"; } >"$file"
}
mkdir -p digits
idx digits/train-images-idx3-ubyte 3 70 28 28
mod=10 idx digits/train-labels-idx1-ubyte 1 70
check "train --data idx: --epochs" 0 "epoch 2/2 .*val .*data wait" -- \
  "$KILN" train mnist_cnn --data idx:digits --epochs 2 --batch 16 --cache-dir cache
check "train --data idx: --json" 0 '"val_accuracy"' -- \
  "$KILN" train mnist_cnn --data idx:digits --epochs 1 --batch 16 --json --cache-dir cache
check "train --data: unknown form" 2 "expected idx:DIR .*npy:X.npy,Y.npy, npz:FILE.npz or folder:DIR" -- \
  "$KILN" train mnist_cnn --data csv:digits --epochs 1
check "train --data: samples of another shape" 2 "samples of \[1,28,28\], the model takes \[784\]" -- \
  "$KILN" train mlp --data idx:digits --epochs 1 --batch 16
mkdir -p badlabels && cp digits/train-images-idx3-ubyte badlabels/
idx badlabels/train-labels-idx1-ubyte 1 70
check "train --data: a label beyond the classes" 2 "sample 10 has label 10, the model has 10 classes" -- \
  "$KILN" train mnist_cnn --data idx:badlabels --epochs 1 --batch 16
# Checkpoints: a resumed run is bitwise the uninterrupted one; refusals; serving the weights.
T=(train mnist_cnn --data idx:digits --batch 16 --cache-dir cache)
check "train --checkpoint" 0 "" -- "$KILN" "${T[@]}" --steps 8 --checkpoint full --save-every 4
check "train --checkpoint, half" 0 "" -- "$KILN" "${T[@]}" --steps 4 --checkpoint half
check "train --resume" 0 "resumed from half/ckpt-00000004.safetensors at step 4" -- \
  "$KILN" "${T[@]}" --steps 8 --checkpoint half --resume
check "resumed run == uninterrupted run, bit for bit" 0 "" -- \
  cmp full/ckpt-00000008.safetensors half/ckpt-00000008.safetensors
check "train --resume with another lr" 2 "was trained with lr 0.01.*this run has 0.02" -- \
  "$KILN" "${T[@]}" --steps 12 --checkpoint half --resume --lr 0.02
check "train --resume past its end" 2 "is at step 8, this run ends at 8" -- \
  "$KILN" "${T[@]}" --steps 8 --checkpoint half --resume
check "train --resume without a checkpoint" 2 "checkpoint 'empty' does not exist" -- \
  "$KILN" "${T[@]}" --steps 8 --checkpoint empty --resume
check "train into a directory that holds a checkpoint" 2 "holds a checkpoint already: --resume" -- \
  "$KILN" "${T[@]}" --steps 8 --checkpoint half
check "train --save-every without --checkpoint" 2 "need --checkpoint DIR" -- \
  "$KILN" "${T[@]}" --steps 8 --save-every 2
head -c 1000 full/ckpt-00000008.safetensors >full/cut && mv full/cut full/ckpt-00000008.safetensors
check "train --resume from a damaged checkpoint" 2 "full/ckpt-00000008.safetensors" -- \
  "$KILN" "${T[@]}" --steps 12 --checkpoint full --resume
check "compile --weights from a checkpoint" 0 "" -- \
  "$KILN" compile mnist_cnn --weights half -o trained.kiln --cache-dir cache
check "run the trained artifact" 0 "" -- "$KILN" run trained.kiln --output y_art.npy
check "run the untrained model" 0 "" -- "$KILN" run mnist_cnn --output y0.npy --cache-dir cache
check "run the model with the checkpoint's weights" 0 "" -- \
  "$KILN" run mnist_cnn --weights half/ckpt-00000008.safetensors --output y_ckpt.npy --cache-dir cache
npy_close() {  # npy_close A B: two f32 .npy files of one shape, equal within 1e-5 relative
  python3 - "$1" "$2" <<'PY'
import struct, sys
def floats(p):
    b = open(p, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    return struct.unpack(f"<{(len(b) - 10 - n) // 4}f", b[10 + n:])
a, b = floats(sys.argv[1]), floats(sys.argv[2])
scale = max(abs(x) for x in a)
assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= 1e-5 * scale, "differ"
PY
}
check "the artifact computes with the trained weights" 0 "" -- npy_close y_art.npy y_ckpt.npy
check "... which are not the untrained ones" 1 "differ" -- npy_close y_art.npy y0.npy
check "--weights of another model" 2 "'fc1.weight' is f32\[128,9216\], the model's is f32\[512,784\]" -- \
  "$KILN" compile mlp --weights half -o x.kiln
absent "no artifact from refused weights" x.kiln
check "train --epochs without data" 2 "--epochs and --val-split need --data" -- \
  "$KILN" train mnist_cnn --epochs 2
check "train --data: fewer samples than a batch" 2 "63 training samples, fewer than one batch of 64" -- \
  "$KILN" train mnist_cnn --data idx:digits --epochs 1

leftovers=$(ls -A | grep -E '\.tmp|~$' || true)
if [ -n "$leftovers" ]; then echo "FAIL: temporary files left: $leftovers"; fail=$((fail + 1)); else pass=$((pass + 1)); fi

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
