"""The heatmaps page after a repaired analysis (AppTest): an analysis job with a bridge repair run on stories260K
keeps the third matrix on the job, and the page draws replacement, interchange and bridged on one colour scale
with the statement, the bridge's caption and the pair's bridged and unbridged span cost."""
from __future__ import annotations

import json

import numpy as np

from support.app_util import open_job_page


def test_a_repaired_analysis_draws_the_bridged_heatmap_beside_both_protocols(cache, stories_path):
    from dashboard import common
    from swapkl import views
    from swapkl.contract import Contract
    from swapkl.jobs import DONE, AnalysisRequest, Job, ModelCache
    from swapkl.jobs.pipelines import run_analysis

    bridge = {"form": "folded", "calib_tokens": 256, "calib_window": 64}
    req = AnalysisRequest(model=str(stories_path), contract=Contract(pairs="gap:2", prompts=2, tokens=16),
                          budget=0, repair="bridge", bridge=bridge)
    job = Job("bridged-heatmaps-test", req)
    job.start()
    run_analysis(job, ModelCache(1))
    job.finish(DONE)
    res, br = job.result, job.bridged
    L = res.num_layers
    spans = {tuple(s["span"]) for s in br["spans"]}
    assert set(res.pairs) <= spans and {(i, L) for i in range(1, L)} <= spans  # same pairs + spans to the end
    assert br["settings"]["calib_tokens"] == 256 and br["contract"]["pairs"] == "gap:2"
    plain = Job("unrepaired", AnalysisRequest(model=str(stories_path), contract=req.contract, budget=0))
    plain.start()
    run_analysis(plain, ModelCache(1))
    assert plain.bridged is None  # nothing changes without a repair

    common.manager()._remember(job)
    at = open_job_page(job, "pages/heatmaps.py")
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    (three,) = [f for f in figs if len([t for t in f["data"] if t["type"] == "heatmap"]) == 3]
    z = [np.array(t["z"], dtype=float) for t in three["data"]]
    for i, j in res.pairs:  # each cell is the job's value: d_repl, d_inter, the span's mean bridged KL
        bridged = next(np.mean(s["bridged"]) for s in br["spans"] if tuple(s["span"]) == (i, j))
        np.testing.assert_allclose([z[0][i, j], z[1][i, j], z[2][i, j]],
                                   [res.replacement()[i, j], res.interchange()[i, j], bridged], rtol=1e-6)
    finite = np.concatenate([m[np.isfinite(m)] for m in z])
    assert np.isclose(three["layout"]["coloraxis"]["cmin"], finite.min())
    assert np.isclose(three["layout"]["coloraxis"]["cmax"], finite.max())
    captions = [c.value for c in at.caption]
    assert views.bridge_statement(res, br) in captions
    assert any(c.startswith("contract:") and "bridge: folded, 256 calibration tokens (window 64" in c
               for c in captions)
    i, j = at.selectbox(key="w_pair_i").value, at.selectbox(key="w_pair_j").value
    b, r = views.span_costs(br, i, j)
    assert f"span {i}..{j - 1}: bridged {b:.4g} nats · unbridged (removed) {r:.4g} nats" in captions
