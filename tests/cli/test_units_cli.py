"""``--unit`` on the command line: a sublayer score keeps the score JSON's format with the unit in its contract and
in its own cache entry; an unknown unit, a family without validated sublayers and a command that does not do
sublayers yet are refused in one line.

The commands run in process (``test_cli.run_cli``); ``test_unknown_unit_one_line`` runs a real ``python -m swapkl``."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from test_cli import run_cli


def _lines(r) -> list[str]:
    return [ln for ln in r.stderr.strip().splitlines() if ln.strip()]


def test_score_unit_json_and_cache(stories, stories_path, tmp_path):
    """The attention score JSON has the block score's keys, the unit in its contract, and the numbers of the
    engine run with that unit (checked against the plain reference); the block score of the same contract is the
    one it always was, in its own cache entry."""
    from swapkl.scoring.reference import reference_sweep

    env = {"SWAPKL_CACHE": str(tmp_path / "c")}
    base = ["score", str(stories_path), "--pairs", "adjacent", "--prompts", "2", "--tokens", "12", "--quiet"]
    out = {u: tmp_path / f"{u}.json" for u in ("block", "attention")}
    r = run_cli(*base, "--json", str(out["attention"]), "--unit", "attention", env_extra=env)
    assert r.returncode == 0, r.stderr
    r = run_cli(*base, "--json", str(out["block"]), env_extra=env)
    assert r.returncode == 0, r.stderr
    att, blk = (json.loads(out[u].read_text()) for u in ("attention", "block"))
    assert set(att) == set(blk) and att["pairs"] == blk["pairs"] and att["prompt_token_ids"] == blk["prompt_token_ids"]
    assert att["contract"]["unit"] == "attention" and blk["contract"]["unit"] == "block"
    assert att["meta"]["cache_key"] != blk["meta"]["cache_key"]
    ids = torch.tensor(att["prompt_token_ids"])
    for unit, d in (("attention", att), ("block", blk)):
        ref = reference_sweep(stories.model, ids, [tuple(p) for p in d["pairs"]], unit=unit)
        for (i, j), v in ref.items():
            assert abs(d["replacement_directed"][i][j] - v["repl_ij"].mean().item()) < 1e-5
            assert abs(d["replacement_directed"][j][i] - v["repl_ji"].mean().item()) < 1e-5
            assert abs(d["interchange"][i][j] - v["inter"].mean().item()) < 1e-5
    # a second attention run reads its own entry: every pair from the cache, the same numbers
    r = run_cli(*base, "--json", str(tmp_path / "again.json"), "--unit", "attention", env_extra=env)
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["meta"]["cached_pairs"] == len(att["pairs"]) and again["replacement"] == att["replacement"]
    # recommend takes the scores file's unit; another --unit is refused, in one line, before loading the model
    r = run_cli("recommend", str(stories_path), "--budget", "1", "--scores", str(out["attention"]), "--unit", "mlp",
                env_extra=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(_lines(r)) == 1 and "--unit mlp but the scores file" in r.stderr and "attention unit" in r.stderr


def test_unknown_unit_one_line(stories_path, tmp_path):
    r = run_cli("score", str(stories_path), "--unit", "ffn", env_extra={"SWAPKL_CACHE": str(tmp_path / "c")},
                process=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert _lines(r) == ["error: unknown unit 'ffn'; choose one of: block, attention, mlp"]


def test_family_without_sublayers_one_line(stories_path, tmp_path):
    """BLOOM (found by the generic fallback) adds the residual inside its attention module: skipping the sublayer
    is not zeroing its projection, so no layout describes its sublayers."""
    import transformers as tf

    cfg = tf.AutoConfig.for_model("bloom", n_layer=3, hidden_size=32, n_head=4, vocab_size=512, bos_token_id=1,
                                  eos_token_id=2)
    folder = tmp_path / "bloom"
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copy(stories_path / name, folder / name)
    env = {"SWAPKL_CACHE": str(tmp_path / "c")}
    r = run_cli("score", str(folder), "--unit", "mlp", "--prompts", "2", "--tokens", "8", env_extra=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = _lines(r)
    assert len(lines) == 1 and lines[0].startswith(
        "error: attention/MLP units are not available for the 'generic:bloom' family"), r.stderr
    assert lines[0].endswith("use --unit block")
    # the same model scores as blocks
    r = run_cli("score", str(folder), "--prompts", "2", "--tokens", "8", "--quiet", env_extra=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("flag", ["--compare", "--seeds-from"])  # recommend does sublayers (test_unit_recommend.py)
def test_recommend_refuses_block_methods_for_sublayers(stories_path, tmp_path, flag):
    r = run_cli("recommend", str(stories_path), "--budget", "1", "--unit", "attention", flag, "replacement,cka",
                env_extra={"SWAPKL_CACHE": str(tmp_path / "c")})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = _lines(r)
    assert lines == ["error: method(s) cka remove whole blocks only; for --unit attention choose from: replacement, "
                     "interchange, random, anti-replacement, anti-interchange, bi, sleb"], r.stderr  # display order
