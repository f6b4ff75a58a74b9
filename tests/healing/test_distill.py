"""Healing by distillation (swapkl.healing.teacher, the kd / kd+lm objectives, the last-k trained part): the KD loss
equals a plain KL from full teacher logits, the top-k teacher stays within its documented bound, distilling the
base toward itself is the identity (zero loss, zero gradient, unchanged logits), an interrupted KD run resumes to
the same weights, and a kd heal's control is the base itself.  stories260K and tiny random models."""
from __future__ import annotations

import math

import pytest
import torch

from swapkl.errors import ComputeInterrupted, ContractError
from swapkl.healing import teacher as TE
from swapkl.healing import train as TR
from swapkl.healing.heal import KD_CONTROL_NOTE, HealSetup, heal
from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator
from swapkl.removal.plan import RunHooks
from swapkl.scoring.corpora import from_file
from swapkl.surgery.blocks import pruned_copy
from conftest import tiny_model
from support.tensors import logits

EV = Evaluator("tiny", 300, 128, 64)
HELDOUT = "tests/fixtures/data/heldout/american-speeches.txt"


def _plain_kl(t_logits, s_logits, temperature):
    """Mean over positions of Σ p log(p / q) × T², one position at a time in float64 with math (the reference)."""
    total, n = 0.0, 0
    for t_row, s_row in zip(t_logits.reshape(-1, t_logits.shape[-1]).tolist(),
                            s_logits.reshape(-1, s_logits.shape[-1]).tolist()):
        p = _softmax(t_row, temperature)
        q = _softmax(s_row, temperature)
        total += sum(pv * math.log(pv / qv) for pv, qv in zip(p, q) if pv > 0)
        n += 1
    return total / n * temperature ** 2


def _softmax(row, temperature):
    m = max(row)
    e = [math.exp((x - m) / temperature) for x in row]
    z = sum(e)
    return [x / z for x in e]


def _plain_coarse_kl(t_logits, s_logits, temperature, k):
    """The KL of the two distributions coarsened onto the teacher's top k + one tail bucket, and the bound's right
    side, p_tail × KL(p(.|tail) ‖ q(.|tail)), both averaged over positions × T² (float64, one position at a time)."""
    coarse, bound, n = 0.0, 0.0, 0
    for t_row, s_row in zip(t_logits.reshape(-1, t_logits.shape[-1]).tolist(),
                            s_logits.reshape(-1, s_logits.shape[-1]).tolist()):
        p, q = _softmax(t_row, temperature), _softmax(s_row, temperature)
        top = sorted(range(len(p)), key=lambda v: -p[v])[:k]
        rest = [v for v in range(len(p)) if v not in set(top)]
        coarse += sum(p[v] * math.log(p[v] / q[v]) for v in top)
        pt, qt = sum(p[v] for v in rest), sum(q[v] for v in rest)
        if rest and pt > 0:
            coarse += pt * math.log(pt / qt)
            bound += pt * sum(p[v] / pt * math.log((p[v] / pt) / (q[v] / qt)) for v in rest if p[v] > 0)
        n += 1
    return coarse / n * temperature ** 2, bound / n * temperature ** 2


