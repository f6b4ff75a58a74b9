"""Evidence per sublayer unit: the ground truth (skipping one attention / MLP sublayer alone: held-out ΔPPL % and
KL to the base) equals plain evaluations of a deep copy with that sublayer's output projection zeroed, and
``swapkl evidence --unit`` compares the per-sublayer signals with it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.commands.cli import main
from swapkl.measure.evaluate import Evaluator, delta_pct, eval_ids, evaluate_ppl
from swapkl.evidence.ground_truth import text_key, unit_ground_truth
from swapkl.measure.memo import EvalMemo
from test_unit_curves import zeroed_plain

EV = Evaluator("tiny", 200, 128, 64)


@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_unit_ground_truth_equals_plain(stories_hf, unit):
    model, tok, corpus = stories_hf
    ids = eval_ids(corpus, tok, EV)
    memo = EvalMemo()
    gt = unit_ground_truth(model, ids, EV, memo, text_key(corpus, EV), unit)
    base = evaluate_ppl(model, ids, EV.window, EV.stride, capture_reference=True)
    for k in range(5):
        r = evaluate_ppl(zeroed_plain(model, [k], unit), ids, EV.window, EV.stride, reference=base.reference)
        assert gt.delta_ppl_pct[k] == pytest.approx(delta_pct(r, base), rel=1e-5, abs=1e-6)
        assert gt.kl[k] == pytest.approx(r.kl_to_base, rel=1e-5, abs=1e-8)
    again = unit_ground_truth(model, ids, EV, memo, text_key(corpus, EV), unit)
    assert again.computed == 0 and again.delta_ppl_pct == gt.delta_ppl_pct
    assert np.ptp(gt.delta_ppl_pct) > 0


def test_cli_evidence_unit(stories_path, wikitext_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    out = tmp_path / "ev.json"
    code = main(["evidence", str(stories_path), "--budget", "2", "--eval-text", str(wikitext_path), "--unit", "mlp",
                 "--max-words", "400", "--prompts", "4", "--tokens", "32", "--boot", "20", "--boot-agreement", "50",
                 "--calib-tokens", "128", "--json", str(out), "--pairs", "all"])
    text = capsys.readouterr().out
    assert code == 0
    d = json.loads(out.read_text())
    assert d["unit"] == "mlp" and d["contract"]["scoring"]["unit"] == "mlp"
    assert set(d["signals"]) == {"replacement", "interchange", "bi", "sleb"}
    assert "single-mlp removal" in text and len(d["ground_truth"]["kl"]) == 5
