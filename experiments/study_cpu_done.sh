#!/usr/bin/env bash
# The rows experiments/study_cpu.sh has finished so far, read from the study cache (nothing is computed for a finished
# row; a model not finished yet would be computed, so only the finished ones are listed): the table, statements and
# report of docs/study.md §6.   python3 -m experiments run study_cpu_done LABEL...   (labels of cache/study-models/study.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=cache/study-models
python3 - "$@" > "$MODELS/done.yaml" <<'PY'
import sys, yaml
want = set(sys.argv[1:])
models = yaml.safe_load(open("cache/study-models/study.yaml"))["models"]
print(yaml.safe_dump({"models": [m for m in models if m["label"] in want]}))
PY
WIKI=tests/fixtures/data/wikitext-2-raw/wiki.test.raw
export HF_HUB_OFFLINE=1 SWAPKL_CACHE="${SWAPKL_CACHE:-$PWD/cache/study-cache}"
python3 -m swapkl study --models "$MODELS/done.yaml" --pairs adjacent --prompts 8 --tokens 64 \
  --corpus "$WIKI" --eval-text "$WIKI" --max-words 500 --budget 3 --methods replacement,interchange,bi --n-boot 1000 \
  --device cpu --json experiments/results/study-cpu-done.json | tee experiments/results/study-cpu-done.txt
python3 -m swapkl report experiments/results/study-cpu-done.json --html --out artifacts/study-cpu-done.html
