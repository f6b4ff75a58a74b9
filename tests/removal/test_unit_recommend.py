"""``recommend`` per sublayer unit on stories260K: every recommended set's held-out ΔPPL equals the plain evaluator on
a deep copy with those sublayers' output projections zeroed, its calibration PPL equals the plain model's on the
calibration text, an unlimited beam is the exhaustive best on calibration text, only the unit's methods seed it,
the unit is recorded in the output and the JSON, and block behaviour is unchanged (tests/removal/test_recommend*.py)."""
from __future__ import annotations

import itertools
import json

import pytest
import torch

from swapkl.measure.evaluate import Evaluator, eval_ids, evaluate_ppl
from swapkl.measure.memo import EvalMemo
from swapkl.removal.recommend import Recommendation, recommend
from swapkl.removal.plan import RunHooks
from swapkl.removal.recommend import recommend_plan, search_params
from test_removal import scores5
from test_unit_curves import zeroed_plain

EV = Evaluator("tiny", 200, 128, 64)
TOKENS = 256


@pytest.fixture(scope="module")
def stories3(stories_path, wikitext_path):
    import transformers as tf

    from swapkl.scoring.corpora import from_file

    torch.set_num_threads(1)
    return (tf.AutoModelForCausalLM.from_pretrained(stories_path).eval(),
            tf.AutoTokenizer.from_pretrained(stories_path), from_file(wikitext_path))


def _calib_plain(model, tok, corpus, layers, unit):
    """Calibration PPL the plain way: the first TOKENS tokens of the corpus's prompt region, the evaluator's window
    and stride, on a zeroed deep copy."""
    words = corpus.prompt_text().split()[:TOKENS]
    ids = torch.as_tensor(tok(" ".join(words))["input_ids"], dtype=torch.long)[:TOKENS]
    m = zeroed_plain(model, layers, unit) if layers else model
    return evaluate_ppl(m, ids, min(EV.window, ids.numel()), EV.stride).ppl


@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_unit_recommend_equals_plain(stories3, unit):
    model, tok, corpus = stories3
    rec = recommend(model, tok, scores5(), recommend_plan(2, search_params(width=10, top_k=5, max_evals=None, calib_tokens=TOKENS), ["replacement"], evaluator=EV, kl=False, unit=unit, method_params={"recommend": {"rule": "calibration"}}),
                    RunHooks(corpus=corpus, memo=EvalMemo()))
    assert rec.unit == unit and rec.settings["unit"] == unit
    # only the unit's methods seed a sublayer search; the block ones are named in a note
    assert rec.settings["seeds"] == ["replacement", "interchange", "bi"]
    assert any("cka" in n and "whole blocks only" in n for n in rec.notes)
    ids = eval_ids(corpus, tok, EV)
    base = evaluate_ppl(model, ids, EV.window, EV.stride).ppl
    assert rec.baseline_ppl == pytest.approx(base, rel=1e-9)
    assert rec.calib_base_ppl == pytest.approx(_calib_plain(model, tok, corpus, [], unit), rel=1e-9)
    # an unlimited beam over every layer: the exhaustive best calibration set of each size, each evaluated plainly
    for e in rec.entries:
        n = e["n"]
        vals = {c: _calib_plain(model, tok, corpus, list(c), unit) for c in itertools.combinations(range(5), n)}
        best = min(vals, key=lambda c: (vals[c], c))
        assert e["removed"] == list(best)
        assert e["calib_ppl"] == pytest.approx(vals[best], rel=1e-5)
        held = evaluate_ppl(zeroed_plain(model, e["removed"], unit), ids, EV.window, EV.stride).ppl
        assert e["ppl"] == pytest.approx(held, rel=1e-5)
        assert e["delta_pct"] == pytest.approx(100.0 * (held / base - 1.0), rel=1e-4, abs=1e-6)
    assert "sublayers of layers" in rec.explain(1)
    again = Recommendation.from_json(rec.to_json())
    assert again.unit == unit and again.entries == json.loads(rec.to_json())["entries"]


def test_recommend_cli_unit_json(stories_path, wikitext_path, tmp_path, capsys, monkeypatch):
    """``recommend --unit mlp`` with a plain matrices file: the JSON records the unit, and its sets are those of
    the library call with the same settings."""
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    sc = {k: [[None if v != v else float(v) for v in row] for row in m] for k, m in scores5().items()}
    (tmp_path / "s.json").write_text(json.dumps(sc))
    out = tmp_path / "rec.json"
    assert main(["recommend", str(stories_path), "--device", "cpu", "--budget", "2", "--scores",
                 str(tmp_path / "s.json"), "--unit", "mlp", "--eval-text", str(wikitext_path), "--max-words", "400",
                 "--calib-tokens", "256", "--compare", "replacement", "--no-kl", "--no-cache", "--quiet",
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["unit"] == "mlp" and d["settings"]["unit"] == "mlp"
    from swapkl.commands.recommend import render

    rec = Recommendation.from_dict(d)
    assert "unit: mlp" in render(rec).splitlines()[0]
    assert rec.unit == "mlp" and [len(e["removed"]) for e in rec.entries] == [1, 2]
