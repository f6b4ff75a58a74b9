#!/usr/bin/env bash
# The package as a user installs it: build the wheel, install it into a fresh virtual environment (no system site
# packages; its dependencies from the package index, pinned to the tested versions by requirements.txt), then,
# from outside the checkout and offline, run `swapkl --help`, one small score on the shipped stories260K, and the
# one-line message of a missing extra.  Prints each step's seconds; exits non-zero on any mismatch.
#   bash .ci/wheel_check.sh            (PYTHON: the interpreter that builds and makes the venv, default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/swapkl-wheel.XXXXXX")
# the venv holds ~1.5 GB of files: deleting them took 2 minutes on a loaded machine, so it goes on in the background
trap '(rm -rf "$work" >/dev/null 2>&1 &)' EXIT
t0=$(date +%s)
step() { echo "wheel_check: $* ($(( $(date +%s) - t0 )) s)"; }
fail() { echo "wheel_check: FAILED: $*" >&2; exit 1; }

# the wheel (setuptools from this environment: nothing downloaded to build)
"$PY" -m pip wheel -q --no-deps --no-build-isolation . -w "$work/dist" >/dev/null
whl=$(ls "$work"/dist/swapkl-*.whl)
step "built $(basename "$whl")"
"$PY" - "$whl" <<'EOF' || fail "the wheel's contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert "swapkl/commands/cli.py" in names and "swapkl/removal/methods/registry.py" in names
assert not [n for n in names if n.split("/")[0] in ("tests", "pages", "dashboard", "benchmarks", "experiments")], "ships tests/, pages/, dashboard/, benchmarks/ or experiments/"
EOF

# a fresh environment (no system site packages): only the wheel and what it declares, at the versions
# requirements.txt pins (torch==2.13.0 resolves to the local CPU wheel).  The downloads are kept in a wheelhouse
# (pip's own HTTP cache stores nothing here), so a later run installs with no network; --no-compile: byte-compiling
# torch's files took 4 of the 6 minutes of an install.
WH=${SWAPKL_WHEELHOUSE:-$HOME/.cache/swapkl-ci/wheelhouse}
mkdir -p "$WH"
"$PY" -m venv "$work/venv"
V="$work/venv/bin"
install() { "$V/python" -m pip install -q --no-compile --disable-pip-version-check --no-index --find-links "$WH" \
              "$whl" -c requirements.txt; }
if ! install 2>/dev/null; then
  "$PY" -m pip download -q --disable-pip-version-check -d "$WH" "$whl" -c requirements.txt 2>&1 | grep -v "is ignored" || true
  rm -f "$WH"/swapkl-*.whl
  step "dependencies downloaded into $WH"
  install
fi
step "installed into a fresh venv"
# run it as a user would: outside the checkout, offline, the cache in the user's cache folder
cd "$work"
export HF_HUB_OFFLINE=1 XDG_CACHE_HOME="$work/xdg" OMP_NUM_THREADS=1 SWAPKL_CORPUS="$ROOT/tests/fixtures/data/wikitext-2-raw/wiki.test.raw"
unset SWAPKL_CACHE VIRTUAL_ENV PYTHONPATH
"$V/python" - <<'EOF' || fail "the venv sees packages it did not install, or the wrong swapkl"
import importlib.util, sys
import swapkl
assert sys.prefix != sys.base_prefix and "site-packages" in swapkl.__file__, swapkl.__file__
assert importlib.util.find_spec("lm_eval") is None and importlib.util.find_spec("peft") is None  # extras not asked for
print("wheel_check: swapkl", swapkl.__version__, "from", swapkl.__file__)
EOF

"$V/swapkl" --help > help.txt || fail "swapkl --help exited $?"
grep -q "score" help.txt && grep -q "curves" help.txt || fail "swapkl --help lists no commands: $(head -3 help.txt)"
step "swapkl --help"
"$V/swapkl" score "$ROOT/tests/fixtures/models/stories260K" --pairs adjacent --prompts 2 --tokens 8 --json x.json \
  --quiet || fail "swapkl score exited $?"
"$V/python" - <<'EOF' || fail "the score's JSON is not what it should be"
import json, math, os
d = json.load(open("x.json"))
assert d["format"].startswith("swapkl.result/"), d.get("format")
assert d["contract"]["prompts"] == 2 and d["contract"]["tokens"] == 8, d["contract"]
pairs = d["pairs"]
assert [list(p) for p in pairs] == [[0, 1], [1, 2], [2, 3], [3, 4]], pairs
inter = d["interchange"]
vals = [inter[i][j] for i, j in pairs]
assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in vals), vals
cache = os.path.join(os.environ["XDG_CACHE_HOME"], "swapkl")
assert os.path.isdir(cache) and os.listdir(cache), "the installed package did not cache under ~/.cache/swapkl"
print("wheel_check: score ok, adjacent d_inter (nats):", ", ".join(f"{v:.4f}" for v in vals))
EOF
step "swapkl score (stories260K, 4 adjacent pairs, 2 prompts x 8 tokens)"
set +e
"$V/swapkl" tasks "$ROOT/tests/fixtures/models/stories260K" --tasks hellaswag --budget 1 2> tasks.err
rc=$?
set -e
[ "$rc" = 2 ] && [ "$(cat tasks.err)" = "error: task accuracy (lm-evaluation-harness) needs lm-eval: install swapkl[tasks]" ] \
  || fail "swapkl tasks without lm-eval: exit $rc, $(cat tasks.err)"
step "swapkl tasks without the tasks extra: exit 2, '$(cat tasks.err)'"
step "done"
