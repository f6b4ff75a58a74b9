"""A demo server's exports against its visitors (issue 51, item 5), through the app (AppTest, stories260K): the
export is a job of the queue whose zip is built once from the files written and served byte for byte under a name
that holds the set; the exports folder's quota is enforced before and after; the written export and the result
and bundle downloads name no path of the server; a browse-only job gets one line and writes nothing."""
from __future__ import annotations

import io
import json
import os
import time
import zipfile

import pytest
from streamlit.testing.v1 import AppTest

from support.app_util import APP, ROOT, STORIES_REL, TIMEOUT, open_job_page, wait_export
from support.served import record_media, served

from swapkl.jobs.export_quota import entry_size


@pytest.fixture
def demo(cache, monkeypatch):
    """Demo mode with the built-in default and stories260K on the allow-list; downloads readable (:func:`served`)."""
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", f"default,{STORIES_REL}")
    record_media(monkeypatch)
    st.cache_resource.clear()
    return cache


def _computed(budget: int = 1):
    """An AppTest session of the demo with stories260K computed (budget ``budget``), on the curves page."""
    from dashboard import common

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="w_demo_model").set_value(STORIES_REL)
    at.number_input(key="w_prompts").set_value(4)
    at.number_input(key="w_tokens").set_value(16)
    at.number_input(key="w_budget").set_value(budget)
    at.run()
    at.button(key="compute").click().run()
    job = common.manager().get(at.session_state["job_analysis"])
    assert job is not None and job.wait(180) and job.status == "done", job.summary()
    at.switch_page("pages/curves.py").run()
    assert not at.exception, at.exception
    return at, job


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _no_server_path(text: str, cache) -> None:
    """No absolute path in the JSON ``text``, and neither the cache nor the project folder anywhere in it."""
    bad = [s for s in _strings(json.loads(text)) if s.startswith("/")]
    assert not bad, bad[:5]
    assert str(cache) not in text and str(ROOT) not in text


def test_demo_export_is_a_queued_job_whose_zip_is_the_written_export(demo):
    from dashboard import common

    at, job = _computed()
    at.button(key="export").click().run()
    ej = common.manager().get(at.session_state["_export_job_export"])
    # a job of the queue, submitted by this session (admitted under its bounds), not a write in the page's thread
    assert ej.request.kind == "export" and ej.submitter == at.session_state["_session"]
    wait_export(at)
    rec = ej.export
    removed = job.curves.methods[at.selectbox(key="w_exp_method").value][0]["removed"]
    assert rec["removed"] == removed and not rec["reused"]
    exports = demo / "exports"
    folder, zp = exports / ej.request.name, exports / f"{ej.request.name}.zip"
    assert sorted(p.name for p in exports.iterdir()) == [folder.name, zp.name]
    # the zip's members are exactly the files written, and the download serves exactly the zip's bytes
    written = sorted(f"{folder.name}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*") if p.is_file())
    assert sorted(zipfile.ZipFile(zp).namelist()) == written and "config.json" in rec["files"]
    name, data = served(at, "dl_export")
    assert name == zp.name and name.endswith(".zip") and f"-minus-{'-'.join(map(str, removed))}-" in name
    assert data == zp.read_bytes() and len(data) == rec["bytes"] == zp.stat().st_size
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for member in z.namelist():
            if member.endswith(".json"):   # config.json's _name_or_path, swapkl_prune.json's identity
                _no_server_path(z.read(member).decode(), demo)
    # the same request again: the same job and files, nothing rewritten
    before = {p.name: p.stat().st_mtime_ns for p in exports.iterdir()}
    at.button(key="export").click().run()
    assert common.manager().get(at.session_state["_export_job_export"]) is ej
    assert {p.name: p.stat().st_mtime_ns for p in exports.iterdir()} == before


def test_demo_export_enforces_the_quota_of_the_exports_folder(demo, monkeypatch):
    exports = demo / "exports"
    exports.mkdir(parents=True)
    now = time.time()

    def put(name: str, size: int, age_h: float):
        (exports / name).write_bytes(os.urandom(size))
        os.utime(exports / name, (now - age_h * 3600, now - age_h * 3600))

    put("stale.yaml", 100_000, 30)          # older than export_max_age_h = 24: removed whatever the size
    put("older.yaml", 1_500_000, 2)         # the oldest left: removed while the folder is over the quota
    put("newer.yaml", 400_000, 1)           # kept: the folder fits under the quota without removing it
    (exports / ".other.x.tmp").mkdir()      # another writer's temporary folder: never touched
    (exports / ".other.x.tmp" / "w").write_bytes(b"x" * 1000)
    monkeypatch.setenv("SWAPKL_DEMO_EXPORT_QUOTA_MB", "3")
    at, _ = _computed()
    at.button(key="export").click().run()
    ej = wait_export(at)
    new = [p for p in exports.iterdir() if p.name.startswith(ej.request.name)]
    size_new = sum(entry_size(p) for p in new)
    assert len(new) == 2 and size_new + 400_000 <= 3 << 20 < size_new + 400_000 + 1_500_000
    assert sorted(p.name for p in exports.iterdir()) == sorted([".other.x.tmp", "newer.yaml"] + [p.name for p in new])
    assert ej.export["quota"]["removed"] == ["stale.yaml", "older.yaml"] and ej.export["quota"]["freed"] == 1_600_000
    total = sum(entry_size(p) for p in exports.iterdir() if not p.name.startswith("."))
    assert total == ej.export["quota"]["left"] == size_new + 400_000 <= 3 << 20


def test_demo_result_and_bundle_downloads_name_no_server_path(demo):
    from swapkl.jobs.reports import result_json

    at, job = _computed()
    raw = json.dumps(result_json(job))
    assert str(ROOT) in raw     # the identity records where the model was loaded from ...
    from support.app_util import switch_page

    switch_page(at, "app.py").run()
    assert not at.exception, at.exception
    for key in ("dl_json_start",):
        name, data = served(at, key)
        assert name == "swapkl-result.json"
        _no_server_path(data.decode(), demo)     # ... the demo server's download does not
        assert json.loads(data)["result"]["model"]["fingerprint"] == job.result.identity["fingerprint"]
    at.switch_page("pages/heatmaps.py").run()
    _no_server_path(served(at, "dl_json_hm")[1].decode(), demo)
    bundles = [b for b in at.get("download_button") if "bundle" in b.proto.id]
    assert bundles, [b.proto.id for b in at.get("download_button")]
    name, data = served(at, bundles[0].proto.id.rsplit("-", 1)[-1])
    assert name == "swapkl-bundle.json"
    _no_server_path(data.decode(), demo)
    from swapkl.compare.bundle import from_dict

    assert from_dict(json.loads(data)).scores.identity["fingerprint"] == job.result.identity["fingerprint"]


def test_a_browse_only_job_is_refused_in_one_line_and_nothing_is_written(demo):
    from dashboard import common
    from dashboard.export_view import BROWSE_ONLY

    _, job = _computed()
    opened = common.manager().open_files(job.result.to_json(), job.curves.to_json())
    opened.browse_only = True      # an opened file whose model this demo server does not offer
    at = open_job_page(opened, "pages/curves.py")
    assert [i.value for i in at.info if i.value == BROWSE_ONLY] == [BROWSE_ONLY]
    assert not [b for b in at.button if b.key == "export"] and not [r for r in at.radio if r.key == "w_export_fmt"]
    assert not (demo / "exports").exists() or not any((demo / "exports").iterdir())
