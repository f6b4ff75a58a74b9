"""A heal, measured honestly: the base, the pruned model, the healed model and the base fine-tuned with the same
recipe on the same text (the control), all on the same evaluation windows (docs/healing.md).

:func:`heal` runs it (every piece cached: the base and pruned evaluations in the removal memo, each adapter under
``<cache>/heal/``), :func:`chosen_set` takes the set a removal method picks (the methods' own code, through the
registry), :func:`export_healed` writes the merged healed model and its adapter.
"""
from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from swapkl import __version__
from swapkl.errors import SwapklError
from swapkl.healing import bridged as B
from swapkl.healing import text as T
from swapkl.healing import train as TR
from swapkl.healing.recipe import Recipe, training_key
from swapkl.healing.result import ROLES, HealResult, compare
from swapkl.model import architectures as arch
from swapkl.measure import evaluate as E
from swapkl.removal import methods as M
from swapkl.measure.memo import EvalMemo, disk_memo
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.repair.bridge import bridged_model
from swapkl.scoring.corpora import load_corpus
from swapkl.store import atomic_write_text
from swapkl.surgery.blocks import pruned_copy, validate_remove
from swapkl.surgery.outputs import check_output_dir, write_model_folder
from swapkl.surgery.prune import source_folders

HEAL_FILE = "swapkl_heal.json"


def chosen_set(model, tokenizer, method: str, n: int, scores: dict | None, plan: RemovalPlan, corpus, *,
               memo: EvalMemo | None = None, hooks: RunHooks | None = None) -> tuple[list[int], dict]:
    """The set of ``n`` layers that removal method ``method`` chooses under ``plan`` (its own code, via the registry,
    with the context :meth:`~swapkl.removal.plan.CheckedPlan.context` gives every run of the plan: its candidates,
    boundary, spacing, partners, per-method parameters and unit), so the set is the one ``removal_curves`` shows for
    ``method`` at ``n`` under the same plan; and its settings.  ``scores``: the swap-KL matrices a guided method
    reads; ``corpus``: the calibration and evaluation text.  Seeded methods and merges are refused (give the set
    with ``removed``)."""
    from swapkl.removal.curves import plan_evaluator

    (spec,) = M.resolve([method], scores) if method not in M.GROUPS else (None,)
    if spec is None:
        raise SwapklError(f"--method wants one method, not the group '{method}'")
    if spec.seeded:
        raise SwapklError(f"method '{method}' is seeded (a different set per seed); give the set with --removed")
    plan = plan.with_(methods=(method,), budget=n)
    checked = plan.check(arch.locate(model).num_layers, scores)
    ctx = checked.context(model, tokenizer, hooks, corpus=corpus, evaluator=plan_evaluator(plan),
                          memo=memo or EvalMemo())
    out = spec.func(ctx, n)
    if out.variant is not None:
        raise SwapklError(f"method '{method}' merges layers; healing takes plain removal (give --removed)")
    if len(out.sets) < n:
        raise SwapklError(f"method '{method}' stops after {len(out.sets)} layers; use --n {len(out.sets)} or less")
    return sorted(int(i) for i in out.sets[n - 1]), {"method": method, "n": n, "settings": out.settings}


def _eval_key(corpus, ev) -> str:
    # the removal-curves runner's text key: base and pruned evaluations are shared with `swapkl curves`
    return f"test:{getattr(corpus, 'sha256', '?')}:{ev.max_words}:{ev.window}:{ev.stride}:{ev.drop_first_target}"


def check_qlora(recipe: Recipe) -> None:
    """With ``recipe.qlora``: one line unless CUDA and bitsandbytes are present (:mod:`swapkl.healing.qlora`)."""
    if recipe.qlora:
        from swapkl.healing.qlora import check_available

        check_available()


def training_text(model, tokenizer, corpus, recipe: Recipe, train_path=None, scoring_corpus=None,
                  prompts: int = 16, tokens: int = 64, prompt_seed: int = 0, avoid=()) -> T.TrainText:
    """The training text (the corpus's training region minus the ``avoid`` windows, or the file ``train_path``
    checked against the evaluation corpus and the scoring corpus) after checking the model's context fits
    ``recipe.seq_len``."""
    arch.check_context(model, recipe.seq_len, f"--seq-len {recipe.seq_len}", "use --seq-len {limit} or less")
    if train_path:
        others = [("evaluation text", corpus)]
        if scoring_corpus is not None and scoring_corpus.sha256 != corpus.sha256:
            others.append(("scoring corpus", scoring_corpus))
        return T.file_train_text(train_path, tokenizer, recipe.seq_len, others)
    return T.corpus_train_text(corpus, tokenizer, recipe.seq_len, prompts, tokens, prompt_seed, avoid)


