"""The removal-curves page on a repaired run (AppTest): a synthetic curves result built to the data contract
(tests/views/test_repaired_view.py) draws each bridged curve dashed over its raw one with the bridged values, the
raw-vs-bridged table with its tie words, and the repair in the contract caption."""
from __future__ import annotations

import json
from dataclasses import dataclass, field


from support.app_util import open_job_page
from swapkl.removal.curves import CurvesResult
from test_repaired_view import synthetic_curves


@dataclass
class Repaired(CurvesResult):
    """A CurvesResult holding ``repaired`` and ``repair`` (the fields the repaired runner adds; the same fields
    again where CurvesResult already has them)."""

    repaired: dict = field(default_factory=dict)
    repair: dict = field(default_factory=dict)


def _repaired_result(d: dict) -> Repaired:
    return Repaired(**{k: v for k, v in d.items() if k in Repaired.__dataclass_fields__})


def test_the_curves_page_draws_bridged_curves_the_table_and_the_caption(cache):
    from dashboard import common
    from swapkl.contract import Contract
    from swapkl.jobs import AnalysisRequest, Job

    d = synthetic_curves()
    req = AnalysisRequest(model="tiny", contract=Contract(prompts=2, tokens=8), budget=2,
                          methods=("replacement", "interchange"), repair="bridge", bridge={"form": "folded"})
    job = Job("repaired-curves-test", req)
    job.done_from("test", curves=_repaired_result(d))
    common.manager()._remember(job)
    at = open_job_page(job, "pages/curves.py")
    main = json.loads(at.get("plotly_chart")[0].proto.spec)
    dashed = {t["meta"]["method"]: t for t in main["data"] if isinstance(t.get("meta"), dict)
              and t["meta"].get("repair") == "bridged"}
    assert set(dashed) == {"replacement", "interchange"}
    for m, t in dashed.items():
        assert t["line"]["dash"] == "dash" and t["y"] == [e["delta_pct"] for e in d["repaired"][m]]
    assert "repair: linear bridge (folded, 4096 calibration tokens" in main["layout"]["meta"]["contract"]
    assert any("repair: linear bridge" in c.value for c in at.caption if c.value.startswith("contract:"))
    (table,) = [t for t in at.dataframe if "verdict" in t.value.columns]
    words = dict(zip(zip(table.value["method"], table.value["n"]), table.value["verdict"]))
    assert words == {("replacement", 1): "bridged better", ("replacement", 2): "tie",
                     ("interchange", 1): "bridged worse", ("interchange", 2): "–"}
    assert "⬇ repaired-curves (CSV)" in [b.proto.label for b in at.get("download_button")]
