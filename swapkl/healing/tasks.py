"""Task accuracy after healing (docs/healing.md, "Task accuracy after healing"): lm-evaluation-harness on the
fine-tuned base (the control) and on each method's healed model at each n of healed curves, next to the same
tasks before healing (the pruned model) and on the base.

The evaluation is the task runner ``swapkl tasks`` uses, :class:`swapkl.measure.task_runner.TaskRunner`
(``lm_eval.simple_evaluate`` on an ``HFLM`` around the in-memory model, :func:`swapkl.measure.lmeval.evaluate`), and
its cache (:mod:`swapkl.store`, kind
``lm-eval-task``): the base and the pruned models hit the entries ``swapkl tasks`` wrote (and write the ones it
reads), and a healed model's entry adds the heal to the key (the weights fingerprint, the recipe key, the training
text key).  The healed model is built by :func:`swapkl.healing.train.healed_model` from the adapter the heal
trained (kept in memory by :func:`~swapkl.healing.multi.heal_curves`, else read from the heal cache): the very
model whose perplexity the heal reports.

A heal after a linear bridge (``--repair bridge``, :mod:`swapkl.healing.bridged`) adds a third model per set: the
raw cut (``pruned``, the ``swapkl tasks`` entry), the bridged model the heal starts from (``bridged``,
:func:`swapkl.repair.bridge.bridged_model`) and the healed model (the bridged model, the LoRA merged and, with
``--train bridge``, the trained ``W``), as the perplexity rows of ``HealResult.repair``.  The bridged and healed
models' cache keys add the bridge's key (:meth:`~swapkl.healing.bridged.HealBridge.key`: settings, spans, forms,
calibration), so they never share an entry with the raw cut or with a heal without a bridge.
"""
from __future__ import annotations

import time

from swapkl import __version__
from swapkl.errors import SwapklError
from swapkl.healing.curves import HealCurves, set_key
from swapkl.healing.recipe import Recipe, training_key
from swapkl.healing.task_figures import FORMAT
from swapkl.measure import lmeval
from swapkl.measure.task_runner import TaskRunner, TaskSettings
from swapkl.removal.plan import RunHooks

# Deferred: swapkl.healing.train (torch, peft) is imported where an adapter is read or a healed model built.

EVALUATOR = "lm-eval simple_evaluate on HFLM(in-memory model: base, pruned copy, or pruned copy + merged LoRA)"
EVALUATOR_BRIDGED = ("lm-eval simple_evaluate on HFLM(in-memory model: base, pruned copy, bridged copy, or bridged "
                     "copy + merged LoRA and trained bridges)")


class _HealRunner(TaskRunner):
    """The task runner whose variants tagged ``{"heal": ...}`` are healed models: the adapter of that
    removed set merged into a private pruned copy (:func:`~swapkl.healing.train.healed_model`).  The tag is part of
    the cache key, so a healed model never shares an entry with its pruned model."""

    def __init__(self, *args, states: dict, recipe: Recipe, bridges: dict | None = None, **kw):
        super().__init__(*args, **kw)
        self.states, self.recipe, self.bridges = states, recipe, bridges or {}

    def _build(self, removed, merge):
        hb = self.bridges.get(set_key(removed)) if removed else None
        if merge is not None and "bridged" in merge:  # the bridged model the heal started from, before training
            from swapkl.repair.bridge import bridged_model

            return bridged_model(self.model, list(hb.bridges))
        if merge is None or "heal" not in merge:
            return super()._build(removed, merge)
        from swapkl.healing.train import healed_model

        return healed_model(self.model, removed, self.recipe.for_set(removed),
                            self.states[set_key(removed)], bridges=hb.bridges if hb is not None else None)


def heal_tag(hc: HealCurves, hb=None) -> dict:
    """What a healed model's cache key adds: the weights it was healed from, the recipe, the training text and,
    after a bridge ``hb`` (:class:`~swapkl.healing.bridged.HealBridge`), the bridge's key."""
    c = hc.contract
    return {"heal": {"fingerprint": c.get("model_fingerprint"), "recipe": c.get("recipe_key"),
                     "text": (hc.train_text or {}).get("key"), **({"bridge": hb.key()} if hb is not None else {})}}


def bridged_tag(hc: HealCurves, hb) -> dict:
    """What the bridged model's cache key adds (the raw cut's key has no merge): the weights and the bridge's key."""
    return {"bridged": {"fingerprint": hc.contract.get("model_fingerprint"), "bridge": hb.key()}}


