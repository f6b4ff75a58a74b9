"""Task accuracy after removal, through lm-evaluation-harness itself (docs/tasks.md).

:func:`task_accuracy` evaluates the base model and each method's pruned model at n = 1..N with lm-eval's own
evaluator (``simple_evaluate`` on an ``HFLM`` wrapped around the in-memory pruned copy,
:func:`swapkl.surgery.blocks.pruned_copy`: no export round trip, no model load per variant).  Which layers each method
removes comes from the removal methods themselves (:func:`removal_sets`: the same method functions, context and
defaults as the curves runner, :func:`swapkl.removal.curves.removal_curves`).  The variants are evaluated by the
task runner of :mod:`swapkl.measure.task_runner` (:class:`~swapkl.measure.task_runner.TaskRunner`), which caches
every result per (model weights, removed set, task, task version and configuration, limit, few-shot count, lm-eval
version) through :mod:`swapkl.store`; the result (:class:`TasksResult`) records each metric under lm-eval's own name
(``"acc,none"``), its stderr, the lm-eval version and every task's version.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from swapkl import __version__
from swapkl.contract import Provenance
from swapkl.errors import ComputeInterrupted
from swapkl.measure import lmeval
from swapkl.measure.task_runner import TaskRunner, TaskSettings
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.scoring.results import finite_json
from swapkl.store import dump_json

EVALUATOR = "lm-eval simple_evaluate on HFLM(in-memory pruned copy)"


@dataclass
class TasksResult:
    """Everything a task-accuracy run produced (JSON-able).

    ``base``: ``{"metrics": {task: {metric: value}}, "stderr": {task: {metric: stderr}}}``; ``methods[name]``:
    a list of ``{"n", "removed", "metrics", "stderr"}`` for n = 1..N (a seeded method: ``metrics`` is the mean over
    seeds, ``stderr`` the mean of the seeds' lm-eval stderrs, ``removed`` None, ``per_seed`` the seeds' sets and
    metrics, ``seed_min``/``seed_max`` the spread).  ``contract``: lm-eval version, per task its versions,
    configuration hash, output types and chance accuracy, the limit, few-shot count and batch size, and the
    selection rule.  With ``repair="bridge"``: ``repaired[name]``, the same entries for each set with its bridges
    (seeded and merging methods are not bridged), and ``repair``, the bridge settings and fits."""

    model: dict
    contract: dict
    base: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)
    method_info: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    complete: bool = True
    repaired: dict = field(default_factory=dict)
    repair: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return finite_json({k: getattr(self, k) for k in self.__dataclass_fields__})

    def to_json(self, path=None, indent: int = 2) -> str:
        return dump_json(self.to_dict(), path, indent)

    @classmethod
    def from_dict(cls, d: dict) -> TasksResult:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def provenance(self) -> Provenance:
        c = self.contract
        versions = "; ".join(f"{t} v{(i.get('versions') or {}).get(t, '?')}" for t, i in (c.get("tasks") or {}).items())
        metrics = list(dict.fromkeys(m for row in (self.base.get("metrics") or {}).values() for m in row))
        extra = [f"lm-eval {c.get('lm_eval_version')}", f"tasks {versions}", f"metrics {', '.join(metrics)}",
                 f"limit {c.get('limit') or 'all'}",
                 _shots(c), f"budget {c.get('budget')}"]
        return Provenance(model=self.model, evaluator=EVALUATOR, extra=tuple(extra))

    def tasks(self) -> list[str]:
        return list(self.contract.get("tasks", {}))


def _shots(c: dict) -> str:
    """``3-shot``, or the task default with the count lm-eval ran (``n-shot``)."""
    if c.get("num_fewshot") is not None:
        return f"{c['num_fewshot']}-shot"
    ran = ", ".join(f"{t} {k}" for t, k in (c.get("n-shot") or {}).items())
    return f"few-shot: task default ({ran})" if ran else "few-shot: task default"


def removal_sets(model, tokenizer, scores: dict | None, plan: RemovalPlan, hooks: RunHooks | None = None,
                 bridger=None) -> dict:
    """The removal sets each method of ``plan`` chooses for n = 1..``plan.budget``: ``{name: MethodOutput}`` (``sets``,
    or ``runs`` per seed, ``variant`` for a merge, ``notes``, ``settings``).  The methods run with the context the
    curves runner gives them (the plan checked against the model, its candidates, spacing, partners and seeds, the
    calibration text of ``hooks.corpus`` and the perplexity memo of ``hooks.identity``), so the sets are the curves'
    sets.  ``bridger``: the run's :class:`~swapkl.repair.bridger.Bridger` (``repair="bridge"``: the ``bridge``
    method scores with its bridges)."""
    from swapkl.model import architectures as arch  # deferred: torch
    from swapkl.removal.curves import plan_evaluator
    from swapkl.measure.memo import disk_memo
    from swapkl.scoring.corpora import load_corpus

    hooks = hooks if hooks is not None else RunHooks()
    c = plan.check(arch.locate(model).num_layers, scores)
    progress = hooks.progress
    ctx = c.context(model, tokenizer, hooks, corpus=hooks.corpus if hooks.corpus is not None else load_corpus(),
                    evaluator=plan_evaluator(plan),
                    memo=hooks.memo if hooks.memo is not None else disk_memo(hooks.identity, True),
                    progress=(lambda d, t, msg: progress(0, 1, msg)) if progress else None, bridger=bridger)
    return {spec.name: spec.func(ctx, plan.budget) for spec in c.specs}




def _bridger(model, tokenizer, plan: RemovalPlan, hooks: RunHooks):
    """The run's :class:`~swapkl.repair.bridger.Bridger` when ``plan.repair == "bridge"`` (else None): calibration
    text from ``hooks.corpus`` avoiding ``hooks.contract``'s scoring prompts, the plan's bridge settings."""
    if plan.repair != "bridge":
        return None
    from swapkl.repair.bridger import Bridger
    from swapkl.scoring.corpora import load_corpus

    corpus = hooks.corpus if hooks.corpus is not None else load_corpus()
    return Bridger(model, tokenizer, corpus, plan.bridge_settings, hooks.contract)


def _plain_sets(sets: dict) -> list[list[int]]:
    """Every non-empty plain removal set of ``sets`` (a merge changes its lowest slot: it shares no prefix)."""
    out = []
    for o in sets.values():
        if not (o.variant and o.variant.get("kind") == "merge"):
            out += [[int(i) for i in s] for s in list(o.sets or []) + [s for v in (o.runs or {}).values() for s in v]
                    if len(s)]
    return out


def _summary(rows: dict, tasks: list[dict]) -> str:
    parts = []
    for t in tasks:
        for leaf in [t["name"]] if t["name"] in rows["metrics"] else list(t["leaves"])[:1]:
            m = rows["metrics"].get(leaf, {})
            k = "acc,none" if "acc,none" in m else next(iter(m), None)
            if k is not None:
                parts.append(f"{leaf} {k.split(',')[0]} {m[k]:.4f}")
    return ", ".join(parts)


def _entry(n: int, removed, rows: dict, merge: dict | None = None) -> dict:
    e = {"n": n, "removed": sorted(int(i) for i in removed), "metrics": rows["metrics"], "stderr": rows["stderr"],
         "docs": rows.get("docs", {})}
    if merge is not None:
        e["merge"] = f"{merge['mode']}: " + ", ".join("+".join(str(i) for i in g) for g in merge["groups"])
    return e


def _seeded(per_seed: dict) -> list[dict]:
    """Mean over seeds per n, with the seeds' spread and each seed's set and metrics."""
    out = []
    for k in range(max(len(v) for v in per_seed.values())):
        rows = {s: v[k] for s, v in per_seed.items() if len(v) > k}
        mean, err, lo, hi = {}, {}, {}, {}
        first = next(iter(rows.values()))
        for task, metrics in first["metrics"].items():
            for tab in (mean, err, lo, hi):
                tab[task] = {}
            for m in metrics:
                vals = np.array([r["metrics"][task][m] for r in rows.values()], dtype=float)
                errs = [r["stderr"][task].get(m) for r in rows.values()]
                mean[task][m], lo[task][m], hi[task][m] = float(vals.mean()), float(vals.min()), float(vals.max())
                err[task][m] = float(np.mean(errs)) if all(e is not None for e in errs) else None
        out.append({"n": k + 1, "removed": None, "metrics": mean, "stderr": err, "seed_min": lo, "seed_max": hi,
                    "n_seeds": len(rows), "per_seed": [{"seed": int(s), "removed": r["removed"],
                                                        "metrics": r["metrics"]} for s, r in rows.items()]})
    return out


def task_accuracy(model, tokenizer, scores: dict | None, plan: RemovalPlan, settings: TaskSettings,
                  hooks: RunHooks | None = None, *, sets: dict | None = None) -> TasksResult:
    """Task accuracy of the base model and of each method's pruned model at n = 1..``plan.budget`` (lm-eval's own
    evaluator on the in-memory copies; see the module docstring), the sets chosen under ``plan`` (:func:`removal_sets`;
    ``sets``: its output when already known), lm-eval run as ``settings`` says (:class:`TaskSettings`).  ``hooks``:
    ``progress(done, total, message)`` after every variant; ``should_stop()`` → True raises
    :class:`~swapkl.errors.ComputeInterrupted` with the partial result in ``.partial``; ``identity`` names the weights
    (cache key and result); ``corpus`` and ``memo``: the calibrating methods'; ``on_partial(result)`` after every
    model (the dashboard's job publishes it).  Raises :class:`~swapkl.measure.lmeval.TaskError` for an unknown or
    unloadable task."""
    t_start = time.perf_counter()
    hooks = hooks if hooks is not None else RunHooks()
    identity, progress, should_stop = hooks.identity, hooks.progress, hooks.should_stop
    ip = lmeval.check_include_path(settings.include_path) if settings.include_path else None
    tm, loaded = lmeval.load_tasks(ip, settings.tasks)  # unknown tasks fail before any work
    bridger = _bridger(model, tokenizer, plan, hooks)
    if sets is None:
        sets = removal_sets(model, tokenizer, scores, plan, hooks, bridger)
    total = 1 + sum((len(o.sets) if o.runs is None else sum(len(v) for v in o.runs.values())) for o in sets.values())
    total += sum(len(o.sets) for o in sets.values() if o.runs is None and not o.variant) if bridger else 0
    limit, num_fewshot, batch_size = settings.limit, settings.num_fewshot, settings.batch_size
    run = TaskRunner(model, tokenizer, loaded, tm, identity=identity, settings=settings,
                     hooks=RunHooks(progress=progress, should_stop=should_stop), total=total)
    run.bridger = bridger
    if settings.share_prefix:
        from swapkl.measure.prefix import PrefixStore

        run.prefix = PrefixStore(min(s) for s in _plain_sets(sets))
        run.record_base = run.worth_recording(_plain_sets(sets))
    selection = plan.to_dict()
    contract = {"evaluator": EVALUATOR, "lm_eval_version": run.lm_eval_version, "budget": plan.budget,
                "limit": limit, "num_fewshot": num_fewshot, "batch_size": batch_size, "include_path": ip,
                "tasks": {t["name"]: {"versions": t["versions"], "config_sha": t["config_sha"],
                                      "output_types": t["output_types"], "chance": lmeval.chance(t, limit)}
                          for t in loaded},
                "selection": {k: selection[k] for k in ("spacing", "exclude_boundary", "partners", "seeds")},
                "plan": selection}
    result = TasksResult(model=identity or {"name_or_path": getattr(model, "name_or_path", None)}, contract=contract,
                         complete=False)
    run.on_partial, run.result = hooks.on_partial, result
    try:
        base = run.variant(())
        result.base = {"metrics": base["metrics"], "stderr": base["stderr"], "docs": base.get("docs", {})}
        contract["n-shot"], contract["n-samples"] = base["n-shot"], base["n-samples"]
        run.tick(f"base: {_summary(base, loaded)}")
        for name, out in sets.items():
            result.method_info[name] = {"settings": out.settings, "notes": list(out.notes)}
            result.notes.extend(f"{name}: {n}" for n in out.notes)
            var = out.variant if out.variant and out.variant.get("kind") == "merge" else None
            if out.runs is None:
                result.methods[name] = []
                for k, s in enumerate(out.sets):
                    merge = None if var is None else {"groups": var["groups"][k], "mode": var["mode"]}
                    rows = run.variant(s, merge)
                    result.methods[name].append(_entry(k + 1, s, rows, merge))
                    run.tick(f"{name} n={k + 1} removed {sorted(s)}: {_summary(rows, loaded)}")
                if bridger is not None and not out.variant:
                    result.repaired[name] = [_entry(k + 1, s, run.variant(s, bridged=True)) for k, s in
                                             enumerate(out.sets)]
                    for e in result.repaired[name]:
                        run.tick(f"{name} n={e['n']} removed {e['removed']} bridged: {_summary(e, loaded)}")
                    result.repair = bridger.summary()
            else:
                per_seed = {}
                for seed, seed_sets in out.runs.items():
                    per_seed[seed] = []
                    for k, s in enumerate(seed_sets):
                        per_seed[seed].append(_entry(k + 1, s, run.variant(s)))
                        run.tick(f"{name} seed {seed} n={k + 1} removed {sorted(s)}")
                result.methods[name] = _seeded(per_seed)
    except ComputeInterrupted as e:
        result.stats = dict(run.stats, seconds=time.perf_counter() - t_start)
        e.partial = result
        raise
    result.stats = dict(run.stats, seconds=time.perf_counter() - t_start, swapkl_version=__version__,
                        **({"prefix": dict(run.prefix.stats, layers=run.prefix.layers)} if run.prefix else {}))
    result.complete = True
    return result
