"""Task accuracy after removal, through lm-evaluation-harness itself (docs/tasks.md).

:func:`task_accuracy` evaluates the base model and each method's pruned model at n = 1..N with lm-eval's own
evaluator (``simple_evaluate`` on an ``HFLM`` wrapped around the in-memory pruned copy,
:func:`swapkl.surgery.blocks.pruned_copy`: no export round trip, no model load per variant).  Which layers each method
removes comes from the removal methods themselves (:func:`removal_sets`: the same method functions, context and
defaults as the curves runner, :func:`swapkl.removal.curves.removal_curves`).  Every result is cached per (model
weights, removed set, task, task version and configuration, limit, few-shot count, lm-eval version) through
:mod:`swapkl.store`; the result (:class:`TasksResult`) records each metric under lm-eval's own name
(``"acc,none"``), its stderr, the lm-eval version and every task's version.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from swapkl import __version__
from swapkl.contract import Provenance, stable_hash
from swapkl.errors import ComputeInterrupted
from swapkl.removal import lmeval
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.scoring.results import finite_json
from swapkl.store import CorruptEntry, cache_root, dump_json, read_entry, warn_unwritable, write_entry

STORE_KIND = "lm-eval-task"
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
    from swapkl.removal.memo import disk_memo
    from swapkl.scoring.corpora import load_corpus

    hooks = hooks if hooks is not None else RunHooks()
    c = plan.check(arch.locate(model).num_layers, scores)
    progress = hooks.progress
    ctx = c.context(model, tokenizer, hooks, corpus=hooks.corpus if hooks.corpus is not None else load_corpus(),
                    evaluator=plan_evaluator(plan),
                    memo=hooks.memo if hooks.memo is not None else disk_memo(hooks.identity, True),
                    progress=(lambda d, t, msg: progress(0, 1, msg)) if progress else None, bridger=bridger)
    return {spec.name: spec.func(ctx, plan.budget) for spec in c.specs}


@dataclass(frozen=True)
class TaskSettings:
    """How :func:`task_accuracy` runs lm-eval: ``tasks`` (lm-eval task or group names: hub tasks, or tasks from YAML
    files under ``include_path``), ``limit`` (examples per task; None = all), ``num_fewshot`` (None = the task's
    default), ``batch_size`` (lm-eval's), ``use_cache`` (the per-variant disk cache) and ``share_prefix`` (variants
    start from the base model's hidden states entering their first removed layer, :mod:`swapkl.removal.prefix`: the
    same numbers, fewer blocks run)."""

    tasks: tuple
    include_path: str | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    batch_size: int = 16
    use_cache: bool = True
    share_prefix: bool = True


def _cache_key(identity: dict | None) -> dict | None:
    ident = {k: (identity or {}).get(k) for k in ("kind", "id", "revision", "commit", "fingerprint", "dtype")}
    if not (ident["fingerprint"] or ident["commit"] or (ident["kind"] == "hub" and ident["revision"])):
        return None  # the identity does not name the weights: nothing is cached
    return ident


class _Runner:
    """One run: the loaded tasks, the variants evaluated so far (a set chosen by two methods is evaluated once),
    the disk cache and the counters."""

    def __init__(self, model, tokenizer, tasks: list[dict], tm, *, identity, settings: TaskSettings, hooks: RunHooks,
                 total: int):
        self.model, self.tok, self.tasks, self.tm = model, copy.deepcopy(tokenizer), tasks, tm
        self.limit, self.num_fewshot, self.batch_size = settings.limit, settings.num_fewshot, settings.batch_size
        self.ident = _cache_key(identity) if settings.use_cache else None
        self.progress, self.should_stop = hooks.progress, hooks.should_stop
        self.done, self.total = 0, total
        self.on_partial, self.result = None, None
        self.memo: dict = {}
        self.bridger = None  # a removal.bridging.Bridger: variant(..., bridged=True) evaluates the bridged model
        self.prefix = None  # a removal.prefix.PrefixStore when variants share the base's hidden states
        self.record_base = False  # evaluate the base model even when its rows are cached (to record its states)
        self.stats = {"evaluations": 0, "cache_hits": 0, "variants": 0, "eval_seconds": 0.0}
        self.lm_eval_version = lmeval.lm_eval_version()

    def _path(self, removed, merge, task, bridged=False):
        key = {"model": self.ident, "removed": list(removed), "merge": merge, "task": task["name"],
               **({"bridge": self.bridger.key()} if bridged else {}),
               "versions": task["versions"], "config_sha": task["config_sha"], "limit": self.limit,
               "num_fewshot": self.num_fewshot, "lm_eval": self.lm_eval_version}
        return cache_root() / "tasks" / f"{stable_hash(key)[:24]}.json"

    def variant(self, removed: Sequence[int], merge: dict | None = None, bridged: bool = False) -> dict:
        """``{"metrics", "stderr", "versions", "n-shot", "n-samples"}`` merged over the run's tasks for the model
        without ``removed`` (or merged by ``merge``; ``bridged``: with the bridger's bridges in place)."""
        removed = sorted(int(i) for i in removed)
        key = (tuple(removed), repr(merge), bridged)
        if key in self.memo:
            return self.memo[key]
        if self.should_stop is not None and self.should_stop():
            raise ComputeInterrupted("task evaluation stopped")
        out = {"metrics": {}, "stderr": {}, "versions": {}, "n-shot": {}, "n-samples": {}}
        pm = None
        for task in self.tasks:
            path = self._path(removed, merge, task, bridged) if self.ident else None
            rows = self._read(path)
            if rows is not None and not removed and merge is None and self.record_base:
                rows = None  # run the base anyway: variants to evaluate start from the states it records
            if rows is None:
                if pm is None:  # a bridged model changes block i-1 (folded): it shares no prefix with the base
                    pm = self.bridger.bridged(removed) if bridged else self._build(removed, merge)
                t0 = time.perf_counter()
                rows = lmeval.evaluate(pm, self.tok, task, self.tm, limit=self.limit, num_fewshot=self.num_fewshot,
                                       batch_size=self.batch_size)
                self.stats["eval_seconds"] += time.perf_counter() - t0
                self.stats["evaluations"] += 1
                self._write(path, rows)
            else:
                self.stats["cache_hits"] += 1
            for k in out:
                out[k].update(rows.get(k, {}))
        self.stats["variants"] += 1
        self.memo[key] = out
        return out

    def worth_recording(self, sets: list) -> bool:
        """Whether the base model should run although its rows are cached: at least two of ``sets`` share a prefix
        with it (first removed layer > 0) and are not cached for every task."""
        if self.prefix is None or not self.prefix.layers or not self.ident:
            return False
        todo = {tuple(sorted(s)) for s in sets if min(s) > 0
                and any(self._read(self._path(sorted(s), None, t)) is None for t in self.tasks)}
        return len(todo) >= 2

    def _build(self, removed, merge):
        from swapkl.surgery.blocks import pruned_copy  # deferred: torch
        from swapkl.surgery.merge import merged_copy

        if merge is not None:
            return merged_copy(self.model, merge["groups"], merge["mode"])
        if not removed:
            return self.prefix.recording(self.model) if self.prefix is not None else self.model
        pm = pruned_copy(self.model, removed)
        if self.prefix is not None:
            self.prefix.attach(pm, removed)
        return pm

    def _read(self, path):
        if path is None:
            return None
        try:
            return read_entry(path, STORE_KIND)
        except CorruptEntry:
            return None

    def _write(self, path, rows):
        if path is None:
            return
        try:
            write_entry(path, STORE_KIND, rows)
        except OSError as e:
            warn_unwritable(path, e)

    def tick(self, msg: str):
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total, msg)
        if self.on_partial is not None:
            self.on_partial(self.result)


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
    e = {"n": n, "removed": sorted(int(i) for i in removed), "metrics": rows["metrics"], "stderr": rows["stderr"]}
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
    model (the dashboard's job publishes it).  Raises :class:`~swapkl.removal.lmeval.TaskError` for an unknown or
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
    run = _Runner(model, tokenizer, loaded, tm, identity=identity, settings=settings,
                  hooks=RunHooks(progress=progress, should_stop=should_stop), total=total)
    run.bridger = bridger
    if settings.share_prefix:
        from swapkl.removal.prefix import PrefixStore

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
        result.base = {"metrics": base["metrics"], "stderr": base["stderr"]}
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