def heal_bridges(hc: HealCurves, bridges: dict | None) -> dict:
    """``{set_key: HealBridge}`` of every set of ``hc`` when its heals started from a bridge (the contract's
    ``repair``), from ``bridges`` (``{tuple(removed): HealBridge}``, the ``shared["bridges"]`` of the heal's session);
    ``{}`` without a repair.  Refused (one line) when a set's bridge is missing or was fitted with other settings."""
    rep = hc.contract.get("repair") or {}
    if not rep:
        return {}
    out = {}
    for rem in heal_sets(hc)[1:]:
        hb = (bridges or {}).get(tuple(rem))
        if hb is None:
            raise SwapklError(f"the bridges of removed {rem} are not in this session: task accuracy after a bridge "
                              "runs with the heal (swapkl heal --repair bridge --tasks T)")
        if hb.settings != rep.get("settings"):
            raise SwapklError(f"the bridges of removed {rem} were fitted with other settings than the heal's")
        out[set_key(rem)] = hb
    return out


def heal_sets(hc: HealCurves) -> list[list[int]]:
    """Every removed set healed in ``hc`` (each once, in the order of the curves), and ``[]`` for the control."""
    sets = {set_key(e["removed"]): sorted(int(i) for i in e["removed"]) for v in hc.methods.values() for e in v}
    return [[]] + [s for k, s in sets.items() if k]


def adapter_states(model, hc: HealCurves, recipe: Recipe, adapters: dict | None = None, hbs: dict | None = None) -> dict:
    """``{set_key: adapter state}`` of every set of ``hc`` and of the control (key ``""``): from ``adapters`` (the
    ``shared["adapters"]`` of :func:`~swapkl.healing.multi.heal_curves`), else from the heal cache.  ``hbs``:
    :func:`heal_bridges` (a bridged set's adapter is keyed by its bridge too).  Refused (one line) when ``model``
    is not the weights ``hc`` was healed from, or an adapter is in neither place."""
    from swapkl.healing import train as TR

    fp, rk, tk = hc.contract.get("model_fingerprint"), hc.contract.get("recipe_key"), (hc.train_text or {}).get("key")
    if recipe.key() != rk:
        raise SwapklError("the recipe is not the one these healed curves were trained with")
    if TR.model_fingerprint(model) != fp:
        raise SwapklError("this model is not the one these healed curves were healed from (weights fingerprint)")
    out = {}
    for rem in heal_sets(hc):
        if not rem and recipe.objective == "kd":  # the kd control is the base itself: nothing was trained
            out[set_key(rem)] = {}
            continue
        hb, rec = (hbs or {}).get(set_key(rem)), recipe.for_set(rem)
        tkey = training_key(tk, hb.key() if hb is not None else None)
        hit = (adapters or {}).get((fp, tuple(rem), rec.key(), tkey))
        if hit is None:
            cached = TR.read_cached(TR.heal_dir(fp, rem, rec, tkey), TR.ADAPTER_KIND, rec)
            if cached is None:
                what = f"removed {rem}" if rem else "the fine-tuned base (the control)"
                raise SwapklError(f"the adapter of {what} is not in the heal cache; rerun the heal with the cache on")
            hit = (cached[1], cached[0])
        out[set_key(rem)] = hit[0]
    return out


def _rows(v: dict) -> dict:
    return {"metrics": v["metrics"], "stderr": v["stderr"]}


