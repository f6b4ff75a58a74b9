"""The served app as users run it: a project folder that holds a ``.venv``-sized tree and the score cache, the
shipped ``.streamlit/config.toml`` (no flags but the port), the built-in default model, Debian's Chromium.

* The computation writes cache files inside the project while something reads the ``.venv`` tree (as imports,
  pip or an editor do): the server log must hold no file-watcher overflow and the result must arrive.  With
  ``SWAPKL_TEST_FILE_WATCHER=auto`` the test passes ``--server.fileWatcherType auto`` instead, which is how to
  see it fail (the watcher walks the tree and floods inotify).
* The default server listens on a loopback address only (read from the kernel's socket table).
* Screenshots of the default model's first view (depth profile, verdict) and of its removal curves go to
  ``artifacts/served/``.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from swapkl.store import read_entry

from support.browser_util import chrome, click_text, free_port, listening_addresses, need_browser, screenshot, served, \
    set_number, streamlit_cmd

need_browser()

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "served"
N_FILES = 20_000


@pytest.fixture
def project(tmp_path):
    """A clone of the committed project with a 20,000-file ``.venv`` tree and the converted default model
    linked into its own ``cache/`` (converted once into the repo's cache, as the built-in tests do)."""
    from swapkl.model import builtin

    try:
        model_dir = builtin.default_model_dir()
    except builtin.BuiltinModelMissing as e:
        pytest.skip(str(e))
    dest = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(dest)], check=True)
    site = dest / ".venv" / "lib" / "python3" / "site-packages"
    for k in range(N_FILES // 100):
        d = site / f"pkg{k:03d}"
        d.mkdir(parents=True)
        for m in range(100):
            (d / f"mod{m:02d}.py").write_text(f"X = {k * 100 + m}\n")
    (dest / "cache" / "models").mkdir(parents=True, exist_ok=True)
    (dest / "cache" / "models" / model_dir.name).symlink_to(model_dir, target_is_directory=True)
    return dest


def _read_tree_until(stop: threading.Event, root: Path, every_s: float = 10.0) -> int:
    """Open every file below ``root`` once every ``every_s`` seconds until ``stop`` (40,000 open/close events
    a pass: more than inotify's default queue of 16,384); returns the files opened."""
    n = 0
    files = list(root.rglob("*.py"))
    while not stop.is_set():
        for p in files:
            with open(p, "rb"):
                n += 1
        stop.wait(every_s)
    return n


def test_served_default_with_venv_tree(project, tmp_path):
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("SWAPKL_CACHE", None)  # the cache lives inside the project folder, as it does for users
    extra = ()
    if os.environ.get("SWAPKL_TEST_FILE_WATCHER"):
        extra = ("--server.fileWatcherType", os.environ["SWAPKL_TEST_FILE_WATCHER"])
    log = tmp_path / "server.log"
    with served(streamlit_cmd(port, *extra), project, env, log, port) as (url, _proc):
        # the shipped config binds the server to loopback: every listening socket of its port is local
        addrs = listening_addresses(port)
        assert addrs and all(a in ("127.0.0.1", "::1") for a in addrs), addrs
        drv = chrome(tmp_path / "chrome", size="1500,1100")
        stop = threading.Event()
        reader = threading.Thread(target=_read_tree_until, args=(stop, project / ".venv"), daemon=True)
        try:
            wait = WebDriverWait(drv, 90)
            drv.get(url)
            wait.until(EC.presence_of_element_located((By.XPATH, "//h1[contains(., 'protocol-aware layer redundancy')]")))
            # the built-in default is preselected; a small contract keeps the test short
            set_number(drv, wait, "Prompts P", 4)
            set_number(drv, wait, "Tokens T per prompt", 16)
            set_number(drv, wait, "Layer budget (0 = no curves)", 1)
            wait.until(EC.presence_of_element_located(
                (By.XPATH, "//code[starts-with(normalize-space(.), 'default') and contains(., '4 prompts × 16 tokens')]")))
            reader.start()
            t0 = time.perf_counter()
            click_text(drv, wait, "Compute", "p")
            WebDriverWait(drv, 900, poll_frequency=1).until(
                EC.presence_of_element_located((By.XPATH, "//*[contains(text(), 'Done:')]")))
            elapsed = time.perf_counter() - t0
            wait.until(EC.presence_of_element_located((By.XPATH, "//h3[contains(., 'prefer')]")))
            # the first view leads with the depth profile of the 29 adjacent pairs
            wait.until(lambda d: any("layer depth" in e.text and e.find_elements(By.CSS_SELECTOR, ".scatterlayer .trace")
                                     for e in d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")))
            done = drv.find_element(By.XPATH, "//*[contains(text(), 'Done:')]")
            drv.execute_script("arguments[0].scrollIntoView({block: 'start'});", done)
            time.sleep(0.5)
            screenshot(drv, ARTIFACTS, "first-view.png")
            click_text(drv, wait, "Removal curves", "span")
            WebDriverWait(drv, 90).until(lambda d: any("ΔPPL after layer removal" in e.text
                                                       for e in d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")))
            chart = [e for e in drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot") if "ΔPPL" in e.text][0]
            assert "replacement-guided" in chart.text and "interchange-guided" in chart.text
            time.sleep(0.5)
            assert screenshot(drv, ARTIFACTS, "removal-curves.png").stat().st_size > 10_000
        finally:
            stop.set()
            drv.quit()
    text = log.read_text(errors="replace")
    assert "Inotify queue overflowed" not in text, f"{text.count('Inotify queue overflowed')} watcher overflows"
    assert "Traceback" not in _without_static_file_races(text), text[-3000:]
    # the computation wrote its cache files inside the project folder
    # (the 29 adjacent pairs, in chunk files written as the engine finishes them)
    pairs = set()
    for f in (project / "cache" / "scores").rglob("chunk-*.json"):
        pairs.update(tuple(p) for p in read_entry(f, "score-chunk")["pairs"])
    assert {(i, i + 1) for i in range(29)} <= pairs, sorted(pairs)
    print(f"served default run (4 x 16, budget 1) with a {N_FILES}-file tree: {elapsed:.1f} s")


def _without_static_file_races(log: str) -> str:
    """The server log without the one traceback that is the web server's, not swapkl's: Starlette's
    ``FileResponse`` streaming one of Streamlit's own static assets sends fewer bytes than it declared
    (``h11 ... Too little data for declared Content-Length`` under ``stream_file``; seen once at start-up on a
    loaded machine, before any swapkl code ran; the page loaded and the run went on).  Any other traceback stays."""
    marker = "Exception in ASGI application\nTraceback"
    kept, rest = [], log
    while marker in rest:
        head, _, tail = rest.partition(marker)
        kept.append(head)
        end = tail.find("Too little data for declared Content-Length")
        nxt = tail.find("Traceback", 1)
        if end >= 0 and "stream_file" in tail[:end] and (nxt < 0 or end < nxt):
            rest = tail[end:]  # this block is the static-file race: drop it
        else:
            kept.append(marker)
            rest = tail
    return "".join(kept) + rest
