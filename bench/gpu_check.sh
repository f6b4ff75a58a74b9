#!/usr/bin/env bash
# The prepared GPU check: one command, no network, prints one JSON object on stdout (progress on stderr).
#   bench/gpu_check.sh            # CUDA: Pythia-410M and Qwen3-8B shapes in bf16 (sized for < 8 min on one H200;
#                                 # the Qwen3-8B run takes as many prompts as fit --budget-s, default 440 s)
#   bench/gpu_check.sh --small    # tiny shapes on the CPU (< 60 s)
# Extra arguments go to bench/gpu_check.py (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
