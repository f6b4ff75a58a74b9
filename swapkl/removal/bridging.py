"""Removal with repair (docs/repair.md, "Removal with repair"): every removal set of a curves run evaluated a second
time with a linear bridge in place of each removed span, on the same windows, through the same memo.

:class:`Bridger` holds what the bridges of one run share: the calibration text (the corpus's prompt region minus the
scoring prompts of the contract, disjoint from the evaluation windows, :func:`swapkl.repair.calibration.check_disjoint`)
built once, and the fitted bridges cached per span, so a span that several sets or methods remove is fitted once.
A set's bridges are one per maximal run of consecutive removed blocks (:func:`~swapkl.repair.bridge.spans_of`).
The folded form is used where it exists; a span without an exact fold (it starts at block 0, or the family has no
fold) uses the residual form, and the run says so once.

:class:`RepairedCurves` is the runner's side: the bridged evaluation of a set (memo key = the raw text key plus a
suffix naming the bridge settings and the calibration windows, so raw and bridged never collide and the disk memo
reuses both), the bridged curve entries with the paired difference to the raw set (bridged minus raw ΔPPL %, the
paired bootstrap over the same windows of :func:`swapkl.removal.paired.paired_delta`) and the result's ``repair``
summary.  Merges and mixed sublayer sets are not bridged (a note says so).
"""
from __future__ import annotations

from typing import Callable, Sequence

from swapkl.contract import stable_hash

#: where a curves entry's bridged point records its paired comparison with the raw point
PAIRED_KEYS = ("paired_delta_pct", "paired_ci")
#: how the run's one note on residual fallbacks starts
FALLBACK_NOTE = "bridge: no exact fold for span(s)"


class Bridger:
    """The bridges of one model, corpus and scoring contract under one set of bridge settings.

    ``settings``: the plan's ``bridge`` dict (:class:`~swapkl.repair.bridged_kl.BridgeSettings` fields; ``{}`` = its
    defaults); ``contract``: the :class:`~swapkl.contract.Contract` whose scoring prompts the calibration text avoids
    (None: the default contract).  Raises :class:`~swapkl.repair.calibration.RegionError` (one line) when the corpus
    has too little text outside the scoring prompts."""

    def __init__(self, model, tokenizer, corpus, settings: dict | None = None, contract=None):
        from swapkl.contract import Contract
        from swapkl.repair.bridged_kl import BridgeSettings
        from swapkl.repair.calibration import calibration_text, check_disjoint
        from swapkl.scoring.prompts import make_prompts

        self.model, self.corpus = model, corpus
        self.settings = BridgeSettings(**dict(settings or {}))
        c = self.contract = contract if contract is not None else Contract()
        self.prompts = make_prompts(tokenizer, corpus, c.prompts, c.tokens, c.seed, c.bos)
        desc = self.prompts.description
        s = self.settings
        self.calib = calibration_text(tokenizer, corpus, desc, c.tokens, s.calib_tokens, s.calib_window, s.calib_seed)
        body = c.tokens - (1 if desc.get("bos") else 0)
        check_disjoint(self.calib.spans, [(int(b), body) for b in desc["window_starts"]], corpus)  # asserted here
        self.fits: dict = {}
        self.forms: dict = {}  # span -> (form used, why it is not the asked form or None)

    def key(self) -> str:
        """The memo key suffix of this bridger's evaluations: the settings and the calibration windows."""
        d = self.calib.description
        return "|bridge:" + stable_hash({"settings": self.settings.to_dict(), "calib": d["window_starts"],
                                         "window": d["window"]})[:16]

    def bridges(self, removed: Sequence[int]) -> list:
        """The :class:`~swapkl.repair.bridge.Bridge` of every maximal span of ``removed`` (fitted on first use)."""
        from swapkl.repair.bridge import spans_of

        spans = spans_of(removed)
        self.fit_spans(spans)
        return [self.fits[sp] for sp in spans]

    def fit_spans(self, spans: Sequence[tuple[int, int]]) -> None:
        """Fit every span ``[i, j)`` of ``spans`` not fitted yet, all of one form in one calibration pass (a method
        that scores many spans asks for them together: one forward of the calibration text, not one per span)."""
        from swapkl.repair.bridge import FORMS
        from swapkl.repair.bridged_kl import span_forms
        from swapkl.repair.calibration import fit_bridges

        new = sorted({(int(i), int(j)) for i, j in spans} - set(self.fits))
        self.forms.update(span_forms(self.model, [sp for sp in new if sp not in self.forms], self.settings.form))
        for form in FORMS:
            mine = [sp for sp in new if self.forms[sp][0] == form]
            if mine:
                self.fits.update(fit_bridges(self.model, self.calib, mine, form, self.settings.ridge))

    def bridged(self, removed: Sequence[int]):
        """The model without ``removed`` and with its bridges (:func:`swapkl.repair.bridge.bridged_model`)."""
        from swapkl.repair.bridge import bridged_model

        return bridged_model(self.model, self.bridges(removed))

    def fallbacks(self) -> list[str]:
        """The spans fitted in the residual form although the settings ask for the folded one, as ``"i..j-1"``."""
        return [f"{i}..{j - 1}" for (i, j), (f, why) in sorted(self.forms.items()) if why]

    def summary(self) -> dict:
        """``{"kind": "bridge", "settings", "calibration", "scoring_prompts_avoided", "fits": {"i-j": fit summary,
        its ``form_note`` (why residual, or None) and ``params_added`` (D² for a residual bridge, 0 folded)}}``."""
        cal = {k: v for k, v in self.calib.description.items() if k != "window_starts"}
        fits = {}
        for (i, j), b in sorted(self.fits.items()):
            fits[f"{i}-{j}"] = b.summary() | {"form_note": self.forms.get((i, j), (None, None))[1],
                                              "params_added": int(b.W.shape[0]) ** 2 if b.form == "residual" else 0}
        return {"kind": "bridge", "settings": self.settings.to_dict(), "calibration": cal,
                "scoring_prompts_avoided": self.contract.to_dict(), "fits": fits}


