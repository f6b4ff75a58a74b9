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


def test_the_task_and_consensus_table_equals_share_one():
    """§7's table prints share 1 of 3 of experiments/study_cpu_tasks.sh (SmolLM2-135M): ΔPPL %, the I/R ratio and
    its CI, and each guided set's ΔAcc with its per-document CI, in accuracy points."""
    doc = (ROOT / "docs" / "study.md").read_text()
    (r,) = json.loads((ROOT / "experiments" / "results" / "study-cpu-tasks-1of3.json").read_text())["rows"]
    table = {cells[0]: cells[1:] for cells in _table_rows(doc, "| SmolLM2-135M | n = 1 |")}
    rows, t = r["removal"]["rows"], r["tasks"]

    def nums(cell):
        return [float(x.replace("−", "-")) for x in re.findall(r"[+−-]?\d+\.\d+", cell)]

    for n in (1, 2, 3):
        x = rows[n - 1]
        assert nums(table["ΔPPL % R / I"][n - 1]) == [round(x["replacement"]["delta_pct"], 2),
                                                      round(x["interchange"]["delta_pct"], 2)]
        assert nums(table["I/R [95 % CI]"][n - 1]) == [round(v, 3) for v in (x["ratio"], *x["ratio_ci"])]
        for label, method in (("ΔAcc points R", "replacement"), ("ΔAcc points I", "interchange"),
                              ("ΔAcc points consensus (mean = max here)", "consensus-mean")):
            d = t["methods"][method][n - 1]["delta"]["wikitext_lastword"]
            assert nums(table[label][n - 1]) == [round(100 * v, 1) for v in (d["delta"], *d["ci"])]
        assert t["methods"]["consensus-max"][n - 1]["removed"] == t["methods"]["consensus-mean"][n - 1]["removed"]