@dataclass(frozen=True)
class HealSetup:
    """What a heal is measured and trained on: ``corpus`` (evaluation text, its evaluation region, and unless
    ``train_path`` is given the training text, its training region, :mod:`swapkl.healing.text`; None = the built-in
    corpus), ``evaluator`` (``matched``, ``standard`` or an :class:`~swapkl.measure.evaluate.Evaluator`), the
    ``scoring_corpus`` and its ``prompts`` × ``tokens`` from ``prompt_seed`` (kept out of the training text),
    ``identity`` (names the weights: the disk memo and the result), ``use_cache`` (the evaluation memo and the
    adapters on disk) and ``heldout``: a corpus of a second text domain that no run trains on
    (:func:`heldout_ids`), where the four models are also measured (``HealResult.held_out``).  The repair the heal
    starts from is the plan's (:func:`heal`'s ``plan``), not the setup's."""

    corpus: object = None
    evaluator: object = "matched"
    train_path: object = None
    scoring_corpus: object = None
    prompts: int = 16
    tokens: int = 64
    prompt_seed: int = 0
    identity: dict | None = None
    use_cache: bool = True
    heldout: object = None


def heal(model, tokenizer, removed: Sequence[int], recipe: Recipe, setup: HealSetup | None = None,
         hooks: RunHooks | None = None, *, plan: RemovalPlan | None = None, selection: dict | None = None,
         keep_states: dict | None = None, shared: dict | None = None) -> HealResult:
    """Heal ``model`` without ``removed`` with ``recipe`` and measure it against the control (module docstring), on
    the texts and evaluator of ``setup`` (:class:`HealSetup`).  ``hooks.progress(done, total, message)``: units are
    training updates plus one per evaluation; ``hooks.should_stop()`` → :class:`~swapkl.errors.ComputeInterrupted`
    (training resumes on the next call).  ``selection``: how ``removed`` was chosen (recorded).  ``keep_states``: a
    dict that receives the two adapter states (for export; the ``kd`` control's is ``{}``: it is the base itself).
    ``shared``: a dict kept across calls with the same model, texts and recipe (training text, fingerprint, memo,
    adapters, teacher: the control trains once; :func:`swapkl.healing.multi.heal_curves`).  ``plan``: the removal
    plan the set comes from; with ``plan.repair == "bridge"`` the heal starts from the bridged model of
    ``plan.bridge_settings`` (:mod:`swapkl.healing.bridged`)."""
    setup = setup if setup is not None else HealSetup()
    hooks = hooks if hooks is not None else RunHooks()
    corpus, identity, use_cache, heldout = setup.corpus, setup.identity, setup.use_cache, setup.heldout
    progress, should_stop = hooks.progress, hooks.should_stop
    t0 = time.perf_counter()
    recipe.validate()
    check_qlora(recipe)
    L = arch.locate(model).num_layers
    removed = validate_remove(removed, L)
    corpus = corpus if corpus is not None else load_corpus()
    ev = E.get_evaluator(setup.evaluator)
    arch.check_context(model, ev.window, f"the '{ev.name}' evaluator's window of {ev.window} tokens",
                       "use an evaluator whose window is at most {limit} tokens")
    texts = _texts(corpus, heldout, tokenizer, ev)
    shared = shared if shared is not None else {}
    repair = plan.bridge_settings if plan is not None and plan.repair == "bridge" else None
    hb = B.prepare(shared, model, tokenizer, corpus, removed, recipe, setup, repair)
    if "text" not in shared:
        shared["text"] = training_text(model, tokenizer, corpus, recipe, setup.train_path, setup.scoring_corpus,
                                       setup.prompts, setup.tokens, setup.prompt_seed,
                                       shared["bridger"].avoid_windows() if hb is not None else ())
    memo = _session(shared, model, identity, use_cache)
    tt, fp = shared["text"], shared["fingerprint"]
    teacher = _teacher(shared, model, recipe, fp, use_cache)
    ticks = _Ticks(progress, 2 * recipe.steps + (4 + (hb is not None)) * len(texts))

    def measure(role, rem, make, suffix=""):
        built = []  # the model, built on the first evaluation the memo does not have

        def once():
            if not built:
                built.append(make())
            return built[0]

        for name, (key, ids) in texts.items():
            res[name][role] = memo.get(key + suffix, rem, lambda ids=ids: E.evaluate_ppl(
                once(), ids, ev.window, ev.stride, ev.drop_first_target, should_stop=should_stop))
            ticks.tick(f"{role} PPL {res[name][role].ppl:.4g}" + ("" if name == "eval" else f" ({name})"))

    res = {name: {} for name in texts}
    measure("base", (), lambda: model)
    measure("pruned", removed, lambda: pruned_copy(model, removed))
    if hb is not None:  # the bridged model before any training: what the heal starts from
        measure("bridged", removed, lambda: bridged_model(model, list(hb.bridges)), f"|bridge:{fp}:{hb.key()}")
    states, training = {}, {}
    for role, rem in (("healed", removed), ("base_finetuned", [])):
        if role == "base_finetuned" and recipe.objective == "kd":  # the KD control is the identity: no training
            states[role], training[role] = {}, _kd_control(res, ticks.tick, recipe.steps + len(texts))
            continue
        br = hb.bridges if hb is not None and rem else None
        rec = recipe.for_set(rem)
        tkey = training_key(tt.key, hb.key() if br else None)
        folder = TR.heal_dir(fp, rem, rec, tkey) if use_cache else None
        kw = {"teacher": teacher} if teacher is not None else {}
        train = functools.partial(TR.train, model, rem, tt.chunks, rec, folder, ticks.training(role), should_stop,
                                  **kw, **({"bridges": br} if br else {}))
        states[role], training[role] = _trained(shared, (fp, tuple(rem), rec.key(), tkey), train)
        ticks.trained(recipe.steps)
        measure(role, rem, lambda rem=rem, role=role, br=br, rec=rec: TR.healed_model(
            model, rem, rec, states[role], bridges=br), f"|heal:{fp}:{rec.key()}:{tkey}")
    if teacher is not None:
        training["healed"] = dict(training["healed"], kd_topk_check=_topk_check(model, removed, tt.chunks, recipe, hb))
    if keep_states is not None:
        keep_states.update(states, **({"healed": B.BridgedState(states["healed"], hb.bridges)} if hb else {}))
    ident = identity or {"name_or_path": getattr(model, "name_or_path", None), "num_layers": L}
    out = _result(removed, res, training, tt, _contract(ident, fp, ev, corpus, recipe), recipe, heldout,
                  selection, time.perf_counter() - t0)
    return B.record(out, hb, res) if hb is not None else out


