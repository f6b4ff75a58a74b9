#!/bin/bash
# The repair bench on the built-in default, on a base commit and on this tree, each with a fresh cache, one after the
# other; prints both outputs and whether every number is identical.
#   bash bench/repair_before_after.sh [BASE]        (BASE: default 7703fe8, the commit before the bridge-forms refactor)
# Arguments of bench/repair_default.py: ARGS (default a budget that fits minutes on the 2-core machine).
set -euo pipefail
BASE=${1:-7703fe8}
ARGS=${ARGS:---budget 1 --max-words 600 --prompts 8 --tokens 24}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mktemp -d)
git -C "$ROOT" worktree add -q --detach "$OUT/base" "$BASE"
trap 'git -C "$ROOT" worktree remove --force "$OUT/base"' EXIT
for side in before after; do
  dir="$OUT/base"; [ "$side" = after ] && dir="$ROOT"
  (cd "$dir" && HF_HUB_OFFLINE=1 SWAPKL_CACHE="$OUT/cache-$side" PYTHONPATH="$dir" python3 bench/repair_default.py $ARGS \
     --json "$OUT/$side.json" 2>"$OUT/$side.err" | tee "$OUT/$side.out")
done
cmp -s "$OUT/before.out" "$OUT/after.out" && echo "stdout: IDENTICAL" || { echo "stdout: DIFFERENT"; diff "$OUT/before.out" "$OUT/after.out" || true; }
python3 - "$OUT" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{s}.json")) for s in ("before", "after"))
print("rows (every ΔPPL and paired CI):", "IDENTICAL" if a["rows"] == b["rows"] else "DIFFERENT")
PY
