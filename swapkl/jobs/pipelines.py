"""What a job computes, step by step (each step reports ``progress(done, total, what)`` through
:meth:`Job.tick` and polls :meth:`Job.should_stop`).

* :func:`run_analysis`: load the checkpoint; swap-KL on the **adjacent** pairs first (the regime verdict is
  available early; the partial :class:`~swapkl.scoring.results.SwapResult` is published after every pair); then the
  contract's wider pair set, reusing the adjacent pairs from the cache; with a bridge repair the third matrix
  (:func:`run_bridged`, kept as ``job.bridged``); then :func:`run_curves`.
* :func:`run_curves`: removal curves one method after the other with one shared evaluation memo, publishing a
  partial ``CurvesResult`` after each method (guided ones first).
* :func:`run_trajectory`: every checkpoint of a list (optionally training the demo model first).
* :func:`run_tasks`: swap-KL scores, then lm-eval task accuracy of the base model and each method's pruned model
  (:func:`swapkl.removal.tasks.task_accuracy`), publishing the partial result after every model.
* :func:`run_compare`: both models' swap-KL, then the transfer of the decision from A to B
  (:func:`swapkl.compare.result.compare`).
* :func:`run_heal`: swap-KL scores, then healed curves (:func:`swapkl.healing.multi.heal_curves`), publishing the
  partial curves after every heal.

The library's modules that import torch are imported inside these functions on purpose: importing
``swapkl.jobs`` (the dashboard does it before its first page is drawn) must not wait for torch.
"""
from __future__ import annotations

import functools

from swapkl.removal import methods as M
from swapkl.contract import Contract, pair_list
from swapkl.scoring.corpora import load_corpus
from swapkl.removal.checks import check_evaluator_context
from swapkl.removal.curves import disk_memo, removal_curves
from swapkl.removal.plan import RunHooks
from swapkl.trajectory.checkpoints import parse_checkpoints
from swapkl.trajectory.compute import Trajectory, compute_trajectory
from .job import Job
from .models import ModelCache
from .requests import AnalysisRequest, HealRequest, TasksRequest, TrajectoryRequest, task_settings


