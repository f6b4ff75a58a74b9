"""``recommend``: which n layers to remove, with the evidence (:class:`Recommendation`, :func:`recommend`).

The search itself is the removal method ``"recommend"`` in :mod:`swapkl.removal.methods.recommended` (one file, like every
method); :func:`recommend` runs it through :func:`swapkl.removal.curves.removal_curves`, so the held-out ΔPPL of each chosen
set, with its paired bootstrap CI, comes from the same evaluator and memo as every other curve.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from swapkl.removal import methods as M
from swapkl.contract import BLOCK, Provenance, check_unit
from swapkl.removal.curves import curves_provenance, removal_curves
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.errors import SwapklError
from swapkl.removal.methods.recommended import (DEFAULT_CALIB_TOKENS, DEFAULT_CALIB_WINDOWS, DEFAULT_WIDTH, LABEL,
                                                SEED_METHODS, default_top_k, search, sleb_cost)
from swapkl.scoring.results import finite_json
from swapkl.store import dump_json

# Deferred imports: pandas is imported by Recommendation.table() only: the CLI and the dashboard import this module
# without it.

__all__ = ["DEFAULT_CALIB_TOKENS", "DEFAULT_CALIB_WINDOWS", "DEFAULT_WIDTH", "LABEL", "SEED_METHODS", "Recommendation",
           "default_top_k", "recommend", "recommend_plan", "search", "search_params", "sleb_cost"]


# ------------------------------------------------------------------------------------------------ the result
@dataclass
class Recommendation:
    """The answer to "which n layers should I remove?", per n = 1..budget.

    ``entries[n-1]``: ``{n, removed, calib_ppl, calib_delta_pct (%), ppl, ppl_ci, delta_pct (held-out ΔPPL %),
    delta_pct_ci, kl_to_base (nats), sources, layer_ranks, evaluations (cumulative calibration evaluations up to
    this n), seconds (cumulative search seconds)}``.  ``baseline_ppl``: the held-out baseline perplexity;
    ``calib_base_ppl``: the calibration baseline.  ``settings``: the search parameters; ``model``/``evaluator``/
    ``corpus``: the evaluation contract."""

    model: dict
    evaluator: dict
    corpus: dict
    baseline_ppl: float
    baseline_ppl_ci: list
    calib_base_ppl: float
    entries: list
    candidates: list
    signals: dict
    settings: dict
    stats: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    #: per n, the held-out paired comparison with every other method of the same run (swapkl.removal.recommend.paired)
    paired: list = field(default_factory=list)
    #: what a removed index removes: the block, or its attention / mlp sublayer (skipped, swapkl.surgery.skip)
    unit: str = "block"
    #: with ``--repair bridge``: every method's bridged curve and the bridge settings and fits (CurvesResult's)
    repaired: dict = field(default_factory=dict)
    repair: dict = field(default_factory=dict)

    # -- access
    @property
    def budget(self) -> int:
        return len(self.entries)

    def entry(self, n: int) -> dict:
        for e in self.entries:
            if e["n"] == n:
                return e
        raise SwapklError(f"no recommendation for n={n} (computed for n = 1..{self.budget})")

    def removed(self, n: int) -> list[int]:
        """The recommended layers (0-based slots) to remove at budget ``n`` (their :attr:`unit`)."""
        return list(self.entry(n)["removed"])

    def explain(self, n: int) -> str:
        """One sentence of evidence for budget ``n``: the set, its calibration and held-out scores, which signals
        chose it, and what it cost."""
        e = self.entry(n)
        k = self.settings.get("top_k")
        parts = []
        for i in e["removed"]:
            r = e["layer_ranks"].get(str(i), {})
            bits = []
            for proto, short in (("replacement", "replacement"), ("interchange", "interchange")):
                if r.get(proto) is not None:
                    bits.append(f"{short} {'top-' + str(k) if r[proto] <= k else 'rank ' + str(r[proto])}"
                                + (f" (rank {r[proto]})" if r[proto] <= k else ""))
            if r.get("bi") is not None:
                bits.append(f"BI rank {r['bi']}")
            if r.get("calibration") is not None:
                bits.append(f"single-layer calibration rank {r['calibration']}")
            parts.append(f"layer {i}: " + (" and ".join(bits[:2]) + ("; " + "; ".join(bits[2:]) if bits[2:] else "")
                                           if bits else "no signal rank"))
        is_beam = lambda s: s.startswith(("beam:", "candidate", "single"))
        seeds = [s for s in e.get("sources", []) if not is_beam(s)]
        found = [s for s in e.get("sources", []) if is_beam(s)]
        how = []
        if seeds:
            merged = self.settings.get("merged_seeds", [])
            how.append("also proposed by " + ", ".join(M.label(s) + (" (as removal)" if s in merged else "")
                                                        for s in seeds))
        if found:
            how.append("found by the beam (" + found[0].replace("beam: ", "from ") + ")")
        held = ""
        if e.get("delta_pct") is not None:
            ci = e.get("delta_pct_ci")
            held = (f", held-out ΔPPL {e['delta_pct']:+.1f} %" +
                    (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else ""))
        what = "layers" if self.unit == "block" else f"the {self.unit} sublayers of layers"
        return (f"Remove {what} {e['removed']} (n={n}): calibration PPL {e['calib_ppl']:.4g} "
                f"({e['calib_delta_pct']:+.1f} % vs {self.calib_base_ppl:.4g}){held}; "
                + "; ".join(parts) + ("; " + "; ".join(how) if how else "")
                + f"; {rule_phrase(e)} after {e['evaluations']} calibration evaluations "
                  f"({e['seconds']:.0f} s)" + judged_phrase(self.paired, n) + ".")

    def table(self):
        """pandas DataFrame, one row per n: removed, calibration PPL / Δ%, held-out PPL / ΔPPL % with CI,
        evaluations, seconds, sources."""
        import pandas as pd

        rows = []
        for e in self.entries:
            ci = e.get("delta_pct_ci") or [None, None]
            rows.append({"n": e["n"], "removed": ", ".join(map(str, e["removed"])), "calib PPL": e["calib_ppl"],
                         "calib Δ %": e["calib_delta_pct"], "PPL": e.get("ppl"), "ΔPPL %": e.get("delta_pct"),
                         "ΔPPL % lo": ci[0], "ΔPPL % hi": ci[1], "evaluations": e["evaluations"],
                         "seconds": e["seconds"], "chosen by": "; ".join(e.get("sources", []))})
        return pd.DataFrame(rows)

    def paired_table(self):
        """pandas DataFrame of the held-out paired comparison (:attr:`paired`): one row per (n, method) with the
        method's ΔPPL %, ΔPPL %(recommend) − ΔPPL %(method) in points, its 95 % CI and better / tie / worse."""
        import pandas as pd

        return pd.DataFrame([{"n": r["n"], "method": c["method"], "zero-evaluation": c["zero_eval"],
                              "method ΔPPL %": c["delta_pct"], "recommend ΔPPL %": r["delta_pct"],
                              "difference (points)": c["diff"], "lo": c["ci"][0], "hi": c["ci"][1],
                              "verdict": c["word"]} for r in self.paired for c in r["comparisons"]])

    def provenance(self) -> Provenance:
        """Model, corpus and held-out evaluator of the recommendation, its budget, and the calibration contract
        (tokens of the prompt region, windows) its calibration PPLs were measured under."""
        base = curves_provenance({"model": self.model, "evaluator": self.evaluator, "corpus": self.corpus,
                                  "budget": self.budget})
        return dataclasses.replace(base, extra=base.extra + (self.calibration_caption(),))

    def calibration_caption(self) -> str:
        """How the calibration PPLs were measured, e.g. "calibration 1024 tokens of the prompt region, window
        512/stride 256"."""
        st = self.settings
        win = (self.evaluator or {}).get("window")
        stride = st.get("calib_stride")
        how = (f"window {win}/stride {stride}" if stride else f"disjoint windows of {win}") if win else (
            f"stride {stride}" if stride else "disjoint windows")
        return f"calibration {st.get('calib_tokens', '?')} tokens of the prompt region, {how}"

    # -- JSON
    def to_dict(self) -> dict:
        return finite_json({k: getattr(self, k) for k in self.__dataclass_fields__})

    def to_json(self, path=None, indent: int = 2) -> str:
        return dump_json(self.to_dict(), path, indent)

    @classmethod
    def from_dict(cls, d: dict) -> Recommendation:
        """From :meth:`to_dict` (or its parsed JSON).  Raises :class:`SwapklError` for a malformed dict."""
        if not isinstance(d, dict):
            raise SwapklError("a recommendation must be a JSON object")
        missing = [k for k in ("model", "evaluator", "corpus", "baseline_ppl", "calib_base_ppl", "entries",
                               "candidates", "signals", "settings") if k not in d]
        if missing:
            raise SwapklError(f"not a swapkl recommendation: {', '.join(missing)} missing")
        entries = d["entries"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "removed" in e and "n" in e
                                                    for e in entries):
            raise SwapklError("not a swapkl recommendation: entries must be a list of {n, removed, ...}")
        unit = check_unit(d.get("unit") or BLOCK, lambda m: SwapklError(f"not a swapkl recommendation: {m}"))
        return cls(**{k: d.get(k, [] if k in ("notes", "baseline_ppl_ci", "paired") else
                               {} if k in ("stats", "repaired", "repair") else None)
                      for k in cls.__dataclass_fields__ if k != "unit"}, unit=unit)

    @classmethod
    def from_json(cls, s_or_path) -> Recommendation:
        s = s_or_path
        if not (isinstance(s, str) and s.lstrip().startswith("{")):
            s = Path(s).read_text()
        return cls.from_dict(json.loads(s))

    @classmethod
    def from_curves(cls, curves) -> Recommendation:
        """From a :class:`~swapkl.removal.curves.CurvesResult` (or its dict) that ran the ``"recommend"`` method: the
        chosen sets, their calibration evidence (``method_info``) and their held-out points (``methods``)."""
        d = curves.to_dict() if hasattr(curves, "to_dict") else curves
        if "recommend" not in (d.get("methods") or {}):
            raise SwapklError("these removal curves did not run the 'recommend' method")
        info = d["method_info"]["recommend"]
        rec = info["recommendation"]
        held = {e["n"]: e for e in d["methods"]["recommend"]}
        entries = []
        for lv in rec["levels"]:
            h = held.get(lv["n"], {})
            entries.append({k: v for k, v in lv.items() if k not in ("beam", "seed_calib")}
                           | {"ppl": h.get("ppl"), "ppl_ci": h.get("ppl_ci"), "delta_pct": h.get("delta_pct"),
                              "delta_pct_ci": h.get("delta_pct_ci"), "kl_to_base": h.get("kl_to_base"),
                              "beam": lv.get("beam"), "seed_calib": lv.get("seed_calib")})
        return cls(model=d.get("model") or {}, evaluator=d.get("evaluator") or {}, corpus=d.get("corpus") or {},
                   baseline_ppl=d.get("baseline_ppl"), baseline_ppl_ci=list(d.get("baseline_ppl_ci") or []),
                   calib_base_ppl=rec["calib_base_ppl"], entries=entries, candidates=rec["candidates"],
                   signals=rec["signals"], settings=info.get("settings", {}),
                   stats={"evaluations": rec["evaluations"], "max_evals": rec["max_evals"],
                          "sleb_evaluations": rec["sleb_evaluations"], "search_seconds": rec["seconds"],
                          "test_evaluations": len(entries)},
                   notes=list(rec.get("notes", [])), paired=list(info.get("paired") or []),
                   unit=d.get("unit") or "block", repaired=dict(d.get("repaired") or {}),
                   repair=dict(d.get("repair") or {}))


