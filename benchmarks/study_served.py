"""Served = library for a study: the same study started from the Study page in a real browser and from the CLI.

    python -m benchmarks run study_served [--json out.json] [--models SPEC,...]

1. **Served**: ``./run.sh`` as the README says (``benchmarks/served_default.py``'s ``Server``: the project's ``.venv`` when
   there is one, a fresh cache inside the project with the converted models linked in), Debian's Chromium opens the
   study's shared link (``/study?models=...&budget=...``), presses **Run the study** and waits until the finished
   study's download button is on the page.  Printed: seconds from the click to the finished grid.
2. **CLI**: ``python -m swapkl study`` with the same models and contract, a fresh cache, timed from the process start
   to its exit (torch's import included, as a user waits for it).
3. Their **ratio** (served / CLI), one run each, on the same machine one after the other.

Contract (both): adjacent pairs, 8 prompts x 32 tokens, 600 held-out words (matched windows 512/256), n = 1..2,
replacement, interchange, random (5 seeds) and BI, 200 bootstrap resamples, the predictor validity; held-out and
prompt text: the shipped WikiText-2 test file (``SWAPKL_CORPUS``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import served_default as SD  # noqa: E402

WIKI = ROOT / "tests" / "fixtures" / "data" / "wikitext-2-raw" / "wiki.test.raw"
SETTINGS = {"budget": 2, "max_words": 600, "n_boot": 200, "prompts": 8, "tokens": 32, "pairs": "adjacent",
            "evidence": "1"}
STATUS_JS = """
const alerts = [...document.querySelectorAll('[data-testid="stAlertContainer"]')].map(e => e.textContent);
return {
  run: [...document.querySelectorAll('button')].some(b => b.textContent.trim() === 'Run the study'),
  done: [...document.querySelectorAll('button')].some(b => b.textContent.includes('swapkl-study (JSON)')),
  error: alerts.find(t => t.trim().startsWith('Error:')) || [...document.querySelectorAll('[data-testid="stException"]')]
    .map(e => e.textContent)[0] || null,
};
"""


def wait(drv, what: str, timeout: float, poll: float) -> None:
    """Poll the page (:data:`STATUS_JS`) until ``what`` is true; an error shown on the page stops the bench."""
    deadline = time.perf_counter() + timeout
    while True:
        st = drv.execute_script(STATUS_JS)
        if st.get("error"):
            raise SystemExit(f"the page shows an error: {st['error'][:300]}")
        if st[what]:
            return
        if time.perf_counter() > deadline:
            raise SystemExit(f"timed out waiting for {what}; page status {st}")
        time.sleep(poll)


def served(models: list[str], cache: Path, tmp: Path) -> dict:
    from selenium.webdriver.common.by import By

    srv = SD.Server(cache, tmp / "served.log")
    drv, _ = SD.browser(tmp / "chrome")
    try:
        q = dict(SETTINGS, models=";".join(models))
        drv.get(f"{srv.url}/study?{urlencode(q)}")
        wait(drv, "run", 180, 0.1)
        time.sleep(SD.READ_S)
        el = drv.find_element(By.XPATH, "//button[.//p[normalize-space(.)='Run the study']]")
        drv.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
        el.click()
        t0 = time.perf_counter()
        wait(drv, "done", 3600, 1.0)
        seconds = time.perf_counter() - t0
        SD.ART.mkdir(parents=True, exist_ok=True)
        drv.save_screenshot(str(SD.ART / "study.png"))
    finally:
        drv.quit()
        srv.stop()
    return {"seconds": seconds, "python": srv.python}


def cli(models: list[str], cache: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", SWAPKL_CACHE=str(cache), SWAPKL_CORPUS=str(WIKI))
    _, python = SD.venv_env(env)
    s = SETTINGS
    cmd = [python, "-m", "swapkl", "study", *models, "--budget", str(s["budget"]), "--max-words", str(s["max_words"]),
           "--n-boot", str(s["n_boot"]), "--prompts", str(s["prompts"]), "--tokens", str(s["tokens"]),
           "--pairs", s["pairs"], "--device", "cpu", "--quiet", "--json", str(cache / "study.json")]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return {"seconds": time.perf_counter() - t0, "command": " ".join(cmd[1:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--models", default="tests/fixtures/models/stories260K", help="comma-separated model specs")
    a = ap.parse_args()
    SD.TICK = float(os.sysconf("SC_CLK_TCK"))
    os.environ["SWAPKL_CORPUS"] = str(WIKI)  # the server inherits it: the same prompt and held-out text
    models = [m for m in a.models.split(",") if m]
    tmp = Path(tempfile.mkdtemp(prefix="bench-study-"))
    caches = [SD.fresh_cache("study-served"), SD.fresh_cache("study-cli")]
    try:
        s = served(models, caches[0], tmp)
        c = cli(models, caches[1])
    finally:
        for d in caches:
            shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"models": models, "settings": SETTINGS, "served_s": s["seconds"], "cli_s": c["seconds"],
           "ratio_served_over_cli": s["seconds"] / c["seconds"], "cli_command": c["command"],
           "load_average": os.getloadavg()}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
