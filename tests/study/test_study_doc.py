"""docs/study.md §6 prints what experiments/study_cpu.sh wrote: every ΔPPL %, ratio, KL gap and ρ in its tables equals the
study's result file (experiments/results/study-cpu.json) at the shown precision."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"SmolLM2-135M": 0, "Gemma-3-270M": 1, "Qwen2.5-Coder-0.5B": 2}


def _table_rows(text: str, header: str) -> list[list[str]]:
    lines = text[text.index(header):].split("\n")
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _num(cell: str) -> float:
    return float(re.match(r"[+−-]?[\d.,]+", cell).group().replace("−", "-").replace(",", ""))


def test_study_tables_equal_the_result_file():
    doc = (ROOT / "docs" / "study.md").read_text()
    result = json.loads((ROOT / "experiments" / "results" / "study-cpu.json").read_text())
    rows = result["rows"]
    assert len(rows) == 3 and result["complete"]

    model = None
    seen = 0
    for cells in _table_rows(doc, "| model | layers | params | base PPL"):
        model = cells[0] or model
        r = rows[LABELS[model]]
        if cells[0]:
            assert int(cells[1]) == r["layers"]
            assert cells[4] == r["verdict"]["regime"]
            assert _num(cells[5]) == round(r["gap"]["median"], 3)
        n = int(cells[6])
        row = r["removal"]["rows"][n - 1]
        assert _num(cells[7]) == round(row["replacement"]["delta_pct"], 1)
        assert _num(cells[8]) == round(row["interchange"]["delta_pct"], 1)
        assert cells[7].split("{")[1].rstrip("}") == ", ".join(map(str, row["replacement"]["removed"]))
        assert cells[8].split("{")[1].rstrip("}") == ", ".join(map(str, row["interchange"]["removed"]))
        assert _num(cells[9]) == round(row["ratio"], 3)
        assert {"better": "cheaper", "worse": "costlier", "tie": "tie"}[row["word"]] == cells[10]
        seen += 1
    assert seen == 9

    for cells in _table_rows(doc, "| model | ρ replacement"):
        ev = rows[LABELS[cells[0]]]["evidence"]["raw"]
        assert _num(cells[1]) == round(ev["replacement"]["rho"], 2)
        assert _num(cells[2]) == round(ev["interchange"]["rho"], 2)
        assert round(rows[LABELS[cells[0]]]["cost"]["seconds"]) == _num(cells[5])


SHARES = "experiments/results/study-cpu-tasks-{k}of3.json"
TASK = "wikitext_lastword"


def _share_row(label: str) -> dict:
    (r,) = json.loads((ROOT / SHARES.format(k=LABELS[label] + 1)).read_text())["rows"]
    assert r["model"]["label"] == label
    return r


def _nums(cell: str) -> list[float]:
    return [float(x.replace("−", "-")) for x in re.findall(r"[+−-]?\d+\.\d+", cell)]


def _section_seven(doc: str) -> str:
    return doc[doc.index("## 7."):]


def test_the_task_and_consensus_tables_equal_the_shares():
    """§7's per-model tables print the shares of experiments/study_cpu_tasks.sh: ΔPPL %, the I/R ratio and its CI,
    each guided set's ΔAcc with its per-document CI (accuracy points), and the consensus against the better of R and
    I (ΔPPL points, accuracy points); one consensus row where both rules chose the same sets, else one per rule."""
    doc = _section_seven((ROOT / "docs" / "study.md").read_text())
    tables = [m for m in LABELS if f"| {m} | n = 1 |" in doc]
    assert tables == list(LABELS)
    for label in tables:
        r = _share_row(label)
        table = {cells[0]: cells[1:] for cells in _table_rows(doc, f"| {label} | n = 1 |")}
        rows, t = r["removal"]["rows"], r["tasks"]
        same = [e["removed"] for e in t["methods"]["consensus-mean"]] == \
            [e["removed"] for e in t["methods"]["consensus-max"]]
        rules = [("consensus (mean = max here)", "consensus", "consensus-mean")] if same else \
            [(f"{c}", c, c) for c in ("consensus-mean", "consensus-max")]
        for n in (1, 2, 3):
            x = rows[n - 1]
            assert _nums(table["ΔPPL % R / I"][n - 1]) == [round(x["replacement"]["delta_pct"], 2),
                                                           round(x["interchange"]["delta_pct"], 2)]
            assert _nums(table["I/R [95 % CI]"][n - 1]) == [round(v, 3) for v in (x["ratio"], *x["ratio_ci"])]
            acc_rows = [("ΔAcc points R", "replacement"), ("ΔAcc points I", "interchange")] + \
                [(f"ΔAcc points {row}", m) for row, _, m in rules]
            for row, method in acc_rows:
                d = t["methods"][method][n - 1]["delta"][TASK]
                assert _nums(table[row][n - 1]) == [round(100 * v, 1) for v in (d["delta"], *d["ci"])], (label, row)
            for _, tag, m in rules:
                c = r["removal"]["consensus"][n - 1][m]
                assert _nums(table[f"{tag} − better, ΔPPL points"][n - 1]) == \
                    [round(v, 2) for v in (c["vs_better"], *c["vs_better_ci"])]
                c = t["consensus"][n - 1][TASK][m]
                assert _nums(table[f"{tag} − better, accuracy points"][n - 1]) == \
                    [round(100 * v, 1) for v in (c["vs_better"], *c["vs_better_ci"])]


def test_the_predictor_table_equals_the_shares():
    """§7's ρ table: each protocol's ρ with held-out ΔPPL and with the accuracy loss, CIs, the best signal and the
    paired pick for accuracy loss, per model measured."""
    doc = _section_seven((ROOT / "docs" / "study.md").read_text())
    seen = []
    for cells in _table_rows(doc, "| model | ρ ΔPPL, replacement"):
        r = _share_row(cells[0])
        ev, pr = r["evidence"]["raw"], r["tasks"]["predictors"][TASK]
        for cell, d in ((cells[1], ev["replacement"]), (cells[2], ev["interchange"]), (cells[4], pr["replacement"]),
                        (cells[5], pr["interchange"])):
            assert _nums(cell) == [round(v, 2) for v in (d["rho"], *d["ci"])]
        assert cells[3] == f"{ev['best']} {ev['best_rho']:.2f}"
        assert cells[6] == (pr["pick"]["winner"] or "tie")
        seen.append(cells[0])
    assert seen == list(LABELS)


def test_the_merged_file_joins_the_shares_and_the_doc_prints_its_statements():
    """study-cpu-tasks.json is the three shares merged (their rows, in order, complete), and §7's statement block is
    the merged run's statement lines, verbatim."""
    merged = json.loads((ROOT / "experiments" / "results" / "study-cpu-tasks.json").read_text())
    assert merged["complete"] and [r["model"]["label"] for r in merged["rows"]] == list(LABELS)
    for label, r in zip(LABELS, merged["rows"]):
        assert r["removal"] == _share_row(label)["removal"] and r["tasks"] == _share_row(label)["tasks"]
    printed = [line for line in (ROOT / "experiments" / "results" / "study-cpu-tasks.txt").read_text().splitlines()
               if line.startswith("- ")]
    doc = _section_seven((ROOT / "docs" / "study.md").read_text())
    block = doc[doc.index("The merged statements"):]
    block = block[block.index("```\n") + 4:]
    assert block[:block.index("```")].splitlines() == printed and len(printed) == 13
