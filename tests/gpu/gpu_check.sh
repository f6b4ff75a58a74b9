#!/usr/bin/env bash
# The GPU acceptance script (issue 29): one call, no network, at most ~7 minutes on one GPU.  Progress on stderr;
# the JSON goes to --out (default $OUT/gpu_check.json), rewritten after every stage, and to stdout at the end.
#   tests/gpu/gpu_check.sh --out results.json   # CUDA: every stage (default budget 390 s)
#   tests/gpu/gpu_check.sh --smoke              # the same stages on tiny shapes on the CPU (what the tests run)
# Interpreter: $PYTHON if set; else the active virtual/conda environment's python3; else ./.venv/bin/python (the
# environment ./run.sh makes) when it exists; else python3.  Other arguments go to tests/gpu/gpu_check.py (--help).
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then PY=python3
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
args=()
for a in "$@"; do
  if [ "$a" = "--small" ]; then args+=("--smoke"); else args+=("$a"); fi   # the old name of --smoke
done
exec "$PY" tests/gpu/gpu_check.py "${args[@]}"
