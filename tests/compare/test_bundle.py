"""The demo bundle (swapkl.compare.bundle, ``swapkl bundle``): one validated JSON file with every finished result of
an analysis; a malformed one is refused with one line and nothing is written; the dashboard's manager opens it as a
finished job with no model and no computation."""
from __future__ import annotations

import json

import pytest

from swapkl.compare.bundle import make_bundle, read_bundle
from swapkl.errors import SwapklError
from swapkl.removal.curves import CurvesResult
from test_compare import synthetic


def _curves(num_layers: int = 6, fingerprint=None) -> CurvesResult:
    def e(n, removed):
        return {"n": n, "removed": removed, "ppl": 10.0 + n, "ppl_ci": [9.0, 12.0 + n], "delta_pct": 5.0 * n,
                "delta_pct_ci": [1.0, 9.0 * n], "kl_to_base": 0.1 * n}
    return CurvesResult(model={"display": "m0", "num_layers": num_layers, "fingerprint": fingerprint},
                        evaluator={"name": "matched"}, corpus={"label": "t"}, budget=2, selection={"spacing": 1},
                        baseline_ppl=10.0, baseline_ppl_ci=[9.0, 11.0], baseline={},
                        methods={"interchange": [e(1, [2]), e(2, [2, 4])]})


@pytest.fixture
def files(tmp_path):
    s, c = tmp_path / "s.json", tmp_path / "c.json"
    synthetic(seed=0, noise=0.05).save(s)
    _curves().to_json(c)
    return s, c


def test_the_command_writes_a_bundle_the_reader_opens_with_every_part(files, tmp_path, capsys):
    from swapkl.commands.cli import main

    s, c = files
    out = tmp_path / "b.json"
    assert main(["bundle", "--scores", str(s), "--curves", str(c), "--device", "NVIDIA H200", "--out", str(out)]) == 0
    assert "NVIDIA H200" in capsys.readouterr().out
    b = read_bundle(out)
    assert b.parts() == ["scores", "curves"]
    assert b.scores.to_dict()["per_prompt"] == json.loads(s.read_text())["per_prompt"]
    assert b.curves.methods == _curves().to_dict()["methods"]
    assert b.caption().startswith("bundle computed on") and "NVIDIA H200" in b.caption()
    assert b.provenance().contract == b.scores.contract


def _bundle_dict():
    return make_bundle(synthetic(seed=0, noise=0.05), _curves())


@pytest.mark.parametrize("corrupt, words", [
    (lambda d: d.update(format="swapkl.result/1"), "not a swapkl bundle"),
    (lambda d: d["parts"].update(script="import os"), "not a bundle part"),
    (lambda d: d["parts"].pop("scores"), "no 'scores' part"),
    (lambda d: d["parts"]["scores"].update(num_layers=-3), "num_layers"),
    (lambda d: d["parts"]["curves"]["methods"]["interchange"][0].update(ppl="x"), "ppl"),
    (lambda d: d["parts"]["curves"]["model"].update(num_layers=9), "different"),
    (lambda d: d.update(computed_on={"host": {"nested": "object"}}), "computed_on"),
])
def test_a_malformed_bundle_is_refused_in_one_line(corrupt, words):
    d = _bundle_dict()
    corrupt(d)
    with pytest.raises(SwapklError) as e:
        read_bundle(json.dumps(d))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_not_json_too_large_or_nan_is_refused_in_one_line():
    text = json.dumps(_bundle_dict())
    for raw, words in ((b"\x80\x04\x95 pickle", "UTF-8"), (text.encode(), "limit"),
                       (text.replace('"budget": 2', '"budget": NaN').encode(), "NaN")):
        with pytest.raises(SwapklError) as e:
            read_bundle(raw, max_bytes=len(text) - 1 if words == "limit" else 1 << 26)
        assert "\n" not in str(e.value), str(e.value)


def test_a_bad_part_writes_nothing(files, tmp_path, capsys):
    from swapkl.commands.cli import main

    s, _ = files
    other = tmp_path / "other.json"
    _curves(num_layers=9).to_json(other)  # curves of another model
    out = tmp_path / "b.json"
    assert main(["bundle", "--scores", str(s), "--curves", str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "other.json", "s.json"]


def test_the_manager_opens_a_bundle_as_a_finished_job_and_refuses_a_bad_one(tmp_path, monkeypatch):
    from swapkl.jobs.manager import JobManager

    cache = tmp_path / "cache"
    monkeypatch.setenv("SWAPKL_CACHE", str(cache))
    m = JobManager(root=tmp_path / "cache" / "dashboard", log_path=tmp_path / "log.txt")
    try:
        job = m.open_files(json.dumps(_bundle_dict()).encode(), owner="s1")
        assert job.status == "done" and job.result.num_layers == 6 and job.curves.budget == 2
        assert job.bundle.startswith("bundle computed on")
        d = _bundle_dict()
        d["parts"]["scores"]["pairs"] = [[0, 99]]
        with pytest.raises(SwapklError) as e:
            m.open_files(json.dumps(d).encode(), owner="s1")
        assert "\n" not in str(e.value)
    finally:
        m.shutdown()
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and p.name != "log.txt")
    assert not [w for w in written if not w.startswith("cache/progress")], written  # opening computes and caches nothing


def test_the_dashboards_bundle_of_an_analysis_reads_back_and_skips_another_models_parts():
    from swapkl.jobs.reports import bundle_json

    class Job:
        running = False

        def __init__(self, **parts):
            self.result = self.curves = self.evidence = self.heal = self.tasks = None
            self.status = "done"
            self.__dict__.update(parts)

    from swapkl.evidence.run import EvidenceResult

    res = synthetic(seed=0, noise=0.05)
    res.identity["fingerprint"] = "f" * 16
    ev_other = Job(evidence=EvidenceResult({"ground_truth": {}, "contract": {"model": {"fingerprint": "e" * 16}}}))
    ev_mine = Job(evidence=EvidenceResult({"ground_truth": {"x": 1}, "contract": {"model": {"fingerprint": "f" * 16}}}))
    b = read_bundle(bundle_json(Job(result=res, curves=_curves(fingerprint="f" * 16)), ev_other, ev_mine))
    assert b.parts() == ["scores", "curves", "evidence"]
    assert b.evidence["ground_truth"] == {"x": 1}  # the evidence of this model, not the other's
    assert b.scores.to_dict()["per_prompt"] == res.to_dict()["per_prompt"]
    import sys

    torch = sys.modules.get("torch")
    gpu = torch is not None and torch.cuda.is_available()
    assert b.computed_on["device"] == (torch.cuda.get_device_name(0) if gpu else "cpu")  # where it ran