def rule_phrase(e: dict) -> str:
    """How the rule (docs/recommend-rule.md) chose the entry's set."""
    r = e.get("rule")
    if not r:
        return "chosen by calibration PPL only"
    if r.get("anchor") is None:
        return f"the search's set ({r.get('why')})"
    if r["outcome"].startswith("anchor, confirmed"):
        return f"the {r['anchor_method']}-guided set, which the search also found best ({r.get('why')})"
    d = r.get("decision") or {}
    ci = d.get("ci") or [float("nan")] * 2
    how = (f"search's {r['challenger']} vs {r['anchor_method']}-guided {r['anchor']} on {d.get('regions')} "
           f"calibration regions: {d.get('diff', float('nan')):+.4f} nats/token [{ci[0]:+.4f}, {ci[1]:+.4f}], "
           f"{d.get('reason')}")
    return ("departed from the protocol rule's set: " if r["outcome"] == "departed"
            else f"kept the {r['anchor_method']}-guided set: ") + how

def judged_phrase(paired: list, n: int) -> str:
    """Held-out, paired with the best zero-evaluation method of the same run ("" when none ran)."""
    row = next((p for p in paired if p["n"] == n), None)
    if not row or not row.get("best_zero_eval"):
        return ""
    c = next(x for x in row["comparisons"] if x["method"] == row["best_zero_eval"])
    return (f"; held-out vs the best zero-evaluation method ({M.label(c['method'])}, {c['delta_pct']:+.1f} %): "
            f"{c['diff']:+.1f} points [{c['ci'][0]:+.1f}, {c['ci'][1]:+.1f}], {c['word']}")


