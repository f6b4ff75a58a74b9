"""Healing after a linear bridge (swapkl.healing.bridged): ``--repair bridge`` starts the heal from the bridged model
(a 0-step heal is it, logits equal), its calibration windows are kept out of the training text, ``--train bridge``
trains the matrices from their least-squares fit with LoRA (trainable count LoRA + Σd², gradients reach W, a KD heal
toward the bridged model itself has zero loss and gradient at step 0), resumes to identical weights, exports the
folded form as an ordinary checkpoint and refuses the residual one.  Tiny models and stories260K, a few steps."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.healing import bridged as B
from swapkl.healing import train as TR
from swapkl.healing.heal import HealSetup, export_healed, heal
from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator, eval_ids, evaluate_ppl
from swapkl.removal.plan import RemovalPlan
from swapkl.repair.bridge import bridged_model
from swapkl.repair.calibration import CalibrationText, fit_bridges
from conftest import tiny_model
from support.tensors import logits

EV = Evaluator("tiny", 300, 128, 64)
BRIDGE = {"calib_tokens": 512, "calib_window": 64}
#: the plan a bridged heal starts from: its repair, with BRIDGE's settings
BRIDGED = RemovalPlan(1, repair="bridge", bridge=BRIDGE)


def _chunks(n=8, t=24, seed=3, vocab=96):
    return torch.randint(1, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def _bridges(model, spans, form):
    fits = fit_bridges(model, CalibrationText(_chunks(), [], {"tokens": 192}), spans, form)
    return [fits[s] for s in spans]


def _bridger(ck, corpus):
    """The heal's bridges of BRIDGE: calibration text outside the heal's scoring prompts (16 × 64 tokens, seed 0)."""
    from swapkl.contract import Contract
    from swapkl.repair.bridger import Bridger

    return Bridger(ck.model, ck.tokenizer, corpus, BRIDGE, Contract(prompts=16, tokens=64, seed=0))


# ----------------------------------------------------------------------------------------- --repair bridge
def test_zero_step_heal_with_a_bridge_is_the_bridged_model(stories, small_corpus):
    ks = {}
    r0 = Recipe(steps=0, seq_len=32)
    setup = HealSetup(corpus=small_corpus, evaluator=EV, use_cache=False)
    r = heal(stories.model, stories.tokenizer, [2], r0, setup, plan=BRIDGED, keep_states=ks)
    (b,) = ks["healed"].bridges
    assert (b.start, b.end, b.form) == (2, 3, "folded")
    # the fit is the plain one on the same calibration text
    calib = _bridger(stories, small_corpus)
    assert np.array_equal(b.W, fit_bridges(stories.model, calib.calib, [(2, 3)], "folded")[(2, 3)].W)
    x = _chunks(n=2, t=30, vocab=500)
    healed = TR.healed_model(stories.model, [2], r0, ks["healed"], bridges=ks["healed"].bridges)
    assert torch.equal(logits(healed, x), logits(bridged_model(stories.model, [b]), x))
    rows = r.repair["eval"]["rows"]
    plain = evaluate_ppl(bridged_model(stories.model, [b]), eval_ids(small_corpus, stories.tokenizer, EV), EV.window,
                         EV.stride, EV.drop_first_target)
    assert rows["bridged"]["ppl"] == pytest.approx(plain.ppl, rel=1e-9) == pytest.approx(r.ppl["healed"], rel=1e-9)
    assert rows["raw"]["ppl"] == r.ppl["pruned"] and rows["healed"]["ppl"] == r.ppl["healed"]
    assert r.repair["eval"]["healed_vs_bridged"]["value"] == pytest.approx(0.0, abs=1e-9)
    assert rows["raw"]["delta_pct"]["value"] == pytest.approx(100 * (r.ppl["pruned"] / r.ppl["base"] - 1))
    rec = 1 - (plain.ppl - r.ppl["base"]) / (r.ppl["pruned"] - r.ppl["base"])
    assert r.repair["eval"]["recovered_by_bridge"] == pytest.approx(rec)
    # the contract records the bridge and its calibration; the training text was cut around the calibration windows
    assert r.contract["repair"]["settings"]["calib_tokens"] == 512 and r.contract["repair"]["calibration"]["windows"] == 8
    win = calib.avoid_windows()
    assert [tuple(w) for w in r.train_text["bridge_calibration_windows"]] == win
    assert "repair: linear bridge (folded)" in " ".join(r.provenance().extra)


def test_training_text_avoids_the_calibration_windows(stories, small_corpus):
    from swapkl.healing import text as T

    calib = _bridger(stories, small_corpus)
    win = calib.avoid_windows()
    plain = T.corpus_train_text(small_corpus, stories.tokenizer, 32)
    tt = T.corpus_train_text(small_corpus, stories.tokenizer, 32, avoid=win)
    touches = [s for s in plain.spans if any(s[0] < b + n and b < s[1] for b, n in win)]
    assert touches and tt.spans == [s for s in plain.spans if s not in touches]
    with pytest.raises(T.TrainTextError, match="overlaps bridge calibration window"):
        T.check_disjoint(plain, plain.description["calib_reserve_tokens"], [], calib_windows=win)


# ----------------------------------------------------------------------------------------- --train bridge
@pytest.mark.parametrize("form", ["folded", "residual"])
def test_train_bridge_starts_at_the_fit_and_counts_lora_plus_d_squared(form):
    model = tiny_model("llama", num_layers=5)
    br = _bridges(model, [(2, 4)], form)
    r = Recipe(steps=0, rank=2, seq_len=24, batch=2, part="bridge")
    pm = TR.trainable_model(model, [2, 3], r, br)
    (w,) = [p for n, p in TR.trainable(pm) if n.endswith(B.MAP_NAME + ".W")]
    assert torch.equal(w.detach(), torch.as_tensor(br[0].W, dtype=torch.float32))
    lora = sum(p.numel() for _, p in TR.trainable(TR.trainable_model(model, [2, 3], Recipe(rank=2), br)))
    state, stats = TR.train(model, [2, 3], _chunks(), r, bridges=br)
    assert stats["trainable_params"] == lora + 32 * 32 == lora + B.trainable_count(br)
    x = _chunks(n=2, t=20, seed=5)
    ref = logits(bridged_model(model, br), x)
    torch.testing.assert_close(logits(TR.healed_model(model, [2, 3], r, state, bridges=br), x), ref,
                               rtol=1e-5, atol=1e-5)  # W in float32 vs the float64 fold: rounding only
    # one step moves W (gradients reach it)
    r1 = Recipe(steps=1, rank=2, seq_len=24, batch=2, part="bridge", lr=1e-2, warmup=0)
    s1, _ = TR.train(model, [2, 3], _chunks(), r1, bridges=br)
    key = next(k for k in s1 if k.endswith(B.MAP_NAME + ".W"))
    assert not torch.equal(s1[key], state[key])


def test_kd_toward_the_bridged_model_itself_has_zero_loss_and_gradient():
    from swapkl.healing.teacher import Teacher

    model = tiny_model("llama", num_layers=5)
    br = _bridges(model, [(2, 4)], "residual")
    r = Recipe(steps=1, rank=2, seq_len=24, batch=2, part="bridge", objective="kd", top_k=8)
    pm = TR.trainable_model(model, [2, 3], r, br)
    x = _chunks(n=2, t=24, seed=7)
    loss = TR.loss_of(pm, x, r, Teacher(bridged_model(model, br), r.temperature, r.top_k))
    loss.backward()
    assert abs(float(loss.detach())) < 1e-6
    (w,) = [p for n, p in TR.trainable(pm) if n.endswith(B.MAP_NAME + ".W")]
    assert w.grad is not None and float(w.grad.abs().max()) < 1e-5


class Crash(Exception):
    """A process killed mid-run."""


@pytest.mark.parametrize("how", ["crash", "stop"])
def test_an_interrupted_bridge_training_resumes_to_identical_weights(tmp_path, how):
    model = tiny_model("llama", num_layers=5)
    br = _bridges(model, [(2, 4)], "folded")
    r = Recipe(steps=5, rank=2, seq_len=24, batch=2, dropout=0.1, checkpoint_every=2, part="bridge", lr=1e-2)
    ref, ref_stats = TR.train(model, [2, 3], _chunks(), r, tmp_path / "ref", bridges=br)
    folder = tmp_path / "run"
    if how == "crash":
        def progress(step, steps, msg):
            if step == 3:
                raise Crash
        with pytest.raises(Crash):
            TR.train(model, [2, 3], _chunks(), r, folder, progress=progress, bridges=br)
        resume_at = 2
    else:
        calls = iter(range(100))
        with pytest.raises(ComputeInterrupted, match="step 3"):
            TR.train(model, [2, 3], _chunks(), r, folder, should_stop=lambda: next(calls) == 3, bridges=br)
        resume_at = 3
    got, stats = TR.train(model, [2, 3], _chunks(), r, folder, bridges=br)
    assert stats["resumed_from"] == resume_at and stats["losses"] == ref_stats["losses"]
    assert set(got) == set(ref) and any(k.endswith(B.MAP_NAME + ".W") for k in got)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_folded_bridge_training_exports_an_ordinary_checkpoint(stories, tmp_path):
    from transformers import AutoModelForCausalLM

    br = _bridges(stories.model, [(2, 3)], "folded")
    r = Recipe(steps=2, rank=2, seq_len=24, batch=2, part="bridge", lr=1e-2, warmup=0)
    state, _ = TR.train(stories.model, [2], _chunks(vocab=500), r, bridges=br)
    out = export_healed(stories.model, [2], r, B.BridgedState(state, br), tmp_path / "healed", stories.tokenizer,
                        stories.identity)
    x = _chunks(n=2, t=30, seed=2, vocab=500)
    mine = logits(TR.healed_model(stories.model, [2], r, state, bridges=br), x)
    again = AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(logits(again, x), mine, rtol=1e-5, atol=1e-5)
    unmerged = TR.trainable_model(stories.model, [2], r, br)
    TR.load_adapter_state(unmerged, state)
    torch.testing.assert_close(logits(unmerged.eval(), x), mine, rtol=1e-4, atol=1e-4)  # the fold is exact
    res = _bridges(stories.model, [(2, 3)], "residual")
    with pytest.raises(SwapklError, match="residual form.*--form folded"):
        export_healed(stories.model, [2], r, B.BridgedState(state, res), tmp_path / "r", stories.tokenizer,
                      stories.identity)


def test_train_bridge_needs_the_repair(stories, small_corpus):
    with pytest.raises(SwapklError, match="--train bridge .* needs --repair bridge"):
        heal(stories.model, stories.tokenizer, [2], Recipe(steps=0, seq_len=32, part="bridge"),
             HealSetup(corpus=small_corpus, evaluator=EV, use_cache=False))


# ----------------------------------------------------------------------------------------- the command
def test_cli_refusals(stories_path, capsys, tmp_path):
    from test_heal import _main_error

    m = stories_path
    for args, pattern in ((("--train", "bridge"), "needs --repair bridge"),
                          (("--calib-tokens", "512"), "go with --repair bridge"),
                          (("--repair", "bridge", "--form", "residual", "--out", tmp_path / "o"), "--form folded"),
                          (("--repair", "bridge", "--calib-tokens", "8", "--calib-window", "64"), "--calib-tokens")):
        line = _main_error(capsys, "heal", m, "--removed", "2", *args)
        assert pattern in line, (args, line)


def test_cli_heal_after_a_bridge(stories_path, small_corpus, tmp_path, cache_dir, capsys):
    import json

    from swapkl.commands.cli import main

    text = tmp_path / "eval.txt"
    text.write_text(" ".join(small_corpus.words))
    out, js = tmp_path / "healed", tmp_path / "h.json"
    args = ["heal", str(stories_path), "--removed", "2", "--steps", "2", "--seq-len", "32", "--batch", "2",
            "--eval-text", str(text), "--max-words", "300", "--repair", "bridge", "--train", "bridge",
            "--calib-tokens", "512", "--calib-window", "64", "--out", str(out), "--json", str(js)]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    d = json.loads(js.read_text())
    assert d["repair"]["settings"] == {"form": "folded", "calib_tokens": 512, "calib_window": 64, "calib_seed": 0,
                                       "ridge": d["repair"]["settings"]["ridge"]}
    assert d["repair"]["trainable_bridge_params"] == 64 * 64  # stories260K: d = 64, one span
    per_block = d["training"]["base_finetuned"]["trainable_params"] // 5  # the control: LoRA on 5 blocks
    assert d["training"]["base_finetuned"]["trained"] == "every linear layer of the kept blocks"  # no bridge there
    assert d["training"]["healed"]["trainable_params"] == 4 * per_block + 64 ** 2  # LoRA on the 4 kept + Σ d²
    for label in ("raw cut", "bridged (before training)", "healed"):
        assert f"ΔPPL {label}" in stdout
    assert "the bridge alone recovers" in stdout and "+ bridge W" in stdout
    assert (out / "model.safetensors").is_file() and not (out / "adapter").exists()
    assert "swapkl_bridge" not in (out / "model.safetensors").read_bytes().decode("latin-1")


def test_kd_heal_after_a_bridge_checks_its_teacher_against_the_bridged_start(stories, small_corpus):
    from swapkl.healing.teacher import check_topk

    r = Recipe(steps=1, rank=2, seq_len=32, batch=2, objective="kd", top_k=16, part="bridge")
    setup = HealSetup(corpus=small_corpus, evaluator=EV, use_cache=False)
    ks = {}
    res = heal(stories.model, stories.tokenizer, [2], r, setup, plan=BRIDGED, keep_states=ks)
    chk = res.training["healed"]["kd_topk_check"]
    from swapkl.healing.heal import training_text

    tt = training_text(stories.model, stories.tokenizer, small_corpus, r,
                       avoid=_bridger(stories, small_corpus).avoid_windows())
    x = tt.chunks[:2]
    want = check_topk(logits(stories.model, x), logits(bridged_model(stories.model, list(ks["healed"].bridges)), x),
                      r.temperature, r.top_k)
    assert chk == want
    assert res.ppl["base_finetuned"] == res.ppl["base"]  # the kd control is the base itself, repair or not


def test_an_interrupted_bridged_heal_resumes_to_the_uninterrupted_result(stories, small_corpus, tmp_path, monkeypatch):
    from swapkl.removal.plan import RunHooks

    r = Recipe(steps=4, rank=2, seq_len=32, batch=2, lr=3e-3, warmup=1, checkpoint_every=2, part="bridge")
    setup = HealSetup(corpus=small_corpus, evaluator=EV, identity=stories.identity)
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "a"))
    ref = heal(stories.model, stories.tokenizer, [2], r, setup, plan=BRIDGED)
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "b"))
    seen = []  # stop once the healed model's third update is done

    def progress(d, t, msg):
        seen.append("healed: step 3/" in msg)
    with pytest.raises(ComputeInterrupted, match="step 3"):
        heal(stories.model, stories.tokenizer, [2], r, setup, RunHooks(progress=progress, should_stop=lambda: any(seen)),
             plan=BRIDGED)
    got = heal(stories.model, stories.tokenizer, [2], r, setup, plan=BRIDGED)
    assert got.training["healed"]["resumed_from"] == 3 and got.ppl == ref.ppl
    assert got.repair["eval"]["rows"] == ref.repair["eval"]["rows"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])  # Linear and GPT-2 Conv1D projections
def test_two_spans_of_mixed_forms_train_together(kind):
    from swapkl.repair.forms import resolve as span_forms

    model = tiny_model(kind, num_layers=5)
    spans = [(0, 1), (3, 5)]  # block 0 has no MLP before it: residual; [3, 5) runs to the end: folded into block 2
    forms = span_forms(model, spans, "folded")
    assert [forms[s][0] for s in spans] == ["residual", "folded"]
    br = [_bridges(model, [s], forms[s][0])[0] for s in spans]
    for part, extra in (("lora", 0), ("bridge", 2 * 32 * 32), ("last-k", None)):
        r = Recipe(steps=0, rank=2, seq_len=24, batch=2, part=part, last_k=1)
        state, stats = TR.train(model, [0, 3, 4], _chunks(), r, bridges=br)
        if extra is not None:
            lora = sum(p.numel() for _, p in TR.trainable(TR.trainable_model(model, [0, 3, 4], Recipe(rank=2))))
            assert stats["trainable_params"] == lora + extra
        x = _chunks(n=2, t=20, seed=4)
        torch.testing.assert_close(logits(TR.healed_model(model, [0, 3, 4], r, state, bridges=br), x),
                                   logits(bridged_model(model, br), x), rtol=1e-5, atol=1e-5)
