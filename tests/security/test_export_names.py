"""A demo export's name, its job and what it says about the server: the name ends with the hash of the whole
request (three sets of one long-named hub model pinned to a commit used to share one folder), an export is a job
admitted under the session and server bounds and run again when the quota removed its files, and the server's
paths are scrubbed from what a visitor downloads."""
from __future__ import annotations

import json
import threading

import pytest

from support.app_util import ROOT, STORIES_REL

from swapkl.contract import Contract
from swapkl.jobs import AnalysisRequest, JobManager
from swapkl.jobs.export_job import ExportRequest
from swapkl.jobs.exports import HASH_CHARS, NAME_CHARS, export_key, export_name
from swapkl.jobs.policy import Policy, PolicyError
from swapkl.jobs.scrub import public_name, scrub, scrub_folder
from swapkl.views.captions import safe_name

HUB = AnalysisRequest(model="EleutherAI/pythia-160m-deduped", revision="a" * 40)
IDENT = {"kind": "hub", "id": HUB.model, "commit": "a" * 40, "fingerprint": "f" * 64}
SETS = ([3, 7], [3, 8], [4, 9, 11])


def _old_name(request, identity, removed) -> str:
    """The name before issue 51: the readable head cut at 60 characters, no hash."""
    tail = request.model.split("/")[-1] + f"@{request.revision}"
    return safe_name(f"{tail}-{identity['fingerprint'][:8]}-minus-{'-'.join(map(str, removed))}")


def test_three_sets_of_one_long_named_model_get_three_names():
    before = {_old_name(HUB, IDENT, s) for s in SETS}
    assert before == {"pythia-160m-deduped-" + "a" * 40}             # one folder, overwritten three times
    after = [export_name(HUB, IDENT, s, "hf") for s in SETS]
    assert after == ["pythia-160m-deduped-aaaaaaaaaaaaaaaaaaaaa-minus-3-7-" + export_key(HUB, IDENT, [3, 7], "hf"),
                     "pythia-160m-deduped-aaaaaaaaaaaaaaaaaaaaa-minus-3-8-" + export_key(HUB, IDENT, [3, 8], "hf"),
                     "pythia-160m-deduped-aaaaaaaaaaaaaaaaaa-minus-4-9-11-" + export_key(HUB, IDENT, [4, 9, 11], "hf")]
    assert len(set(after)) == 3 and all(len(n) <= NAME_CHARS for n in after)
    # the same request (a new object) gives the same name; the server's folder keeps it as is
    same = AnalysisRequest(model="EleutherAI/pythia-160m-deduped", revision="a" * 40)
    assert export_name(same, dict(IDENT), [3, 7], "hf") == after[0]
    assert [Policy(demo=True).export_dir(n, "/c").name for n in after] == after


def test_the_hash_covers_the_whole_request():
    base = export_name(HUB, IDENT, [3, 7], "hf")
    others = [export_name(HUB, IDENT, [3, 7], "mergekit"),
              export_name(HUB, {**IDENT, "fingerprint": "e" * 64}, [3, 7], "hf"),
              export_name(AnalysisRequest(model=HUB.model, revision="b" * 40), IDENT, [3, 7], "hf"),
              export_name(HUB, IDENT, [3, 7], "hf", merge={"mode": "mean", "groups": [[3, 4]]}),
              export_name(HUB, IDENT, [3, 7], "hf", merge={"mode": "laco", "groups": [[3, 4]]}),
              export_name(HUB, IDENT, [3, 7], "hf", heal={"recipe_key": "r1"}, tag="-healed-r1"),
              export_name(HUB, IDENT, [3, 7], "hf", heal={"recipe_key": "r2"}, tag="-healed-r1")]
    assert len({base, *others}) == 8 and others[0].endswith(".yaml")
    many = export_name(HUB, IDENT, list(range(30)), "hf")             # the layers cut too: the hash still ends it
    assert len(many) <= NAME_CHARS and many.startswith("pythia-160m-") and many[-HASH_CHARS - 1] == "-"
    assert many != export_name(HUB, IDENT, list(range(31)), "hf")


