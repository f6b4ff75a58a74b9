"""The single entry to a run's bridges: :class:`Bridger` (docs/repair.md, docs/architecture.md "Where a bridge
lives").  One Bridger holds what the bridges of one model, corpus and scoring contract share under one
:class:`~swapkl.repair.settings.BridgeSettings`: the calibration text (the corpus's prompt region minus the scoring
prompts of the contract, disjoint from the evaluation windows, :func:`swapkl.repair.calibration.check_disjoint`), built
once, and the fitted bridges cached per span, fitted for any set of spans in one calibration pass per form
(:func:`swapkl.repair.calibration.fit_bridges`), so a span that several sets, methods or layers need is fitted once.
The asked form is used where it applies; a span where it does not (the folded form at block 0, or a family without a
fold) uses the form's fallback, and :meth:`Bridger.fallbacks` says where.

Removal curves and methods, the bridged ground truth, the bridged matrix, the evidence, ``prune --repair bridge``
and healing all fit through it; none builds calibration text or calls ``fit_bridges`` itself.
"""
from __future__ import annotations

from typing import Sequence

from swapkl.contract import stable_hash
from swapkl.repair import forms
from swapkl.repair.settings import BridgeSettings


class Bridger:
    """The bridges of ``model`` on ``corpus`` under ``settings`` (a :class:`BridgeSettings`; a dict of its fields
    or None is read by :meth:`BridgeSettings.from_dict`), calibrated outside the scoring prompts of ``contract``
    (a :class:`~swapkl.contract.Contract`; None: the default contract).  ``prompts``: those prompts when the caller
    has already cut them (:class:`~swapkl.scoring.prompts.Prompts`).  Raises
    :class:`~swapkl.repair.calibration.RegionError` (one line) when the corpus has too little text outside the
    scoring prompts."""

    def __init__(self, model, tokenizer, corpus, settings=None, contract=None, prompts=None):
        from swapkl.contract import Contract
        from swapkl.repair.calibration import calibration_text, check_disjoint
        from swapkl.scoring.prompts import make_prompts

        self.model, self.corpus = model, corpus
        self.settings = BridgeSettings.from_dict(settings)
        c = self.contract = contract if contract is not None else Contract()
        self.prompts = prompts if prompts is not None else make_prompts(tokenizer, corpus, c.prompts, c.tokens,
                                                                        c.seed, c.bos)
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

    def calibration(self) -> dict:
        """The calibration text's description (tokens, window, seed, region, corpus), without its window list."""
        return {k: v for k, v in self.calib.description.items() if k != "window_starts"}

    def avoid_windows(self) -> list[tuple[int, int]]:
        """The calibration windows as ``(begin, length)`` in the prompt region's token coordinates (for a training
        text that must stay clear of them)."""
        return [(int(b), int(e) - int(b)) for b, e in self.calib.spans]

    def fit_spans(self, spans: Sequence[tuple[int, int]]) -> None:
        """Fit every span ``[i, j)`` of ``spans`` not fitted yet, all of one form in one calibration pass (a caller
        that needs many spans asks for them together: one forward of the calibration text, not one per span)."""
        from swapkl.repair.calibration import fit_bridges

        new = sorted({(int(i), int(j)) for i, j in spans} - set(self.fits))
        self.forms.update(forms.resolve(self.model, [sp for sp in new if sp not in self.forms], self.settings.form))
        for form in forms.NAMES:
            mine = [sp for sp in new if self.forms[sp][0] == form]
            if mine:
                self.fits.update(fit_bridges(self.model, self.calib, mine, form, self.settings.ridge))

    def span_bridges(self, spans: Sequence[tuple[int, int]]) -> list:
        """The :class:`~swapkl.repair.bridge.Bridge` of each span of ``spans``, in that order (fitted on first use)."""
        spans = [(int(i), int(j)) for i, j in spans]
        self.fit_spans(spans)
        return [self.fits[sp] for sp in spans]

    def bridges(self, removed: Sequence[int]) -> list:
        """The bridge of every maximal span of ``removed`` (:func:`~swapkl.repair.bridge.spans_of`), in span order."""
        from swapkl.repair.bridge import spans_of

        return self.span_bridges(spans_of(removed))

    def bridged(self, removed: Sequence[int]):
        """The model without ``removed`` and with its bridges (:func:`swapkl.repair.bridge.bridged_model`)."""
        from swapkl.repair.bridge import bridged_model

        return bridged_model(self.model, self.bridges(removed))

    def fallback_notes(self, spans) -> dict:
        """``{span: why}`` for the spans of ``spans`` fitted in another form than the asked one."""
        return {sp: self.forms[sp][1] for sp in spans if self.forms.get(sp, (None, None))[1]}

    def fallbacks(self) -> list[str]:
        """The spans fitted in another form than the asked one, as ``"i..j-1"``."""
        return [f"{i}..{j - 1}" for (i, j) in sorted(self.fallback_notes(self.forms))]

    def summary(self) -> dict:
        """``{"kind": "bridge", "settings", "calibration", "scoring_prompts_avoided", "fits": {"i-j": fit summary,
        its ``form_note`` (why another form, or None) and ``params_added`` (what the form adds: D² for a residual
        bridge, 0 folded)}}``."""
        fits = {}
        for (i, j), b in sorted(self.fits.items()):
            fits[f"{i}-{j}"] = b.summary() | {"form_note": self.forms.get((i, j), (None, None))[1],
                                              "params_added": b.kind.params_added(int(b.W.shape[0]))}
        return {"kind": "bridge", "settings": self.settings.to_dict(), "calibration": self.calibration(),
                "scoring_prompts_avoided": self.contract.to_dict(), "fits": fits}
