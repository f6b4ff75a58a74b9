"""The study's figures (swapkl/study/figures.py): heights grow with the models, and the contract caption sits
clear of the small multiples' subplot titles (pinned to the top, the subplot titles below it)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _study(k: int):
    from swapkl.study.result import StudyResult

    d = json.loads((ROOT / "experiments" / "results" / "study-cpu.json").read_text())
    rows = []
    for i in range(k):
        r = copy.deepcopy(d["rows"][i % len(d["rows"])])
        r["model"] = dict(r["model"], label=f"model-{i} with a long readable name")
        rows.append(r)
    return StudyResult.from_dict(d | {"rows": rows})


def _caption_bottom(fig) -> float:
    """Pixels from the top to the caption's last line: the pinned title's offset, its line, the caption's lines."""
    lines = fig.layout.title.subtitle.text.count("<br>") + 1
    return fig.layout.title.y and (1 - fig.layout.title.y) * fig.layout.height + 26 + 15 * lines


def test_heights_grow_with_the_models_and_the_caption_clears_the_subplot_titles():
    from swapkl.study.figures import ratio_multiples, rho_dots

    heights = {}
    for k in (1, 3, 6, 12):
        s = _study(k)
        ratio, rho = ratio_multiples(s), rho_dots(s)
        heights[k] = (ratio.layout.height, rho.layout.height)
        for fig in (ratio, rho):
            assert fig.layout.title.yanchor == "top" and fig.layout.title.yref == "container"
        titles = [a for a in ratio.layout.annotations if a.text and a.text.startswith("model-")]
        assert len(titles) == k
        top_row = [a for a in titles if a.y == max(t.y for t in titles)]
        # a subplot title of the first row is drawn just above the plot area: the band under the top margin
        assert all(a.yanchor == "bottom" and abs(a.y - 1.0) < 1e-9 for a in top_row)
        assert _caption_bottom(ratio) <= ratio.layout.margin.t - 24
        plot_px = rho.layout.height - rho.layout.margin.t - 90
        assert plot_px >= 60 * k  # every model row at least 60 px
    assert heights[1][1] < heights[3][1] < heights[6][1] < heights[12][1]
    assert heights[1][0] < heights[6][0] < heights[12][0]  # rows of four panels


def test_the_task_figure_draws_each_guided_sets_accuracy_change_with_its_ci():
    """With tasks, the figures hold one ``acc_TASK`` small multiple: per model panel, per method, the points and CI
    bars are the row's ΔAcc (accuracy points) at each n, the x of each method offset around its n; the caption clears
    the subplot titles as in the other multiples."""
    from swapkl.study.figures import figures
    from swapkl.study.result import StudyResult

    s = StudyResult.from_dict(json.loads((ROOT / "experiments" / "results" / "study-cpu-tasks.json").read_text()))
    figs = figures(s)
    assert list(figs) == ["ratio", "rho", "acc_wikitext_lastword"]
    fig = figs["acc_wikitext_lastword"]
    rows = s.done()
    methods = list(rows[0]["tasks"]["methods"])
    assert methods == ["replacement", "interchange", "consensus-mean", "consensus-max"]
    assert len(fig.data) == len(rows) * len(methods)
    for k, r in enumerate(rows):
        for j, m in enumerate(methods):
            tr = fig.data[k * len(methods) + j]
            d = [e["delta"]["wikitext_lastword"] for e in r["tasks"]["methods"][m]]
            assert tr.name == m and tr.showlegend == (k == 0)
            assert list(tr.y) == [100 * x["delta"] for x in d]
            assert [round(v, 9) for v in tr.error_y.arrayminus] == [round(100 * (x["delta"] - x["ci"][0]), 9)
                                                                    for x in d]
            assert [round(v, 9) for v in tr.error_y.array] == [round(100 * (x["ci"][1] - x["delta"]), 9) for x in d]
            assert [round(x) for x in tr.x] == [1, 2, 3] and len(set(tr.x)) == 3
    titles = [a.text for a in fig.layout.annotations if a.text in {r["model"]["label"] for r in rows}]
    assert titles == [r["model"]["label"] for r in rows]
    assert _caption_bottom(fig) <= fig.layout.margin.t - 24
    # a study without tasks draws no task figure
    assert "acc_wikitext_lastword" not in figures(_study(2))
