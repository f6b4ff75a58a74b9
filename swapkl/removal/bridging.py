"""Removal with repair (docs/repair.md, "Removal with repair"): every removal set of a curves run evaluated a second
time with a linear bridge in place of each removed span, on the same windows, through the same memo.

The run's bridges are one :class:`~swapkl.repair.bridger.Bridger` built from the plan's
:class:`~swapkl.repair.settings.BridgeSettings` (calibration text once, each span fitted once whatever the sets and
methods that remove it).  A set's bridges are one per maximal run of consecutive removed blocks
(:func:`~swapkl.repair.bridge.spans_of`); a span where the asked form does not apply uses its fallback, and the run
says so once.

:class:`RepairedCurves` is the runner's side: the bridged evaluation of a set (memo key = the raw text key plus a
suffix naming the bridge settings and the calibration windows, so raw and bridged never collide and the disk memo
reuses both), the bridged curve entries with the paired difference to the raw set (bridged minus raw ΔPPL %, the
paired bootstrap over the same windows of :func:`swapkl.removal.recommend.paired.paired_delta`) and the result's ``repair``
summary.  Merges and mixed sublayer sets are not bridged (a note says so).
"""
from __future__ import annotations

from typing import Callable, Sequence

from swapkl.repair.bridger import Bridger

#: where a curves entry's bridged point records its paired comparison with the raw point
PAIRED_KEYS = ("paired_delta_pct", "paired_ci")
#: how the run's one note on residual fallbacks starts
FALLBACK_NOTE = "bridge: no exact fold for span(s)"


def method_bridger(ctx, calib_tokens: int) -> tuple[Bridger, bool]:
    """The bridges a bridge-guided method scores its sets with, and whether they are its own: the run's
    (``ctx.bridger``) when the run repairs with a bridge, else a new :class:`Bridger` with the default settings,
    ``calib_tokens`` calibration tokens and the run's scoring prompts (``ctx.contract``; the method's sets are then
    evaluated raw)."""
    if ctx.bridger is not None:
        return ctx.bridger, False
    from swapkl.repair.settings import BridgeSettings

    return Bridger(ctx.model, ctx.tokenizer, ctx.corpus, BridgeSettings(calib_tokens=calib_tokens), ctx.contract), True


def short_prompts_note(bridger: Bridger) -> str | None:
    """A bridge-guided method's note when it scores on prompts shorter than its bridges' calibration windows
    (tokens), else None (the runner prefixes the method's name; docs/repair.md compares the two context lengths)."""
    tokens, window = bridger.contract.tokens, bridger.settings.calib_window
    if tokens >= window:
        return None
    return (f"bridged KL scored on {tokens}-token prompts, its bridges fitted on {window}-token windows; "
            f"scoring at the bridges' context length (--tokens {window}) predicted the cost after repair better "
            f"on the default model (docs/repair.md)")


def finish_notes(out, bridger: Bridger, own: bool) -> None:
    """Append a bridge-guided method's closing notes to its output ``out``: the short-prompts note
    (:func:`short_prompts_note`) and, when it fitted its own bridges (``own``), that its sets are evaluated raw."""
    if (note := short_prompts_note(bridger)) is not None:
        out.notes.append(note)
    if own:
        out.notes.append("its sets are evaluated without a bridge here; --repair bridge adds their bridged curve")


class RepairedCurves:
    """The bridged side of one :class:`~swapkl.removal.curves.CurvesRun` (module docstring)."""

    def __init__(self, run):
        self.run = run
        self.bridger = Bridger(run.model, run.tokenizer, run.corpus, run.plan.bridge_settings, run.hooks.contract)
        self.key = run.text_key + self.bridger.key()

    def evaluate(self, removed: Sequence[int]):
        """The bridged :class:`~swapkl.measure.evaluate.PPLResult` of ``removed`` (memoised)."""
        run = self.run
        run.stop_check()

        def compute():
            run.counter["evals"] += 1
            return run._ppl(self.bridger.bridged(removed), reference=run.reference)
        return run.memo.get(self.key, removed, compute)

    def entry(self, raw_entry: dict) -> dict:
        """The bridged curve point of the raw point ``raw_entry`` (same keys, plus :data:`PAIRED_KEYS`)."""
        from swapkl.measure import evaluate as E
        from swapkl.removal.recommend.paired import paired_delta

        run, removed = self.run, raw_entry["removed"]
        r = self.evaluate(removed)
        raw = run.memo.peek(run.text_key, removed)
        run.report(f"n={raw_entry['n']} removed {sorted(removed)} bridged: PPL {r.ppl:.4g}")
        st = paired_delta(r.nll, [raw.nll], run.baseline.nll, run.baseline.counts)
        return {"n": raw_entry["n"], "removed": sorted(int(i) for i in removed), "ppl": r.ppl, "ppl_ci": list(r.ci()),
                "delta_pct": E.delta_pct(r, run.baseline), "delta_pct_ci": list(E.delta_pct_ci(r, run.baseline)),
                "kl_to_base": r.kl_to_base, "paired_delta_pct": st["diff"], "paired_ci": list(st["ci"])}

    def add(self, name: str, out, result, aggregate: Callable) -> None:
        """Evaluate method ``name``'s sets (its :class:`~swapkl.removal.methods.MethodOutput` ``out``, already in
        ``result.methods``) bridged into ``result.repaired[name]``; ``aggregate``: the runner's mean over seeds."""
        if out.variant is not None and out.variant.get("kind") in ("merge", "units"):
            result.notes.append(f"{name}: not bridged (a {out.variant['kind']} variant is not a removal of whole "
                                "blocks)")
        elif out.runs is None:
            result.repaired[name] = [self.entry(e) for e in result.methods[name]]
        else:  # a seeded method: each seed's sets bridged, averaged like the raw curve
            per_seed = {s: [self.entry(e) for e in v] for s, v in result.random_seeds[name].items()}
            rows = aggregate(per_seed)
            for k, e in enumerate(rows):  # the paired difference: its mean over seeds (no CI across seeds)
                diffs = [v[k]["paired_delta_pct"] for v in per_seed.values() if len(v) > k]
                e.update(paired_delta_pct=sum(diffs) / len(diffs), paired_ci=None)
            result.repaired[name] = rows
        self.finish(result)

    def finish(self, result) -> None:
        """``result.repair`` (the settings and every fit so far) and the run's one note on the spans fitted in the
        fallback form because the asked one does not apply (kept current as spans are fitted)."""
        result.repair = self.bridger.summary()
        result.notes[:] = [n for n in result.notes if not n.startswith(FALLBACK_NOTE)]
        spans = self.bridger.fallbacks()
        if spans:
            result.notes.append(f"{FALLBACK_NOTE} {', '.join(spans)} (it starts at block 0 or the family has no "
                                "fold): the residual form is used there")
