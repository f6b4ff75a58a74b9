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
from swapkl.healing import text as T
from swapkl.healing import train as TR
from swapkl.healing.recipe import Recipe
from swapkl.healing.result import ROLES, HealResult, compare
from swapkl.model import architectures as arch
from swapkl.removal import evaluate as E
from swapkl.removal import methods as M
from swapkl.removal.memo import EvalMemo, disk_memo
from swapkl.removal.plan import RunHooks
from swapkl.removal.selection import default_candidates
from swapkl.scoring.corpora import load_corpus
from swapkl.store import atomic_write_text
from swapkl.surgery.blocks import pruned_copy, validate_remove
from swapkl.surgery.outputs import check_output_dir, write_model_folder
from swapkl.surgery.prune import source_folders

HEAL_FILE = "swapkl_heal.json"


def chosen_set(model, tokenizer, method: str, n: int, scores: dict | None, corpus, evaluator="matched", *,
               spacing: int = 1, memo: EvalMemo | None = None, should_stop=None) -> tuple[list[int], dict]:
    """The set of ``n`` layers that removal method ``method`` chooses (its own code, via the registry), and its
    settings.  Seeded methods and merges are refused (give the set with ``removed``)."""
    (spec,) = M.resolve([method], scores) if method not in M.GROUPS else (None,)
    if spec is None:
        raise SwapklError(f"--method wants one method, not the group '{method}'")
    if spec.seeded:
        raise SwapklError(f"method '{method}' is seeded (a different set per seed); give the set with --removed")
    L = arch.locate(model).num_layers
    ctx = M.MethodContext(model=model, tokenizer=tokenizer, scores=scores or {}, num_layers=L,
                          candidates=default_candidates(L), spacing=spacing, partners=None, corpus=corpus,
                          evaluator=E.get_evaluator(evaluator), seeds=[0], memo=memo or EvalMemo(),
                          should_stop=should_stop)
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
                  prompts: int = 16, tokens: int = 64, prompt_seed: int = 0) -> T.TrainText:
    """The training text (the corpus's training region, or the file ``train_path`` checked against the
    evaluation corpus and the scoring corpus) after checking the model's context fits ``recipe.seq_len``."""
    arch.check_context(model, recipe.seq_len, f"--seq-len {recipe.seq_len}", "use --seq-len {limit} or less")
    if train_path:
        others = [("evaluation text", corpus)]
        if scoring_corpus is not None and scoring_corpus.sha256 != corpus.sha256:
            others.append(("scoring corpus", scoring_corpus))
        return T.file_train_text(train_path, tokenizer, recipe.seq_len, others)
    return T.corpus_train_text(corpus, tokenizer, recipe.seq_len, prompts, tokens, prompt_seed)


@dataclass(frozen=True)
class HealSetup:
    """What a heal is measured and trained on: ``corpus`` (evaluation text, its evaluation region, and unless
    ``train_path`` is given the training text, its training region, :mod:`swapkl.healing.text`; None = the built-in
    corpus), ``evaluator`` (``matched``, ``standard`` or an :class:`~swapkl.removal.evaluate.Evaluator`), the
    ``scoring_corpus`` and its ``prompts`` × ``tokens`` from ``prompt_seed`` (kept out of the training text),
    ``identity`` (names the weights: the disk memo and the result) and ``use_cache`` (the evaluation memo and the
    adapters on disk)."""

    corpus: object = None
    evaluator: object = "matched"
    train_path: object = None
    scoring_corpus: object = None
    prompts: int = 16
    tokens: int = 64
    prompt_seed: int = 0
    identity: dict | None = None
    use_cache: bool = True


