"""docs/evidence.md "Evidence of the default with task ground truth" prints what the run wrote
(experiments/results/evidence-default-tasks.json): every ρ and CI of its table and the two truths' agreement."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_task_ground_truth_table_equals_the_result_file():
    doc = (ROOT / "docs" / "evidence.md").read_text()
    d = json.loads((ROOT / "experiments" / "results" / "evidence-default-tasks.json").read_text())
    section = doc[doc.index("### Evidence of the default with task ground truth"):]
    section = section[:section.index("\n### ", 10)]
    rows = [ln for ln in section.splitlines() if ln.strip().startswith("| ") and "---" not in ln][1:]
    assert len(rows) == len(d["signals"])
    sp, acc = d["agreement"]["spearman"], d["agreement"]["spearman_ci"]

    def nums(cell):
        return [float(x) for x in re.findall(r"-?\d+\.\d+", cell)]

    for row in rows:
        name, ppl, loss = [c.strip() for c in row.strip().strip("|").split("|")]
        got = {"ground_truth_ppl": nums(ppl), "ground_truth_acc": nums(loss)}
        for truth, vals in got.items():
            assert vals == [round(sp[name][truth], 2), *(round(v, 2) for v in acc[name][truth])], (name, truth)
    ta = d["task_truth"]["truths_agreement"]
    assert f"**{ta['spearman']:.2f} [{ta['spearman_ci'][0]:.2f}, {ta['spearman_ci'][1]:.2f}]**" in section