class _Blocking:
    """A loader that holds every job in 'loading' until released."""

    def __init__(self):
        self.go = threading.Event()

    def __call__(self, *a, **k):
        self.go.wait(30)
        from swapkl.errors import ModelLoadError

        raise ModelLoadError("released")


def _export_req(root, name="stories260K-minus-1-0123abcd", removed=(1,)):
    return ExportRequest(model=STORIES_REL, revision=None, removed=removed, name=name, root=str(root), device="cpu")


def test_an_export_is_admitted_under_the_session_and_server_bounds(cache):
    gate = _Blocking()
    mgr = JobManager(loader=gate, use_snapshots=False)
    try:
        mgr.submit(AnalysisRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=16)), owner="A", max_active=1)
        with pytest.raises(PolicyError, match="already have 1 computation queued or running"):
            mgr.submit(_export_req(cache / "exports"), owner="A", max_active=1)
        with pytest.raises(PolicyError, match="the server is busy"):
            mgr.submit(_export_req(cache / "exports"), owner="B", max_active=1, max_total=1)
        assert [j.request.kind for j in mgr.jobs()] == ["analysis"]
    finally:
        gate.go.set()
        mgr.shutdown()
    with pytest.raises(PolicyError, match="offers only these checkpoints"):
        Policy(demo=True, models=("default",)).check_request(_export_req(cache / "exports"))


def test_an_export_whose_files_the_quota_removed_is_written_again(cache):
    mgr = JobManager(use_snapshots=False)
    try:
        job = mgr.submit(_export_req(cache / "exports"))
        assert job.wait(120) and job.status == "done", job.error
        zp = cache / "exports" / "stories260K-minus-1-0123abcd.zip"
        assert job.export["download"] == str(zp) and zp.stat().st_size == job.export["bytes"]
        assert mgr.submit(_export_req(cache / "exports")) is job              # there: the same job
        zp.unlink()
        again = mgr.submit(_export_req(cache / "exports"))
        assert again is not job and again.wait(120) and again.status == "done" and zp.is_file()
        prune = (cache / "exports" / "stories260K-minus-1-0123abcd" / "swapkl_prune.json").read_text()
        assert str(ROOT) not in prune and str(cache) not in prune and '"stories260K"' in prune
    finally:
        mgr.shutdown()
    with pytest.raises(Exception, match="not allowed"):
        _export_req(cache, name="../x")


def test_scrub_replaces_every_server_path_with_the_models_name(tmp_path):
    ident = {"kind": "local", "id": "/srv/models/stories260K", "display": "stories260K", "fingerprint": "9c92"}
    doc = {"model": ident, "note": "loaded /srv/models/stories260K in 2 s", "url": "https://huggingface.co/x/y",
           "rate": "3 tok/s", "rel": "tests/fixtures/models/stories260K", "cache": f"{tmp_path}/cache/x"}
    out = scrub(doc, public_name(ident), (str(tmp_path),))
    assert out == {"model": {**ident, "id": "stories260K"}, "note": "loaded stories260K in 2 s",
                   "url": "https://huggingface.co/x/y", "rate": "3 tok/s", "rel": "tests/fixtures/models/stories260K",
                   "cache": "stories260K"}
    assert public_name({"display": "/srv/models/other"}) == "other"
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "/srv/models/stories260K", "n": 1}))
    (folder / "README.md").write_text(f"# from {tmp_path}/m\n")
    (folder / "model.safetensors").write_bytes(b"/srv/binary")
    assert sorted(scrub_folder(folder, "stories260K", (str(tmp_path),))) == ["README.md", "config.json"]
    assert json.loads((folder / "config.json").read_text()) == {"_name_or_path": "stories260K", "n": 1}
    assert (folder / "README.md").read_text() == "# from stories260K\n"
    assert (folder / "model.safetensors").read_bytes() == b"/srv/binary"         # weights are never touched