def search_params(width: int = DEFAULT_WIDTH, top_k: int | None = None, calib_tokens: int = DEFAULT_CALIB_TOKENS,
                  calib_windows: str = DEFAULT_CALIB_WINDOWS, max_evals="sleb", seeds: Sequence[str] = SEED_METHODS,
                  constrained: bool = False) -> dict:
    """The search's options, as ``method_params["recommend"]`` of a plan: beam ``width``, the signals' ``top_k``
    (None: :func:`default_top_k`), ``calib_tokens`` of the prompt region, ``calib_windows``, the evaluation cap
    ``max_evals`` (``"sleb"``: SLEB's count), the ``seeds`` methods and ``constrained`` (the selection rule's
    candidates and spacing)."""
    return {"width": width, "calib_tokens": calib_tokens, "calib_windows": calib_windows, "max_evals": max_evals,
            "seeds": list(seeds), "constrained": constrained} | ({"top_k": top_k} if top_k is not None else {})


def recommend_plan(budget: int, search: dict | None = None, compare: Sequence[str] = (), **fields) -> RemovalPlan:
    """The :class:`~swapkl.removal.plan.RemovalPlan` of a recommendation up to ``budget``: the ``"recommend"``
    method with the ``search`` options (:func:`search_params`; its defaults fill what is not given;
    ``method_params["recommend"]`` among ``fields`` overrides both), then the ``compare`` methods; ``fields``: any other plan field (spacing, unit, evaluator, kl, ...)."""
    params = {k: dict(v) for k, v in (fields.pop("method_params", None) or {}).items()}
    params["recommend"] = search_params() | dict(search or {}) | params.get("recommend", {})
    methods = ("recommend",) + tuple(m for m in compare if m != "recommend")
    return RemovalPlan(budget=budget, methods=methods, method_params=params, **fields)