class _Ticks:
    """A heal's progress, ``progress(done, total, message)``: units are training updates plus one per evaluation."""

    def __init__(self, progress: Callable | None, total: int):
        self.progress, self.total, self.done, self.start = progress, total, 0, 0

    def tick(self, msg: str, k: int = 1) -> None:
        self.done += k
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total, msg)

    def training(self, role: str) -> Callable:
        """The ``progress`` of :func:`~swapkl.healing.train.train` for ``role``: its step k is unit start + k."""
        self.start = self.done

        def step(k, steps, msg):
            self.done = self.start + k
            if self.progress is not None:
                self.progress(self.done, self.total, f"{role}: {msg}")
        return step

    def trained(self, steps: int) -> None:
        """After a training (or its cached adapter): all its ``steps`` units done."""
        self.done = self.start + steps


def _session(shared: dict, model, identity, use_cache: bool) -> EvalMemo:
    """The session's weights fingerprint and evaluation memo (set once per ``shared``); returns the memo."""
    if "fingerprint" not in shared:
        shared["fingerprint"] = TR.model_fingerprint(model)
    return shared.setdefault("memo", disk_memo(identity, kl=False) if use_cache else EvalMemo())


def _texts(corpus, heldout, tokenizer, ev) -> dict:
    """``{name: (memo text key, token ids)}`` of the evaluation windows and, with ``heldout``, the held-out text."""
    texts = {"eval": (_eval_key(corpus, ev), E.eval_ids(corpus, tokenizer, ev))}
    if heldout is not None:
        texts["held_out"] = (f"heldout:{heldout.sha256}:{ev.max_words}:{ev.window}:{ev.stride}:"
                             f"{ev.drop_first_target}", heldout_ids(heldout, tokenizer, ev))
    return texts


