"""Every page address as the very first request of a fresh server, in Debian's Chromium (selenium).

Streamlit discovers a ``pages/`` folder beside the main script by itself: on a fresh server, until ``app.py``'s
``st.navigation`` has run once, it ran the page file a URL names without ``app.py`` and listed every file of the
folder as a page (helper modules included; docs/architecture.md, ``dashboard/navigation.py``).  Here each address
-- the root with a shared link's query, ``/heatmaps``, ``/curves``, ``/trajectory``, ``/evidence`` and
``/compare?a=..&b=..`` -- gets a server of its own (own port, own empty cache), started the README's way
(``./run.sh``: ``serve.py``) and as ``streamlit run app.py``; the address is the server's first visit.  The
servers of one way start at once.  Asserted: the sidebar's navigation is exactly the app's seven pages (no helper
module, no discovered file), the page the address names is drawn (its heading) under ``app.py`` (the sidebar
that ``app.py`` draws), and the query is kept (in the address bar; on the Start page also read by the page: the
shared link's prompt count fills its input).  Screenshots of a failure: ``artifacts/browser/first-visit-*.png``."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import pytest

from support.browser_util import ARTIFACTS, ROOT, free_port, need_browser, screenshot, served, streamlit_cmd

need_browser()

#: app.py's navigation as the sidebar shows it: (label, address path), in order
APP_NAVIGATION = [("Start", "/"), ("Heatmaps", "/heatmaps"), ("Removal curves", "/curves"),
                  ("Training trajectory", "/trajectory"), ("Evidence", "/evidence"), ("Compare", "/compare"),
                  ("Study", "/study")]
#: the prompt count the Start page's shared link carries
START_PROMPTS = "7"
#: one fresh server each: (name, address opened first, the page's heading); the Start page's shared link sets the
#: prompt count, which its "Prompts P" input then shows
ADDRESSES = [("start", f"/?prompts={START_PROMPTS}", "swapkl — protocol-aware layer redundancy"),
             ("heatmaps", "/heatmaps?pair=1-2", "Heatmaps"),
             ("curves", "/curves", "Removal curves"),
             ("trajectory", "/trajectory", "Training trajectory"),
             ("evidence", "/evidence", "Evidence"),
             ("compare", "/compare?a=job-a&b=job-b", "Compare"), ("study", "/study?models=default&budget=1&max_words=600&n_boot=200&prompts=16&tokens=32&pairs=adjacent&evidence=1",
              "Study")]  # the Study page writes its whole request into the address bar: its link, opened as it is
#: how a server is started: the README's way (./run.sh runs serve.py) and Streamlit's own command
LAUNCHERS = {"run.sh": streamlit_cmd,
             "streamlit run app.py": lambda port: [sys.executable, "-m", "streamlit", "run", "app.py",
                                                   "--server.port", str(port)]}

STATE_JS = """
const nav = [...document.querySelectorAll('[data-testid="stSidebarNav"] a')].map(
  a => [a.innerText.trim().split('\\n').pop().trim(), new URL(a.href).pathname]);
const side = document.querySelector('[data-testid="stSidebarUserContent"]');
const prompts = document.querySelector("input[aria-label='Prompts P']");
return {nav: nav, headings: [...document.querySelectorAll('h1')].map(h => h.innerText.trim()),
        sidebar: side ? side.innerText : '', prompts: prompts ? prompts.value : null, url: location.href};
"""


@contextlib.contextmanager
def fresh_servers(tmp_path, launcher, names):
    """One fresh server per name (own free port, own empty cache and log under ``tmp_path/name``), all started at
    once and waited for together; yields ``{name: url}`` and always stops them all."""
    ports: list[int] = []
    while len(ports) < len(names):
        if (p := free_port()) not in ports:
            ports.append(p)
    cms = {}
    for name, port in zip(names, ports):
        folder = tmp_path / name
        folder.mkdir()
        env = dict(os.environ, SWAPKL_CACHE=str(folder / "cache"), HF_HUB_OFFLINE="1")
        cms[name] = served(launcher(port), ROOT, env, folder / "streamlit.log", port, timeout=240)
    with contextlib.ExitStack() as stack:
        with ThreadPoolExecutor(len(cms)) as pool:
            started = {name: pool.submit(cm.__enter__) for name, cm in cms.items()}
        failed = []
        urls = {}
        for name, fut in started.items():
            try:
                urls[name] = fut.result()[0]
                stack.push(cms[name].__exit__)
            except BaseException as e:  # pytest.fail's exception is a BaseException; the server is already stopped
                failed.append(e)
        if failed:
            raise failed[0]
        yield urls


def open_tabs(drv, addresses: list[str]) -> list[str]:
    """Open each full address in a tab of its own (the first in the current one), all before any is checked, so the
    servers draw their first pages at the same time; returns the tabs' window handles, in order."""
    handles = []
    for k, address in enumerate(addresses):
        if k:
            drv.switch_to.new_window("tab")
        drv.get(address)
        handles.append(drv.current_window_handle)
    return handles


def drawn(drv, handle: str, address: str, heading: str, seconds: float = 120) -> dict:
    """Switch to the tab ``handle`` (that opened ``address``) and wait until the app's navigation and the page's
    heading are drawn under app.py (its sidebar; on the Start page also its prompt input, holding the link's count:
    Streamlit may first mount the input at its minimum and then apply the session's value); returns what the page
    shows (``STATE_JS``).  Fails with the last state seen, and a screenshot."""
    drv.switch_to.window(handle)
    start = heading == ADDRESSES[0][2]
    deadline = time.time() + seconds
    while True:
        state = drv.execute_script(STATE_JS)
        if state["nav"] == [list(x) for x in APP_NAVIGATION] and heading in state["headings"] \
                and "Current analysis" in state["sidebar"] and (state["prompts"] == START_PROMPTS or not start):
            return state
        if time.time() > deadline:
            screenshot(drv, ARTIFACTS, f"first-visit-{urlsplit(address).path.strip('/') or 'start'}.png")
            pytest.fail(f"{address} as a fresh server's first visit: not the app's navigation and page after "
                        f"{seconds:.0f} s: {state}")
        time.sleep(0.3)


def test_the_addresses_cover_every_page_of_the_navigation():
    assert sorted(urlsplit(a).path for _, a, _ in ADDRESSES) == sorted(path for _, path in APP_NAVIGATION)


@pytest.mark.parametrize("way", list(LAUNCHERS))
def test_every_address_as_a_fresh_servers_first_visit(way, tmp_path, browser):
    t0 = time.time()
    with fresh_servers(tmp_path, LAUNCHERS[way], [name for name, _, _ in ADDRESSES]) as urls:
        started = time.time() - t0
        tabs = open_tabs(browser, [urls[name] + address for name, address, _ in ADDRESSES])
        for tab, (name, address, heading) in zip(tabs, ADDRESSES):
            state = drawn(browser, tab, address, heading)
            shown = urlsplit(state["url"])
            want = urlsplit(address)
            assert shown.path == want.path, (address, state["url"])
            assert parse_qs(shown.query) == parse_qs(want.query), (address, state["url"])  # the query is kept
            assert not any("common" in label or "panel" in label for label, _ in state["nav"])
            if name == "start":  # the Start page read the shared link's query: its prompt count fills the input
                assert state["prompts"] == START_PROMPTS, state
    print(f"{way}: {len(ADDRESSES)} fresh servers started in {started:.0f} s; "
          f"all first visits checked in {time.time() - t0:.0f} s")  # a figure for the log, not a limit
