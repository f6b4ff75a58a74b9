"""Healed curves in the dashboard: the HealRequest job (runs through the job system with progress, is snapshotted and
served from the snapshot without the model), the demo policy's bounds on a hostile request, and the Healing panel
(AppTest: the dashed healed curves equal the result's numbers, the headline, the downloads; demo widgets bounded).
stories260K, a tiny recipe."""
from __future__ import annotations

import json

import pytest

from swapkl.contract import Contract
from swapkl.healing.recipe import Recipe
from swapkl.jobs import HealRequest
from swapkl.jobs.policy import Policy, PolicyError
from swapkl.measure.evaluate import Evaluator
from support.app_util import heal_panel_app

EV = Evaluator("tiny", 300, 128, 64)
TINY = Recipe(steps=2, rank=2, seq_len=32, batch=2, lr=3e-3, warmup=1)


def test_demo_policy_bounds_heal_requests():
    demo = Policy(demo=True, models=("default",), max_budget=4, max_heal_steps=50, max_heal_tokens=51_200,
                  max_heal_rank=16, max_heal_sets=8)
    ok = HealRequest(model="default", methods=("interchange", "replacement"), ns=(1, 2),
                     recipe=Recipe(steps=50, rank=8, seq_len=128, batch=8))
    demo.check_request(ok)
    bad = {
        "too many steps": (dict(recipe=Recipe(steps=10_000, seq_len=8, batch=1)), "at most 50 steps"),
        "too many tokens": (dict(recipe=Recipe(steps=50, seq_len=512, batch=16)), "at most 51200 tokens"),
        "a big rank": (dict(recipe=Recipe(steps=10, rank=512)), "rank at most 16"),
        "QLoRA": (dict(recipe=Recipe(steps=10, qlora=True)), "QLoRA"),
        "n past the budget": (dict(ns=(1, 9)), "at most 4 layers"),
        "too many sets": (dict(methods=("interchange", "replacement", "bi"), ns=(1, 2, 3)), "at most 8 sets"),
        "a seeded method": (dict(methods=("random",)), "not 'random'"),
        "many blocks in full": (dict(recipe=Recipe(steps=10, part="last-k", last_k=12)), "last 4 blocks in full"),
        "a merging method": (dict(methods=("laco",)), "not 'laco'"),
        "an unknown method": (dict(methods=("../../etc",)), "not '../../etc'"),
        "a visitor's evaluator": (dict(evaluator=Evaluator("big", 10**9, 512, 256)), "own evaluator"),
        "a model off the list": (dict(model="/etc"), "offers only"),
        "no method": (dict(methods=()), "at least one method"),
    }
    for why, (change, msg) in bad.items():
        req = HealRequest(**(ok.to_dict() | {"contract": ok.contract} | change))
        with pytest.raises(PolicyError, match=msg):
            demo.check_request(req)
            pytest.fail(why)
    Policy(demo=False).check_request(HealRequest(recipe=Recipe(steps=10_000)))  # a local user: no bound
    env = Policy.from_env({"SWAPKL_DEMO": "1", "SWAPKL_DEMO_MAX_HEAL_STEPS": "20",
                           "SWAPKL_DEMO_MAX_HEAL_TOKENS": "1000"}, config_file="/nonexistent.toml")
    assert (env.max_heal_steps, env.max_heal_tokens) == (20, 1000)


def test_request_key_and_bad_recipe(stories_path):
    from swapkl.errors import SwapklError
    from swapkl.jobs import request_key

    s = str(stories_path)
    a = HealRequest(model=s, recipe=TINY)
    assert a.to_dict()["recipe"]["steps"] == 2 and a.recipe_obj() == TINY
    assert request_key(a) == request_key(HealRequest(model=s, recipe=TINY.__dict__))
    assert request_key(a) != request_key(HealRequest(model=s, recipe=Recipe(steps=3, rank=2, seq_len=32)))
    with pytest.raises(SwapklError, match="--steps"):
        HealRequest(recipe={"steps": -1})


@pytest.fixture(scope="module")
def heal_job(stories_path, tmp_path_factory):
    """One heal job through a JobManager (private cache): interchange and replacement at n = 1."""
    from swapkl.jobs import DONE, JobManager

    mp = pytest.MonkeyPatch()
    mp.setenv("SWAPKL_CACHE", str(tmp_path_factory.mktemp("heal-cache")))
    req = HealRequest(model=str(stories_path), contract=Contract(prompts=4, tokens=16), ns=(1,), recipe=TINY,
                      evaluator=EV, spacing=0)
    m = JobManager()
    try:
        job = m.submit(req)
        assert job.wait(600), job.summary()
        assert job.status == DONE, job.error
        yield job, req, mp
    finally:
        m.shutdown()
        mp.undo()