def heal(model, tokenizer, removed: Sequence[int], recipe: Recipe, setup: HealSetup | None = None,
         hooks: RunHooks | None = None, *, selection: dict | None = None, keep_states: dict | None = None,
         shared: dict | None = None) -> HealResult:
    """Heal ``model`` without ``removed`` with ``recipe`` and measure it against the control (module docstring), on
    the texts and evaluator of ``setup`` (:class:`HealSetup`).  ``hooks.progress(done, total, message)``: units are
    training updates plus one per evaluation; ``hooks.should_stop()`` → :class:`~swapkl.errors.ComputeInterrupted`
    (training resumes on the next call).  ``selection``: how ``removed`` was chosen (recorded).  ``keep_states``: a
    dict that receives the two adapter states (for export).  ``shared``: a dict kept across calls with the same
    model, texts and recipe (training text, fingerprint, memo, adapters: the control trains once;
    :func:`swapkl.healing.multi.heal_curves`)."""
    setup = setup if setup is not None else HealSetup()
    hooks = hooks if hooks is not None else RunHooks()
    corpus, identity, use_cache = setup.corpus, setup.identity, setup.use_cache
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
    ids = E.eval_ids(corpus, tokenizer, ev)
    shared = shared if shared is not None else {}
    if "text" not in shared:
        shared["text"] = training_text(model, tokenizer, corpus, recipe, setup.train_path, setup.scoring_corpus,
                                       setup.prompts, setup.tokens, setup.prompt_seed)
        shared["fingerprint"] = TR.model_fingerprint(model)
    memo = shared.setdefault("memo", disk_memo(identity, kl=False) if use_cache else EvalMemo())
    tt, fp = shared["text"], shared["fingerprint"]
    key = _eval_key(corpus, ev)
    total = 2 * recipe.steps + 4
    done = {"n": 0}

    def tick(msg, k=1):
        done["n"] += k
        if progress is not None:
            progress(min(done["n"], total), total, msg)

    def evaluate(m):
        return E.evaluate_ppl(m, ids, ev.window, ev.stride, ev.drop_first_target, should_stop=should_stop)

    res = {"base": memo.get(key, (), lambda: evaluate(model))}
    tick(f"base PPL {res['base'].ppl:.4g}")
    res["pruned"] = memo.get(key, removed, lambda: evaluate(pruned_copy(model, removed)))
    tick(f"pruned PPL {res['pruned'].ppl:.4g}")
    states, training = {}, {}
    for role, rem in (("healed", removed), ("base_finetuned", [])):
        folder = TR.heal_dir(fp, rem, recipe, tt.key) if use_cache else None
        base_done = done["n"]

        def step_progress(step, steps, msg, role=role, base_done=base_done):
            done["n"] = base_done + step
            if progress is not None:
                progress(done["n"], total, f"{role}: {msg}")

        train = functools.partial(TR.train, model, rem, tt.chunks, recipe, folder, step_progress, should_stop)
        states[role], training[role] = _trained(shared, (fp, tuple(rem), recipe.key(), tt.key), train)
        done["n"] = base_done + recipe.steps
        hkey = f"{key}|heal:{fp}:{recipe.key()}:{tt.key}"
        res[role] = memo.get(hkey, rem, lambda rem=rem, role=role: evaluate(
            TR.healed_model(model, rem, recipe, states[role])))
        tick(f"{role} PPL {res[role].ppl:.4g}")
    if keep_states is not None:
        keep_states.update(states)
    for role in ROLES:
        if not (res[role].counts == res["base"].counts).all():
            raise SwapklError("internal: the four evaluations are not on the same windows")
    cmp = compare({r: res[r].nll for r in ROLES}, res["base"].counts)
    ident = identity or {"name_or_path": getattr(model, "name_or_path", None), "num_layers": L}
    tt_desc = dict(tt.description, label=_text_label(tt.description), key=tt.key)
    contract = _contract(ident, fp, ev, corpus, recipe)
    return HealResult(removed=removed, ppl=cmp["ppl"], ppl_ci=cmp["ppl_ci"], delta_pct=cmp["delta_pct"],
                      recovered=cmp["recovered"], recovered_ci=cmp["recovered_ci"], recipe=recipe.to_dict(),
                      training=training, train_text=tt_desc, contract=contract, seconds=time.perf_counter() - t0,
                      selection=selection or {"given": removed},
                      windows={"counts": res["base"].counts.tolist(), **{r: res[r].nll.tolist() for r in ROLES}})


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
    return (f"{c.get('label', '?')}, training region ({d.get('chunks')} chunks of {d.get('seq_len')} tokens after "
            f"{d.get('calib_reserve_words')} calibration words, scoring prompts excluded)")


def export_healed(model, removed, recipe: Recipe, state: dict, out, tokenizer=None, identity: dict | None = None,
                  force: bool = False, record: dict | None = None) -> Path:
    """Write the merged healed model (LoRA folded into the weights) to ``out`` as a Hugging Face folder with
    ``swapkl_heal.json``, and the adapter alone as a peft folder in ``out/adapter/``.  ``out`` is checked like
    ``prune --out`` (never the source folder; a non-empty one only with ``force``)."""
    out = check_output_dir(out, "--out", force=force, protected=source_folders(model, identity),
                           force_hint="--force")
    L = arch.locate(model).num_layers
    rec = {"tool": "swapkl", "swapkl_version": __version__, "source": identity, "removed": sorted(removed),
           "kept": [i for i in range(L) if i not in set(removed)], "recipe": recipe.to_dict(), **(record or {})}

    def write(folder: Path) -> None:
        healed = TR.healed_model(model, removed, recipe, state, adapter_dir=folder / "adapter")
        healed.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        atomic_write_text(folder / HEAL_FILE, json.dumps(rec, indent=2, default=str))

    return write_model_folder(out, write)
