"""Task accuracy in the HTML report (swapkl.views.tasks.section, ``report --tasks``, the dashboard's one-click report)
and the closing-note table: on a real ``swapkl tasks --json`` file (experiments/results/tasks-default-limit40.json, the
built-in default at limit 40) plus a seeded method built by the runner's own averaging (``_seeded``), the report
holds one figure per metric whose points are the file's numbers, a table whose every number is the file's to the
printed precision, and the contract; a hostile --tasks file is one ``error:`` line."""
from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path

import pytest

from swapkl.views import report
from swapkl.views import tasks as tv
from test_plots import IDENTITY, synthetic
from test_report import figure_json, run_cli

ROOT = Path(__file__).resolve().parents[2]
TASK = "tinystories_mc"
METRICS = ("acc,none", "acc_norm,none")


def _seed_entry(removed, acc, acc_norm, limit=40):
    se = lambda p: (p * (1 - p) / (limit - 1)) ** 0.5
    return {"n": len(removed), "removed": removed, "metrics": {TASK: {"acc,none": acc, "acc_norm,none": acc_norm}},
            "stderr": {TASK: {"acc,none": se(acc), "acc_norm,none": se(acc_norm)}}}


@pytest.fixture(scope="module")
def tasks_dict() -> dict:
    """The committed default-model run, with a ``random`` method of two seeds averaged by the runner itself."""
    from swapkl.removal.tasks import _seeded

    d = json.loads((ROOT / "experiments" / "results" / "tasks-default-limit40.json").read_text())
    d["methods"]["random"] = _seeded({0: [_seed_entry([3], 0.9, 0.875), _seed_entry([3, 20], 0.825, 0.8)],
                                      1: [_seed_entry([7], 0.95, 0.95), _seed_entry([7, 11], 0.7, 0.725)]})
    return json.loads(json.dumps(d))


def _html_rows(doc: str, after: str) -> list[list[str]]:
    """The cells of the first table after the text ``after``."""
    body = doc[doc.index(after):]
    table = body[body.index("<table>"):body.index("</table>")]
    return [[html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table)]


def test_section_figures_and_table_equal_the_json(tasks_dict):
    r = tv.load_tasks(tasks_dict)
    plain = report.build_report(result=synthetic())
    doc = report.build_report(result=synthetic(), sections=[tv.section(r)])
    assert report.figure_count(plain) == 2 and report.figure_count(doc) == 2 + len(METRICS)
    # figures 3 and 4: acc then acc_norm, each method's points are the file's (n = 0 the base), stderr as error bars
    for k, metric in enumerate(METRICS, start=3):
        traces = figure_json(doc, k)
        assert {t["meta"]["method"] for t in traces} == set(tasks_dict["methods"])
        for t in traces:
            entries = tasks_dict["methods"][t["meta"]["method"]]
            assert t["x"] == [0] + [e["n"] for e in entries]
            assert t["y"] == pytest.approx([tasks_dict["base"]["metrics"][TASK][metric]]
                                           + [e["metrics"][TASK][metric] for e in entries])
            assert t["error_y"]["array"] == pytest.approx([tasks_dict["base"]["stderr"][TASK][metric]]
                                                          + [e["stderr"][TASK][metric] for e in entries])
    # the table: one row per (method, n), every metric and its stderr equal to the file's at 4 decimals
    rows = _html_rows(doc, "Every metric, with lm-eval")
    head, body = rows[0], rows[1:]
    assert head[:3] == ["method", "n", "removed"]
    expected = [("base", 0, tasks_dict["base"])] + [(m, e["n"], e) for m, es in tasks_dict["methods"].items()
                                                     for e in es]
    assert len(body) == len(expected) == 1 + 3 * 4 + 2
    for row, (method, n, e) in zip(body, expected):
        assert row[0] == method and int(row[1]) == n
        if method == "random":
            assert row[2] == "mean of 2 seeds"
        elif method != "base":
            assert row[2] == " ".join(map(str, e["removed"]))
        for metric in METRICS:
            assert row[head.index(f"{TASK} {metric}")] == f"{e['metrics'][TASK][metric]:.4f}"
            assert row[head.index(f"{TASK} {metric} stderr")] == f"{e['stderr'][TASK][metric]:.4f}"
    assert tasks_dict["methods"]["random"][1]["metrics"][TASK]["acc,none"] == pytest.approx((0.825 + 0.7) / 2)
    # the seeds' own sets and numbers
    seeds = _html_rows(doc, "each seed's set")
    assert [r[2:4] for r in seeds[1:]] == [["0", "3"], ["1", "7"], ["0", "3 20"], ["1", "7 11"]]
    # the contract: model, lm-eval version, task version, metric names, limit, few-shot
    cap = html.unescape(doc)
    for part in ("SmolLM2-135M-Instruct", "lm-eval 0.4.13", "tasks tinystories_mc v1.0",
                 "metrics acc,none, acc_norm,none", "limit 40", "few-shot: task default (tinystories_mc 0)"):
        assert part in cap, part
    assert "40 of 200 documents" in cap and "chance 0.2500" in cap


