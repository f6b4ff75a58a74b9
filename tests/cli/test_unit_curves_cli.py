"""``swapkl curves --unit``: a scores file's unit is the curve's unit (a different --unit is refused in one line),
and ``--gains`` puts each point's measured gain beside its ΔPPL."""
from __future__ import annotations

import json

from swapkl.commands.cli import main
from test_removal import scores5


def _plain_scores(tmp_path, unit):
    s = scores5()
    path = tmp_path / f"scores-{unit}.json"
    path.write_text(json.dumps({"replacement": s["replacement"].tolist(), "interchange": s["interchange"].tolist(),
                                "contract": {"unit": unit}}).replace("NaN", "null"))
    return path


def test_curves_unit_from_scores_with_gains(stories_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    out = tmp_path / "curves.json"
    rc = main(["curves", str(stories_path), "--budget", "1", "--scores", str(_plain_scores(tmp_path, "mlp")),
               "--methods", "replacement,interchange", "--max-words", "300", "--device", "cpu", "--gains",
               "--gains-context", "32", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "unit: mlp" in text and "non-emb params" in text and "prefill ×" in text
    d = json.loads(out.read_text())
    assert d["unit"] == "mlp" and d["gains"]["settings"]["context"] == 32
    key = d["gains"]["points"]["replacement"]["1"]
    assert d["gains"]["sets"][key]["removed"] == [[d["methods"]["replacement"][0]["removed"][0], "mlp"]]


def test_curves_unit_mismatch_refused(stories_path, tmp_path, capsys):
    rc = main(["curves", str(stories_path), "--budget", "1", "--scores", str(_plain_scores(tmp_path, "mlp")),
               "--unit", "attention", "--methods", "replacement", "--max-words", "300", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "scores the mlp unit" in err[0]


def test_curves_with_other_units_common_axis(stories_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    att = tmp_path / "att.json"
    common = ["--budget", "1", "--methods", "replacement", "--max-words", "300", "--device", "cpu"]
    assert main(["curves", str(stories_path), "--scores", str(_plain_scores(tmp_path, "attention")), *common,
                 "--json", str(att), "--quiet"]) == 0
    fig = tmp_path / "fig.html"
    assert main(["curves", str(stories_path), "--scores", str(_plain_scores(tmp_path, "block")), *common,
                 "--with", str(att), "--figure", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "common axis" in text and "attention" in text and fig.is_file()
    d = json.loads(att.read_text())
    share = 100.0 * d["sizes"]["attention"][d["methods"]["replacement"][0]["removed"][0]] / d["sizes"]["non_embedding"]
    assert f"{share:.1f}%" in text


def test_curves_unit_scores_with_the_engine(stories_path, tmp_path, capsys, monkeypatch):
    """Without --scores, the unit's swap-KL is computed (the contract's unit) and guides the sublayer curve."""
    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.removal.selection import select
    from swapkl.scoring.score import score

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    out = tmp_path / "c.json"
    assert main(["curves", str(stories_path), "--unit", "attention", "--budget", "2", "--methods", "interchange",
                 "--prompts", "2", "--tokens", "16", "--max-words", "300", "--device", "cpu", "--json", str(out),
                 "--quiet"]) == 0
    d = json.loads(out.read_text())
    ck = load_checkpoint(str(stories_path), device="cpu")
    res = score(ck, Contract(prompts=2, tokens=16, device="cpu", unit="attention"))
    want = select(res.interchange(), 2, spacing=1, candidates=[1, 2, 3], strict=False)
    assert d["unit"] == "attention" and [e["removed"] for e in d["methods"]["interchange"]] == want
