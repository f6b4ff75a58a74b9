"""Text from a study file or a visitor's study list reaches figures and the HTML report as plain text (issue 51): a
label ``<a href="https://evil.example">x</a>`` would otherwise be a clickable external link in a plotly title (plotly
draws a subset of HTML: ``<a href>``, ``<b>``, ``<br>``, ``<span style>``)."""
from __future__ import annotations

import json

import pytest

from support.app_util import ROOT

STUDY = ROOT / "experiments" / "results" / "study-cpu.json"  # a real `swapkl study --json` file of three models
EVIL = '<a href="https://evil.example">x</a>'
STYLED = '<b>big</b><br><span style="font-size:99px">y</span>'


@pytest.fixture
def hostile_study(tmp_path):
    d = json.loads(STUDY.read_text())
    d["rows"][0]["model"]["label"] = EVIL
    d["rows"][1]["model"]["label"] = STYLED
    d["rows"][2]["model"]["spec"] = 'Qwen/<a href="https://evil.example/spec">Qwen</a>'
    d["notes"] = ['see <a href="https://evil.example/note">here</a>']
    p = tmp_path / "study.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("raw, plain", [(EVIL, "x"), (STYLED, "big y"), ("SmolLM2-135M", "SmolLM2-135M"),
                                        ("&lt;a href=q&gt;z&lt;/a&gt;", "z"), ("<<b>a href=q>z</a>", "z"),
                                        ("AT&T 2<3", "AT&T 23"), ("two\nlines", "two lines")])
def test_plain_text(raw, plain):
    from swapkl.schema import plain_text

    assert plain_text(raw) == plain


def test_a_study_files_label_leaves_no_link_in_the_report(hostile_study, tmp_path, cli):
    out = tmp_path / "report.html"
    rc, _, err = cli("report", str(hostile_study), "--html", "--out", str(out))
    assert rc == 0, err
    html = out.read_text(encoding="utf-8")
    assert "evil.example" not in html and "font-size:99px" not in html
    figs = [json.loads(s) for s in _figure_json(html)]
    titles = [a["text"] for f in figs for a in f["layout"].get("annotations", [])]
    assert titles[:3] == ["x", "big y", "Qwen2.5-Coder-0.5B"]  # the subplot titles: the labels' plain text
    dots = next(f for f in figs if f["layout"]["xaxis"]["title"]["text"].startswith("Spearman"))
    assert dots["layout"]["yaxis"]["categoryarray"][-2:] == ["big y", "x"]
    assert '<td class="l">x</td>' in html and '<td class="l">big y</td>' in html  # the table shows them too
    assert "see here" in html


def _figure_json(html: str) -> list[str]:
    """The figure JSON documents of a report (the argument of each ``Plotly.newPlot``)."""
    import re

    out = []
    for m in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', html):
        data, end = json.JSONDecoder().raw_decode(html, m.end())
        rest = html[end:].lstrip(" ,\n")
        layout, _ = json.JSONDecoder().raw_decode(rest)
        out.append(json.dumps({"data": data, "layout": layout}))
    return out


def test_a_visitors_study_list_label_is_plain_and_figures_draw_plain_text():
    from swapkl.study.figures import ratio_multiples, rho_dots
    from swapkl.study.plan import StudyModel
    from swapkl.study.result import StudyResult

    assert StudyModel("default", label=EVIL).label == "x"
    assert StudyModel("default", label="<b></b>").label == "default"
    # a result built in memory (not read from a file) is drawn as plain text too
    d = json.loads(STUDY.read_text())
    d["rows"][0]["model"]["label"] = EVIL
    study = StudyResult.from_dict(d)
    study.rows[1]["model"]["label"] = STYLED  # as if set after validation
    fig = ratio_multiples(study)
    assert [a.text for a in fig.layout.annotations][:2] == ["x", "big y"]
    assert "evil" not in fig.to_json() and "font-size:99px" not in fig.to_json()
    assert "evil" not in rho_dots(study).to_json()
