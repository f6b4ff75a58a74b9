"""Exporting one healed model of a finished heal job (the Healing panel's export): the heal of ``method``'s set at
``n`` re-run with the job's recipe and setup -- its adapter and evaluations come back from the disk cache the job
filled -- then written by :func:`swapkl.healing.heal.export_healed` as a merged Hugging Face folder (and the LoRA
adapter alone in ``adapter/``).  The gate first: a heal that made its model worse (:func:`swapkl.jobs.exports.heal_gate`)
is refused in one line unless ``anyway`` (the panel's "export anyway", ``heal --force``)."""
from __future__ import annotations

from pathlib import Path

from swapkl import heavy
from swapkl.errors import SwapklError
from swapkl.jobs.exports import export_name, heal_gate


def healed_entry(heal_curves, method: str, n: int) -> dict:
    """The entry of ``method`` at ``n`` in healed curves; one-line error when there is none."""
    entry = next((e for e in heal_curves.methods.get(method) or [] if int(e["n"]) == int(n)), None)
    if entry is None:
        raise SwapklError(f"no heal of {method} at n = {n} in this job")
    return entry


def heal_recipe(job) -> dict:
    """What a healed model's weights depend on besides the model and the set: the recipe (and its key), the
    repair it starts from, the contract's prompts and the evaluator (a healed export's part of
    :func:`swapkl.jobs.exports.export_key`)."""
    req, hc = job.request, job.heal
    return {"recipe_key": (hc.contract or {}).get("recipe_key"), "recipe": dict(req.recipe or {}),
            "repair": req.setup_fields(), "contract": req.contract.to_dict(), "evaluator": req.evaluator}


def healed_export_name(job, method: str, n: int) -> str:
    """``<model tail>-<fingerprint[:8]>-minus-<layers>-healed-<recipe key[:8]>-<hash>`` (made safe, the hash of the
    whole request with its heal recipe, :func:`swapkl.jobs.exports.export_name`): the folder a demo server writes,
    and the default name of a local export."""
    hc = job.heal
    entry = healed_entry(hc, method, n)
    ident = (hc.contract or {}).get("model") if isinstance((hc.contract or {}).get("model"), dict) else {}
    key = str((hc.contract or {}).get("recipe_key") or "")[:8]
    return export_name(job.request, ident, entry["removed"], "hf", heal=heal_recipe(job), tag=f"-healed-{key}")


def export_healed_model(manager, job, method: str, n: int, out, replace: bool = False, anyway: bool = False) -> Path:
    """Write the healed model of ``method`` at ``n`` of the heal job ``job`` to the folder ``out`` (an existing,
    non-empty one only with ``replace``); refused when the heal made it worse unless ``anyway``.  Returns the
    folder."""
    from swapkl.healing.heal import HealSetup, export_healed, heal  # deferred: torch, peft
    from swapkl.removal.curves import plan_evaluator
    from swapkl.scoring.corpora import load_corpus

    if job.request.kind != "heal" or job.heal is None:
        raise SwapklError("only a finished heal job exports a healed model")
    entry = healed_entry(job.heal, method, n)
    line = heal_gate(entry)
    if line and not anyway:
        raise SwapklError(f"{line}; not exported (tick 'export anyway' to export it)")
    req, c = job.request, job.request.contract
    ck = manager.checkpoint_for(req.model, req.revision, c.dtype, c.device)
    recipe = req.recipe_obj()
    setup = HealSetup(corpus=load_corpus(c.corpus), evaluator=plan_evaluator(req.removal_plan()), prompts=c.prompts,
                      tokens=c.tokens, prompt_seed=c.seed, identity=ck.identity)
    states: dict = {}
    result = heal(ck.model, ck.tokenizer, entry["removed"], recipe, setup, plan=req.removal_plan(), keep_states=states)
    if result.gate_line():  # measured again: the same numbers as the job's (same windows, cached adapter)
        if not anyway:
            raise SwapklError(f"{result.gate_line()}; not exported (tick 'export anyway' to export it)")
        result.notes.append(result.gate_line() + "; exported anyway")
    with heavy.exclusive():  # saving resolves lazy transformers modules while a job may load a model
        return export_healed(ck.model, result.removed, recipe, states["healed"], out, ck.tokenizer, ck.identity,
                             force=replace, record={"ppl": result.ppl, "recovered": result.recovered,
                                                    "contract": result.contract, "notes": result.notes,
                                                    "chosen_by": f"{method}, n={n} (healed curves)"},
                             result=None if anyway else result)
