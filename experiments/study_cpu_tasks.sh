#!/usr/bin/env bash
# The three-model study of study_cpu.sh again with task accuracy and the consensus (docs/study.md §7, issue 53):
#   the same models (SmolLM2-135M, Gemma-3-270M GGUF, Qwen2.5-Coder-0.5B GGUF; assembled by study_cpu.sh), adjacent
#   pairs, 8 prompts x 64 tokens, budget 3; methods replacement, interchange, consensus-mean, consensus-max and the
#   BI baseline (no random seeds: the CPU is shared); held-out text: the study's default 6,000 words; task accuracy
#   on the shipped offline task wikitext_lastword (its first 100 documents: --limit 100), per-document bootstrap.
#
#   python3 -m experiments run study_cpu_tasks      # writes experiments/results/study-cpu-tasks.{json,txt,log} and
#                                                   # the report artifacts/study-cpu-tasks.html
#   bash experiments/study_cpu_tasks.sh 2/3         # one share (here Gemma-3-270M): study-cpu-tasks-2of3.*; the
#       shares join with: python3 -m swapkl study --merge experiments/results/study-cpu-tasks-{1,2,3}of3.json --json ...
# Re-running reads every finished model from the study cache (nothing is computed again).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARD="${1:-}"  # K/N: one share of the models (every N-th from the K-th), e.g. one per session on a 2-core CPU
OUT=experiments/results/study-cpu-tasks${SHARD:+-${SHARD%/*}of${SHARD#*/}}
bash experiments/study_cpu.sh --assemble-only
MODELS=cache/study-models
WIKI=tests/fixtures/data/wikitext-2-raw/wiki.test.raw
export HF_HUB_OFFLINE=1 SWAPKL_CACHE="${SWAPKL_CACHE:-$PWD/cache/study-cache}"
/usr/bin/time -v python3 -m swapkl study --models "$MODELS/study.yaml" --pairs adjacent --prompts 8 --tokens 64 \
  --corpus "$WIKI" --eval-text "$WIKI" --max-words 6000 --budget 3 \
  --methods replacement,interchange,consensus-mean,consensus-max,bi --n-boot 1000 --device cpu \
  --tasks wikitext_lastword --limit 100 ${SHARD:+--shard "$SHARD"} \
  --json "$OUT.json" 2> >(tee "$OUT.log" >&2) | tee "$OUT.txt"
python3 -m swapkl report "$OUT.json" --html --out "artifacts/$(basename "$OUT").html"
