"""The dashboard's unit selector: the request a sublayer unit makes (the methods that apply per unit, its unit in the
contract and in a shared link), and an attention analysis on stories260K whose drawn numbers and captions are the
library's, with removal curves that skip attention sublayers."""
from __future__ import annotations

import json

import numpy as np
from streamlit.testing.v1 import AppTest

from support.app_util import APP, ROOT, STORIES_REL, TIMEOUT
from swapkl.contract import Contract
from swapkl.jobs import forms
from swapkl.jobs.requests import AnalysisRequest


def test_a_sublayer_request_keeps_unit_methods_and_links_its_unit():
    att = Contract(pairs="adjacent", prompts=4, tokens=16, unit="attention")
    req = forms.analysis_request("m", None, att, 3, ("replacement", "cka", "random"), None)
    assert req.contract.unit == "attention" and req.budget == 3 and req.methods == ("replacement", "random")
    assert forms.curves_analysis(type("J", (), {"request": req})()) is None  # the task/heal panels remove blocks
    assert forms.unit_note(att) == forms.SUBLAYER_NOTE and forms.unit_note(att.with_(unit="block")) == ""
    assert forms.analysis_request("m", None, att.with_(unit="block"), 3, ("replacement",), None).budget == 3
    q = forms.query_params(req)
    assert q["unit"] == "attention" and forms.query_settings(q, ())["unit"] == "attention"
    assert "unit" not in forms.query_params(AnalysisRequest(model="m", contract=att.with_(unit="block")))
    assert "unit attention" in forms.request_caption(req)
    assert req.label().endswith("· unit attention · budget 3")  # a sublayer analysis has removal curves too
    assert "unit" not in forms.request_caption(AnalysisRequest(model="m", contract=att.with_(unit="block")))
    # the evidence of a sublayer analysis removes blocks: it keeps the contract's other settings, as blocks
    ev = forms.evidence_request("m", 2, 20, base=req)
    assert ev.contract == att.with_(unit="block")


def test_attention_analysis_on_stories(cache):
    from swapkl import views
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.score import score

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    at.radio(key="w_source").set_value("Local folder").run()
    at.selectbox(key="w_local").set_value(STORIES_REL)
    at.number_input(key="w_prompts").set_value(4)
    at.number_input(key="w_tokens").set_value(16)
    at.radio(key="w_unit").set_value("attention")
    at.number_input(key="w_budget").set_value(2)
    at.run()
    assert not at.exception, at.exception
    assert any(forms.SUBLAYER_NOTE == x.value for x in at.info)
    assert "unit attention" in at.code[0].value
    at.button(key="compute").click().run()
    from dashboard import common

    job = common.manager().get(at.session_state["job_analysis"])
    assert job.wait(180), job.summary()
    at.run()
    assert not at.exception, at.exception
    assert job.status == "done", job.error
    res = job.result
    assert res.contract["unit"] == "attention"
    assert job.curves is not None and job.curves.unit == "attention" and job.curves.sizes["attention"]
    ck = load_checkpoint(str(ROOT / STORIES_REL), device="cpu")
    direct = score(ck, Contract(prompts=4, tokens=16, device="cpu", unit="attention"))
    np.testing.assert_allclose(res.replacement(), direct.replacement(), equal_nan=True)
    block = score(ck, Contract(prompts=4, tokens=16, device="cpu"))
    assert np.nanmax(np.abs(block.replacement() - direct.replacement())) > 1e-4  # another unit, other numbers
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert figs and all("unit attention" in f["layout"]["meta"]["contract"] for f in figs if "meta" in f["layout"])
    assert views.contract_caption(res) in [f["layout"]["meta"]["contract"] for f in figs if "meta" in f["layout"]]
    # the curves page draws the sublayer curves and their common-axis figure (the library's), and points the export
    # to the command line (the dashboard's export writes blocks)
    at.switch_page("pages/curves.py").run()
    assert not at.exception, at.exception
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    axis = [f for f in figs if f["layout"].get("xaxis", {}).get("title", {}).get("text") ==
            views.units.AXES["params"]]
    assert len(axis) == 1
    want = views.common_axis_figure([job.curves], methods=list(job.curves.methods))
    assert [t["x"] for t in axis[0]["data"]] == [list(t.x) for t in want.data]
    assert any("--unit attention" in c.value for c in at.caption)
