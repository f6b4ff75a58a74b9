#!/usr/bin/env bash
# Rehearse the GPU machine's software on the CPU before spending device time (issue 29): a venv with the device
# image's torch and transformers (device/KINDS.md: torch 2.11.0, transformers 5.17.0) and only what that image
# holds besides (numpy, scipy, safetensors, accelerate, tokenizers, pandas, PyYAML, filelock, pytest; no streamlit,
# datasets, plotly or gguf), then the acceptance script's smoke run and the engine's tests in it.
#   tests/gpu/device_rehearsal.sh [VENV_DIR]        # default /tmp/swapkl-device-rehearsal; needs the package index
# Prints the versions, the smoke run's stage table and the tests' summary line; exit status non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-/tmp/swapkl-device-rehearsal}"
TORCH="${DEVICE_TORCH:-2.11.0}" TRANSFORMERS="${DEVICE_TRANSFORMERS:-5.17.0}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH" "transformers==$TRANSFORMERS" "tokenizers==0.23.2" "safetensors==0.8.0" \
    "accelerate==1.15.0" numpy scipy pandas pyyaml filelock psutil pytest 2>&1 | grep -v "is ignored" || true
fi
PY="$VENV/bin/python"
"$PY" -c "import sys, torch, transformers; print('rehearsal: python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
export HF_HUB_OFFLINE=1 SWAPKL_SLOW_TESTS=1
out="$(mktemp -d)"
PYTHON="$PY" bash tests/gpu/gpu_check.sh --smoke --out "$out/smoke.json" > "$out/smoke.log" 2>&1
"$PY" - "$out/smoke.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for row in r["table"]:
    print(f"rehearsal: smoke {row['stage']:<12} pass={row['pass']}  {row['seconds']:.1f} s")
print("rehearsal: smoke all_pass", r["all_pass"], "complete", r["complete"])
sys.exit(0 if r["all_pass"] and r["complete"] else 1)
EOF
"$PY" -m pytest -q -p no:cacheprovider tests/scoring/test_engine.py tests/scoring/test_kl_impls.py tests/scoring/test_units_scoring.py \
  tests/scoring/test_distributed.py tests/scoring/test_memory_model.py tests/scoring/test_oom_messages.py tests/scoring/test_gpu_check.py 2>&1 | tail -1
