"""Healing after removal (swapkl.healing, `swapkl heal`): zero steps give the pruned model exactly, the training
text is disjoint from the evaluation text, the scoring prompts and the calibration text, an interrupted run
resumes to bit-identical weights, the merged export reloads with equal logits, the control gets the same recipe and
text, and a seed determines the weights.  stories260K and tiny random models, a few training steps each."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from swapkl.errors import ComputeInterrupted
from swapkl.healing import text as T
from swapkl.healing import train as TR
from swapkl.healing.heal import HealSetup, export_healed, heal
from swapkl.healing.recipe import Recipe
from swapkl.healing.result import compare, recovered_share
from swapkl.measure.evaluate import Evaluator
from swapkl.removal.plan import RunHooks
from swapkl.scoring.corpora import from_file
from swapkl.surgery.blocks import pruned_copy
from conftest import tiny_model
from test_hostile_cli import assert_user_error, run_cli
from support.tensors import logits

EV = Evaluator("tiny", 300, 128, 64)
SMALL = Recipe(steps=4, rank=2, seq_len=32, batch=2, lr=3e-3, warmup=1, checkpoint_every=2)


@pytest.fixture(scope="module")
def train_text(stories, small_corpus):
    return T.corpus_train_text(small_corpus, stories.tokenizer, SMALL.seq_len)


def random_chunks(vocab=96, n=16, t=24, seed=0):
    return torch.randint(1, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------- the training region
def test_train_region_is_disjoint_from_eval_prompts_and_calibration(stories, small_corpus, train_text):
    from swapkl.scoring.prompts import make_prompts, tokenize_stream

    tok = stories.tokenizer
    d = train_text.description
    stream = tokenize_stream(tok, small_corpus.prompt_text())
    reserve = len(tokenize_stream(tok, " ".join(small_corpus.prompt_text().split(" ")[:T.CALIB_RESERVE_WORDS])))
    assert d["calib_reserve_tokens"] == reserve > 0
    starts = make_prompts(tok, small_corpus, 16, 64, 0).description["window_starts"]
    body = 63  # Llama: BOS + 63 text tokens
    for (b, e), row in zip(train_text.spans, train_text.chunks.tolist()):
        assert b >= reserve                                    # after the calibration text
        assert all(not (b < s + body and s < e) for s in starts)  # no scoring prompt
        assert row[1:] == stream[b:e] and row[0] == tok.bos_token_id
    # the evaluation region is the corpus's first words; the training text is cut from what follows it
    eval_words = set(range(small_corpus.split_point))
    assert d["corpus"]["eval_region_words"] == len(eval_words) == 6000
    # the check itself refuses an overlap
    with pytest.raises(T.TrainTextError, match="scoring prompt window"):
        T.check_disjoint(train_text, reserve, [(train_text.spans[3][0] + 1, 10)])
    with pytest.raises(T.TrainTextError, match="calibration"):
        T.check_disjoint(train_text, train_text.spans[0][1], [])


def test_train_file_overlapping_the_evaluation_text_is_refused(stories, small_corpus, tmp_path, wikitext_path):
    words = small_corpus.words
    same = tmp_path / "same.txt"
    same.write_text(" ".join(words))
    with pytest.raises(T.TrainTextError, match="same content"):
        T.file_train_text(same, stories.tokenizer, 32, [("evaluation text", small_corpus)])
    part = tmp_path / "part.txt"  # fresh text with one evaluation passage in the middle
    part.write_text("a fresh start of text . " * 50 + " ".join(words[1000:1100]) + " and more new words here" * 30)
    with pytest.raises(T.TrainTextError, match="overlaps the evaluation text .*evaluation region"):
        T.file_train_text(part, stories.tokenizer, 32, [("evaluation text", small_corpus)])
    ok = tmp_path / "ok.txt"
    ok.write_text(" ".join(from_file(wikitext_path).words[200_000:203_000]))
    tt = T.file_train_text(ok, stories.tokenizer, 32, [("evaluation text", small_corpus)])
    assert tt.chunks.shape[1] == 32 and tt.description["source"] == "file"


# ----------------------------------------------------------------------------------------- the training loop
def test_zero_steps_give_the_pruned_model_exactly():
    for kind in ("llama", "gpt2"):  # Linear and GPT-2 Conv1D layers
        model = tiny_model(kind, num_layers=4)
        r = Recipe(steps=0, rank=4, seq_len=24, batch=2)
        state, stats = TR.train(model, [1], random_chunks(), r)
        assert stats["resumed_from"] == 0 and stats["loss_last"] is None
        healed = TR.healed_model(model, [1], r, state)
        x = random_chunks(n=2, t=20, seed=1)
        assert torch.equal(logits(healed, x), logits(pruned_copy(model, [1]), x))
        names, conv = TR.lora_targets(pruned_copy(model, [1]))
        assert conv == (kind == "gpt2")
        assert len(names) == 3 * (7 if kind == "llama" else 4)  # q k v o gate up down | c_attn c_proj c_fc c_proj


def test_training_changes_only_a_private_copy_and_lowers_the_loss():
    model = tiny_model("llama", num_layers=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = Recipe(steps=8, rank=4, seq_len=24, batch=4, lr=1e-2, warmup=0)
    state, stats = TR.train(model, [2], random_chunks(), r)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())  # the caller's model is not frozen either
    assert stats["loss_last"] < stats["loss_first"]
    assert stats["trainable_params"] == sum(v.numel() for v in state.values()) > 0


def test_a_seed_determines_the_weights():
    model = tiny_model("llama", num_layers=4)
    r = Recipe(steps=3, rank=2, seq_len=24, batch=2, dropout=0.1)
    a, _ = TR.train(model, [1], random_chunks(), r)
    b, _ = TR.train(model, [1], random_chunks(), r)
    c, _ = TR.train(model, [1], random_chunks(), Recipe(**{**r.__dict__, "seed": 1}))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert TR.batch_indices(5, 16, 4, 0).tolist() == TR.batch_indices(5, 16, 4, 0).tolist()


class Crash(Exception):
    """A process killed mid-run (kill -9): nothing after the raise is written."""


@pytest.mark.parametrize("how", ["crash", "stop"])
def test_an_interrupted_run_resumes_to_identical_weights(tmp_path, how):
    model = tiny_model("llama", num_layers=4)
    r = Recipe(steps=7, rank=2, seq_len=24, batch=2, dropout=0.1, checkpoint_every=2, schedule="cosine")
    ref, ref_stats = TR.train(model, [1], random_chunks(), r, tmp_path / "ref")
    folder = tmp_path / "run"
    if how == "crash":
        def progress(step, steps, msg):
            if step == 5:
                raise Crash  # after update 5: the last checkpoint is the one at step 4
        with pytest.raises(Crash):
            TR.train(model, [1], random_chunks(), r, folder, progress=progress)
        resume_at = 4
    else:
        calls = iter(range(100))
        with pytest.raises(ComputeInterrupted, match="step 3"):
            TR.train(model, [1], random_chunks(), r, folder, should_stop=lambda: next(calls) == 3)
        resume_at = 3
    assert sorted(p.name for p in folder.glob("checkpoint-*.pt")) == [f"checkpoint-{resume_at}.pt"]
    got, stats = TR.train(model, [1], random_chunks(), r, folder)
    assert stats["resumed_from"] == resume_at
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert stats["losses"] == ref_stats["losses"]
    assert not list(folder.glob("checkpoint-*"))  # finished: the checkpoints are gone, the adapter is cached
    again, st = TR.train(model, [1], random_chunks(), r, folder)
    assert st["cached"] and all(torch.equal(ref[k], again[k]) for k in ref)


def test_a_damaged_checkpoint_is_ignored(tmp_path):
    model = tiny_model("llama", num_layers=4)
    r = Recipe(steps=4, rank=2, seq_len=24, batch=2, checkpoint_every=2)
    ref, _ = TR.train(model, [1], random_chunks(), r)
    with pytest.raises(Crash):
        TR.train(model, [1], random_chunks(), r, tmp_path, progress=lambda s, n, m: (_ for _ in ()).throw(Crash)
                 if s == 3 else None)
    ck = tmp_path / "checkpoint-2.pt"
    ck.write_bytes(ck.read_bytes()[:-10])  # torn
    got, stats = TR.train(model, [1], random_chunks(), r, tmp_path)
    assert stats["resumed_from"] == 0 and all(torch.equal(ref[k], got[k]) for k in ref)


# ----------------------------------------------------------------------------------------- the measurement
def test_recovered_share_and_its_paired_ci():
    assert recovered_share({"base": 10, "pruned": 20, "healed": 14, "base_finetuned": 9}) == pytest.approx(0.5)
    assert recovered_share({"base": 10, "pruned": 10, "healed": 9, "base_finetuned": 9}) is None
    rng = np.random.default_rng(0)
    counts = np.full(40, 100)
    base = rng.normal(300, 20, 40)
    nll = {"base": base, "pruned": base + 60, "healed": base + 25, "base_finetuned": base - 5}
    out = compare(nll, counts)
    want = 1 - (out["ppl"]["healed"] - out["ppl"]["base_finetuned"]) / (out["ppl"]["pruned"] - out["ppl"]["base"])
    assert out["recovered"] == pytest.approx(want)
    lo, hi = out["recovered_ci"]
    assert lo < out["recovered"] < hi and hi - lo < 0.05  # paired: the shared window noise cancels
    assert out["delta_pct"]["healed_vs_base_finetuned"]["tie"] is False


def test_heal_uses_the_same_recipe_and_text_for_the_control(stories, small_corpus, cache_dir, monkeypatch):
    calls = []
    real = TR.train

    def spy(model, removed, chunks, recipe, folder=None, progress=None, should_stop=None):
        calls.append((list(removed), chunks, recipe))
        return real(model, removed, chunks, recipe, folder, progress, should_stop)

    monkeypatch.setattr(TR, "train", spy)
    seen = []
    setup = HealSetup(corpus=small_corpus, evaluator=EV, identity=stories.identity)
    r = heal(stories.model, stories.tokenizer, [1, 3], SMALL, setup, RunHooks(progress=lambda d, t, m: seen.append((d, t))))
    (rem_h, text_h, rec_h), (rem_c, text_c, rec_c) = calls
    assert rem_h == [1, 3] and rem_c == [] and rec_h == rec_c == SMALL and torch.equal(text_h, text_c)
    assert seen[-1] == (2 * SMALL.steps + 4, 2 * SMALL.steps + 4)
    d = r.to_dict()
    assert set(d["ppl"]) == {"base", "pruned", "healed", "base_finetuned"}
    assert d["recipe"]["tokens_seen"] == SMALL.steps * SMALL.batch * SMALL.seq_len and d["recipe"]["seed"] == 0
    assert d["removed"] == [1, 3] and d["seconds"] > 0 and d["contract"]["evaluator"]["name"] == "tiny"
    assert r.ppl["pruned"] > r.ppl["base"]
    assert r.recovered == pytest.approx(recovered_share(r.ppl))
    assert r.recovered_ci[0] <= r.recovered <= r.recovered_ci[1]
    # cached: a second run trains nothing and gives the same numbers
    calls.clear()
    r2 = heal(stories.model, stories.tokenizer, [1, 3], SMALL, setup)
    assert all(v["cached"] for v in r2.training.values()) and r2.ppl == r.ppl


def test_zero_steps_heal_equals_the_pruned_model(stories, small_corpus):
    r = heal(stories.model, stories.tokenizer, [2], Recipe(steps=0, seq_len=32),
             HealSetup(corpus=small_corpus, evaluator=EV, use_cache=False))
    assert r.ppl["healed"] == r.ppl["pruned"] and r.ppl["base_finetuned"] == r.ppl["base"]
    assert r.recovered == 0.0


def test_merged_export_reloads_with_equallogits(stories, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    r = Recipe(steps=3, rank=2, seq_len=24, batch=2, lr=1e-2)
    state, _ = TR.train(stories.model, [1, 3], random_chunks(vocab=500), r)
    out = export_healed(stories.model, [1, 3], r, state, tmp_path / "healed", stories.tokenizer, stories.identity)
    x = random_chunks(vocab=500, n=2, t=30, seed=2)
    mine = logits(TR.healed_model(stories.model, [1, 3], r, state), x)
    again = AutoModelForCausalLM.from_pretrained(out).eval()
    assert again.config.num_hidden_layers == 3 and torch.equal(logits(again, x), mine)
    assert not torch.allclose(mine, logits(pruned_copy(stories.model, [1, 3]), x))  # the LoRA did something
    rec = json.loads((out / "swapkl_heal.json").read_text())
    assert rec["removed"] == [1, 3] and rec["kept"] == [0, 2, 4] and rec["recipe"]["steps"] == 3
    base = TR.private_copy(stories.model, [1, 3])
    via_adapter = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    torch.testing.assert_close(logits(via_adapter, x), mine, rtol=1e-4, atol=1e-4)  # unmerged: rounding


# ----------------------------------------------------------------------------------------- the command
def _main_error(capsys, *args) -> str:
    """``swapkl.commands.cli.main`` in-process: exit 2 and one ``error: ...`` line, no traceback."""
    from swapkl.commands.cli import main

    assert main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_cli_hostile_input(stories_path, wikitext_path, tmp_path, cache_dir, capsys):
    import re

    m, w = stories_path, wikitext_path
    assert_user_error(run_cli("heal", m, cache=tmp_path / "c", process=True), "--removed LAYERS or --method")  # a real process
    cases = [(("--removed", "1", "--method", "bi", "--n", "1"), "one of them"),
             (("--removed", "x"), "--removed wants"), (("--method", "nope", "--n", "1"), "nope"),
             (("--method", "bi"), "--n N"), (("--removed", "1", "--steps", "-3"), "--steps"),
             (("--removed", "1", "--lr", "0"), "--lr"), (("--removed", "1", "--qlora"), "CUDA|bitsandbytes|QLoRA"),
             (("--removed", "1", "--eval-text", w, "--train-text", w), "is the evaluation text"),
             (("--removed", "1", "--train-text", tmp_path / "missing.txt"), "no such text file"),
             (("--removed", "1", "--out", m), "source model folder"),
             (("--removed", "1", "--json", tmp_path), "is a folder"),
             (("--removed", "9", "--eval-text", w, "--max-words", "300"), "out of range")]
    for args, pattern in cases:
        line = _main_error(capsys, "heal", m, *args)
        assert re.search(pattern, line), (args, line)
    # every case was refused before training: no training state, no adapter (test_cli_end_to_end shows they land
    # under <cache>/heal/ when a heal runs)
    written = [p.relative_to(cache_dir) for p in cache_dir.rglob("*") if p.is_file()]
    assert [p for p in written if p.parts[0] == "heal" or p.suffix == ".pt"] == [], written


def test_cli_end_to_end(stories_path, small_corpus, tmp_path, cache_dir, capsys):
    from swapkl.commands.cli import main

    text = tmp_path / "eval.txt"
    text.write_text(" ".join(small_corpus.words))
    out, js = tmp_path / "healed", tmp_path / "h.json"
    args = ["heal", str(stories_path), "--removed", "1,3", "--steps", "3", "--seq-len", "32", "--batch", "2",
            "--eval-text", str(text), "--max-words", "300", "--out", str(out), "--json", str(js)]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    d = json.loads(js.read_text())
    assert {"removed", "ppl", "recovered", "recovered_ci", "recipe", "seconds", "contract"} <= set(d)
    assert d["recipe"]["steps"] == 3 and d["recipe"]["tokens_seen"] == 3 * 2 * 32
    assert (out / "model.safetensors").is_file() and (out / "adapter" / "adapter_config.json").is_file()
    assert "recovers" in stdout and "contract:" in stdout and "healing: LoRA r8" in stdout
    # a heal that ran keeps its adapter under <cache>/heal/ (where test_cli_hostile_input looks for leftovers)
    assert [p for p in (cache_dir / "heal").rglob("*") if p.is_file()]
    assert main(args[:-4] + ["--json", str(js)]) == 0  # again: both adapters come from the cache
    assert all(v["cached"] for v in json.loads(js.read_text())["training"].values())


def test_method_set_is_the_methods_own_choice(stories, small_corpus):
    from swapkl.healing.heal import chosen_set
    from swapkl.removal.selection import select
    from swapkl.errors import SwapklError
    from swapkl.removal.plan import RemovalPlan

    L = stories.num_layers
    d = np.full((L, L), np.nan)
    for i in range(L - 1):
        d[i, i + 1] = d[i + 1, i] = [0.5, 0.1, 0.3, 0.9][i]
    scores = {"interchange": d, "replacement": d[::-1, ::-1].copy()}
    for method in ("interchange", "replacement"):
        got, sel = chosen_set(stories.model, stories.tokenizer, method, 2, scores,
                              RemovalPlan(2, spacing=0, evaluator=EV), small_corpus)
        assert got == select(scores[method], 2, spacing=0)[-1] and sel["method"] == method and sel["n"] == 2
    with pytest.raises(SwapklError, match="seeded"):
        chosen_set(stories.model, stories.tokenizer, "random", 1, scores, RemovalPlan(1, evaluator=EV), small_corpus)
    with pytest.raises(SwapklError, match="budget 3 is larger"):  # one line from the selection rule
        chosen_set(stories.model, stories.tokenizer, "interchange", 3, scores, RemovalPlan(3, spacing=1, evaluator=EV),
                   small_corpus)
