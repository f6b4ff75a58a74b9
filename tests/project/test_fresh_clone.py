"""The README's first command on a fresh clone, offline: ``./run.sh`` sets up (nothing to download once the
packages are installed; pip runs with --no-index to prove it) and serves a rendered default dashboard."""
from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.browser_util import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def test_readme_commands_are_what_ci_and_this_test_run():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme.split("## The two commands", 1)[1], re.S)
    assert blocks[0].strip() == "./run.sh"
    # the README's test command, from HF_HUB_OFFLINE on, is CI's to the last flag (the xdist workers included)
    test_cmd = re.search(r"HF_HUB_OFFLINE=1 python3 -m pytest -q.*", blocks[1]).group(0).strip()
    assert " -n " in test_cmd
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "-m pytest" in line]
    assert len(ci) == 1 and ci[0].endswith(" " + test_cmd), (ci, test_cmd)


@pytest.fixture
def clone(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout")
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(dest)], check=True)
    return dest


@pytest.mark.server
def test_fresh_clone_run_sh_serves_the_default_dashboard(clone, tmp_path):
    """With no virtual environment active (as on a stock Debian/Ubuntu python3, PEP 668), run.sh makes
    ``.venv`` in the clone, says so, installs into it and serves the app with its python.  The venv reuses the
    packages already installed here (SWAPKL_VENV_ARGS="--system-site-packages --without-pip": the system's pip
    and setuptools serve it, and pip --no-index proves nothing is downloaded) so the test does not copy torch."""
    port = free_port()
    # the venv is made by the interpreter running these tests (PYTHON), not python3 from PATH; when that
    # interpreter is itself a virtual environment's, its packages are not the base's "system site packages", so
    # they are put on the path as well
    env = dict(os.environ, HF_HUB_OFFLINE="1", PIP_NO_INDEX="1", SWAPKL_CACHE=str(tmp_path / "cache"),
               SWAPKL_VENV_ARGS="--system-site-packages --without-pip", PYTHON=sys.executable)
    for k in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME"):
        env.pop(k, None)
    if sys.prefix != sys.base_prefix:
        env["PYTHONPATH"] = os.pathsep.join([*site.getsitepackages(), *filter(None, [env.get("PYTHONPATH")])])
    log = open(tmp_path / "run.log", "w")
    # only the port on the command line: the rest (loopback address, no file watcher, headless, no usage
    # statistics) comes from the shipped .streamlit/config.toml
    proc = subprocess.Popen(["bash", "run.sh", "--server.port", str(port)], cwd=clone, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        ok = False
        while time.time() < deadline and proc.poll() is None:
            try:
                ok = urllib.request.urlopen(url + "/_stcore/health", timeout=2).read().strip() == b"ok"
                if ok:
                    break
            except OSError:
                time.sleep(1)
        out = (tmp_path / "run.log").read_text()
        assert ok, "run.sh did not serve the dashboard:\n" + out[-3000:]
        assert f"no virtual environment is active: creating ./.venv ({sys.executable} -m venv" in out
        venv_python = clone / ".venv" / "bin" / "python"
        assert venv_python.exists()
        # the server process (run.sh exec's it) is the clone's .venv python
        argv0 = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert Path(argv0) == venv_python, argv0
        assert "Inotify" not in out
        if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
            _assert_rendered_in_browser(url, tmp_path)
        else:  # no browser here: render the clone's app script headlessly instead
            from streamlit.testing.v1 import AppTest

            at = AppTest.from_file(str(clone / "app.py"), default_timeout=120).run()
            assert not at.exception
            assert "protocol-aware layer redundancy" in at.title[0].value
            assert any("SmolLM2" in c.value or "default" in c.value for c in at.code)
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


def _assert_rendered_in_browser(url: str, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
              "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
              f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1400,1000"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        driver.get(url)
        WebDriverWait(driver, 90).until(
            lambda d: "protocol-aware layer redundancy" in d.find_element(By.TAG_NAME, "body").text)
        WebDriverWait(driver, 60).until(lambda d: "Compute" in d.find_element(By.TAG_NAME, "body").text)
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "SmolLM2" in body or "default" in body
        out = ROOT / "artifacts" / "fresh-clone"
        out.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out / "default-dashboard.png"))
    finally:
        driver.quit()