def recommend(model, tokenizer, scores: dict | None, plan: RemovalPlan, hooks: RunHooks | None = None
              ) -> Recommendation:
    """Recommend the layers to remove for n = 1..``plan.budget`` (see the module docstring) and evaluate each choice
    on the held-out text of ``plan.evaluator`` once, after the choice.  ``plan``: a plan whose methods include
    ``"recommend"`` (:func:`recommend_plan`); its other methods run on the same held-out windows, so that each n
    carries the paired comparison (``Recommendation.paired``, :mod:`swapkl.removal.recommend.paired`); ``plan.spacing`` is the
    selection rule's Δ (the guided seeds', and the search's with ``constrained``); ``plan.unit`` ``attention`` /
    ``mlp``: the search skips that sublayer of each chosen layer, seeded by the methods defined on the unit,
    ``scores`` being the unit's matrices.  ``scores``: ``{"replacement": L×L, "interchange": L×L}`` nats (either may
    be missing).  ``hooks``: as for :func:`~swapkl.removal.curves.removal_curves` (default memo: the model's disk memo
    when ``hooks.identity`` names the weights).  Returns a :class:`Recommendation`."""
    if "recommend" not in plan.methods:
        raise SwapklError("a recommendation's plan must include the 'recommend' method (recommend_plan)")
    params = plan.params()
    params["recommend"] = search_params() | params.get("recommend", {})
    methods = ("recommend",) + tuple(m for m in plan.methods if m != "recommend")
    res = removal_curves(model, tokenizer, scores, plan.with_(methods=methods, method_params=params), hooks)
    rec = Recommendation.from_curves(res)
    rec.notes = list(res.notes) + [n for n in rec.notes if n not in res.notes]
    return rec