def heal_task_accuracy(model, tokenizer, hc, settings: TaskSettings, recipe: Recipe | None = None, *,
                       adapters: dict | None = None, bridges: dict | None = None,
                       hooks: RunHooks | None = None) -> dict:
    """lm-eval tasks on the base, the fine-tuned base and, per method and n of the healed curves ``hc`` (a
    :class:`HealCurves` or its dict), the pruned and the healed model, run as ``settings`` says
    (:class:`~swapkl.measure.task_runner.TaskSettings`: task names, local YAMLs under ``include_path``, limit, few-shot
    count, batch size, cache; ``share_prefix`` does not apply).  ``recipe``: default the curves' own.

    Returns the JSON-able ``{"format", "model", "contract", "base", "base_finetuned", "methods": {method: [{"n",
    "removed", "pruned", "healed"}]}, "stats"}`` where each of ``base``, ``base_finetuned``, ``pruned``, ``healed``
    is ``{"metrics": {task: {metric: value}}, "stderr": {...}}`` under lm-eval's names; the contract holds the
    removal tasks contract (lm-eval version, task versions, limit, few-shot count) and the recipe.  ``adapters``:
    see :func:`adapter_states`.  Curves healed after a bridge (``--repair bridge``) need ``bridges`` (the heal
    session's ``shared["bridges"]``, :func:`heal_bridges`); each entry then adds ``bridged`` (the model the heal
    started from) beside ``pruned`` (the raw cut) and ``healed``, and the contract records the ``repair``.  ``hooks``: ``identity`` names the weights (cache key and result),
    ``progress(done, total, message)`` after each model, ``should_stop()`` →
    :class:`~swapkl.errors.ComputeInterrupted`."""
    hooks = hooks if hooks is not None else RunHooks()
    identity, include_path = hooks.identity, settings.include_path
    t0 = time.perf_counter()
    hc = hc if isinstance(hc, HealCurves) else HealCurves.from_dict(hc)
    recipe = recipe if recipe is not None else Recipe.from_dict(hc.recipe)
    ip = lmeval.check_include_path(include_path) if include_path else None
    tm, loaded = lmeval.load_tasks(ip, settings.tasks)
    if not loaded:
        raise SwapklError("task accuracy after healing needs at least one task")
    hbs = heal_bridges(hc, bridges)
    states = adapter_states(model, hc, recipe, adapters, hbs)
    sets = heal_sets(hc)
    run = _HealRunner(model, tokenizer, loaded, tm, identity=identity, settings=settings, hooks=hooks,
                      total=2 + (2 + bool(hbs)) * (len(sets) - 1), states=states, recipe=recipe, bridges=hbs)
    base = run.variant(())
    run.tick("base")
    out = {"format": FORMAT, "model": identity or {"name_or_path": getattr(model, "name_or_path", None)},
           "contract": _contract(hc, run, loaded, base, ip), "base": _rows(base),
           "base_finetuned": _rows(run.variant((), heal_tag(hc))), "methods": {}}
    run.tick("fine-tuned base")
    for m, entries in hc.methods.items():
        out["methods"][m] = []
        for e in entries:
            rem = sorted(int(i) for i in e["removed"])
            hb = hbs.get(set_key(rem))
            row = {"n": int(e["n"]), "removed": rem, "pruned": _rows(run.variant(rem))}
            run.tick(f"{m} n={e['n']} pruned")
            if hb is not None:
                row["bridged"] = _rows(run.variant(rem, bridged_tag(hc, hb)))
                run.tick(f"{m} n={e['n']} bridged")
            row["healed"] = _rows(run.variant(rem, heal_tag(hc, hb)))
            out["methods"][m].append(row)
            run.tick(f"{m} n={e['n']} healed")
    out["stats"] = dict(run.stats, seconds=time.perf_counter() - t0, swapkl_version=__version__)
    return out


def _contract(hc: HealCurves, run: TaskRunner, loaded: list, base: dict, ip) -> dict:
    rep = hc.contract.get("repair") or {}
    out = {"evaluator": EVALUATOR_BRIDGED if rep else EVALUATOR, "lm_eval_version": run.lm_eval_version,
           "limit": run.limit, "num_fewshot": run.num_fewshot, "batch_size": run.batch_size, "include_path": ip,
           "tasks": {t["name"]: {"versions": t["versions"], "config_sha": t["config_sha"],
                                 "output_types": t["output_types"], "chance": lmeval.chance(t, run.limit)}
                     for t in loaded},
           "n-shot": base["n-shot"], "n-samples": base["n-samples"],
           "recipe_line": hc.recipe_line(), "recipe_key": hc.contract.get("recipe_key"),
           "model_fingerprint": hc.contract.get("model_fingerprint"),
           "train_text": (hc.train_text or {}).get("label"), "healed_model": "the heal's adapter merged into a "
           "private pruned copy (healing.train.healed_model): the model whose perplexity the heal reports"}
    if rep:
        out["repair"] = {k: rep.get(k) for k in ("kind", "settings", "calibration")}
        out["pruned_model"] = "the raw cut (the swapkl tasks entry); 'bridged': the bridged model the heal starts from"
        out["healed_model"] = ("the bridged copy with the heal's LoRA merged and, for --train bridge, the trained "
                               "bridge matrices (healing.train.healed_model): the model whose perplexity the heal "
                               "reports")
    return out
