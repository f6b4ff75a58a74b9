#!/usr/bin/env bash
# Issue 35's suite-time comparison: the README's test command with CI's settings, before and after, on the same
# test files, in fresh clones, one after the other on this machine.
#
#   python3 -m benchmarks run suite_time [BEFORE=ab5e475] [AFTER=HEAD]        (from the checkout's root; ~15 min on 2 cores)
#
# * before: a clone at BEFORE, its README command of the time (serial: python3 -m pytest -q);
# * after: a clone at AFTER, the README command now (-n 2 --dist loadfile --no-loadscope-reorder);
# * same test files: the after run ignores every test file added since BEFORE (git diff -M --diff-filter=A), except
#   tests/dashboard/test_heal_panel.py, which existed at BEFORE under another name;
# * both with SWAPKL_SLOW_TESTS=1 SWAPKL_FAIL_ON_SKIP=1 HF_HUB_OFFLINE=1 (CI's settings); /usr/bin/time gives wall and
#   CPU (user + system of pytest and the processes it waited for; Chromium, which chromedriver starts, is not in it).
# Run it on a quiet machine: the suite is CPU-bound, so anything else running lengthens both runs unevenly.
set -u
BEFORE=${1:-ab5e475}
AFTER=$(git rev-parse "${2:-HEAD}")
SRC=$(git rev-parse --show-toplevel)
WORK=$(mktemp -d)
git clone -q "$SRC" "$WORK/before" && git -C "$WORK/before" checkout -q "$BEFORE"
git clone -q "$SRC" "$WORK/after" && git -C "$WORK/after" checkout -q "$AFTER"
IGN=$(cd "$WORK/after" && bash "$SRC/benchmarks/added_tests.sh" "$BEFORE")
export SWAPKL_SLOW_TESTS=1 SWAPKL_FAIL_ON_SKIP=1 HF_HUB_OFFLINE=1
echo "before $BEFORE, after $AFTER; $(echo "$IGN" | wc -w) new test files left out of the after run"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
(cd "$WORK/before" && /usr/bin/time -o "$WORK/before.time" -f "%e %U %S" python3 -m pytest -q > "$WORK/before.log" 2>&1)
(cd "$WORK/after" && /usr/bin/time -o "$WORK/after.time" -f "%e %U %S" \
   python3 -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder $IGN > "$WORK/after.log" 2>&1)
for run in before after; do
  read -r wall user sys < <(tail -1 "$WORK/$run.time")  # the last line: /usr/bin/time may first say the exit status
  printf "%-6s %s | wall %7.1f s | CPU %6.0f s (user %.0f + sys %.0f)\n" "$run" \
    "$(grep -E '(passed|failed)' "$WORK/$run.log" | tail -1)" "$wall" "$(echo "$user + $sys" | bc)" "$user" "$sys"
done
echo "ratio after/before wall: $(echo "scale=3; $(tail -1 "$WORK/after.time" | cut -d' ' -f1) / $(tail -1 "$WORK/before.time" | cut -d' ' -f1)" | bc)"
echo "logs: $WORK/before.log $WORK/after.log"