def method_bridger(ctx, calib_tokens: int) -> tuple[Bridger, bool]:
    """The bridges a bridge-guided method scores its sets with, and whether they are its own: the run's
    (``ctx.bridger``) when the run repairs with a bridge, else a new :class:`Bridger` with the default settings,
    ``calib_tokens`` calibration tokens and the run's scoring prompts (``ctx.contract``; the method's sets are then
    evaluated raw)."""
    if ctx.bridger is not None:
        return ctx.bridger, False
    return Bridger(ctx.model, ctx.tokenizer, ctx.corpus, {"calib_tokens": calib_tokens}, ctx.contract), True


def short_prompts_note(bridger: Bridger) -> str | None:
    """A bridge-guided method's note when it scores on prompts shorter than its bridges' calibration windows
    (tokens), else None (the runner prefixes the method's name).  On the default model the bridged KL on 32- and
    64-token prompts ranked sets against the held-out text after repair, and on 256-token prompts (the calibration
    window) with it (docs/repair.md)."""
    tokens, window = bridger.contract.tokens, bridger.settings.calib_window
    if tokens >= window:
        return None
    return (f"bridged KL scored on {tokens}-token prompts, its bridges fitted on {window}-token windows; "
            f"scoring at the bridges' context length (--tokens {window}) predicted the cost after repair better "
            f"on the default model (docs/repair.md)")


class RepairedCurves:
    """The bridged side of one :class:`~swapkl.removal.curves.CurvesRun` (module docstring)."""

    def __init__(self, run):
        self.run = run
        self.bridger = Bridger(run.model, run.tokenizer, run.corpus, dict(run.plan.bridge), run.hooks.contract)
        self.key = run.text_key + self.bridger.key()

    def evaluate(self, removed: Sequence[int]):
        """The bridged :class:`~swapkl.removal.evaluate.PPLResult` of ``removed`` (memoised)."""
        run = self.run
        run.stop_check()

        def compute():
            run.counter["evals"] += 1
            return run._ppl(self.bridger.bridged(removed), reference=run.reference)
        return run.memo.get(self.key, removed, compute)

    def entry(self, raw_entry: dict) -> dict:
        """The bridged curve point of the raw point ``raw_entry`` (same keys, plus :data:`PAIRED_KEYS`)."""
        from swapkl.removal import evaluate as E
        from swapkl.removal.paired import paired_delta

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
        residual form because they have no exact fold (kept current as spans are fitted)."""
        result.repair = self.bridger.summary()
        result.notes[:] = [n for n in result.notes if not n.startswith(FALLBACK_NOTE)]
        spans = self.bridger.fallbacks()
        if spans:
            result.notes.append(f"{FALLBACK_NOTE} {', '.join(spans)} (it starts at block 0 or the family has no "
                                "fold): the residual form is used there")