def engine_kw(ck, contract: Contract, n_pairs: int, chunks: int = 8) -> dict:
    """Engine limits that split a sweep into about ``chunks`` chunks of pairs (never more variants alive
    than the memory-based limit allows), so progress, partial results and cancel come several times per
    step instead of once at its end."""
    from swapkl.scoring.score import engine_limits  # deferred: torch

    lim = engine_limits(ck, contract.prompts, contract.tokens)
    per_chunk = max(2, -(-n_pairs // chunks))
    return {"max_live": max(3, min(lim["max_live"], 3 * per_chunk))}


def evaluator_of(req: AnalysisRequest):
    """The request's perplexity evaluator (``matched`` when it names none)."""
    from swapkl.measure.evaluate import Evaluator, get_evaluator  # deferred: torch

    return Evaluator.from_dict(req.evaluator) if req.evaluator else get_evaluator("matched")


def run_analysis(job: Job, models: ModelCache) -> None:
    from swapkl.scoring.score import score  # deferred: torch (looked up at call time, so tests can patch it)

    req: AnalysisRequest = job.request
    c = req.contract
    wider = c.pairs != "adjacent"
    bridged = req.repair == "bridge" and c.unit == "block"  # the third matrix replaces whole blocks
    steps = 2 + int(wider) + int(bridged) + int(req.wants_curves)
    job.phase(1, steps, f"loading {req.model}" + (f"@{req.revision}" if req.revision else ""))
    ck = models.get(req.model, req.revision, c.dtype, c.device)
    job.checkpoint = ck
    L = ck.num_layers
    job.note(f"loaded {ck.identity.get('display') or req.model}: {L} layers on {ck.device}")
    if req.wants_curves:  # an evaluator window beyond the model's context fails now, not after the scores
        check_evaluator_context(ck.model, evaluator_of(req), name=ck.identity.get("display"))

    def publish(res):
        job.result = res

    job.phase(2, steps, "swap-KL on the adjacent pairs (both protocols)")
    adjacent = pair_list("adjacent", L)
    adj = score(ck, c, progress=job.tick, should_stop=job.should_stop, on_partial=publish,
                pairs=adjacent, engine_kw=engine_kw(ck, c, len(adjacent)))
    job.result = adj
    full = adj
    if wider:
        job.phase(3, steps, f"swap-KL on the pair set {c.pairs} (adjacent pairs reused)")
        full = score(ck, c, progress=job.tick, should_stop=job.should_stop, on_partial=publish,
                     engine_kw=engine_kw(ck, c, len(c.pair_list(L))))
        job.result = full
    if bridged:
        job.phase(3 + int(wider), steps, "bridged swap-KL (each span replaced by its linear bridge)")
        job.bridged = run_bridged(job, ck, full)
    if req.wants_curves:
        job.phase(steps, steps, f"removal curves up to n = {req.budget}")
        run_curves(job, ck, full)


def run_bridged(job: Job, ck, res) -> dict:
    """The third matrix on the request's contract and the result's pairs, with the request's bridge settings
    (:func:`swapkl.repair.bridged_kl.bridged_scores`), as its dict (what the heatmaps page draws)."""
    from swapkl.repair.bridged_kl import bridged_scores  # deferred: torch
    from swapkl.repair.settings import BridgeSettings

    req: AnalysisRequest = job.request
    br = bridged_scores(ck, req.contract, BridgeSettings.from_dict(req.bridge), progress=job.tick, should_stop=job.should_stop,
                        pairs=list(res.pairs))
    return br.to_dict()


def run_curves(job: Job, ck, res) -> None:
    """The request's removal plan (:meth:`AnalysisRequest.removal_plan`: guided methods first) run once, each
    method's curve published as soon as it is measured (``on_curve``); progress counts evaluations against the
    plan's :meth:`~swapkl.removal.plan.RemovalPlan.expected_evaluations`."""
    req: AnalysisRequest = job.request
    plan = req.removal_plan()
    scores = res.protocol_scores()
    memo = disk_memo(ck.identity, kl=True)  # evaluations survive a cancel or a restart
    job.tick(0, plan.expected_evaluations(ck.num_layers, scores), "baseline perplexity")
    hooks = RunHooks(progress=job.tick, should_stop=job.should_stop, memo=memo, identity=ck.identity,
                     corpus=load_corpus(req.contract.corpus),
                     on_curve=lambda _name, partial: setattr(job, "curves", partial))
    hooks.contract = req.contract  # the scoring contract whose prompts a bridge's calibration text avoids
    job.curves = removal_curves(ck.model, ck.tokenizer, scores, plan, hooks)


def run_trajectory(job: Job, models: ModelCache) -> None:
    """Score every checkpoint of the list, each loaded through ``models``' gate (:meth:`ModelCache.load`); the
    demo trajectory's checkpoints are the server's own folder, trained here."""
    req: TrajectoryRequest = job.request
    steps = 2 if req.train_demo else 1
    if req.train_demo:
        from swapkl.trajectory import demo as demo_trajectory  # deferred: torch

        job.phase(1, 2, "training the demo model (GPT-NeoX, CPU, about 3 min)")
        demo_trajectory.train_demo_trajectory(req.checkpoints, progress=job.tick, should_stop=job.should_stop)
    if not req.train_demo:
        models.check_list(req.checkpoints)  # the list is text until the policy allows it to be read from disk
    specs = parse_checkpoints(req.checkpoints)
    n = len(specs)
    job.phase(steps, steps, f"trajectory: {n} checkpoints, pairs {req.contract.pairs}")
    results: list = []
    cur = {"k": 0}

    def on_checkpoint(k, spec, res):
        results.append(res)
        cur["k"] = k + 1
        job.trajectory = Trajectory(specs=specs, results=list(results), contract=req.contract.to_dict())
        job.result = res

    def prog(done, total, what):
        # progress over the whole list: finished checkpoints + the current one's fraction
        frac = done / total if total else 0.0
        job.tick(int(1000 * (cur["k"] + frac)), 1000 * n, what)

    job.trajectory = compute_trajectory(specs, req.contract, progress=prog, should_stop=job.should_stop,
                                        on_checkpoint=on_checkpoint,
                                        loader=functools.partial(models.load, own=req.train_demo))


def run_evidence(job: Job, models: ModelCache) -> None:
    """Ground truth, every signal, agreement and stability (:func:`swapkl.evidence.run.compute_evidence`); with the
    request's repair also the "after repair" part (its :class:`~swapkl.repair.settings.BridgeSettings`)."""
    from swapkl.evidence.run import compute_evidence  # deferred: torch-based modules behind it

    req = job.request
    c = req.contract
    settings = req.bridge_settings()  # bad settings fail here, before the model is loaded
    job.phase(1, 2, f"loading {req.model}" + (f"@{req.revision}" if req.revision else ""))
    ck = models.get(req.model, req.revision, c.dtype, c.device)
    job.checkpoint = ck
    ev = evaluator_of(req)
    check_evaluator_context(ck.model, ev, name=ck.identity.get("display"))
    rep = ", each block with its bridge" if settings is not None else ""
    job.phase(2, 2, f"evidence: swap-KL, ground truth per layer{rep}, signals, agreement, stability")
    job.evidence = compute_evidence(ck, c, ev, load_corpus(c.corpus), budget=req.budget, n_boot=5 * req.n_boot,
                                    n_stability=req.n_boot, progress=job.tick, should_stop=job.should_stop,
                                    repair=settings, tasks=req.task_settings())


def run_tasks(job: Job, models: ModelCache) -> None:
    from swapkl.removal.tasks import task_accuracy  # deferred: torch-based helpers
    from swapkl.scoring.score import score

    req: TasksRequest = job.request
    c = req.contract
    job.phase(1, 3, f"loading {req.model}" + (f"@{req.revision}" if req.revision else ""))
    ck = models.get(req.model, req.revision, c.dtype, c.device)
    job.checkpoint = ck
    job.phase(2, 3, f"swap-KL on the pair set {c.pairs} (the guided methods' scores)")
    res = score(ck, c, progress=job.tick, should_stop=job.should_stop,
                engine_kw=engine_kw(ck, c, len(c.pair_list(ck.num_layers))))
    job.result = res
    job.phase(3, 3, f"lm-eval task accuracy: {', '.join(req.tasks)}, n = 1..{req.budget}")
    plan = req.removal_plan()
    settings = task_settings(req)
    job.tasks = task_accuracy(ck.model, ck.tokenizer, res.protocol_scores(), plan, settings,
                              RunHooks(progress=job.tick, should_stop=job.should_stop, identity=ck.identity,
                                       corpus=load_corpus(c.corpus), on_partial=lambda r: setattr(job, "tasks", r)))


def run_heal(job: Job, models: ModelCache) -> None:
    """Healed curves (:func:`swapkl.healing.multi.heal_curves`): the guided methods' scores, then every set healed
    with the one recipe against one control, publishing the partial curves after each heal."""
    from swapkl.healing.heal import HealSetup  # deferred: torch, peft
    from swapkl.healing.multi import heal_curves
    from swapkl.scoring.score import score

    req: HealRequest = job.request
    c = req.contract
    steps = 4 if req.tasks else 3  # + task accuracy after healing
    job.phase(1, steps, f"loading {req.model}" + (f"@{req.revision}" if req.revision else ""))
    ck = models.get(req.model, req.revision, c.dtype, c.device)
    job.checkpoint = ck
    scores = None
    if any(M.get(m).needs for m in req.methods):
        job.phase(2, steps, f"swap-KL on the pair set {c.pairs} (the guided methods' sets)")
        res = score(ck, c, progress=job.tick, should_stop=job.should_stop,
                    engine_kw=engine_kw(ck, c, len(c.pair_list(ck.num_layers))))
        job.result = res
        scores = res.protocol_scores()
    recipe = req.recipe_obj()
    job.phase(3, steps, f"healing {', '.join(req.methods)} at n = {', '.join(map(str, req.ns))}: {recipe.describe()}")
    shared: dict = {}
    plan = req.removal_plan()
    setup = HealSetup(corpus=load_corpus(c.corpus), prompts=c.prompts, tokens=c.tokens, prompt_seed=c.seed,
                      identity=ck.identity)
    job.heal = heal_curves(ck.model, ck.tokenizer, scores, plan, req.ns, recipe, setup,
                           RunHooks(progress=job.tick, should_stop=job.should_stop,
                                    on_partial=lambda h: setattr(job, "heal", h)), shared=shared)
    if req.tasks:  # task accuracy after healing: the curves stay on show while lm-eval runs
        from swapkl.healing.tasks import heal_task_accuracy

        job.phase(4, 4, f"lm-eval task accuracy after healing: {', '.join(req.tasks)}")
        hc = job.heal
        hc.tasks = heal_task_accuracy(ck.model, ck.tokenizer, hc, task_settings(req), recipe, adapters=shared["adapters"],
                                      bridges=shared.get("bridges"),
                                      hooks=RunHooks(progress=job.tick, should_stop=job.should_stop,
                                                     identity=ck.identity))
        job.heal = hc


def run_compare(job: Job, models: ModelCache) -> None:
    """The transfer of the decision (:func:`swapkl.compare.result.compare`): A and B scored under the contract
    (cached pairs reused), then A's and B's own sets removed from B on B's held-out windows."""
    from swapkl.compare.result import compare
    from swapkl.scoring.score import score

    req = job.request
    c = req.contract
    job.phase(1, 3, f"swap-KL of A ({req.model_a})")
    ck_a = models.get(req.model_a, req.revision_a, c.dtype, c.device)
    res_a = score(ck_a, c, progress=job.tick, should_stop=job.should_stop)
    del ck_a
    job.phase(2, 3, f"swap-KL of B ({req.model_b})")
    ck_b = models.get(req.model_b, req.revision_b, c.dtype, c.device)
    job.checkpoint = ck_b
    res_b = score(ck_b, c, progress=job.tick, should_stop=job.should_stop)
    ev = evaluator_of(req)
    check_evaluator_context(ck_b.model, ev, name=ck_b.identity.get("display"))
    job.phase(3, 3, f"transfer: A's sets removed from B, n = 1..{req.budget}")
    job.comparison = compare(res_a, res_b, source_a=req.model_a, source_b=req.model_b, ck_b=ck_b, budget=req.budget,
                             evaluator=ev, corpus=load_corpus(c.corpus), progress=job.tick,
                             should_stop=job.should_stop)

