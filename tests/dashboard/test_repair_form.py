"""The Start form's "Repair after removal" choice: from the widgets to the request's plan fields (the data contract
of ``RemovalPlan.repair`` / ``RemovalPlan.bridge``), its one-line refusals, and its shared link."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from support.app_util import APP, TIMEOUT
from swapkl.contract import Contract
from swapkl.errors import SwapklError
from swapkl.jobs import forms
from swapkl.jobs.requests import AnalysisRequest

CONTRACT = Contract(pairs="adjacent", prompts=4, tokens=16, device="cpu")


def _form(repair="bridge", bridge=None, unit="block", budget=2):
    """The form's request (its plan checked: a repair this build's plan lacks is refused there, in one line)."""
    return forms.analysis_request("m", None, CONTRACT.with_(unit=unit), budget, ("replacement", "interchange"), None,
                                  repair, bridge if bridge is not None else {"form": "residual", "calib_tokens": 4096})


def _req(repair="bridge", bridge=None, budget=2):
    """The request the form makes, without the plan's check (the mapping to the plan is what is tested)."""
    b = forms.bridge_settings(repair, **(bridge if bridge is not None else {"form": "residual", "calib_tokens": 4096}))
    return AnalysisRequest(model="m", contract=CONTRACT, budget=budget, methods=("replacement", "interchange"),
                           repair=repair, bridge=b)


def test_the_repair_reaches_the_plan_fields_and_only_with_a_repair():
    req = _req()
    assert (req.repair, req.bridge) == ("bridge", {"form": "residual", "calib_tokens": 4096})
    f = req.plan_fields()
    assert f["repair"] == "bridge" and f["bridge"] == {"form": "residual", "calib_tokens": 4096}
    assert f["budget"] == 2 and f["unit"] == "block" and set(f["methods"]) == {"replacement", "interchange"}
    assert req.to_dict()["repair"] == "bridge" and req.to_dict()["bridge"]["calib_tokens"] == 4096
    plain = _req("none")
    assert "repair" not in plain.plan_fields() and "bridge" not in plain.plan_fields()
    # a request without repair keeps the dict (and so the job key) it had before repairs existed
    assert set(plain.to_dict()) == {"kind", "model", "revision", "contract", "budget", "methods", "evaluator"}
    assert plain.bridge == {} and plain.removal_plan().repair == "none"
    assert _form("none").to_dict() == plain.to_dict()
    assert _form(budget=0).repair == "bridge"  # no curves: the third matrix alone (the bridged heatmap)


def test_the_plan_takes_the_bridge_when_this_build_has_it():
    from swapkl.removal.plan import REPAIRS

    req = _req()
    if "bridge" in REPAIRS:
        plan = _form().removal_plan()
        assert plan.to_dict()["repair"] == "bridge" and dict(plan.to_dict()["bridge"]) == req.bridge
    else:  # refused in one line at the form, naming what the plan accepts
        with pytest.raises(SwapklError, match="unknown repair 'bridge'; choose one of: none"):
            _form()


@pytest.mark.parametrize("repair, bridge, words", [
    ("patch", {}, "unknown repair 'patch'"),
    ("bridge", {"form": "diagonal", "calib_tokens": 4096}, "unknown bridge form 'diagonal'"),
    ("bridge", {"form": "folded", "calib_tokens": 10}, "calibration tokens must be an integer in 256..1048576"),
    ("bridge", {"form": "folded", "calib_tokens": 10**9}, "got 1000000000"),
    ("bridge", {"form": "folded", "calib_tokens": "8192; rm"}, "calibration tokens must be an integer"),
    ("bridge", {"form": "folded", "calib_tokens": True}, "calibration tokens must be an integer"),
    ("bridge", {"form": "folded", "calib_tokens": 512.5, "exec": "x"}, "calibration tokens must be an integer"),
])
def test_a_hostile_repair_is_refused_in_one_line(repair, bridge, words):
    with pytest.raises(SwapklError, match=words) as e:
        _form(repair, bridge)
    assert "\n" not in str(e.value)


def test_a_bridge_needs_whole_blocks():
    with pytest.raises(SwapklError, match="a linear bridge replaces removed blocks; unit mlp"):
        _form(unit="mlp")


def test_the_bridge_forms_are_the_repair_packages():
    from swapkl.repair.bridge import FORMS
    from swapkl.repair.calibration import DEFAULT_CALIB_TOKENS, DEFAULT_CALIB_WINDOW

    assert forms.BRIDGE_FORMS == FORMS and forms.BRIDGE_TOKENS == DEFAULT_CALIB_TOKENS
    assert forms.BRIDGE_TOKENS_RANGE[0] == DEFAULT_CALIB_WINDOW


def test_a_shared_link_carries_the_repair():
    req = _req()
    q = forms.query_params(req)
    assert (q["repair"], q["bridge_form"], q["bridge_tokens"]) == ("bridge", "residual", "4096")
    s = forms.query_settings(q, ("replacement", "interchange"))
    assert (s["repair"], s["bridge_form"], s["bridge_tokens"]) == ("bridge", "residual", 4096)
    assert "repair" not in forms.query_params(_req("none"))
    bad = forms.query_settings({"repair": "rm -rf", "bridge_form": "x", "bridge_tokens": "3", "budget": "2"}, ())
    assert bad == {"budget": 2}
    cap = forms.request_caption(req)
    assert cap.endswith("repair: linear bridge (residual, 4096 calibration tokens)")
    assert "repair" not in forms.request_caption(_req("none"))


