"""Every uploader goes through the server's size limit before anything parses the file, and a parsed upload is kept
once per session (keyed by its content's sha256, bounded), so a rerun does not parse it again (issue 51).  Through
the app (AppTest): the Evidence page's evidence JSON and the Compare page's transfer table."""
from __future__ import annotations

import json

import pytest

from swapkl.compare.result import CompareResult
from support.app_util import APP, ROOT, STORIES_REL, TIMEOUT
from test_compare import synthetic

EVIDENCE = ROOT / "experiments" / "results" / "evidence-default-256.json"  # a real `swapkl evidence --json` file
BIG = b'{"pad": "' + b"x" * (17 * 2 ** 20) + b'"}'  # 17 MiB: over demo mode's 16 MB, under the server's 64


@pytest.fixture
def demo(cache, monkeypatch):
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", f"default,{STORIES_REL}")
    st.cache_resource.clear()
    return cache


def _counting(monkeypatch, module, name) -> list:
    """Replace ``module.name`` by a wrapper that records each call; returns the list of calls."""
    calls, real = [], getattr(module, name)

    def wrapper(*a, **k):
        calls.append(a)
        return real(*a, **k)
    monkeypatch.setattr(module, name, wrapper)
    return calls


def _evidence_page():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/evidence.py").run()
    assert not at.exception, at.exception
    return at


def test_an_opened_evidence_file_is_parsed_once_across_reruns(demo, monkeypatch):
    from swapkl.evidence import section

    parses = _counting(monkeypatch, section, "opened_evidence")
    at = _evidence_page()
    at.file_uploader(key="ev_open").set_value(("ev.json", EVIDENCE.read_bytes(), "application/json")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    headline = json.loads(EVIDENCE.read_text())["headline"]
    for _ in range(3):  # three reruns (a click, a poll): the file is drawn again, never parsed again
        at.run()
        assert any(headline in m.value for m in at.markdown)
    assert len(parses) == 1
    # a refused file is refused on every rerun from the kept refusal, in one line
    at.file_uploader(key="ev_open").set_value(("bad.json", b'{"layers": 1}', "application/json")).run()
    at.run()
    assert len(parses) == 2 and len(at.error) == 1 and "\n" not in at.error[0].value
    # what a session keeps is bounded: six more distinct files, four kept
    for k in range(6):
        at.file_uploader(key="ev_open").set_value((f"b{k}.json", b'{"k": %d}' % k, "application/json")).run()
    assert len(parses) == 8 and len(at.session_state["_uploads"]) == 4


def test_an_evidence_file_with_a_malformed_part_is_one_line_not_a_traceback(demo):
    d = json.loads(EVIDENCE.read_text())
    d["stability"] = {"replacement": {"1": 5}}  # passes the file's checks, then a figure reads it
    at = _evidence_page()
    at.file_uploader(key="ev_open").set_value(("odd.json", json.dumps(d).encode(), "application/json")).run()
    assert not at.exception, at.exception
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and errs[0].startswith("evidence file odd.json: a part of it is malformed") and "\n" not in errs[0]


def test_an_oversized_evidence_file_is_refused_in_demo_mode_before_any_parse(demo, monkeypatch):
    from swapkl.evidence import section
    from swapkl.schema import text

    parses = _counting(monkeypatch, section, "opened_evidence")
    json_parses = _counting(monkeypatch, text, "parse_json")
    at = _evidence_page()
    at.file_uploader(key="ev_open").set_value(("big.json", BIG, "application/json")).run()
    assert not at.exception
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and "up to 16 MB" in errs[0] and "17.8 MB" in errs[0] and "\n" not in errs[0]
    assert parses == [] and json_parses == []


def test_a_local_server_parses_the_same_file(cache, monkeypatch):
    """Nothing a local user does is refused by size: the 17 MiB file is read (and refused for what it holds)."""
    from swapkl.evidence import section

    parses = _counting(monkeypatch, section, "opened_evidence")
    at = _evidence_page()
    at.file_uploader(key="ev_open").set_value(("big.json", BIG, "application/json")).run()
    errs = [e.value for e in at.error]
    assert len(parses) == 1 and len(errs) == 1 and "MB" not in errs[0] and "not a swapkl evidence file" in errs[0]


def _two_opened_and_a_transfer_file():
    from dashboard import common
    from swapkl.jobs.comparisons import compare_jobs

    a, b = synthetic(seed=0, noise=0.05), synthetic(seed=1, noise=0.05)
    m = common.manager()
    job_a, job_b = m.open_files(a.to_json().encode()), m.open_files(b.to_json().encode())
    d = CompareResult(a={"model": {"display": "m0"}, "contract": a.contract},
                      b={"model": {"display": "m1", "num_layers": 6}, "contract": b.contract},
                      agreement=compare_jobs(job_a, job_b).agreement,
                      transfer={"baseline_ppl": 20.0, "n_windows": 8, "protocols": {"interchange": [{"n": 1, "set_a": [2], "set_b": [3], "diff": 1.5,
                                                               "ci": [0.5, 2.5], "word": "worse"}]}}).to_json()
    return d.encode()


def _compare_page():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    return at


def test_the_transfer_table_is_parsed_once_and_bounded_by_size_in_demo_mode(demo, monkeypatch):
    from swapkl.jobs import comparisons

    parses = _counting(monkeypatch, comparisons, "transfer_file")
    data = _two_opened_and_a_transfer_file()
    at = _compare_page()
    at.file_uploader(key="cmp_transfer").set_value(("t.json", data, "application/json")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    for _ in range(3):
        at.run()
    rows = next(t.value for t in at.dataframe if "verdict" in t.value.columns).to_dict("records")
    assert rows[0]["verdict"] == "worse" and rows[0]["set chosen on A"] == "[2]"
    assert len(parses) == 1  # four runs, one parse
    at.file_uploader(key="cmp_transfer").set_value(("big.json", BIG, "application/json")).run()
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and errs[0].startswith("big.json: this demo server opens result files up to 16 MB")
    assert len(parses) == 1  # refused by size, not parsed
    assert list(at.dataframe[0].value["protocol"]) == ["replacement", "interchange"]  # the page goes on
