#!/usr/bin/env bash
# Builds a libFuzzer target (clang-16, ASan + UBSan) in build-fuzz/ and runs it for SECONDS on
# a scratch copy of its seed corpus tests/fuzz/corpus/TARGET/. Exits non-zero when an input
# crashes, hangs, leaks or breaks a round trip, and prints that input's path.
#   scripts/fuzz.sh TARGET|all SECONDS [libFuzzer flags...]
# Targets: the directories under tests/fuzz/corpus/. Crashing inputs are kept in
# build-fuzz/artifacts/TARGET/; add them to tests/fuzz/regressions/TARGET/ (see
# tests/fuzz/README.md). KILN_FUZZ_KEEP=1 keeps the grown working corpus.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: scripts/fuzz.sh TARGET|all SECONDS [libFuzzer flags...]" >&2
  echo "targets: $(ls tests/fuzz/corpus | tr '\n' ' ')" >&2
  exit 2
}
[ $# -ge 2 ] || usage
target=$1
seconds=$2
shift 2
[[ $seconds =~ ^[0-9]+$ ]] || usage
if [ "$target" = all ]; then
  targets=($(ls tests/fuzz/corpus))
else
  [ -d "tests/fuzz/corpus/$target" ] || { echo "fuzz: unknown target '$target'" >&2; usage; }
  targets=("$target")
fi

scripts/install-deps.sh
BUILD_DIR=${KILN_FUZZ_BUILD_DIR:-build-fuzz}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # RelWithDebInfo: optimized, with line numbers in sanitizer stacks. No tests, no tools: only
  # what the fuzz targets link (frontends, ir) is ever built here.
  CC=clang-16 CXX=clang++-16 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKILN_FUZZ=ON -DBUILD_TESTING=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

# Inputs the targets' scratch files (fuzz_checks.h) go to: memory when /dev/shm is usable.
scratch_root=${TMPDIR:-/tmp}
[ -d /dev/shm ] && [ -w /dev/shm ] && scratch_root=/dev/shm

# The largest input each target may be given: a few times its largest seed.
max_len() {
  case $1 in
    npy) echo 4096 ;;
    text_ir) echo 16384 ;;
    *) echo 65536 ;;
  esac
}

failed=()
for t in "${targets[@]}"; do
  work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz-$t.XXXXXX")
  scratch=$(mktemp -d "$scratch_root/kiln-fuzz-$t.XXXXXX")
  artifacts="$PWD/$BUILD_DIR/artifacts/$t"
  mkdir -p "$work/corpus" "$artifacts"
  # The committed seeds are copied, so that the run never adds to or rewrites them.
  cp tests/fuzz/corpus/"$t"/* "$work/corpus/"
  dict=()
  if [ -f "tests/fuzz/dict/$t.dict" ]; then
    cp "tests/fuzz/dict/$t.dict" "$work/dict"
    if [ "$t" = text_ir ] || [ "$t" = json_graph ]; then
      sed -n 's/^KILN_OP([^,]*, *"\([a-z0-9_]*\)".*/"\1"/p' ir/ops.def >>"$work/dict"
    fi
    dict=(-dict="$work/dict")
  fi

  echo "fuzz: fuzz_$t for ${seconds}s ($(ls "$work/corpus" | wc -l) seeds; log $work/log)"
  # -timeout: an input that takes 10 s is a hang. -rss_limit_mb (and with it -malloc_limit_mb):
  # inputs are at most 64 KiB, so an allocation of 2 GiB is a missing size check.
  touch "$work/started"
  rc=0
  TMPDIR="$scratch" \
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$BUILD_DIR/tests/fuzz/fuzz_$t" "$work/corpus" -max_total_time="$seconds" \
    -max_len="$(max_len "$t")" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "${dict[@]}" "$@" >"$work/log" 2>&1 || rc=$?
  rm -rf "$scratch"

  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n1)
  [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$work/log" | tail -n1 | tr -d '#')
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$work/log" | tail -n1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/log" | tail -n1)
  # Every input this run saved (with -fork=N -ignore_crashes=1 libFuzzer goes on past a crash
  # and may still exit 0), except slow-unit-* files: inputs that once took over 10 s but
  # finished, which a stalled machine also produces (a real hang fails through -timeout).
  found=$(find "$artifacts" -type f -newer "$work/started" ! -name 'slow-unit-*' | sort)
  for slow in $(find "$artifacts" -type f -newer "$work/started" -name 'slow-unit-*'); do
    echo "fuzz: fuzz_$t: note: slow input (replay it to see whether it is always slow): $slow"
  done
  if [ "$rc" -eq 0 ] && [ -z "$found" ]; then
    echo "fuzz: fuzz_$t: no crash, ${execs:-?} executions in ${secs:-$seconds} s," \
      "${cov:-cov: ?}, corpus $(ls "$work/corpus" | wc -l) files"
    if [ "${KILN_FUZZ_KEEP:-0}" = 1 ]; then
      echo "fuzz: working corpus kept in $work/corpus"
    else
      rm -rf "$work"
    fi
  else
    echo "fuzz: fuzz_$t FAILED (exit $rc) after ${execs:-?} executions; the last lines of $work/log:"
    tail -n 60 "$work/log" | sed 's/^/  /'
    for input in ${found:-}; do echo "fuzz: fuzz_$t: failing input: $input"; done
    [ -n "$found" ] || echo "fuzz: fuzz_$t: no input was saved (see the log)"
    echo "fuzz: replay one with: $BUILD_DIR/tests/fuzz/fuzz_$t INPUT"
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
