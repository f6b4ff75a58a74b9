"""What the dashboard decides, decided in the library and tested without Streamlit: requests from forms and shared
links (swapkl.jobs.forms), the verdict of a job and content keys (contents), the result JSON, the report and its
fingerprint rule (reports), export formats and names (exports), the local model folders (defaults)."""
from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import pytest

from swapkl.contract import Contract
from swapkl.errors import SwapklError
from swapkl.jobs import AnalysisRequest, Job
from swapkl.jobs import contents, exports, forms, reports
from swapkl.views.captions import safe_name
from test_plots import IDENTITY, synthetic

CONTRACT = Contract(pairs="gap:2", prompts=8, tokens=24, dtype="float32", device="cpu", seed=3)
EVAL = {"name": "quick", "max_words": 600, "window": 256, "stride": 192}


def _analysis(**kw) -> AnalysisRequest:
    args = dict(model="EleutherAI/pythia-160m", revision="step1000", contract=CONTRACT, budget=3,
                methods=("replacement", "interchange"), evaluator=EVAL)
    return AnalysisRequest(**(args | kw))


# ============================================================================================ forms
def test_a_shared_link_reads_back_the_request_it_was_made_of():
    req = _analysis()
    q = forms.query_params(req)
    assert all(isinstance(v, str) for v in q.values())
    assert q["model"] == "EleutherAI/pythia-160m" and q["revision"] == "step1000" and q["evaluator"] == "quick"
    s = forms.query_settings(q, offered_methods=("replacement", "interchange", "random"))
    assert s == {"pairs": "gap:2", "prompts": 8, "tokens": 24, "positions": "all", "dtype": "float32",
                 "device": "cpu", "aggregation": "max", "seed": 3, "budget": 3, "evaluator": "quick",
                 "methods": ["replacement", "interchange"]}
    assert Contract(**{k: s[k] for k in ("pairs", "prompts", "tokens", "positions", "dtype", "device",
                                         "aggregation", "seed")}) == req.contract
    assert "revision" not in forms.query_params(_analysis(revision=None))


def test_a_hostile_link_loses_only_its_bad_values():
    q = {"prompts": "many", "tokens": "32", "seed": None, "methods": "replacement,rm -rf,interchange"}
    assert forms.query_settings(q, ("replacement", "interchange")) == {"tokens": 32,
                                                                       "methods": ["replacement", "interchange"]}