def test_heal_job_runs_publishes_and_is_snapshotted(heal_job):
    from swapkl.jobs import DONE, JobManager

    job, req, _ = heal_job
    hc = job.heal
    assert set(hc.methods) == {"interchange", "replacement"} and [c["n"] for c in hc.comparisons] == [1]
    assert hc.recipe["steps"] == 2 and job.result is not None and job.updates["heal"] >= 2  # partial + final
    p = job.progress()
    assert (p.step, p.steps) == (3, 3) and p.done == p.total
    m2 = JobManager(loader=lambda *a, **k: pytest.fail("a cached request must not load the model"))
    try:
        j2 = m2.submit(req)
        assert j2.status == DONE and j2.from_snapshot and j2.heal.to_dict() == hc.to_dict()
    finally:
        m2.shutdown()


def _demo_widgets_app():
    from dashboard import heal_panel
    from swapkl.jobs.policy import Policy

    r = heal_panel._recipe_widgets(Policy(demo=True, max_heal_steps=20, max_heal_rank=4))
    import streamlit as st

    st.write(f"recipe {r.steps} {r.rank}")


def test_panel_draws_dashed_healed_curves_headline_and_downloads(heal_job, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    hc = heal_job[0].heal
    f = tmp_path / "heal.json"
    hc.to_json(f)
    monkeypatch.setenv("SWAPKL_TEST_HEAL", str(f))
    at = AppTest.from_function(heal_panel_app, default_timeout=60).run()
    assert not at.exception, at.exception
    (chart,) = at.get("plotly_chart")
    fig = json.loads(chart.proto.spec)
    healed = [t for t in fig["data"] if t["meta"]["kind"] == "healed"]
    assert healed and all(t["line"]["dash"] == "dash" for t in healed)
    for t in healed:
        entries = hc.methods[t["meta"]["method"]]
        assert t["y"] == [e["delta_pct"][t["meta"]["delta"]]["value"] for e in entries]
    assert hc.recipe_line() in fig["layout"]["meta"]["contract"]
    assert any(hc.headline[1:30] in m.value for m in at.markdown)
    assert len(at.get("download_button")) == 3


def test_demo_recipe_widgets_stop_at_the_policy():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_demo_widgets_app, default_timeout=30).run()
    assert not at.exception, at.exception
    assert at.number_input(key="w_heal_steps").max == 20 and at.number_input(key="w_heal_rank").max == 4


