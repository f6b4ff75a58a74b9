"""swapkl.views: figures assert on their JSON (what the dashboard and the report show)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from swapkl import views as plots
from swapkl.views.scores import _log_ticks
from swapkl.contract import Contract, Provenance
from swapkl.removal.curves import curves_provenance
from swapkl.scoring.results import SwapResult

CONTRACT = {"pairs": "gap:2", "prompts": 3, "tokens": 8, "positions": "last", "corpus": None, "seed": 0,
            "dtype": "float32", "device": "cpu", "aggregation": "max", "corpus_label": "toy corpus"}
IDENTITY = {"kind": "local", "id": "/x/toy", "display": "toy-model", "fingerprint": "abcdef0123456789",
            "revision": None}


def synthetic(L: int = 5) -> SwapResult:
    """gap:2 pairs of a 5-layer model; pair (0, 2) left out so that some cells are NaN."""
    rng = np.random.default_rng(1)
    vec = {}
    for g in (1, 2):
        for i in range(L - g):
            if (i, i + g) == (0, 2):
                continue
            base = 0.02 * (i + 1) * g
            vec[(i, i + g)] = {"repl_ij": (base + rng.uniform(0, 0.05, 3)).tolist(),
                               "repl_ji": (base * 2 + rng.uniform(0, 0.05, 3)).tolist(),
                               "inter": (base * 0.5 + rng.uniform(0, 0.02, 3)).tolist()}
    return SwapResult.from_pair_vectors(L, vec, contract=dict(CONTRACT), identity=dict(IDENTITY))


def fj(fig) -> dict:
    return json.loads(fig.to_json())


def same(z, m) -> bool:
    """A figure z array (None for blank) equals a numpy matrix with NaN."""
    m = np.asarray(m, dtype=float)
    if len(z) != m.shape[0]:
        return False
    for row, mrow in zip(z, m):
        for a, b in zip(row, mrow):
            if math.isnan(b):
                if a is not None:
                    return False
            elif a is None or not math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15):
                return False
    return True


@pytest.fixture(scope="module")
def res():
    return synthetic()


@pytest.fixture(scope="module")
def real(stories_path, tmp_path_factory):
    """A tiny real run: stories260K (5 layers), all pairs, 4 prompts x 16 tokens."""
    import os

    from swapkl.scoring.score import score
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.contract import Contract

    old = os.environ.get("SWAPKL_CACHE")
    os.environ["SWAPKL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        return score(load_checkpoint(str(stories_path), device="cpu"), Contract(prompts=4, tokens=16, pairs="all"))
    finally:
        if old is None:
            os.environ.pop("SWAPKL_CACHE", None)
        else:
            os.environ["SWAPKL_CACHE"] = old


# ------------------------------------------------------------------------------------------------ caption
def test_caption_fields(res):
    c = plots.contract_caption(res)
    for part in ("toy-model", "abcdef01", "pairs gap:2", "3 prompts × 8 tokens", "positions last",
                 "aggregation max", "float32", "corpus toy corpus"):
        assert part in c, (part, c)
    assert "\n" not in c
    # the JSON form gives the same caption
    assert plots.contract_caption(SwapResult.from_dict(res.to_dict())) == c
    assert "evaluator matched" in plots.contract_caption(res, evaluator={"name": "matched", "max_words": 5000,
                                                                         "window": 512, "stride": 256})


def test_caption_hub_revision():
    d = Provenance(contract=CONTRACT, model={"kind": "hub", "id": "EleutherAI/pythia-410m", "revision": "step1000",
                                             "display": "EleutherAI/pythia-410m@step1000",
                                             "commit": "0123456789abcdef"})
    c = plots.contract_caption(d)
    assert c.startswith("EleutherAI/pythia-410m@step1000 (commit 01234567)")
    assert c.count("@step1000") == 1


def test_caption_takes_one_shape(res):
    """One input shape: a Provenance (or a result's provenance()); a bare dict is refused, not guessed at."""
    with pytest.raises(TypeError, match="Provenance"):
        plots.contract_caption(res.to_dict())
    assert plots.contract_caption(res.provenance()) == plots.contract_caption(res)
    c = plots.contract_caption(Contract(prompts=7, tokens=9).provenance(model="org/m@main"))
    assert c.startswith("org/m@main") and "7 prompts × 9 tokens" in c
    cur = curves_provenance({"model": {"display": "m"}, "evaluator": {"name": "quick"}, "budget": 3,
                             "selection": {"spacing": 1}, "corpus": {"label": "toy"}})
    assert plots.contract_caption(cur) == "m · corpus toy · budget 3 · spacing Δ=1 · evaluator quick".replace(
        " · ", plots.SEP)


def test_caption_real(real):
    c = plots.contract_caption(real)
    for part in ("stories260K", "4 prompts × 16 tokens", "positions all", "float32", "pairs all", "corpus "):
        assert part in c


# ------------------------------------------------------------------------------------------------ heatmaps
@pytest.mark.parametrize("directed", [False, True])
def test_heatmaps_values_and_shared_axis(res, directed):
    d = fj(plots.heatmaps(res, directed=directed))
    left, right = d["data"]
    want_left = res.replacement_directed() if directed else res.replacement()
    assert same(left["z"], want_left)
    assert same(right["z"], res.interchange())
    # not computed: pair (0, 2) and the diagonal are blank, not zero
    assert right["z"][0][2] is None and right["z"][2][0] is None and left["z"][1][1] is None
    assert left["coloraxis"] == right["coloraxis"] == "coloraxis"
    ca = d["layout"]["coloraxis"]
    both = np.concatenate([want_left[np.isfinite(want_left)], res.interchange()[np.isfinite(res.interchange())]])
    assert ca["cmin"] == pytest.approx(both.min()) and ca["cmax"] == pytest.approx(both.max())
    assert "coloraxis2" not in d["layout"]
    xt = d["layout"]["xaxis"]["title"]["text"]
    yt = d["layout"]["yaxis"]["title"]["text"]
    assert (xt, yt) == (("block j", "slot i") if directed else ("layer j", "layer i"))
    # caption as subtitle and in meta
    assert d["layout"]["meta"]["contract"] == plots.contract_caption(res)
    assert "3 prompts × 8 tokens" in d["layout"]["title"]["subtitle"]["text"]


def test_heatmap_hover_has_ci_and_gap(res):
    d = fj(plots.heatmaps(res))
    row = res.pair_table().set_index(["i", "j"]).loc[(1, 2)]
    txt = d["data"][0]["text"][1][2]
    assert f"{row['d_repl']:.4f}" in txt and f"{row['d_inter']:.4f}" in txt and f"{row['gap']:.4f}" in txt
    assert f"[{row['d_repl_lo']:.4f}, {row['d_repl_hi']:.4f}]" in txt
    assert "i = 1, j = 2" in txt
    assert d["data"][0]["text"][0][2] == ""  # not computed: no hover content


def test_heatmaps_log_scale(res):
    d = fj(plots.heatmaps(res, scale="log"))
    want = np.log10(res.interchange())
    assert same(d["data"][1]["z"], want)
    cb = d["layout"]["coloraxis"]["colorbar"]
    # ticks sit at log10 positions inside the colour range and are labelled with the value in nats
    lo, hi = d["layout"]["coloraxis"]["cmin"], d["layout"]["coloraxis"]["cmax"]
    assert len(cb["tickvals"]) >= 2 and all(lo - 1e-9 <= v <= hi + 1e-9 for v in cb["tickvals"])
    assert [float(t) for t in cb["ticktext"]] == pytest.approx([10.0 ** v for v in cb["tickvals"]], rel=5e-3)
    vals, text = _log_ticks(-1.5, 0.1)
    assert text == ["0.05", "0.1", "0.2", "0.5", "1"]
    assert vals == pytest.approx([np.log10(0.05), -1, np.log10(0.2), np.log10(0.5), 0])
    assert _log_ticks(-4.2, 0.5)[1] == ["0.0001", "0.001", "0.01", "0.1", "1"]  # wide range: decades only
    assert d["layout"]["coloraxis"]["cmin"] == pytest.approx(np.nanmin(np.log10(res.interchange())))
    with pytest.raises(ValueError):
        plots.heatmaps(res, scale="sqrt")


def test_heatmaps_real_run(real):
    d = fj(plots.heatmaps(real))
    assert same(d["data"][0]["z"], real.replacement())
    assert same(d["data"][1]["z"], real.interchange())
    assert len(d["data"][0]["z"]) == real.num_layers == 5


def test_gap_heatmap(res, real):
    for r in (res, real):
        d = fj(plots.gap_heatmap(r))
        (tr,) = d["data"]
        assert tr["zmid"] == 0
        assert same(tr["z"], r.gap())
        assert tr["zmin"] == pytest.approx(-tr["zmax"])
        assert "RdBu" in json.dumps(tr["colorscale"]) or tr["colorscale"]  # diverging scale given
    assert fj(plots.gap_heatmap(res))["data"][0]["z"][0][2] is None


def test_pair_distribution(res):
    d = fj(plots.pair_distribution(res, 3, 1))  # order does not matter
    boxes = [t for t in d["data"] if t["type"] == "box"]
    assert len(boxes) == 3
    assert boxes[0]["y"] == pytest.approx(res.per_prompt["repl"][(1, 3)].tolist())
    assert boxes[1]["y"] == pytest.approx(res.per_prompt["repl"][(3, 1)].tolist())
    assert boxes[2]["y"] == pytest.approx(res.per_prompt["inter"][(1, 3)].tolist())
    mean = next(t for t in d["data"] if t["name"] == "mean")
    R = res.replacement_directed()
    assert mean["y"] == pytest.approx([R[1, 3], R[3, 1], res.interchange()[1, 3]])
    from swapkl.errors import SwapklError
    with pytest.raises(SwapklError, match="not computed"):
        plots.pair_distribution(res, 0, 2)


def test_top_pairs_table(res):
    df = plots.top_pairs_table(res, k=3)
    pt = res.pair_table(ci=False)
    r3 = pt.nsmallest(3, "d_repl")
    i3 = pt.nsmallest(3, "d_inter")
    assert list(df["rank"]) == [1, 2, 3]
    assert df["d_repl"].tolist() == pytest.approx(r3["d_repl"].tolist())
    assert df["d_inter"].tolist() == pytest.approx(i3["d_inter"].tolist())
    rp = {f"{a}-{b}" for a, b in zip(r3["i"], r3["j"])}
    ip = {f"{a}-{b}" for a, b in zip(i3["i"], i3["j"])}
    assert list(df["repl_pair"]) == [f"{a}-{b}" for a, b in zip(r3["i"], r3["j"])]
    assert list(df["repl_not_in_inter_top"]) == [p not in ip for p in df["repl_pair"]]
    assert list(df["inter_not_in_repl_top"]) == [p not in rp for p in df["inter_pair"]]
    assert list(df["disagree"]) == [a or b for a, b in zip(df["repl_not_in_inter_top"], df["inter_not_in_repl_top"])]
    assert len(plots.top_pairs_table(res, k=100)) == len(res.pairs)


def test_top_pairs_disagreement_constructed():
    # replacement ranks (0,1) best, interchange ranks (1,2) best; top-1 sets differ
    vec = {(0, 1): {"repl_ij": [0.01, 0.01], "repl_ji": [0.01, 0.01], "inter": [0.5, 0.5]},
           (1, 2): {"repl_ij": [0.9, 0.9], "repl_ji": [0.9, 0.9], "inter": [0.02, 0.02]}}
    r = SwapResult.from_pair_vectors(3, vec, contract=dict(CONTRACT), identity=dict(IDENTITY))
    df = plots.top_pairs_table(r, k=1)
    assert df.loc[0, "repl_pair"] == "0-1" and df.loc[0, "inter_pair"] == "1-2"
    assert bool(df.loc[0, "disagree"]) is True
    assert not plots.top_pairs_table(r, k=2)["disagree"].any()


# ------------------------------------------------------------------------------------------------ curves
def fake_curves() -> dict:
    def e(n, removed, d, lo, hi, kl):
        return {"n": n, "removed": removed, "ppl": 10 * (1 + d / 100), "ppl_ci": [9, 11], "delta_pct": d,
                "delta_pct_ci": [lo, hi], "kl_to_base": kl}
    return {
        "model": {"display": "toy-model", "fingerprint": "abcdef0123"},
        "evaluator": {"name": "matched", "max_words": 5000, "window": 512, "stride": 256,
                      "drop_first_target": False},
        "corpus": {"name": "wikitext2", "label": "WikiText-2 raw test"},
        "budget": 2, "selection": {"spacing": 1}, "baseline_ppl": 10.0, "baseline_ppl_ci": [9.5, 10.5],
        "methods": {
            "random": [{"n": 1, "removed": None, "ppl": 12.0, "delta_pct": 20.0, "delta_pct_min": 10.0,
                        "delta_pct_max": 35.0, "delta_pct_ci": None, "kl_to_base": 0.3},
                       {"n": 2, "removed": None, "ppl": 15.0, "delta_pct": 50.0, "delta_pct_min": 30.0,
                        "delta_pct_max": 80.0, "delta_pct_ci": None, "kl_to_base": 0.6}],
            "interchange": [e(1, [3], 4.0, 3.0, 5.0, 0.05), e(2, [1, 3], 9.0, 7.5, 10.5, 0.12)],
            "replacement": [e(1, [2], 6.0, 5.0, 7.0, 0.07), e(2, [2, 4], 12.0, 10.0, 14.0, 0.15)],
            "bi": [e(1, [2], 6.0, 5.0, 7.0, 0.07), e(2, [2, 5], 15.0, 12.0, 18.0, 0.2)],
        },
        "delta_ratio": [], "verdict": None,
    }


def test_removal_curves_traces():
    c = fake_curves()
    d = fj(plots.removal_curves(c))
    lines = {t["meta"]["method"]: t for t in d["data"] if isinstance(t.get("meta"), dict) and "method" in t["meta"]}
    assert set(lines) == {"replacement", "interchange", "random", "bi"}
    for m, entries in c["methods"].items():
        assert lines[m]["x"] == [e["n"] for e in entries]
        assert lines[m]["y"] == pytest.approx([e["delta_pct"] for e in entries])
    # guided methods prominent, baselines thinner; guided drawn first
    assert lines["replacement"]["line"]["width"] > lines["bi"]["line"]["width"]
    assert lines["interchange"]["line"]["width"] > lines["random"]["line"]["width"]
    order = [t["meta"]["method"] for t in d["data"] if "method" in (t.get("meta") or {})]
    assert order[:2] == ["replacement", "interchange"]
    bands = {t["name"]: t for t in d["data"] if t["name"].endswith(" band")}
    # CI band: upper along n, lower back
    assert bands["replacement band"]["y"] == pytest.approx([7.0, 14.0, 10.0, 5.0])
    assert bands["replacement band"]["x"] == [1, 2, 2, 1]
    assert bands["random band"]["y"] == pytest.approx([35.0, 80.0, 30.0, 10.0])
    assert "evaluator matched" in d["layout"]["meta"]["contract"]
    assert "toy-model" in d["layout"]["meta"]["contract"]
    # subset of methods, no bands
    d2 = fj(plots.removal_curves(c, methods=["interchange"], bands=False))
    assert [t["meta"]["method"] for t in d2["data"]] == ["interchange"]


def test_removal_curves_accepts_curvesresult():
    from swapkl.removal.curves import CurvesResult

    c = fake_curves()
    cr = CurvesResult(**{k: c[k] for k in ("model", "evaluator", "corpus", "budget", "selection", "baseline_ppl",
                                           "baseline_ppl_ci", "methods")}, baseline={})
    assert fj(plots.removal_curves(cr))["data"] == fj(plots.removal_curves(c))["data"]
    assert fj(plots.removal_curves(cr.to_json()))["data"] == fj(plots.removal_curves(c))["data"]


def test_kl_to_base_and_removed_table():
    c = fake_curves()
    d = fj(plots.kl_to_base_figure(c))
    tr = {t["meta"]["method"]: t for t in d["data"]}
    assert tr["interchange"]["y"] == pytest.approx([0.05, 0.12])
    assert tr["random"]["y"] == pytest.approx([0.3, 0.6])
    df = plots.removed_layers_table(c)
    assert list(df.columns) == ["n", "replacement", "interchange", "bi", "repl_vs_inter_differ"]
    assert df["replacement"].tolist() == ["2", "2, 4"]
    assert df["interchange"].tolist() == ["3", "1, 3"]
    assert df["repl_vs_inter_differ"].tolist() == [True, True]
    c["methods"]["interchange"] = c["methods"]["replacement"]
    assert plots.removed_layers_table(c)["repl_vs_inter_differ"].tolist() == [False, False]


# ------------------------------------------------------------------------------------------------ trajectory
def test_trajectory_figures_spec_columns():
    stats = pd.DataFrame({"step": [0, 1000, 16000], "gap_mean": [0.03, 0.1, 0.26], "gap_median": [0.02, 0.08, 0.15],
                          "gap_p75": [0.04, 0.12, 0.3], "gap_max": [0.2, 0.9, 1.97],
                          "kl_ratio_mean": [0.9, 0.6, 0.4], "kl_ratio_median": [0.95, 0.55, 0.35],
                          "pearson": [0.99, 0.9, 0.8]})
    depth = pd.DataFrame({"depth": [0.1, 0.5, 0.9], "gap": [0.3, -0.1, 0.2], "i": [0, 2, 4], "j": [1, 3, 5]})
    figs = plots.trajectory_figures(stats, depth, caption="CAPTION")
    assert set(figs) == {"gap", "kl_ratio", "pearson", "depth"}
    g = {t["name"]: t for t in fj(figs["gap"])["data"]}
    assert set(g) == {"mean", "median", "p75", "max"}
    assert g["max"]["y"] == pytest.approx([0.2, 0.9, 1.97]) and g["mean"]["x"] == [0, 1000, 16000]
    r = {t["name"]: t for t in fj(figs["kl_ratio"])["data"]}
    assert r["median"]["y"] == pytest.approx([0.95, 0.55, 0.35])
    assert fj(figs["pearson"])["data"][0]["y"] == pytest.approx([0.99, 0.9, 0.8])
    dd = fj(figs["depth"])["data"][0]
    assert dd["x"] == pytest.approx([0.1, 0.5, 0.9]) and dd["y"] == pytest.approx([0.3, -0.1, 0.2])
    assert "pair (2, 3)" in dd["text"]
    assert all(fj(f)["layout"]["meta"]["contract"] == "CAPTION" for f in figs.values())


def test_trajectory_figures_from_library(res):
    from swapkl.trajectory import stats as T

    r2 = synthetic()
    pts = [(0, res), (500, r2)]
    stats = T.checkpoint_stats(pts)
    figs = plots.trajectory_figures(stats, T.gap_vs_depth(pts))
    g = {t["name"]: t for t in fj(figs["gap"])["data"]}
    assert g["mean"]["y"] == pytest.approx(stats["gap_mean"].tolist())
    r = {t["name"]: t for t in fj(figs["kl_ratio"])["data"]}
    assert r["mean"]["y"] == pytest.approx(stats["ratio_mean"].tolist())
    assert len(fj(figs["depth"])["data"][0]["x"]) == len(res.pairs)


# ------------------------------------------------------------------------------------------------ exports
def test_figure_html_self_contained(res):
    fig = plots.gap_heatmap(res)
    h = plots.figure_html(fig)
    assert h.count("<script type=\"text/javascript\">/**\n* plotly.js") <= 1
    import re
    assert not re.search(r"<script[^>]+src=", h)  # nothing fetched from the network
    assert h.count("Plotly.newPlot") == 1
    assert len(h) > 1_000_000  # plotly.js inlined
    import html as _html
    assert _html.escape(plots.contract_caption(res)) in h


def test_table_csv(res):
    df = plots.top_pairs_table(res, k=2)
    s = plots.table_csv(df, res)
    first, rest = s.split("\n", 1)
    assert first == "# contract: " + plots.contract_caption(res)
    back = pd.read_csv(__import__("io").StringIO(s), comment=None, skiprows=1)
    assert back["d_repl"].tolist() == pytest.approx(df["d_repl"].tolist())
    assert plots.table_csv(df, "x").startswith("# contract: x\n")


# ------------------------------------------------------------------------------------------------ depth profile
def adjacent_result(L: int = 6) -> SwapResult:
    rng = np.random.default_rng(3)
    vec = {}
    for i in range(L - 1):
        vec[(i, i + 1)] = {"repl_ij": (0.2 + 0.05 * i + rng.uniform(0, 0.05, 4)).tolist(),
                           "repl_ji": (0.3 + rng.uniform(0, 0.05, 4)).tolist(),
                           "inter": (0.01 + 0.03 * abs(i - 2) + rng.uniform(0, 0.01, 4)).tolist()}
    return SwapResult.from_pair_vectors(L, vec, contract=dict(CONTRACT, pairs="adjacent", prompts=4),
                                        identity=dict(IDENTITY))


def test_depth_profile_values_bands_thresholds_best():
    from swapkl.scoring.verdict import regime_verdict

    r = adjacent_result()
    assert plots.is_adjacent_only(r) and not plots.is_adjacent_only(synthetic())
    v = regime_verdict(r.replacement(), r.interchange())
    d = fj(plots.depth_profile(r, verdict=v))
    lines = {t["meta"]["protocol"]: t for t in d["data"] if "protocol" in (t.get("meta") or {})}
    rep, inter = r.replacement(), r.interchange()
    assert lines["replacement"]["x"] == pytest.approx([i + 0.5 for i in range(5)])
    assert lines["replacement"]["y"] == pytest.approx([rep[i, i + 1] for i in range(5)])
    assert lines["interchange"]["y"] == pytest.approx([inter[i, i + 1] for i in range(5)])
    # 95 % CI bands over prompts, from the result's own bootstrap (upper along depth, lower back)
    tab = r.pair_table().sort_values("i")
    band = {t["name"]: t for t in d["data"] if t["name"].endswith(" band")}["interchange band"]
    assert band["y"] == pytest.approx(list(tab["d_inter_hi"]) + list(tab["d_inter_lo"])[::-1])
    # best pair of each protocol marked where the minimum is
    best = {t["name"]: t for t in d["data"] if "best" in (t.get("meta") or {})}
    bi = int(np.argmin([inter[i, i + 1] for i in range(5)]))
    assert best["best interchange pair"]["x"] == [bi + 0.5] and best["best interchange pair"]["meta"]["best"] == f"{bi}–{bi + 1}"
    # thresholds 0.05 and 0.10 nats; log axis; verdict in the title; contract kept in meta
    ys = sorted(s["y0"] for s in d["layout"]["shapes"])
    assert ys == pytest.approx([0.05, 0.10])
    assert d["layout"]["yaxis"]["type"] == "log"
    assert v["regime"] in d["layout"]["title"]["text"] and f"prefer {v['prefer']}" in d["layout"]["title"]["text"]
    assert d["layout"]["meta"]["contract"] == plots.contract_caption(r)
    # the directed means are there on demand (hidden in the legend until asked for)
    directed = [t for t in d["data"] if "directed" in (t.get("meta") or {})]
    assert {t["meta"]["directed"] for t in directed} == {"R_ij", "R_ji"}
    assert all(t["visible"] == "legendonly" for t in directed)
    Rd = r.replacement_directed()
    on = [t for t in fj(plots.depth_profile(r, directed=True))["data"] if "directed" in (t.get("meta") or {})]
    assert all(t.get("visible", True) is True for t in on)
    assert {t["meta"]["directed"]: t["y"] for t in on}["R_ji"] == pytest.approx([Rd[i + 1, i] for i in range(5)])


def test_removal_curves_random_spread_does_not_flatten_guided():
    c = fake_curves()
    c["methods"]["random"][1].update(delta_pct=400.0, delta_pct_max=900.0, delta_pct_min=120.0)
    d = fj(plots.removal_curves(c))
    lo, hi = d["layout"]["yaxis"]["range"]
    det_max = max(e["delta_pct"] for m in ("replacement", "interchange", "bi") for e in c["methods"][m])
    assert det_max < hi < 2 * det_max and lo <= 0          # fitted to the deterministic curves
    # the guided curves span most of the axis at every n (readable), the random point above it is marked
    assert (det_max - 0) / (hi - lo) > 0.6
    off = [t for t in d["data"] if (t.get("meta") or {}).get("off_scale") == "random"]
    assert len(off) == 1 and off[0]["x"] == [1, 2] and off[0]["text"] == ["20.0 %", "400.0 %"]  # both above hi
    assert d["layout"]["meta"]["focus_range"] == pytest.approx([lo, hi])
    # full range on demand; and no clipping when everything fits
    full = fj(plots.removal_curves(c, full_range=True))
    assert "range" not in full["layout"]["yaxis"] and full["layout"]["meta"]["focus_range"] is None
    assert "range" not in fj(plots.removal_curves(fake_curves(), methods=["replacement", "interchange"]))["layout"]["yaxis"]
