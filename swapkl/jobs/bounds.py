"""The demo bounds of the request kinds that carry their own settings: a heal (:func:`check_heal`), a repair after
removal (:func:`check_repair`) and a study (:func:`check_study`).  Each takes the server's
:class:`~swapkl.jobs.policy.Policy` and raises :class:`~swapkl.errors.PolicyError` naming the bound it passed."""
from __future__ import annotations

from swapkl.errors import PolicyError

#: demo mode: calibration tokens of a bridge after removal, and the blocks a last-k heal trains in full, at most
DEMO_MAX_BRIDGE_TOKENS = 16_384
DEMO_MAX_LAST_K = 4


def check_heal(self, request) -> None:
    """A healing request (:class:`~swapkl.jobs.requests.HealRequest`) against policy ``self`` in demo mode
    (training runs on the server's CPU): offered deterministic methods only, n up to ``max_budget``, at most
    ``max_heal_sets`` heals, a recipe of at most ``max_heal_steps`` updates, ``max_heal_tokens`` training tokens and
    rank ``max_heal_rank``, no QLoRA, the server's evaluator.  A bound passed: :class:`PolicyError` naming it."""
    if not self.demo:
        return
    from swapkl.healing.multi import MERGING  # torch-free
    from swapkl.removal import methods as M  # the registry: torch-free

    for m in request.methods:
        spec = M.find(m)
        if spec is None or not spec.offered or spec.seeded or m in M.GROUPS or m in MERGING:
            raise PolicyError(f"this demo server heals only the sets of its offered deterministic methods; "
                              f"not '{m}'")
    if not request.methods or not request.ns:
        raise PolicyError("choose at least one method and one n to heal")
    if max(request.ns) > self.max_budget:
        raise PolicyError(f"this demo server removes at most {self.max_budget} layers; n = {max(request.ns)} "
                          "asked")
    sets = len(request.methods) * len(request.ns)
    if sets > self.max_heal_sets:
        raise PolicyError(f"this demo server heals at most {self.max_heal_sets} sets per request (methods x n); "
                          f"{sets} asked")
    r = request.recipe
    tokens = int(r["steps"]) * int(r["batch"]) * int(r["seq_len"])
    if int(r["steps"]) > self.max_heal_steps:
        raise PolicyError(f"this demo server trains at most {self.max_heal_steps} steps per heal; "
                          f"{r['steps']} asked")
    if tokens > self.max_heal_tokens:
        raise PolicyError(f"this demo server trains on at most {self.max_heal_tokens} tokens per heal (steps x "
                          f"batch x sequence length); {r['steps']} x {r['batch']} x {r['seq_len']} = {tokens}")
    if int(r["rank"]) > self.max_heal_rank:
        raise PolicyError(f"this demo server allows LoRA rank at most {self.max_heal_rank}; {r['rank']} asked")
    if r.get("qlora"):
        raise PolicyError("this demo server has no QLoRA (it needs CUDA and bitsandbytes)")
    check_repair(request)  # a heal from the bridged model fits the same bridge
    if r.get("part") == "last-k" and int(r.get("last_k") or 0) > DEMO_MAX_LAST_K:
        raise PolicyError(f"this demo server trains at most the last {DEMO_MAX_LAST_K} blocks in full; "
                          f"k = {r['last_k']} asked")
    if request.evaluator is not None:
        raise PolicyError("this demo server evaluates healing with its own evaluator (matched)")
    if getattr(request, "tasks", ()) or getattr(request, "include_path", None) is not None:
        self.check_tasks(request)  # task accuracy after healing: the task panel's bounds


def check_repair(request) -> None:
    """An analysis's (a heal's, an evidence's) repair after removal in demo mode: at most
    :data:`DEMO_MAX_BRIDGE_TOKENS` calibration tokens (the fit streams them through the model; every setting is checked again by the plan)."""
    tokens = (getattr(request, "bridge", None) or {}).get("calib_tokens")
    if getattr(request, "repair", "none") != "none" and tokens is not None and int(tokens) > DEMO_MAX_BRIDGE_TOKENS:
        raise PolicyError(f"this demo server fits a bridge on at most {DEMO_MAX_BRIDGE_TOKENS} calibration tokens; "
                          f"{tokens} asked")


def check_study(pol, request) -> None:
    """A study in demo mode: allow-listed models only, the server's held-out text, the budget and bootstrap bounds
    of an evidence request (5 x its stability bound: the study's CIs are the agreement's)."""
    if request.plan.eval_text:
        raise PolicyError("this demo server uses its own held-out text; a file cannot be chosen")
    pol.check_contract(request.plan.contract)
    if len(request.plan.models) > pol.max_study_models:
        raise PolicyError(f"this demo server studies at most {pol.max_study_models} models at once; "
                          f"{len(request.plan.models)} given")
    words = int((request.plan.evaluator or {}).get("max_words") or 0)
    if not 1 <= words <= pol.max_heldout_words:
        raise PolicyError(f"this demo server evaluates at most {pol.max_heldout_words} held-out words per model; "
                          f"{words or 'the whole text'} asked")
    for m in request.plan.models:
        pol.check_model(m.spec, m.revision)
    if request.budget > pol.max_budget or request.plan.n_boot > 5 * pol.max_evidence_boot:
        raise PolicyError(f"this demo server removes at most {pol.max_budget} layers with at most "
                          f"{5 * pol.max_evidence_boot} bootstrap resamples")