def test_curves_page_heals_through_the_job_system(cache):
    """The whole path in the app: an analysis on stories260K, then the Healing panel's Heal button on the curves
    page runs a heal job; the page's removal-curves figure gets the dashed healed curves (the job's numbers), the
    panel its figure and headline, and the one-click report the healing section."""
    from streamlit.testing.v1 import AppTest

    from support.app_util import APP, TIMEOUT
    from dashboard import common
    from swapkl.views.report import figure_count
    from test_app import _choose_stories, _compute

    at = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT), pairs="adjacent", budget=1)
    job = _compute(at)
    at.switch_page("pages/curves.py").run()
    assert not at.exception, at.exception
    at.number_input(key="w_heal_steps").set_value(2)
    at.number_input(key="w_heal_batch").set_value(2)
    at.selectbox(key="w_heal_seq").set_value(64)
    at.button(key="heal_start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    hjob = common.manager().get(at.session_state["job_heal"])
    assert hjob.request.kind == "heal" and hjob.request.recipe["steps"] == 2 and hjob.request.ns == (1,)
    assert hjob.wait(300), hjob.summary()
    assert hjob.status == "done", hjob.error
    at.run()
    assert not at.exception, at.exception
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    main = charts[0]
    dashed = {t["meta"]["method"]: t for t in main["data"] if isinstance(t.get("meta"), dict)
              and t["meta"].get("kind") == "healed"}
    assert set(dashed) == {"replacement", "interchange"}
    for m, t in dashed.items():
        assert t["y"] == [e["delta_pct"]["healed_vs_base"]["value"] for e in hjob.heal.methods[m]]
    assert "healed: LoRA r8" in main["layout"]["meta"]["contract"]
    assert any(c["layout"].get("meta", {}).get("healed") for c in charts[1:])  # the panel's own figure
    plain = common.report_html(job, None)
    html = common.report_html(job, None, hjob)
    assert figure_count(html) == figure_count(plain) + 1 and "Healing after removal" in html


# ============================================================================================ objectives, the gate
def _section_app():
    from dashboard import heal_panel
    from swapkl.jobs import AnalysisRequest, Job

    heal_panel.section(Job("heal-section-test", AnalysisRequest(model="default", budget=2,
                                                                methods=("replacement", "interchange"))))


def test_the_panel_passes_objective_part_k_and_temperature_to_the_request(cache, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard.heal_panel import DEFAULT
    from swapkl.healing.heal import KD_CONTROL_NOTE

    asked = []
    monkeypatch.setattr("dashboard.common.start", asked.append)
    at = AppTest.from_function(_section_app, default_timeout=60).run()
    assert not at.exception, at.exception
    assert at.selectbox(key="w_heal_objective").value == "lm" and at.radio(key="w_heal_part").value == "lora"
    assert not any(KD_CONTROL_NOTE in i.value for i in at.info)
    at.selectbox(key="w_heal_objective").set_value("kd").run()
    assert any(KD_CONTROL_NOTE in i.value for i in at.info)  # the control of a kd heal is the base itself
    at.number_input(key="w_heal_temp").set_value(2.0)
    at.radio(key="w_heal_part").set_value("last-k").run()
    at.number_input(key="w_heal_k").set_value(2)
    at.button(key="heal_start").click().run()
    assert not at.exception, at.exception
    r = asked[-1].recipe_obj()
    assert (r.objective, r.temperature, r.part, r.last_k) == ("kd", 2.0, "last-k", 2)
    assert (r.steps, r.seq_len, r.batch) == (DEFAULT.steps, DEFAULT.seq_len, DEFAULT.batch)
    at.selectbox(key="w_heal_objective").set_value("kd+lm").run()
    assert not any(KD_CONTROL_NOTE in i.value for i in at.info)
    at.number_input(key="w_heal_kd_weight").set_value(0.3)
    at.radio(key="w_heal_part").set_value("lora").run()
    at.button(key="heal_start").click().run()
    r = asked[-1].recipe_obj()
    assert (r.objective, r.temperature, r.kd_weight, r.part) == ("kd+lm", 2.0, 0.3, "lora")
    assert asked[-1].to_dict()["recipe"]["objective"] == "kd+lm"


def _gate_result(eval_ci, held_ci=None):
    from swapkl.healing.result import HealResult

    d = lambda ci: {"healed_vs_pruned": {"value": (ci[0] + ci[1]) / 2, "ci": list(ci), "tie": ci[0] <= 0 <= ci[1]}}
    return HealResult(removed=[2], ppl={}, ppl_ci={}, delta_pct=d(eval_ci), recovered=None, recovered_ci=None,
                      recipe={}, training={}, train_text={}, contract={}, seconds=0.0,
                      held_out={"delta_pct": d(held_ci)} if held_ci else {})


@pytest.mark.parametrize("eval_ci, held_ci", [((1.0, 3.0), None), ((-1.0, 3.0), None), ((-3.0, -1.0), (0.5, 2.0)),
                                              ((0.2, 0.4), (0.5, 2.0)), ((-1.0, 1.0), (-2.0, 0.0))])
def test_the_panels_gate_is_the_heal_results(eval_ci, held_ci):
    from swapkl.jobs.exports import heal_exportable, heal_gate, worse_heals

    r = _gate_result(eval_ci, held_ci)
    entry = {"n": 1, "delta_pct": r.delta_pct, "held_out": r.held_out}
    assert heal_gate(entry) == r.gate_line()
    hc = {"methods": {"bi": [entry]}}
    assert worse_heals(hc) == ({("bi", 1): r.gate_line()} if r.gate_line() else {})
    assert heal_exportable(hc, "bi", 1) == (r.gate_line() is None) and heal_exportable(hc, "bi", 1, force=True)


def _worse(hc):
    """``hc`` with interchange's heal at n = 1 measured worse than its pruned model (paired CI above 0)."""
    d = hc.to_dict()
    e = d["methods"]["interchange"][0]
    e["delta_pct"]["healed_vs_pruned"] = {"value": 4.0, "ci": [1.5, 6.5], "tie": False}
    return d


def test_a_worse_heal_is_marked_and_gets_no_export_button(heal_job, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    f = tmp_path / "heal.json"
    f.write_text(json.dumps(_worse(heal_job[0].heal)))
    monkeypatch.setenv("SWAPKL_TEST_HEAL", str(f))
    at = AppTest.from_function(heal_panel_app, default_timeout=60).run()
    assert not at.exception, at.exception
    marks = [e.value for e in at.error]
    assert marks == ["interchange, n = 1: the healed model is worse than the pruned model it heals: evaluation PPL "
                     "+4 % [+1.5, +6.5] vs the pruned model"]
    at.selectbox(key="w_heal_exp_method").set_value("interchange").run()
    assert not [b for b in at.button if b.key == "heal_export"]  # no export button for the worse model
    at.checkbox(key="w_heal_exp_force").check().run()
    assert [b.label for b in at.button if b.key == "heal_export"] == ["Export healed model (interchange, n = 1)"]
    at.selectbox(key="w_heal_exp_method").set_value("replacement").run()
    assert not [c for c in at.checkbox if c.key == "w_heal_exp_force"]  # not worse: no box, the button as it is
    assert [b for b in at.button if b.key == "heal_export"]


def test_a_healed_model_exports_and_a_worse_one_only_anyway(heal_job, tmp_path):
    from swapkl.errors import SwapklError
    from swapkl.healing.curves import HealCurves
    from swapkl.jobs import Job, JobManager
    from swapkl.jobs.heal_export import export_healed_model

    job, req, _ = heal_job
    m = JobManager()
    try:
        out = export_healed_model(m, job, "replacement", 1, tmp_path / "healed")
        rec = json.loads((out / "swapkl_heal.json").read_text())
        assert rec["removed"] == job.heal.methods["replacement"][0]["removed"] and (out / "config.json").exists()
        assert rec["recipe"]["steps"] == TINY.steps and (out / "adapter").is_dir()
        worse = Job("worse-heal", req)
        worse.done_from("test", heal=HealCurves.from_dict(_worse(job.heal)))
        with pytest.raises(SwapklError, match="the healed model is worse .*; not exported \\(tick 'export anyway'"):
            export_healed_model(m, worse, "interchange", 1, tmp_path / "worse")
        assert not (tmp_path / "worse").exists()
    finally:
        m.shutdown()


def test_a_demo_healed_export_is_a_queued_job_with_its_zip(heal_job, tmp_path):
    """Demo mode's healed export (issue 51): a job of the queue whose name holds the heal recipe's hash, whose zip's
    members are the files written, and whose provenance names no server path."""
    import zipfile

    from swapkl.jobs import JobManager
    from swapkl.jobs.export_job import ExportRequest
    from swapkl.jobs.heal_export import healed_entry, healed_export_name
    from support.app_util import ROOT

    job, req, _ = heal_job
    name = healed_export_name(job, "replacement", 1)
    assert name == healed_export_name(job, "replacement", 1)   # a healed model is its set and recipe, not its method
    removed = healed_entry(job.heal, "replacement", 1)["removed"]
    ereq = ExportRequest(model=req.model, revision=None, removed=removed, name=name, root=str(tmp_path / "exports"),
                         device="cpu", heal={"method": "replacement", "n": 1, "anyway": False, "job": job.key},
                         source=job)
    m = JobManager(use_snapshots=False)
    try:
        ej = m.submit(ereq, owner="A", max_active=1, max_total=1)
        assert ej.wait(300) and ej.status == "done", ej.error
    finally:
        m.shutdown()
    folder, zp = tmp_path / "exports" / name, tmp_path / "exports" / f"{name}.zip"
    written = sorted(f"{name}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*") if p.is_file())
    assert sorted(zipfile.ZipFile(zp).namelist()) == written and f"{name}/adapter/adapter_config.json" in written
    assert ej.export["bytes"] == zp.stat().st_size and "-healed-" in name
    for f in folder.rglob("*.json"):
        assert str(ROOT) not in f.read_text(), f


def test_healed_points_with_raw_bridged_healed_get_their_figure(heal_job, tmp_path, monkeypatch):
    import plotly.graph_objects as go
    from streamlit.testing.v1 import AppTest

    from swapkl import views

    d = heal_job[0].heal.to_dict()
    for entries in d["methods"].values():
        for k, e in enumerate(entries):
            row = lambda v: {"ppl": 10 + v / 10, "ppl_ci": [9.0, 12.0],  # a row of healing.result.compare_bridged
                             "delta_pct": {"value": v, "ci": [v - 1, v + 1], "tie": False}}
            e.update(raw=row(20.0 + k), bridged=row(9.0 + k), healed=row(3.0 + k))
    f = tmp_path / "heal.json"
    f.write_text(json.dumps(d))
    monkeypatch.setenv("SWAPKL_TEST_HEAL", str(f))
    at = AppTest.from_function(heal_panel_app, default_timeout=60).run()
    assert not at.exception, at.exception
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    # the bridged stage is drawn once per method: in the stages figure, or in the healed-curves figure where that
    # figure draws it itself (then the stages figure is left out)
    bridged = [(t["meta"]["method"], t["y"]) for f in figs for t in f["data"] if isinstance(t.get("meta"), dict)
               and "bridged" in (t["meta"].get("stage"), t["meta"].get("kind"))]
    assert sorted(bridged) == sorted((m, [9.0 + k for k, _ in enumerate(v)]) for m, v in d["methods"].items())
    stages = [f for f in figs if any((t.get("meta") or {}).get("stage") for t in f["data"])]
    assert len(stages) == (0 if any(views.draws_bridged(go.Figure(f)) for f in figs) else 1)
    for f in stages:
        got = {(t["meta"]["method"], t["meta"]["stage"]): t["y"] for t in f["data"] if t.get("meta")}
        assert got == {(m, s): [v + k for k, _ in enumerate(d["methods"][m])] for m in d["methods"]
                       for s, v in (("raw", 20.0), ("bridged", 9.0), ("healed", 3.0))}
    # without these keys the panel draws one figure, as before (test_panel_draws_dashed_healed_curves_...)


def _bridged_section_app():
    from dashboard import heal_panel
    from swapkl.jobs import AnalysisRequest, Job

    heal_panel.section(Job("heal-bridged-test", AnalysisRequest(
        model="default", budget=2, methods=("replacement", "interchange"), repair="bridge",
        bridge={"form": "residual", "calib_tokens": 1024})))


def test_a_repaired_analysis_heals_from_its_bridged_model(cache, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from swapkl.healing.recipe import PARTS
    from swapkl.jobs.forms import heal_repairs

    asked = []
    monkeypatch.setattr("dashboard.common.start", asked.append)
    from dashboard.heal_panel import PART_LABELS

    at = AppTest.from_function(_bridged_section_app, default_timeout=60).run()
    assert not at.exception, at.exception
    box = at.checkbox(key="w_heal_from_bridge")
    if heal_repairs():
        assert box.value is True and not box.disabled
        assert at.radio(key="w_heal_part").options == [PART_LABELS[p] for p in PARTS]  # the bridge is offered
        at.button(key="heal_start").click().run()
        assert (asked[-1].repair, asked[-1].bridge) == ("bridge", {"form": "residual", "calib_tokens": 1024})
        assert asked[-1].setup_fields() == {"repair": "bridge", "bridge": {"form": "residual", "calib_tokens": 1024}}
        at.checkbox(key="w_heal_from_bridge").uncheck().run()
    else:  # this build's healing cannot start from a bridge: the box is off and cannot be ticked
        assert box.value is False and box.disabled
    assert PART_LABELS["bridge"] not in at.radio(key="w_heal_part").options
    at.button(key="heal_start").click().run()
    assert asked[-1].repair == "none" and asked[-1].setup_fields() == {} and "repair" not in asked[-1].to_dict()


def test_a_heal_from_the_bridged_model_runs_draws_its_stages_and_exports(stories_path, tmp_path, monkeypatch):
    """Where the healing package takes the repair: a repaired analysis's heal through the job system starts from
    the bridged model, the stages figure holds its raw / bridged / healed points, and the healed model exports
    (folded bridge).  Before, the request is refused in one line."""
    from swapkl import views
    from swapkl.errors import SwapklError
    from swapkl.jobs import DONE, AnalysisRequest, JobManager, forms
    from swapkl.jobs.heal_export import export_healed_model

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    base = AnalysisRequest(model=str(stories_path), contract=Contract(prompts=4, tokens=16), budget=1,
                           methods=("interchange",), evaluator=EV, repair="bridge",
                           bridge={"form": "folded", "calib_tokens": 512})
    if not forms.heal_repairs():
        with pytest.raises(SwapklError, match="healing from a bridged model needs"):
            forms.heal_request(base, ["interchange"], [1], TINY, False, from_bridge=True)
        return
    m = JobManager()
    try:
        job = m.submit(forms.heal_request(base, ["interchange"], [1], TINY, False, from_bridge=True))
        assert job.wait(600), job.summary()
        assert job.status == DONE, job.error
        d = job.heal.to_dict()
        e = d["methods"]["interchange"][0]
        fig = views.healed_stages_figure(d)
        got = {t.meta["stage"]: list(t.y) for t in fig.data if t.meta}
        assert got == {s: [e[s]["delta_pct"]["value"]] for s in ("raw", "bridged", "healed")}
        out = export_healed_model(m, job, "interchange", 1, tmp_path / "healed")
        assert json.loads((out / "swapkl_heal.json").read_text())["removed"] == e["removed"]
    finally:
        m.shutdown()
