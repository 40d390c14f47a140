#!/usr/bin/env bash
# kill -9 during checkpoint saves loses nothing: mlp trains with a checkpoint after every step
# (so that most of the time is spent saving) and is killed at random moments, six times; after
# each kill the directory's latest checkpoint must load and the run must resume from it, and no
# temporary file may outlive the next save.
#   checkpoint_kill.sh KILN_BINARY
set -u
KILN=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
fail=0
last=0
for round in 1 2 3 4 5 6; do
  resume=()
  [ -f ck/latest.json ] && resume=(--resume)
  "$KILN" train mlp --steps 1000000 --batch 8 --checkpoint ck --save-every 1 "${resume[@]}" \
    --cache-dir cache >/dev/null 2>&1 &
  pid=$!
  [ "$round" = 1 ] && sleep 2  # The first round compiles.
  sleep "0.$((RANDOM % 6 + 2))"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null
  if [ ! -f ck/latest.json ]; then echo "round $round: no checkpoint written yet"; continue; fi
  midsave=$(ls -A ck | grep -c '\.tmp\.' || true)  # A save's temporaries: killed in the middle.
  step=$(grep -o 'ckpt-[0-9]*' ck/latest.json | grep -o '[0-9]*' | sed 's/^0*//')
  if ! out=$("$KILN" train mlp --steps $((step + 1)) --batch 8 --checkpoint ck --resume \
               --cache-dir cache 2>&1); then
    echo "FAIL: round $round: resuming from step $step failed:"; echo "$out" | head -3
    fail=$((fail + 1))
    continue
  fi
  echo "round $round: killed after step $step (saved $((step - last)) checkpoints;" \
    "$midsave temporary files of the save in progress), resumed"
  last=$((step + 1))
  leftovers=$(ls -A ck | grep '\.tmp\.' || true)
  if [ -n "$leftovers" ]; then echo "FAIL: round $round: temporary files left: $leftovers"; fail=$((fail + 1)); fi
done
[ "$last" -gt 0 ] || { echo "FAIL: no round saved a checkpoint"; fail=$((fail + 1)); }
exit $((fail > 0))