def _kd_control(res: dict, tick: Callable, units: int) -> dict:
    """The ``kd`` control: the base's evaluations stand for the fine-tuned base's (module constant's note)."""
    for r in res.values():
        r["base_finetuned"] = r["base"]
    tick("base_finetuned: the base itself (distilling the base toward itself is the identity)", units)
    return dict(KD_CONTROL_STATS)


def _result(removed, res: dict, training: dict, tt, contract: dict, recipe: Recipe, heldout, selection, seconds):
    cmp = {name: _compared(r) for name, r in res.items()}
    c, r0 = cmp["eval"], res["eval"]
    return HealResult(removed=removed, ppl=c["ppl"], ppl_ci=c["ppl_ci"], delta_pct=c["delta_pct"],
                      recovered=c["recovered"], recovered_ci=c["recovered_ci"], recipe=recipe.to_dict(),
                      training=training, contract=contract, seconds=seconds, selection=selection or {"given": removed},
                      train_text=dict(tt.description, label=_text_label(tt.description), key=tt.key),
                      windows={"counts": r0["base"].counts.tolist(), **{r: r0[r].nll.tolist() for r in ROLES}},
                      held_out=_held_out(heldout, cmp.get("held_out"), res.get("held_out")),
                      notes=[KD_CONTROL_NOTE] if recipe.objective == "kd" else [])


#: what a ``kd`` heal says about its control (the fine-tuned base)
KD_CONTROL_NOTE = ("the control of a kd heal is the unpruned base itself: distilling the base toward itself is the "
                   "identity (zero loss, zero gradient), so 'fine-tuned base' = base")
KD_CONTROL_STATS = {"identity": True, "note": KD_CONTROL_NOTE, "steps": 0, "seconds": 0.0, "loss_first": 0.0,
                    "loss_last": 0.0, "losses": [], "trainable_params": 0, "cached": False, "resumed_from": 0}


def heldout_ids(corpus, tokenizer, ev):
    """Token ids (1-D) of a second-domain text for held-out perplexity: its first ``ev.max_words`` words, the
    whole text when shorter (no part of it is trained on, scored or calibrated on, unlike the evaluation corpus,
    so it has no regions).  Raises :class:`SwapklError` when it is shorter than one evaluation window."""
    import torch

    ids = torch.as_tensor(tokenizer(" ".join(corpus.words[:ev.max_words]))["input_ids"], dtype=torch.long).reshape(-1)
    if ids.numel() < ev.window:
        raise SwapklError(f"held-out text '{corpus.name}' gives {ids.numel()} tokens, fewer than one "
                          f"{ev.window}-token evaluation window")
    return ids


def _compared(res: dict) -> dict:
    for role in ROLES:
        if not (res[role].counts == res["base"].counts).all():
            raise SwapklError("internal: the four evaluations are not on the same windows")
    return compare({r: res[r].nll for r in ROLES}, res["base"].counts)


def _held_out(corpus, cmp: dict | None, res: dict | None) -> dict:
    if corpus is None:
        return {}
    return {"corpus": corpus.describe(), "label": corpus.label, "ppl": cmp["ppl"], "ppl_ci": cmp["ppl_ci"],
            "delta_pct": cmp["delta_pct"], "recovered": cmp["recovered"], "recovered_ci": cmp["recovered_ci"],
            "windows": {"counts": res["base"].counts.tolist(), **{r: res[r].nll.tolist() for r in ROLES}}}


def _teacher(shared: dict, model, recipe: Recipe, fp: str, use_cache: bool):
    """The run's top-k teacher (one per session and (T, k)), on disk under the heal cache unless ``use_cache`` is
    off; None for the ``lm`` objective."""
    if not recipe.distills:
        return None
    from swapkl.healing.teacher import Teacher, teacher_dir

    key = ("teacher", recipe.temperature, recipe.top_k)
    if key not in shared:
        folder = teacher_dir(fp, recipe.temperature, recipe.top_k) if use_cache else None
        shared[key] = Teacher(model, recipe.temperature, recipe.top_k, folder)
    return shared[key]