def test_markdown_table_is_the_closing_note_table(tasks_dict):
    md = tv.markdown_table(tasks_dict, "acc,none")
    lines = md.splitlines()
    assert lines[0] == "tinystories_mc, acc,none (± lm-eval stderr; n = layers removed)"
    assert lines[2] == "| method | n = 0 | n = 1 | n = 2 | n = 3 | n = 4 |"
    base = tasks_dict["base"]
    assert lines[4] == f"| base | {base['metrics'][TASK]['acc,none']:.3f} ± {base['stderr'][TASK]['acc,none']:.3f} |" \
        + " |" * 4
    bi = next(ln for ln in lines if ln.startswith("| Block Influence"))
    cells = [c.strip() for c in bi.strip("|").split("|")][1:]
    assert cells[1:] == [f"{e['metrics'][TASK]['acc,none']:.3f} ± {e['stderr'][TASK]['acc,none']:.3f}"
                         for e in tasks_dict["methods"]["bi"]]
    rnd = next(ln for ln in lines if ln.startswith("| random"))
    assert "n=1: mean of seeds" in rnd
    assert [c.strip() for c in rnd.strip("|").split("|")][3] == f"{(0.825 + 0.7) / 2:.3f} ± " + \
        f"{tasks_dict['methods']['random'][1]['stderr'][TASK]['acc,none']:.3f}"
    assert lines[-1].startswith("contract: SmolLM2-135M-Instruct") and "lm-eval 0.4.13" in lines[-1]


def test_cli_report_tasks_only_and_with_scores(tasks_dict, tmp_path):
    f = tmp_path / "tasks.json"
    f.write_text(json.dumps(tasks_dict))
    out = tmp_path / "r.html"
    r = run_cli("report", "--tasks", str(f), "--out", str(out), env_extra={"SWAPKL_CACHE": str(tmp_path / "c")},
                process=True)  # the real entry point once; the other runs are in process (test_report.run_cli)
    assert r.returncode == 0, r.stderr
    doc = out.read_text()
    assert report.figure_count(doc) == 2 and "Task accuracy after removal" in doc and "2 figures" in r.stderr
    assert not (tmp_path / "c").exists()  # no model, no computation
    # with a scores file of the same model: 2 + 2 figures; of another model: refused in one line
    scores = tmp_path / "scores.json"
    scores.write_text(synthetic().to_json())
    same = dict(tasks_dict, model=dict(IDENTITY, num_layers=5))
    f.write_text(json.dumps(same))
    r = run_cli("report", "--scores", str(scores), "--tasks", str(f), "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    assert report.figure_count(out.read_text()) == 4
    f.write_text(json.dumps(tasks_dict))
    r = run_cli("report", "--scores", str(scores), "--tasks", str(f), "--out", str(out), "--quiet")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is for another model" in r.stderr


def _hostile(d: dict) -> list[tuple[dict | str, str]]:
    def change(fn):
        x = copy.deepcopy(d)
        fn(x)
        return x

    return [
        ('{"x": 1}', r"document.base is missing"),
        ("[1, 2]", r"is not an object"),
        (change(lambda x: x["methods"]["bi"][0].update(removed="3,4")), r"methods.bi\[0\].removed .* is not an array"),
        (change(lambda x: x["methods"]["bi"][0].update(n=0)), r"n = 0 is outside 1\.\."),
        (change(lambda x: x["base"]["metrics"].update({TASK: [0.5]})), r"base.metrics.tinystories_mc .* not an object"),
        (change(lambda x: x["base"]["metrics"][TASK].update({"acc,none": "high"})), r"is not a number"),
        (change(lambda x: x["contract"]["tasks"][TASK].update(chance=3)), r"chance = 3 is outside"),
        (change(lambda x: x.update(notes="hi")), r"notes .* is not an array"),
        (change(lambda x: x["methods"]["random"][0]["per_seed"][0].update(removed=None)), r"per_seed\[0\].removed"),
        (json.dumps(d).replace("0.975", "NaN", 1), r"NaN|finite"),
    ]


def test_hostile_tasks_file_is_one_error_line(tasks_dict, tmp_path):
    f = tmp_path / "t.json"
    for bad, pattern in _hostile(tasks_dict):
        f.write_text(bad if isinstance(bad, str) else json.dumps(bad))
        r = run_cli("report", "--tasks", str(f), "--out", str(tmp_path / "x.html"))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --tasks file"), r.stderr
        assert re.search(pattern, lines[0]), (pattern, lines[0])
        assert not (tmp_path / "x.html").exists()


def test_one_click_report_holds_a_finished_tasks_job(tasks_dict):
    """The dashboard's one-click report (swapkl.jobs.reports.report_html): the section of the session's finished tasks
    job; none while it runs or when it is for another model than the analysis."""
    from swapkl.jobs import AnalysisRequest, Job, TasksRequest
    from swapkl.jobs import reports as jobs_reports

    analysis = Job("a", AnalysisRequest())
    analysis.done_from("test", result=synthetic())
    tasks = Job("t", TasksRequest(tasks=(TASK,)))
    tasks.done_from("test", tasks=tv.load_tasks(dict(tasks_dict, model=dict(IDENTITY, num_layers=5))))
    doc = jobs_reports.report_html(analysis, None, tasks)
    assert report.figure_count(doc) == 4 and "Task accuracy after removal" in doc
    assert report.figure_count(jobs_reports.report_html(analysis, None, None)) == 2
    other = Job("o", TasksRequest(tasks=(TASK,)))
    other.done_from("test", tasks=tv.load_tasks(tasks_dict))  # the default model's fingerprint
    assert "Task accuracy after removal" not in jobs_reports.report_html(analysis, None, other)
