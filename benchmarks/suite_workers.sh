#!/usr/bin/env bash
# How many pytest-xdist workers: the README's test command with CI's settings at -n A and -n B, alternately, on one
# fresh clone, printing each run's wall time, the CPU of pytest's process tree, the machine's busy and idle CPU
# seconds (/proc/stat: what Chromium and every other process used too) and the wall ratio B / A per round.
#
#   python3 -m benchmarks run suite_workers [A=3] [B=2] [ROUNDS=2] [SINCE]      (from the checkout's root; ~12 min a round)
#
# SINCE (a commit, optional): leave out the test files added since it, as benchmarks/suite_time.sh does, so the figures
# compare with that script's "after" runs.  Run it on a quiet machine; rounds alternate the order (A B, B A, ...)
# because the machine's speed drifts.
set -u
A=${1:-3}; B=${2:-2}; ROUNDS=${3:-2}; SINCE=${4:-}
SRC=$(git rev-parse --show-toplevel)
WORK=$(mktemp -d)
git clone -q "$SRC" "$WORK/clone" && git -C "$WORK/clone" checkout -q "$(git rev-parse HEAD)"
cd "$WORK/clone" || exit 1
IGN=""
if [ -n "$SINCE" ]; then
  IGN=$(bash benchmarks/added_tests.sh "$SINCE")
fi
export SWAPKL_SLOW_TESTS=1 SWAPKL_FAIL_ON_SKIP=1 HF_HUB_OFFLINE=1
echo "commit $(git rev-parse --short HEAD); $(echo "$IGN" | wc -w) test files left out; load $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # $1 workers -> prints one line, sets WALL
  head -1 /proc/stat > "$WORK/s0"
  /usr/bin/time -o "$WORK/time" -f "%e %U %S" python3 -m pytest -q -n "$1" --dist loadfile --no-loadscope-reorder \
    $IGN > "$WORK/log.$1" 2>&1
  head -1 /proc/stat > "$WORK/s1"
  WALL=$(python3 - "$WORK" "$1" <<'PY'
import sys
work, n = sys.argv[1], sys.argv[2]
a, b = (list(map(int, open(f"{work}/{f}").read().split()[1:])) for f in ("s0", "s1"))
d = [y - x for x, y in zip(a, b)]
wall, user, sys_ = map(float, open(f"{work}/time").read().split()[-3:])
last = [ln.strip() for ln in open(f"{work}/log.{n}") if "passed" in ln or "failed" in ln][-1]
print(f"-n {n}: wall {wall:.1f} s, pytest tree CPU {user + sys_:.0f} s, machine busy {(sum(d) - d[3] - d[4]) / 100:.0f} s,"
      f" idle {d[3] / 100:.0f} s | {last}", file=sys.stderr)
print(wall)
PY
)
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then run "$A"; wa=$WALL; run "$B"; wb=$WALL; else run "$B"; wb=$WALL; run "$A"; wa=$WALL; fi
  echo "round $r: wall -n $B / -n $A = $(echo "scale=3; $wb / $wa" | bc)"
done 2>&1
echo "logs: $WORK/log.$A $WORK/log.$B"