def random_chunks(vocab=96, n=16, t=24, seed=0):
    return torch.randint(1, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------- the loss
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_kd_loss_equals_a_plain_kl_from_full_teacherlogits(temperature):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 5, 40, generator=g) * 3
    s = (torch.randn(2, 5, 40, generator=g) * 3).requires_grad_(True)
    loss = TE.kd_loss(s, TE.log_probs(t, temperature), temperature)
    assert float(loss.detach()) == pytest.approx(_plain_kl(t, s.detach(), temperature), rel=1e-5)
    loss.backward()
    # the analytic gradient equals autograd's through the plain formula (float64)
    s64 = s.detach().double().requires_grad_(True)
    p = torch.softmax(t.double() / temperature, -1)
    ref = (p * (p.log() - torch.log_softmax(s64 / temperature, -1))).sum(-1).mean() * temperature ** 2
    ref.backward()
    torch.testing.assert_close(s.grad.double(), s64.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("k", [1, 4, 16, 40])
def test_topk_teacher_is_the_coarsened_kl_within_the_documented_bound(k):
    g = torch.Generator().manual_seed(1)
    t, s = torch.randn(2, 6, 40, generator=g) * 2, torch.randn(2, 6, 40, generator=g) * 2
    temperature = 2.0
    tk = TE.top_k(TE.log_probs(t, temperature), k)
    sg = s.clone().requires_grad_(True)
    TE.kd_loss(sg, tk, temperature).backward()
    # its gradient equals autograd's through the plain coarsened KL (float64)
    s64 = s.double().requires_grad_(True)
    p = torch.softmax(t.double() / temperature, -1)
    logq = torch.log_softmax(s64 / temperature, -1)
    p_s, logq_s = p.gather(-1, tk.idx), logq.gather(-1, tk.idx)
    ref = (p_s * (p_s.log() - logq_s)).sum(-1)
    if k < 40:
        p_tail = 1 - p_s.sum(-1)
        ref = ref + p_tail * (p_tail.log() - torch.logsumexp(logq.scatter(-1, tk.idx, float("-inf")), -1))
    (ref.mean() * temperature ** 2).backward()
    torch.testing.assert_close(sg.grad.double(), s64.grad, rtol=1e-4, atol=1e-7)
    got = float(TE.kd_loss(s, tk, temperature))
    full = _plain_kl(t, s, temperature)
    coarse, bound = _plain_coarse_kl(t, s, temperature, k)
    assert got == pytest.approx(coarse, rel=1e-5, abs=1e-6)
    # the bound: KL − KL_k = p_tail × KL(p|tail ‖ q|tail) ≥ 0, and 0 when k covers the vocabulary
    assert full - got == pytest.approx(bound, rel=1e-4, abs=1e-5) and bound >= 0
    if k == 40:
        assert got == pytest.approx(full, rel=1e-5) and torch.isinf(tk.log_tail).all()
    chk = TE.check_topk(t, s, temperature, k)
    assert chk["kl_full"] == pytest.approx(full, rel=1e-5) and chk["kl_topk"] == pytest.approx(got, rel=1e-6)
    assert chk["gap"] >= -1e-6 and chk["positions"] == 12
    want_tail = [sum(sorted(_softmax(r, temperature))[:-k]) for r in t.reshape(-1, 40).tolist()]
    assert chk["tail_mass_mean"] == pytest.approx(sum(want_tail) / 12, abs=1e-6)


# ----------------------------------------------------------------------------------------- the identity
@pytest.mark.parametrize("part", ["lora", "last-k"])
@pytest.mark.parametrize("k", [8, 512])
def test_distilling_the_base_toward_itself_is_the_identity(stories, part, k):
    model = stories.model
    r = Recipe(steps=3, rank=2, seq_len=24, batch=2, lr=1e-2, warmup=0, objective="kd", part=part, last_k=2,
               top_k=k, temperature=2.0)
    x = random_chunks(vocab=500, n=4, t=24, seed=3)
    pm = TR.trainable_model(model, [], r)
    pm.train()
    loss = TR.loss_of(pm, x[:2], r, TE.Teacher(model, r.temperature, r.top_k))
    loss.backward()
    assert abs(float(loss.detach())) <= 1e-6
    grads = [p.grad for p in pm.parameters() if p.requires_grad]
    assert grads and max(float(gr.abs().max()) for gr in grads) <= 1e-7
    # a whole KD fine-tune of the base toward itself leaves its logits unchanged
    one = Recipe(**{**r.__dict__, "batch": 1})
    state, stats = TR.train(model, [], x, one)
    assert all(abs(v) <= 1e-6 for v in stats["losses"]) and len(stats["losses"]) == 3
    torch.testing.assert_close(logits(TR.healed_model(model, [], one, state), x), logits(model, x),
                               rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------- resume
class Crash(Exception):
    """A process killed mid-run (kill -9): nothing after the raise is written."""


@pytest.mark.parametrize("how", ["crash", "stop"])
@pytest.mark.parametrize("objective,part", [("kd", "lora"), ("kd+lm", "last-k")])
def test_an_interrupted_kd_run_resumes_to_identical_weights(tmp_path, how, objective, part):
    model = tiny_model("llama", num_layers=4)
    r = Recipe(steps=7, rank=2, seq_len=24, batch=2, dropout=0.1, checkpoint_every=2, schedule="cosine", lr=1e-2,
               objective=objective, part=part, last_k=2, top_k=8, temperature=2.0)
    chunks = random_chunks()
    ref, ref_stats = TR.train(model, [1], chunks, r, tmp_path / "ref")
    folder, tdir = tmp_path / "run", tmp_path / "teacher"
    first = TE.Teacher(model, r.temperature, r.top_k, tdir)
    if how == "crash":
        def progress(step, steps, msg):
            if step == 5:
                raise Crash  # after update 5: the last checkpoint is the one at step 4
        with pytest.raises(Crash):
            TR.train(model, [1], chunks, r, folder, progress=progress, teacher=first)
        resume_at = 4
    else:
        calls = iter(range(100))
        with pytest.raises(ComputeInterrupted, match="step 3"):
            TR.train(model, [1], chunks, r, folder, should_stop=lambda: next(calls) == 3, teacher=first)
        resume_at = 3
    seen = first.computed
    assert seen > 0 and len(list(tdir.glob("*.pt"))) == seen  # one teacher file per chunk used
    again = TE.Teacher(model, r.temperature, r.top_k, tdir)  # a new process: the teacher comes from the disk
    got, stats = TR.train(model, [1], chunks, r, folder, teacher=again)
    assert stats["resumed_from"] == resume_at and stats["objective"] == objective
    assert all(torch.equal(ref[k], got[k]) for k in ref) and set(ref) == set(got)
    assert stats["losses"] == ref_stats["losses"]
    assert again.computed + seen == ref_stats["teacher_chunks_computed"]  # nothing computed twice


def test_teacher_cache_reads_back_and_recomputes_a_damaged_file(tmp_path):
    model = tiny_model("llama", num_layers=4)
    x = random_chunks(n=3)
    a = TE.Teacher(model, 2.0, 8, tmp_path)
    first = a.batch(x)
    b = TE.Teacher(model, 2.0, 8, tmp_path)
    second = b.batch(x)
    assert b.computed == 0 and a.computed == 3
    for f in ("logp", "idx", "log_tail"):
        assert torch.equal(getattr(first, f), getattr(second, f))
    # the stored top-k is the top-k of the model's own log-probabilities at T, computed one chunk at a time
    want = TE.top_k(TE.log_probs(logits(model, x[:1]), 2.0), 8)
    assert torch.equal(first.logp[0], want.logp[0]) and torch.equal(first.idx[0], want.idx[0])
    victim = sorted(tmp_path.glob("*.pt"))[0]
    victim.write_bytes(victim.read_bytes()[:-7])  # torn: its checksum no longer matches
    c = TE.Teacher(model, 2.0, 8, tmp_path)
    assert torch.equal(c.batch(x).logp, first.logp) and c.computed == 1


# ----------------------------------------------------------------------------------------- recipe and parts
def test_recipe_keys_objectives_and_parts():
    lm = Recipe()
    assert Recipe(temperature=3.0, top_k=5, last_k=1).key() == lm.key()  # unused settings do not split the key
    keys = {Recipe(objective=o, part=p).key() for o in ("lm", "kd", "kd+lm") for p in ("lora", "last-k", "bridge")}
    assert len(keys) == 9
    assert Recipe(objective="kd", temperature=2.0).key() != Recipe(objective="kd").key()
    assert TR.heal_dir("f", [1], Recipe(objective="kd"), "t") != TR.heal_dir("f", [1], lm, "t")
    for bad, msg in ((dict(part="x"), "--train must be one of lora, last-k, bridge"), (dict(objective="x"), "--objective"),
                     (dict(part="last-k", qlora=True), "needs --train lora"), (dict(temperature=0.0), "--temperature"),
                     (dict(kd_weight=1.5), "--kd-weight"), (dict(top_k=0), "--top-k"), (dict(last_k=0), "--k")):
        with pytest.raises(ContractError, match=msg):
            Recipe(**bad).validate()
    assert "KD 0.5 + LM 0.5 T 2 top-64" in Recipe(objective="kd+lm", temperature=2.0).describe()
    assert Recipe(part="last-k", last_k=2).describe().startswith("last 2 blocks + lm_head")


def test_last_k_trains_the_last_blocks_and_lm_head_only(stories):
    model = stories.model
    r = Recipe(steps=3, seq_len=24, batch=2, lr=1e-2, warmup=0, part="last-k", last_k=2, objective="kd+lm", top_k=16)
    state, stats = TR.train(model, [1], random_chunks(vocab=500), r)
    pruned = pruned_copy(model, [1])  # kept blocks 0, 2, 3, 4 → the last two are the copy's blocks 2 and 3
    healed = TR.healed_model(model, [1], r, state)
    changed = {n for n, p in healed.named_parameters() if not torch.equal(p, dict(pruned.named_parameters())[n])}
    head = {"lm_head.weight"} if not model.config.tie_word_embeddings else {"model.embed_tokens.weight"}
    allowed = {n for n, _ in pruned.named_parameters() if n.startswith(("model.layers.2.", "model.layers.3."))} | head
    assert changed and changed <= allowed and head <= changed
    assert stats["trainable_params"] == sum(p.numel() for n, p in pruned.named_parameters() if n in allowed)
    assert stats["trained"] == "the last 2 kept blocks and lm_head, in full"
    with pytest.raises(ContractError, match="--k 5 is more than the 4 blocks"):
        TR.train(model, [1], random_chunks(vocab=500), Recipe(**{**r.__dict__, "last_k": 5}))


# ----------------------------------------------------------------------------------------- the heal
def test_kd_heal_control_is_the_base_and_heldout_domain_is_measured(stories, small_corpus, cache_dir):
    r = Recipe(steps=4, rank=2, seq_len=32, batch=2, lr=3e-3, warmup=1, objective="kd", top_k=16, temperature=2.0)
    heldout = from_file(HELDOUT)
    seen = []
    res = heal(stories.model, stories.tokenizer, [1, 3], r,
               HealSetup(corpus=small_corpus, evaluator=EV, identity=stories.identity, heldout=heldout),
               RunHooks(progress=lambda d, t, m: seen.append((d, t))))
    assert res.ppl["base_finetuned"] == res.ppl["base"] and res.training["base_finetuned"]["identity"]
    assert KD_CONTROL_NOTE in res.notes and "identity" in KD_CONTROL_NOTE
    assert seen[-1][0] == seen[-1][1]
    chk = res.training["healed"]["kd_topk_check"]
    assert chk["k"] == 16 and chk["gap"] >= -1e-5 and chk["kl_full"] > 0
    h = res.held_out
    assert h["label"] == heldout.label and set(h["ppl"]) == {"base", "pruned", "healed", "base_finetuned"}
    assert h["ppl"]["base_finetuned"] == h["ppl"]["base"] and h["ppl"]["pruned"] != h["ppl"]["healed"]
    # the held-out perplexity is the plain evaluator's on the first 300 words of the shipped text
    from swapkl.measure.evaluate import evaluate_ppl
    from swapkl.healing.heal import heldout_ids

    ids = heldout_ids(heldout, stories.tokenizer, EV)
    want = evaluate_ppl(pruned_copy(stories.model, [1, 3]), ids, EV.window, EV.stride).ppl
    assert h["ppl"]["pruned"] == pytest.approx(want, rel=1e-6)
    x = h["delta_pct"]["healed_vs_pruned"]
    assert x["value"] == pytest.approx(100 * (h["ppl"]["healed"] / h["ppl"]["pruned"] - 1))
    assert x["ci"][0] <= x["value"] <= x["ci"][1]
    # the kd heal and an lm heal of the same set never share an adapter folder
    again = heal(stories.model, stories.tokenizer, [1, 3], r,
                 HealSetup(corpus=small_corpus, evaluator=EV, identity=stories.identity))
    assert again.training["healed"]["cached"] and again.ppl == res.ppl
    lm = heal(stories.model, stories.tokenizer, [1, 3], Recipe(**{**r.__dict__, "objective": "lm"}),
              HealSetup(corpus=small_corpus, evaluator=EV, identity=stories.identity))
    assert not lm.training["healed"]["cached"] and lm.ppl["healed"] != res.ppl["healed"]