def _topk_check(model, removed, chunks, recipe: Recipe, hb=None) -> dict:
    """:func:`swapkl.healing.teacher.check_topk` of the student's start (the pruned model, or with ``hb`` the bridged
    one) against the teacher on the first two chunks."""
    import torch

    from swapkl.healing.teacher import check_topk

    x = chunks[:2].to(next(model.parameters()).device)
    with torch.no_grad():
        t = model(input_ids=x, use_cache=False).logits
        start = bridged_model(model, list(hb.bridges)) if hb is not None else pruned_copy(model, removed)
        s = start(input_ids=x, use_cache=False).logits
    return check_topk(t, s, recipe.temperature, recipe.top_k)


def _contract(ident: dict, fp: str, ev, corpus, recipe: Recipe) -> dict:
    """What every number of a heal was computed under: model, weights fingerprint, evaluator, corpus, recipe."""
    return {"model": ident, "model_fingerprint": fp, "evaluator": ev.to_dict(), "corpus": corpus.describe(),
            "corpus_label": corpus.label, "recipe_line": recipe.describe(), "recipe_key": recipe.key(),
            "swapkl_version": __version__}


def _trained(shared: dict, key: tuple, train: Callable) -> tuple[dict, dict]:
    """(adapter state, stats) of ``key`` trained earlier in this session (stats marked cached), else ``train()``."""
    adapters = shared.setdefault("adapters", {})
    if key in adapters:
        state, stats = adapters[key]
        return state, dict(stats, cached=True)
    adapters[key] = train()
    return adapters[key]


def _text_label(d: dict) -> str:
    c = d.get("corpus") or {}
    if d.get("source") == "file":
        return f"{c.get('label', '?')} (whole file, {d.get('chunks')} chunks of {d.get('seq_len')} tokens)"
    bridge = ", bridge calibration windows" if d.get("bridge_calibration_windows") else ""
    return (f"{c.get('label', '?')}, training region ({d.get('chunks')} chunks of {d.get('seq_len')} tokens after "
            f"{d.get('calib_reserve_words')} calibration words, scoring prompts{bridge} excluded)")


class WorseHealError(SwapklError):
    """A healed model measured worse than the pruned model it heals, refused at export (docs/healing.md)."""


def check_gate(result: HealResult | None, force: bool = False) -> None:
    """The gate before any export: raise :class:`WorseHealError` (one line) when ``result`` says the healed model's
    perplexity is above the pruned model's (:meth:`HealResult.worse`) and ``force`` is off."""
    line = result.gate_line() if result is not None else None
    if line and not force:
        raise WorseHealError(f"{line}; not exported (--force exports it anyway)")


def export_healed(model, removed, recipe: Recipe, state: dict, out, tokenizer=None, identity: dict | None = None,
                  force: bool = False, record: dict | None = None, result: HealResult | None = None) -> Path:
    """Write the merged healed model (LoRA folded into the weights; ``last-k``: the trained tensors in place) to
    ``out`` as a Hugging Face folder with ``swapkl_heal.json``, and the LoRA adapter alone as a peft folder in
    ``out/adapter/``.  ``result``: the heal's measurement, gated first (:func:`check_gate`: nothing is written
    for a heal that made the model worse unless ``force``).  ``out`` is checked like ``prune --out`` (never the
    source folder; a non-empty one only with ``force``).  A ``--repair bridge`` heal's ``state`` is a
    :class:`swapkl.healing.bridged.BridgedState` (its ``bridges``: folded ones only,
    :func:`swapkl.healing.bridged.check_exportable`)."""
    check_gate(result, force)
    bridges = getattr(state, "bridges", None)
    B.check_exportable(bridges)
    out = check_output_dir(out, "--out", force=force, protected=source_folders(model, identity),
                           force_hint="--force")
    L = arch.locate(model).num_layers
    rec = {"tool": "swapkl", "swapkl_version": __version__, "source": identity, "removed": sorted(removed),
           "kept": [i for i in range(L) if i not in set(removed)], "recipe": recipe.to_dict(), **(record or {})}

    def write(folder: Path) -> None:
        adapter = None if bridges and recipe.part == "bridge" else folder / "adapter"
        healed = TR.healed_model(model, removed, recipe, state, adapter_dir=adapter, bridges=bridges)
        healed.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        atomic_write_text(folder / HEAL_FILE, json.dumps(rec, indent=2, default=str))

    return write_model_folder(out, write)