def test_spec_source(tmp_path, monkeypatch):
    assert [forms.spec_source(s) for s in ("default", "builtin", "m.GGUF", "./m", "/abs", "~/m", "org/name")] == [
        "builtin", "builtin", "gguf", "local", "local", "local", "hub"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    assert forms.spec_source("folder") == "local" and forms.spec_source("absent") == "hub"


def test_requests_from_forms():
    assert forms.analysis_request("m", None, CONTRACT, 2, ("sleb",), None).methods == ("sleb",)
    with pytest.raises(SwapklError, match="choose a checkpoint"):
        forms.analysis_request("", None, CONTRACT, 2, ("sleb",), None)
    t = forms.trajectory_request("  a@step0, @step1  ", 1, 8, 32, "cpu")
    assert t.checkpoints == "a@step0, @step1" and t.contract.pairs == "adjacent" and t.contract.tokens == 32
    assert forms.trajectory_request("a", 3, 8, 32, "cpu").contract.pairs == "gap:3"
    with pytest.raises(SwapklError, match="give at least one checkpoint"):
        forms.trajectory_request("  ", 1, 8, 32, "cpu")
    base = _analysis()
    same = forms.evidence_request(" EleutherAI/pythia-160m ", 4, 200, base)
    assert (same.model, same.revision, same.contract, same.evaluator, same.budget, same.n_boot) == (
        base.model, "step1000", CONTRACT, EVAL, 4, 200)
    other = forms.evidence_request("default", 2, 50, base)
    assert (other.revision, other.contract, other.evaluator["name"]) == (None, Contract(), "matched")
    with pytest.raises(SwapklError, match="choose a checkpoint"):
        forms.evidence_request(" ", 2, 50, None)


def test_panel_requests_follow_the_analysis():
    from swapkl.healing.recipe import Recipe

    base = _analysis()
    t = forms.tasks_request(base, ["tinystories_mc"], 40, None, "tests/fixtures/tasks")
    assert (t.model, t.revision, t.contract, t.budget, t.methods, t.tasks, t.limit, t.include_path) == (
        base.model, base.revision, CONTRACT, 3, base.methods, ("tinystories_mc",), 40, "tests/fixtures/tasks")
    r = Recipe(steps=4, rank=2, alpha=4.0, lr=1e-3, warmup=1, seq_len=64, batch=2)
    h = forms.heal_request(base, ["interchange"], range(1, 3), r, demo=False)
    assert (h.ns, h.methods, h.evaluator, h.include_path) == ((1, 2), ("interchange",), EVAL, None)
    assert Recipe.from_dict(h.recipe) == r
    assert forms.heal_request(base, ["interchange"], [1], r, demo=True).evaluator is None
    assert forms.heal_request(base, ["interchange"], [1], r, False, (), include="x").include_path is None
    assert forms.task_list(" a, ,b ,") == ("a", "b") and forms.few_shot(" 5 ") == 5 and forms.few_shot("-1") is None
    assert forms.curves_analysis(SimpleNamespace(request=base)) is base
    assert forms.curves_analysis(SimpleNamespace(request=_analysis(budget=0))) is None
    assert forms.curves_analysis(None) is None
    # one set per n: no seeded baseline (random), no merge (laco); the guided methods first
    assert forms.healable(["random", "laco", "sleb", "interchange", "replacement"]) == [
        "replacement", "interchange", "sleb"]


def test_request_caption():
    from swapkl import views

    cap = forms.request_caption(_analysis())
    assert cap.startswith("EleutherAI/pythia-160m@step1000 · pairs gap:2 · 8 prompts × 24 tokens")
    assert cap == views.contract_caption(CONTRACT.provenance(model="EleutherAI/pythia-160m@step1000"), evaluator=EVAL) \
        + " · budget 3 · methods replacement, interchange"
    assert "evaluator quick (600 words, window 256/stride 192)" in cap
    assert "budget" not in forms.request_caption(_analysis(budget=0)) and forms.request_caption(None) == ""
    assert "trajectory: a@step0" in forms.request_caption(forms.trajectory_request("a@step0", 1, 8, 32, "cpu"))


# ============================================================================================ contents
def test_content_key_names_content_not_objects():
    a, b = synthetic(), synthetic()
    assert a is not b and contents.content_key(a) == contents.content_key(b)
    assert contents.content_key(a, None) != contents.content_key(a) != contents.content_key(None)
    c = copy.deepcopy(a)
    c.per_prompt["inter"][(1, 2)][0] += 1e-9  # one per-prompt value
    assert contents.content_key(c) != contents.content_key(a)
    assert len(contents.content_key(a)) == 32


def test_has_content():
    res = synthetic()
    assert contents.has_content(res) and not contents.has_content(None)
    assert not contents.has_content(SimpleNamespace(pairs=[]))
    assert not contents.has_content(SimpleNamespace(methods={})) and contents.has_content(SimpleNamespace(results=[1]))


def test_job_verdict_needs_every_adjacent_pair():
    from swapkl.scoring.verdict import regime_verdict

    res = synthetic()  # gap:2 without (0, 2): every adjacent pair
    job = SimpleNamespace(result=res, curves=None)
    want = regime_verdict(res.replacement(), res.interchange(), [(i, i + 1) for i in range(4)])
    got = contents.job_verdict(job)
    assert got["regime"] == want["regime"] and got["sentence"] == want["sentence"]
    part = copy.deepcopy(res)
    part.pairs = [p for p in part.pairs if p != (2, 3)]
    assert contents.job_verdict(SimpleNamespace(result=part, curves=None)) is None
    assert contents.job_verdict(SimpleNamespace(result=None, curves=None)) is None
    mine = {"regime": "x"}
    assert contents.job_verdict(SimpleNamespace(result=part, curves=SimpleNamespace(verdict=mine))) is mine


# ============================================================================================ reports
def test_the_fingerprint_rule():
    assert reports.same_model({"fingerprint": "a"}, {"fingerprint": "a"})
    assert not reports.same_model({"fingerprint": "a"}, {"fingerprint": "b"})
    assert reports.same_model({"fingerprint": "a"}, {}) and reports.same_model(None, {"fingerprint": "b"})


def test_result_json_and_matching_evidence():
    job = Job("k", _analysis())
    job.done_from("test", result=synthetic())
    d = reports.result_json(job)
    assert d["format"] == "swapkl.dashboard/1" and d["request"] == job.request.to_dict() and "curves" not in d
    assert d["result"]["pairs"] == [list(p) for p in job.result.pairs]
    ev = {"headline": "h"}
    jobs = [SimpleNamespace(request=SimpleNamespace(kind="evidence", model=m, revision="step1000", contract=c),
                            evidence=e)
            for m, c, e in (("EleutherAI/pythia-160m", Contract(), ev), ("other", CONTRACT, ev),
                            ("EleutherAI/pythia-160m", CONTRACT, None), ("EleutherAI/pythia-160m", CONTRACT, ev))]
    assert reports.matching_evidence(jobs, job.request) is jobs[3].evidence
    assert reports.matching_evidence(jobs[:3], job.request) is None


def test_report_sections_of_jobs(monkeypatch):
    analysis = Job("a", AnalysisRequest())
    analysis.done_from("test", result=synthetic())
    t = SimpleNamespace(base={"metrics": {}}, model=dict(IDENTITY))
    tasks = SimpleNamespace(running=False, tasks=t, status="done")
    import swapkl.views.tasks as tv

    monkeypatch.setattr(tv, "section", lambda r: ("section of", r))  # the section itself: test_tasks_report.py
    assert reports.tasks_sections(analysis, tasks) == [("section of", t)]
    assert reports.job_sections(tasks, analysis) == [("section of", t)]
    assert reports.tasks_sections(analysis, SimpleNamespace(running=True, tasks=t)) == []
    assert reports.tasks_sections(analysis, SimpleNamespace(running=False, tasks=SimpleNamespace(
        base={}, model=dict(IDENTITY)))) == []
    other = SimpleNamespace(running=False, tasks=SimpleNamespace(base=t.base, model={"fingerprint": "0" * 16}))
    assert reports.tasks_sections(analysis, other) == []
    assert reports.tasks_sections(None, other) == [("section of", other.tasks)]  # no analysis: nothing to differ from
    assert reports.job_sections(None) == [] and not reports.evidence_done(None)
    assert not reports.evidence_done(SimpleNamespace(status="running", evidence={}))


# ============================================================================================ exports
def test_export_formats_and_names():
    assert exports.export_formats({"kind": "hub", "id": "o/n"}) == ["hf", "mergekit"]
    assert exports.export_formats({"kind": "gguf", "id": "/m.gguf"}) == ["hf", "mergekit", "gguf"]
    assert exports.export_formats({"kind": "gguf", "id": "/m.gguf"}, merge={"mode": "avg", "groups": []}) == ["hf"]
    req = _analysis()
    ident = {"kind": "hub", "id": "EleutherAI/pythia-160m", "commit": "0123456789ab", "fingerprint": "fedcba9876543"}
    assert exports.model_tail(req) == "pythia-160m@step1000"
    # the readable head, then the hash of the whole request (tests/security/test_export_names.py)
    key = exports.export_key(req, ident, [3, 5], "mergekit")
    assert exports.export_name(req, ident, [3, 5], "mergekit") == f"pythia-160m-step1000-fedcba98-minus-3-5-{key}.yaml"
    key = exports.export_key(req, ident, [3, 5], "hf")
    assert exports.export_name(req, ident, [3, 5], "hf") == f"pythia-160m-step1000-fedcba98-minus-3-5-{key}"
    merge = {"mode": "laco", "groups": [[2, 3], [5, 6, 7]]}
    key = exports.export_key(req, {}, [3, 6, 7], "hf", merge)
    assert exports.export_name(req, {}, [3, 6, 7], "hf", merge) == f"pythia-160m-step1000-merged-laco-2-3-5-6-7-{key}"
    long = exports.export_name(req, ident, list(range(40)), "gguf")
    assert len(long) <= 60 + len(".gguf") and long.endswith(f"-{exports.export_key(req, ident, list(range(40)), 'gguf')}.gguf")
    assert exports.demo_model_ref(req, ident) == "EleutherAI/pythia-160m@0123456789ab"
    assert exports.demo_model_ref(_analysis(model="/srv/models/tiny/", revision=None), {"kind": "local"}) == "./tiny"
    job = SimpleNamespace(result=synthetic())
    assert exports.export_identity(job) == IDENTITY and exports.export_identity(job, {"x": 1}) == {"x": 1}
    assert exports.export_identity(SimpleNamespace(result=None)) == {}


def test_which_set_is_exported():
    curves = SimpleNamespace(
        methods={"replacement": [{"n": 1, "removed": [3]}, {"n": 2, "removed": [3, 4]}],
                 "random": [{"n": 1, "removed": None}], "empty": [],
                 "laco": [{"n": 1, "removed": [4], "merge": "laco:3+4"}]},
        method_info={"laco": {"groups": [[[3, 4]]]}})
    assert exports.curve_export_methods(curves) == ["replacement", "laco"]
    entry, merge = exports.curve_export(curves, "replacement", 2)
    assert entry["removed"] == [3, 4] and merge is None
    entry, merge = exports.curve_export(curves, "laco", 1)
    assert entry["removed"] == [4] and merge == {"groups": [[3, 4]], "mode": "laco"}
    d = {"stability": {"bi": {"2": {"set": [7, "2"]}}}}
    assert exports.evidence_export(d, "bi", 2) == [2, 7]


def test_safe_name():
    assert safe_name("a/b c@d") == "a-b-c-d" and safe_name("--x--") == "x" and safe_name("///") == "swapkl"
    assert safe_name("é.tar_gz") == "é.tar_gz" and len(safe_name("x" * 100)) == 60


# ============================================================================================ defaults
def test_local_model_folders(tmp_path, monkeypatch):
    from swapkl.jobs.defaults import HUB_TRAJECTORY, default_trajectory_list, local_model_folders

    def model(d):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")

    project = tmp_path / "work" / "project"
    project.mkdir(parents=True)
    model(tmp_path / "work" / "shared" / "models" / "b")
    (tmp_path / "work" / "shared" / "models" / "not-a-model").mkdir()
    model(tmp_path / "elsewhere" / "z")
    model(tmp_path / "elsewhere" / "a")
    monkeypatch.setenv("SWAPKL_MODEL_DIRS", os.pathsep.join([str(tmp_path / "elsewhere"), str(tmp_path / "absent")]))
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "work" / "cache"))
    model(tmp_path / "work" / "cache" / "exports" / "pruned")
    assert local_model_folders(project) == [str(tmp_path / "elsewhere" / "a"), str(tmp_path / "elsewhere" / "z"),
                                            os.path.join("..", "shared", "models", "b"),
                                            os.path.join("..", "cache", "exports", "pruned")]
    assert default_trajectory_list() == HUB_TRAJECTORY
    (tmp_path / "work" / "cache" / "demo-trajectory").mkdir()
    assert default_trajectory_list() == str(tmp_path / "work" / "cache" / "demo-trajectory")


def test_the_dashboard_logic_imports_without_streamlit_or_torch():
    """The library's dashboard logic imports without Streamlit (pages only draw) and without torch (first paint)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; import swapkl.jobs.forms, swapkl.jobs.contents, swapkl.jobs.reports, swapkl.jobs.exports; "
            "print('streamlit' in sys.modules, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr
