"""Removal curves: every method's nested removal sets evaluated with one memo of perplexity evaluations keyed
by the frozenset of removed layers (see ``docs/removal.md``) and the result type :class:`CurvesResult`.  The
checks that scores and curves belong to the model at hand live in :mod:`swapkl.removal.checks`."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Sequence

from swapkl import schema
from swapkl.removal import methods as M
from swapkl.contract import Provenance
from swapkl.scoring.corpora import load_corpus
from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.removal.checks import check_evaluator_context
from swapkl.measure.memo import EvalMemo, disk_memo
from swapkl.store import dump_json
from swapkl.scoring.results import finite_json as _jsonable
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.removal.seeds import aggregate_seeds
from swapkl.removal.units import check_unit_run, unit_key_suffix
from swapkl.scoring.verdict import regime_verdict

# Deferred imports: torch and the torch-based swapkl modules are imported inside the functions that evaluate: the
# dashboard imports this module for CurvesResult before torch is loaded.


def curves_provenance(d: dict) -> Provenance:
    """The :class:`~swapkl.contract.Provenance` of a curves dict (:meth:`CurvesResult.to_dict`): model,
    evaluator, corpus label, and the budget and spacing as extra caption pieces."""
    corpus = d.get("corpus") or {}
    extra = []
    if d.get("budget") is not None:
        extra.append(f"budget {d['budget']}")
    sel = d.get("selection") or {}
    if sel.get("spacing") is not None:
        extra.append(f"spacing Δ={sel['spacing']}")
    if calib := M.calibration_caption(d.get("method_info") or {}):
        extra.append(calib)
    return Provenance(model=d.get("model"),
                      contract={"corpus_label": corpus.get("label") or corpus.get("name")} if corpus else {},
                      evaluator=d.get("evaluator"), extra=tuple(extra))


@dataclass
class CurvesResult:
    """Everything a removal-curve run produced (JSON-able).

    ``methods[name]``: list of ``{n, removed, ppl, ppl_ci, delta_pct, delta_pct_ci, kl_to_base}`` (ppl: perplexity;
    delta_pct: ΔPPL % vs ``baseline_ppl``; kl_to_base: mean KL(base || pruned) per scored token, nats).  For
    a seeded method (``random``): entries hold the mean over seeds in ``ppl``/``delta_pct``/``kl_to_base``, ``removed`` is None and
    ``delta_pct_min``/``delta_pct_max``/``delta_pct_std``/``per_seed`` give the spread; the per-seed curves are
    in ``random_seeds``.  ``delta_ratio``: per n, ΔPPL%(interchange) / ΔPPL%(replacement).  ``unit``: what each
    removed index removes (``block``, or the ``attention`` / ``mlp`` sublayer, skipped); ``sizes``: the model's
    parameter counts (:func:`swapkl.surgery.sizes.unit_sizes`), the common x axis of block and sublayer curves;
    ``gains``: what each set gains, measured (:func:`swapkl.measure.gains.curve_gains`), when asked for;
    ``plan``: the :class:`~swapkl.removal.plan.RemovalPlan` the curves ran (:meth:`RemovalPlan.to_dict`).
    ``repaired`` (``plan.repair == "bridge"``, else empty): per method, its curve with every set bridged, entries as in
    ``methods`` plus ``paired_delta_pct``/``paired_ci`` (bridged − raw ΔPPL %, paired bootstrap over the same
    windows); ``repair``: ``{"kind": "bridge", "settings", "calibration", "fits": {"i-j": fit}}`` or ``{}``
    (:mod:`swapkl.removal.bridging`).
    """

    model: dict
    evaluator: dict
    corpus: dict
    budget: int
    selection: dict
    baseline_ppl: float
    baseline_ppl_ci: list
    baseline: dict
    methods: dict = field(default_factory=dict)
    method_info: dict = field(default_factory=dict)
    random_seeds: dict = field(default_factory=dict)
    delta_ratio: list = field(default_factory=list)
    verdict: dict | None = None
    stats: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    complete: bool = True
    unit: str = "block"
    sizes: dict = field(default_factory=dict)
    gains: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    repaired: dict = field(default_factory=dict)
    repair: dict = field(default_factory=dict)

    def provenance(self) -> Provenance:
        """Model, corpus, evaluator, budget and spacing of these curves (:func:`curves_provenance`)."""
        return curves_provenance(vars(self))

    def to_dict(self) -> dict:
        """Every field, JSON-able (NaN/inf as None), so ``json.dumps`` and :meth:`from_dict` take it as is."""
        return _jsonable({k: getattr(self, k) for k in self.__dataclass_fields__})

    @classmethod
    def from_dict(cls, d: dict, what: str = "curves") -> CurvesResult:
        """Inverse of :meth:`to_dict`, validated (:func:`swapkl.schema.curves_fields`)."""
        return cls(**schema.curves_fields(d, what))

    def to_json(self, path=None, indent: int = 2) -> str:
        return dump_json(self.to_dict(), path, indent)

    @classmethod
    def from_json(cls, s_or_path, what: str = "curves file") -> CurvesResult:
        """From :meth:`to_json`'s text (``str`` starting with ``{``, or ``bytes``), its parsed dict, or a path.
        Validated by :func:`swapkl.schema.curves_fields` before anything is built; a bad file raises
        :class:`~swapkl.errors.UploadError` naming ``what`` and the field."""

        s = s_or_path
        if isinstance(s, (bytes, bytearray)) or (isinstance(s, str) and s.lstrip().startswith("{")):
            d = schema.parse_json(s, what, keep_constants=True)
        elif isinstance(s, dict):
            d = s
        else:
            d = schema.read_json_file(s, what, keep_constants=True)
            what = f"{what} {s}"
        return cls.from_dict(d, what)

    def curve(self, method: str) -> list[dict]:
        return self.methods[method]


def removal_curves(model, tokenizer, scores: dict | None, plan: RemovalPlan, hooks: RunHooks | None = None
                   ) -> CurvesResult:
    """Removal curves for n = 1..``plan.budget`` of each of ``plan.methods`` (see :mod:`swapkl.removal.methods`), each
    set evaluated on the held-out text of ``plan.evaluator`` through one memo of evaluations.

    ``scores``: ``{"replacement": L×L, "interchange": L×L}`` (nats, NaN = not scored; the unit's matrices for a
    sublayer plan); needed by the guided and anti-guided methods and by the verdict.  ``plan``: a
    :class:`~swapkl.removal.plan.RemovalPlan`, checked here against the model (:meth:`RemovalPlan.check`) before any
    evaluation.  ``hooks``: the :class:`~swapkl.removal.plan.RunHooks`: ``progress(done, total, message)`` after every
    evaluation (``total`` = :meth:`RemovalPlan.expected_evaluations`, raised when an estimate falls short);
    ``should_stop()`` → True raises :class:`ComputeInterrupted` with the partial result in ``.partial``;
    ``on_curve(name, partial_result)`` after each method's curve, in run order; the memo, corpus (evaluation text =
    its eval region, calibration text = its prompt region, disjoint) and identity.  Returns a :class:`CurvesResult`."""
    return CurvesRun(model, tokenizer, scores, plan, hooks).run()


def plan_evaluator(plan: RemovalPlan):
    """The :class:`~swapkl.measure.evaluate.Evaluator` of ``plan`` (its name resolved, or its settings rebuilt)."""
    from swapkl.measure import evaluate as E

    spec = plan.evaluator_dict()
    return E.get_evaluator(spec if isinstance(spec, str) else E.Evaluator.from_dict(spec))


class CurvesRun:
    """One :func:`removal_curves` call: the plan checked against the model, the evaluation text and memo set up,
    then the baseline and each method's sets evaluated through the memo (:meth:`entry`) into one
    :class:`CurvesResult`."""

    def __init__(self, model, tokenizer, scores, plan: RemovalPlan, hooks: RunHooks | None = None):
        from swapkl.model import architectures as arch  # deferred: torch (the dashboard imports CurvesResult first)

        self.t_start = time.perf_counter()
        self.model, self.tokenizer, self.plan = model, tokenizer, plan
        self.hooks = hooks if hooks is not None else RunHooks()
        self.checked = plan.check(arch.locate(model).num_layers, scores)  # fails before any work
        self.L, self.scores, self.specs = self.checked.num_layers, self.checked.scores, self.checked.specs
        self.budget, self.kl, self.unit = plan.budget, plan.kl, check_unit_run(model, plan.unit, self.specs)
        self.counter = {"evals": 0}
        self._text()
        self._memo()
        self.planned = self.checked.expected_evaluations()
        self.prefix = self.repair = None  # the prefix store once the baseline is computed here (not read from the memo)
        if plan.repair == "bridge":  # the calibration text is built (and its disjointness asserted) before any work
            from swapkl.removal.bridging import RepairedCurves

            self.repair = RepairedCurves(self)

    def _text(self) -> None:
        """The evaluator, the corpus and the evaluation token ids (``self.ids``, 1-D LongTensor) with their memo key."""
        import torch

        from swapkl.measure import evaluate as E

        self.ev = ev = plan_evaluator(self.plan)
        check_evaluator_context(self.model, ev, name=(self.hooks.identity or {}).get("display"))
        self.corpus = self.hooks.corpus if self.hooks.corpus is not None else load_corpus()
        ids = self.hooks.eval_ids if self.hooks.eval_ids is not None else E.eval_ids(self.corpus, self.tokenizer, ev)
        self.ids = torch.as_tensor(ids).reshape(-1).long()
        self.text_key = (f"test:{getattr(self.corpus, 'sha256', '?')}:{ev.max_words}:{ev.window}:{ev.stride}:"
                         f"{ev.drop_first_target}" + unit_key_suffix(self.unit))

    def _memo(self) -> None:
        """The memo of this run (the hooks' or the model's disk memo), bound to this model and text."""
        self.memo = self.hooks.memo if self.hooks.memo is not None else disk_memo(self.hooks.identity, self.kl)
        self.memo.bind((id(self.model), self.L, int(self.ids.numel())))
        self.memo_start = self.memo.misses + self.memo.disk_hits

    def report(self, msg: str, finished: bool = False) -> None:
        """``progress(done, total, msg)``: evaluations made (or read from disk) so far in this run, of the plan's
        expected total (raised when an estimate falls short; ``done == total`` at the end)."""
        if self.hooks.progress is not None:
            done = self.memo.misses + self.memo.disk_hits - self.memo_start
            self.planned = max(self.planned, done)
            self.hooks.progress(self.planned if finished else done, self.planned, msg)

    def stop_check(self) -> None:
        if self.hooks.stopped():
            raise ComputeInterrupted("removal curves stopped")

    def _ppl(self, model, record: bool = False, **kw):
        """``evaluate_ppl`` on the run's text.  ``record``: ``model`` (the base) runs as a private copy that records the
        state entering every block, which the sets then start from (``self.prefix``; docs/removal.md, Work reuse)."""
        from swapkl.measure import evaluate as E, prefix

        if record:
            self.prefix, model = prefix.recording_every_block(model, self.L, prefix.CURVES_STATES_BYTES)
        ev = self.ev
        return E.evaluate_ppl(model, self.ids, ev.window, ev.stride, ev.drop_first_target, batch_size=self.plan.batch_size,
                              should_stop=self.hooks.should_stop, **kw)

    def evaluate_baseline(self):
        self.baseline = self.memo.get(self.text_key, (), lambda: self._ppl(self.model, True, capture_reference=self.kl))
        if self.kl and self.baseline.reference is None:  # a memo filled without KL: redo the baseline with a reference
            self.baseline = self._ppl(self.model, True, capture_reference=True)
            self.memo.store[(self.text_key, frozenset())] = self.baseline
        self.reference = self.baseline.reference if self.kl else None
        self.report(f"baseline PPL {self.baseline.ppl:.4g}")

    def evaluate_set(self, removed: Sequence[int], merge: dict | None = None, units: Sequence[int] | None = None):
        from swapkl.surgery.merge import merged_copy
        from swapkl.surgery.skip import removed_copy

        self.stop_check()
        if units is not None:  # a mixed set of sublayer units (swapkl.removal.methods.mix): codes, skipped
            from swapkl.removal.methods.mix import MIXED_KEY, decode

            def mixed():
                self.counter["evals"] += 1
                return self._ppl(removed_copy(self.model, decode(units)), reference=self.reference)
            return self.memo.get(self.text_key + MIXED_KEY, units, mixed)

        def compute():
            self.counter["evals"] += 1
            if merge is None:
                pm = removed_copy(self.model, removed, self.unit)
                if self.prefix is not None:  # blocks 0..f-1: the baseline's recorded states
                    self.prefix.attach(pm, removed)
            else:  # a merged model (swapkl.surgery.merge): new tensors for the merged blocks only
                pm = merged_copy(self.model, merge["groups"], merge["mode"])
            return self._ppl(pm, reference=self.reference)
        key = self.text_key if merge is None else f"{self.text_key}|merge:{merge['mode']}:{merge['groups']}"
        return self.memo.get(key, removed, compute)

    def entry(self, n: int, removed: Sequence[int], merge: dict | None = None,
              units: Sequence[int] | None = None) -> dict:
        """One curve point.  ``units``: the codes of a mixed set (:mod:`swapkl.removal.methods.mix`; ``removed`` is
        then its whole blocks): the entry's ``removed`` is None (n counts blocks' worth of parameters, not layers),
        ``removal`` its label and ``params_removed`` its non-embedding parameters."""
        from swapkl.measure import evaluate as E

        r = self.evaluate_set(removed, merge, units)
        mixed = None
        if units is not None:
            from swapkl.removal.methods.mix import decode
            from swapkl.surgery.sizes import params_removed, unit_sizes

            mixed = decode(units)
            self._sizes = getattr(self, "_sizes", None) or unit_sizes(self.model)
        self.report(f"n={n} removed {mixed.label() if mixed is not None else sorted(int(i) for i in removed)}: "
                    f"PPL {r.ppl:.4g}")
        e = {"n": n, "removed": None if mixed is not None else sorted(int(i) for i in removed), "ppl": r.ppl,
             "ppl_ci": list(r.ci()),
             "delta_pct": E.delta_pct(r, self.baseline), "delta_pct_ci": list(E.delta_pct_ci(r, self.baseline)),
             "kl_to_base": r.kl_to_base}
        if mixed is not None:  # scalars only: the set itself is in method_info (sets[n-1]["removal"])
            e["removal"] = mixed.label()
            e["params_removed"] = params_removed(self._sizes, mixed)
        if merge is not None:
            # a scalar (curve entries hold scalars only): "average: 3+4, 7+8"; the groups are in method_info
            e["merge"] = f"{merge['mode']}: " + ", ".join("+".join(str(i) for i in g) for g in merge["groups"])
        return e

    def context(self) -> M.MethodContext:
        return self.checked.context(self.model, self.tokenizer, self.hooks, corpus=self.corpus, evaluator=self.ev,
                                    memo=self.memo, progress=lambda d, t, msg: self.report(msg),
                                    bridger=self.repair.bridger if self.repair is not None else None)

    def run_method(self, spec, ctx, result: CurvesResult) -> None:
        """Run one method and evaluate the sets it returns into ``result``."""
        t0 = time.perf_counter()
        out = spec.func(ctx, self.budget)
        if out.notes:
            result.notes.extend(f"{spec.name}: {n}" for n in out.notes)
        info = dict(out.info)
        info["settings"] = out.settings
        info["selection_seconds"] = time.perf_counter() - t0
        if out.runs is None:
            var = out.variant if out.variant and out.variant.get("kind") == "merge" else None
            mix = out.variant["sets"] if out.variant and out.variant.get("kind") == "units" else None
            entries = [self.entry(k + 1, s, None if var is None else {"groups": var["groups"][k], "mode": var["mode"]},
                                  None if mix is None else mix[k])
                       for k, s in enumerate(out.sets)]
            if len(entries) < self.budget and not out.notes:
                result.notes.append(f"{spec.name}: curve stops at n={len(entries)}")
            result.methods[spec.name] = entries
        else:
            per_seed = {}
            for seed, sets in out.runs.items():
                per_seed[str(seed)] = [self.entry(k + 1, s) for k, s in enumerate(sets)]
            result.random_seeds[spec.name] = per_seed
            result.methods[spec.name] = aggregate_seeds(per_seed)
        if self.repair is not None:
            self.repair.add(spec.name, out, result, aggregate_seeds)
        info["seconds"] = time.perf_counter() - t0
        result.method_info[spec.name] = info

    def publish(self, name: str, result: CurvesResult) -> None:
        """``on_curve(name, partial)``: a copy of the result so far (ratios, verdict and stats filled,
        ``complete=False``), so a caller can show each curve as soon as it is measured."""
        if self.hooks.on_curve is not None:
            partial = copy.deepcopy(result)
            _finish(partial, self.scores, self.memo, self.counter, self.t_start)
            self.hooks.on_curve(name, partial)

    def run(self) -> CurvesResult:
        self.evaluate_baseline()
        result = _new_result(self)
        ctx = self.context()
        try:
            for spec in self.specs:
                self.stop_check()
                self.run_method(spec, ctx, result)
                self.publish(spec.name, result)
        except ComputeInterrupted as e:
            _finish(result, self.scores, self.memo, self.counter, self.t_start)
            self.report("stopped")
            e.partial = result
            raise
        if "recommend" in result.methods:  # recommend judged fairly: paired with every other method (docs/recommend-rule.md)
            from swapkl.removal.recommend.paired import paired_comparisons

            result.method_info["recommend"]["paired"] = paired_comparisons(
                result, lambda s: self.memo.peek(self.text_key, s), self.baseline)
        _finish(result, self.scores, self.memo, self.counter, self.t_start, self.prefix)
        result.complete = True
        self.report("done", finished=True)
        return result


def _new_result(run: CurvesRun) -> CurvesResult:
    """The empty result of ``run``: model, evaluator, corpus, budget, selection, baseline, sizes and plan."""
    from swapkl.surgery.sizes import unit_sizes

    model, plan = run.model, run.plan.to_dict()
    return CurvesResult(
        model=run.hooks.identity or {"name_or_path": getattr(model, "name_or_path", None), "model_type":
                                getattr(model.config, "model_type", None), "num_layers": run.L},
        evaluator=run.ev.to_dict(), corpus=run.corpus.describe() if hasattr(run.corpus, "describe") else {},
        budget=run.budget,
        selection={"spacing": plan["spacing"], "exclude_boundary": plan["exclude_boundary"],
                   "candidates": list(run.checked.candidates), "partners": plan["partners"],
                   "seeds": list(run.checked.seeds)},
        baseline_ppl=run.baseline.ppl, baseline_ppl_ci=list(run.baseline.ci()), baseline=run.baseline.to_dict(),
        complete=False, unit=run.unit, sizes=unit_sizes(model), plan=plan)


def _finish(result: CurvesResult, scores: dict, memo: EvalMemo, counter: dict, t_start: float, prefix=None) -> None:
    rep, inter = result.methods.get("replacement"), result.methods.get("interchange")
    if rep and inter:
        ratios = []
        for a, b in zip(inter, rep):
            r = a["delta_pct"] / b["delta_pct"] if b["delta_pct"] not in (0, None) else None
            ratios.append({"n": a["n"], "ratio": r, "interchange_delta_pct": a["delta_pct"],
                           "replacement_delta_pct": b["delta_pct"]})
        result.delta_ratio = ratios
    if "replacement" in scores and "interchange" in scores:
        try:
            result.verdict = regime_verdict(scores["replacement"], scores["interchange"])
        except SwapklError as e:
            result.notes.append(f"no regime verdict: {e}")
    n_calib = sum(1 for k in memo.store if str(k[0]).startswith("calib:"))
    result.stats = {"evaluations": counter["evals"], "calibration_evaluations": n_calib,
                    "memo_hits": memo.hits, "memo_misses": memo.misses,
                    "eval_seconds": memo.seconds, "seconds": time.perf_counter() - t_start,
                    **({"prefix": dict(prefix.stats, bytes=prefix.bytes)} if prefix is not None else {})}
