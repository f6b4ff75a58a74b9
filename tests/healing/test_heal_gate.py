"""The gate: a heal whose perplexity rises above the pruned model's (the paired CI of healed vs pruned above 0, on
the evaluation windows or the held-out text) is refused at export with one line, a non-zero exit and nothing
written, unless --force.  Synthetic window NLLs and a real stories260K heal driven to ruin by a huge learning rate."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.healing.heal import WorseHealError, check_gate
from swapkl.healing.result import HealResult, compare
from swapkl.scoring.corpora import from_file
from swapkl.stats import bootstrap_indices

HELDOUT = "tests/fixtures/data/heldout/american-speeches.txt"


def _result(nll: dict, counts, held_out: dict | None = None) -> HealResult:
    c = compare(nll, counts)
    return HealResult(removed=[1], ppl=c["ppl"], ppl_ci=c["ppl_ci"], delta_pct=c["delta_pct"],
                      recovered=c["recovered"], recovered_ci=c["recovered_ci"], recipe={}, training={}, train_text={},
                      contract={}, seconds=0.0, held_out=held_out or {})


def _windows(shift_healed: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    counts = np.full(40, 100)
    base = rng.normal(300, 20, 40)
    return {"base": base, "pruned": base + 60, "healed": base + 60 + shift_healed + rng.normal(0, 2, 40),
            "base_finetuned": base - 5}, counts


def test_healed_vs_pruned_is_a_paired_bootstrap_on_the_same_windows():
    nll, counts = _windows(5.0)
    got = compare(nll, counts)["delta_pct"]["healed_vs_pruned"]
    ppl = {r: np.exp(np.sum(v) / counts.sum()) for r, v in nll.items()}
    assert got["value"] == pytest.approx(100 * (ppl["healed"] / ppl["pruned"] - 1))
    vals = []
    for row in bootstrap_indices(len(counts), 1000, 0):  # one resample at a time, the same windows for both
        c = counts[row].sum()
        vals.append(100 * (np.exp(nll["healed"][row].sum() / c) / np.exp(nll["pruned"][row].sum() / c) - 1))
    assert got["ci"] == pytest.approx(list(np.percentile(vals, [2.5, 97.5])), rel=1e-9)


def test_the_gate_reads_the_ci_of_healed_vs_pruned():
    worse = _result(*_windows(+8.0))
    assert worse.delta_pct["healed_vs_pruned"]["ci"][0] > 0
    line = worse.gate_line()
    assert line.startswith("the healed model is worse than the pruned model") and "evaluation PPL +" in line
    assert "\n" not in line
    with pytest.raises(WorseHealError, match="not exported .*--force"):
        check_gate(worse, force=False)
    check_gate(worse, force=True)  # forced: no refusal
    better = _result(*_windows(-20.0))
    tie = _result(*_windows(0.0))
    assert better.gate_line() is None and tie.gate_line() is None
    assert tie.delta_pct["healed_vs_pruned"]["tie"]
    check_gate(better)  # not worse: no refusal
    # the held-out text alone can close the gate
    ho = compare(*_windows(+8.0, seed=1))
    held = _result(*_windows(-20.0), held_out={"delta_pct": ho["delta_pct"]})
    (only,) = held.worse()
    assert only.startswith("held-out PPL +")
    # a result from before the comparison existed has no gate
    old = _result(*_windows(+8.0))
    old.delta_pct.pop("healed_vs_pruned")
    assert old.gate_line() is None


def _main(capsys, *args) -> tuple[int, str, str]:
    from swapkl.commands.cli import main

    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(scope="module")
def eval_text(wikitext_path, tmp_path_factory):
    p = tmp_path_factory.mktemp("gate") / "eval.txt"
    p.write_text(" ".join(from_file(wikitext_path).words[:12_000]))
    return p


def test_a_heal_that_makes_the_model_worse_is_not_exported(stories_path, eval_text, tmp_path, cache_dir, capsys):
    out, js = tmp_path / "healed", tmp_path / "h.json"
    ruin = ["heal", stories_path, "--removed", "1", "--steps", "4", "--seq-len", "32", "--batch", "2", "--lr", "0.5",
            "--warmup", "0", "--train", "last-k", "--k", "2", "--eval-text", eval_text, "--max-words", "300",
            "--heldout-text", HELDOUT, "--json", js, "--quiet"]
    rc, stdout, err = _main(capsys, *ruin, "--out", out)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: the healed model is worse than the pruned model it heals: evaluation PPL +")
    assert lines[0].endswith("not exported (--force exports it anyway)")
    assert not out.exists()  # nothing written
    d = json.loads(js.read_text())  # the measurement that explains the refusal is kept
    assert d["ppl"]["healed"] > d["ppl"]["pruned"] and d["delta_pct"]["healed_vs_pruned"]["ci"][0] > 0
    assert d["held_out"]["ppl"]["healed"] > d["held_out"]["ppl"]["pruned"]
    assert d["training"]["healed"]["trainable_params"] > 0 and d["recipe"]["part"] == "last-k"
    # without --out: one note, exit 0; with --force: exported, and the note says so
    rc, stdout, err = _main(capsys, *ruin[:-1])
    assert rc == 0 and "note: the healed model is worse than the pruned model" in stdout
    rc, stdout, err = _main(capsys, *ruin[:-1], "--out", out, "--force")
    assert rc == 0 and (out / "model.safetensors").is_file() and not (out / "adapter").exists()
    assert "exported anyway (--force)" in stdout


def test_cli_refuses_bridge_and_bad_objectives_in_one_line(stories_path, capsys):
    for args, pattern in ((("--train", "bridge"), "it needs --repair bridge"),
                          (("--objective", "kd", "--temperature", "0"), "--temperature"),
                          (("--train", "last-k", "--qlora"), "needs --train lora")):
        rc, _, err = _main(capsys, "heal", stories_path, "--removed", "1", *args)
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning:")]
        assert rc == 2 and len(lines) == 1 and pattern in lines[0], err