def _start(query: dict | None = None):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for k, v in (query or {}).items():
        at.query_params[k] = v
    return at.run()


def test_the_start_form_makes_a_bridged_request(cache, monkeypatch):
    """The widgets' values reach the plan fields of the request the form makes (recorded where the form checks its
    plan, which is then checked without the repair: this build's plan may not know the bridge yet)."""
    from swapkl.removal.plan import RemovalPlan

    made = []

    def recorded(self):
        made.append(self.plan_fields())
        return RemovalPlan(**{k: v for k, v in self.plan_fields().items() if k not in ("repair", "bridge")})

    monkeypatch.setattr(AnalysisRequest, "removal_plan", recorded)
    at = _start()
    assert not at.exception
    assert at.radio(key="w_repair").value == "none" and "repair" not in made[-1]
    at.radio(key="w_repair").set_value("bridge").run()
    assert at.selectbox(key="w_bridge_form").value == "folded"
    assert at.number_input(key="w_bridge_tokens").value == forms.BRIDGE_TOKENS
    at.selectbox(key="w_bridge_form").set_value("residual")
    at.number_input(key="w_bridge_tokens").set_value(2048).run()
    assert not at.exception
    assert made[-1]["repair"] == "bridge" and made[-1]["bridge"] == {"form": "residual", "calib_tokens": 2048}


def test_a_shared_link_sets_the_repair_and_a_hostile_one_is_ignored(cache):
    at = _start({"repair": "bridge", "bridge_form": "residual", "bridge_tokens": "1024", "budget": "2"})
    assert not at.exception
    assert at.radio(key="w_repair").value == "bridge" and at.selectbox(key="w_bridge_form").value == "residual"
    assert at.number_input(key="w_bridge_tokens").value == 1024
    at = _start({"repair": "bridge", "bridge_form": "<script>", "bridge_tokens": "99999999999", "budget": "2"})
    assert not at.exception
    assert at.selectbox(key="w_bridge_form").value == "folded"
    assert at.number_input(key="w_bridge_tokens").value == forms.BRIDGE_TOKENS


def test_a_demo_server_bounds_the_bridges_calibration():
    from swapkl.jobs.policy import DEMO_MAX_BRIDGE_TOKENS, Policy, PolicyError

    demo = Policy(demo=True, models=("m",), max_budget=4)
    demo.check_request(_req(bridge={"form": "folded", "calib_tokens": DEMO_MAX_BRIDGE_TOKENS}))
    with pytest.raises(PolicyError, match=f"at most {DEMO_MAX_BRIDGE_TOKENS} calibration tokens; 65536 asked"):
        demo.check_request(_req(bridge={"form": "folded", "calib_tokens": 65536}))
    Policy().check_request(_req(bridge={"form": "folded", "calib_tokens": 65536}))  # a local user: no bound
    from swapkl.healing.recipe import Recipe
    from swapkl.jobs import HealRequest

    heal = HealRequest(model="m", methods=("interchange",), ns=(1,), recipe=Recipe(steps=10), repair="bridge",
                       bridge={"form": "folded", "calib_tokens": 65536})
    demo.check_request(HealRequest(**{k: v for k, v in vars(heal).items() if k not in ("repair", "bridge")}))
    with pytest.raises(PolicyError, match="at most 16384 calibration tokens"):
        demo.check_request(heal)


def test_a_bridged_analysis_from_the_start_page_reaches_the_curves_page(cache):
    """The whole path in the app on stories260K: the Start form with a linear bridge, Compute, and the curves page's
    dashed bridged curves and table hold the job's numbers (once the plan knows the bridge; before, the form
    refuses it in one line and nothing is computed)."""
    import json

    from dashboard import common
    from swapkl.removal.plan import REPAIRS
    from test_app import _choose_stories, _compute

    at = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT), pairs="adjacent", budget=2)
    at.radio(key="w_repair").set_value("bridge").run()
    at.number_input(key="w_bridge_tokens").set_value(512).run()
    assert not at.exception, at.exception
    if "bridge" not in REPAIRS:
        assert any("unknown repair 'bridge'" in e.value for e in at.error)
        return
    job = _compute(at)
    assert job.request.repair == "bridge" and job.request.bridge == {"form": "folded", "calib_tokens": 512}
    c = job.curves.to_dict()
    assert set(c["repaired"]) == set(c["methods"]) and c["repair"]["settings"]["calib_tokens"] == 512
    at.switch_page("pages/curves.py").run()
    assert not at.exception, at.exception
    main = json.loads(at.get("plotly_chart")[0].proto.spec)
    dashed = {t["meta"]["method"]: t["y"] for t in main["data"] if (t.get("meta") or {}).get("repair") == "bridged"}
    assert dashed == {m: [e["delta_pct"] for e in v] for m, v in c["repaired"].items()}
    (table,) = [t for t in at.dataframe if "verdict" in t.value.columns]
    assert list(table.value["bridged − raw (pp)"]) == [e["paired_delta_pct"] for m in dashed for e in c["repaired"][m]]
    assert "repair: linear bridge (folded, 512 calibration tokens" in common.report_html(job, None)
