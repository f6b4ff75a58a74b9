"""``recommend``: which n layers to remove, chosen on calibration text, with the evidence.

The search (:func:`search`, also registered as the removal method ``"recommend"``, label "recommended"):

1. **Candidates**: the union of the ``top_k`` best layers of each protocol (ascending layer score
   ``s(i) = min_j d(i, j)``, docs/method.md §4, over the literature candidates: every layer, or the rule's with
   ``constrained``), ordered by their best rank under either protocol, ties broken by Block Influence rank.
2. **Seeds**: every other method's proposed set for each n (replacement- and interchange-guided, BI, CKA,
   Taylor, the LaCo-merge's removed layers), so the final choice is never worse *on calibration text* than any
   of them.  Seeds that cannot be computed (missing scores, a budget the spacing rule refuses) are skipped with a
   note.
3. **Beam search** over removal sets, level n = 1..budget: the level's seeds first, then every expansion of the
   best beam member by one candidate (this contains SLEB's greedy path restricted to the candidates), then the
   other members' expansions in candidate order; all scored by perplexity on **calibration text from the corpus's
   prompt region** (:meth:`MethodContext.calib_ppl`, never the test text), through the run's memo so no set is
   evaluated twice.  The ``width`` best sets of size n form the next beam.
4. The set recommended for n is the best calibration PPL among every size-n set evaluated.

Cost cap: ``max_evals`` distinct calibration evaluations (default: what SLEB-iterative spends for the same budget,
``1 + Σ_{s<budget} (C - s)`` over its ``C`` candidates), shared over the levels; seeds are evaluated first at
each level.  ``max_evals=None`` removes the cap: with ``width`` at least the number of size-(n-1) subsets of the
candidates the search is exhaustive over them.

:func:`recommend` runs the search through :func:`swapkl.removal.removal_curves` (so the held-out ΔPPL of each
chosen set, with its paired bootstrap CI, comes from the same evaluator and memo as every other curve) and returns
a :class:`Recommendation`.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence


from swapkl.errors import SwapklError
from swapkl.methods import MethodOutput, register
from swapkl import methods as M
from swapkl.selection import BudgetError, layer_scores
from swapkl.results import finite_json
from swapkl.store import dump_json

# Deferred imports: pandas is imported by Recommendation.table() only: the CLI and the dashboard import this module
# without it.

#: methods whose proposed sets seed the beam (those that cannot run are skipped)
SEED_METHODS = ("replacement", "interchange", "bi", "cka", "taylor", "laco")
LABEL = "recommended"
DEFAULT_WIDTH = 4
DEFAULT_CALIB_TOKENS = 1024  # the same calibration text as SLEB-iterative's default, so the memo is shared


def default_top_k(num_layers: int) -> int:
    """Best layers taken from each protocol: ``max(3, ceil(L / 5))`` (6 for a 30-layer model)."""
    return max(3, math.ceil(num_layers / 5))


def sleb_cost(n_candidates: int, budget: int) -> int:
    """Calibration evaluations SLEB-iterative spends for ``budget`` steps over ``n_candidates`` layers with no
    spacing rule: one per remaining candidate per step, plus the unpruned baseline."""
    return 1 + sum(max(0, n_candidates - s) for s in range(budget))


def _ranks(values: Sequence[float], layers: Sequence[int], descending: bool = False) -> dict[int, int]:
    """1-based rank of each layer of ``layers`` by ``values`` (ascending; NaN last; ties by index)."""
    def key(i):
        v = values[i]
        bad = v is None or (isinstance(v, float) and math.isnan(v))
        return (bad, 0.0 if bad else (-v if descending else v), i)
    return {i: r + 1 for r, i in enumerate(sorted(layers, key=key))}


def _fmt(s) -> str:
    return "{" + ", ".join(str(i) for i in sorted(s)) + "}"


def search(ctx, budget: int) -> MethodOutput:
    """The search described in the module docstring, on ``ctx`` (a :class:`swapkl.methods.MethodContext`).

    Parameters (``ctx.params["recommend"]``): ``width`` (beam width, default 4), ``top_k`` (best layers per
    protocol, default :func:`default_top_k`), ``calib_tokens`` (default 1024), ``max_evals`` (default
    :func:`sleb_cost`; ``None`` = no cap), ``seeds`` (method names, default :data:`SEED_METHODS`),
    ``constrained`` (the rule's candidates and spacing instead of every layer without spacing).

    Returns a :class:`MethodOutput` whose ``sets[n-1]`` is the recommended set for n (not necessarily nested) and
    whose ``info["recommendation"]`` holds, per n, the calibration PPL, the sources that proposed the set, the
    per-layer signal ranks and the cumulative cost."""

    t0 = time.perf_counter()
    p = lambda k, d: ctx.param("recommend", k, d)
    L = ctx.num_layers
    cands_all, spacing, settings = ctx.literature_candidates("recommend", budget)
    width = int(p("width", DEFAULT_WIDTH))
    top_k = int(p("top_k", default_top_k(L)))
    calib_tokens = int(p("calib_tokens", DEFAULT_CALIB_TOKENS))
    seed_names = list(p("seeds", SEED_METHODS))
    singles = bool(p("singles", True))
    cap = p("max_evals", "sleb")
    cap = sleb_cost(len(cands_all), budget) if cap == "sleb" else (None if cap is None else int(cap))
    if width < 1 or top_k < 1 or calib_tokens < 16:
        raise SwapklError("recommend needs width >= 1, top_k >= 1 and calib_tokens >= 16")
    notes: list[str] = []

    # ---- seeds: every other method's proposed sets
    seeds: dict[int, list[tuple[frozenset, str]]] = {}
    seed_info: dict[str, dict] = {}
    for name in seed_names:
        try:
            spec = M.get(name)
            if any(need not in ctx.scores for need in spec.needs):
                notes.append(f"seed {name} skipped: needs {', '.join(spec.needs)} scores")
                continue
        except SwapklError as e:
            notes.append(f"seed {name} skipped: {e}")
            continue
        out, err = None, None
        for b in range(budget, 0, -1):  # the largest budget the method accepts (a spacing rule may refuse some)
            try:
                out = spec.func(ctx, b)
                break
            except (BudgetError, SwapklError) as e:
                err = err or e
        if out is None:
            notes.append(f"seed {name} skipped: {err}")
            continue
        if len(out.sets) < budget:
            notes.append(f"seed {name} proposes sets up to n={len(out.sets)}")
        seed_info[name] = out.info
        for k, s in enumerate(out.sets):
            key = frozenset(int(i) for i in s)
            lst = seeds.setdefault(k + 1, [])
            if all(key != a for a, _ in lst):
                lst.append((key, name))
            elif name not in [b for a, b in lst if a == key]:
                lst.append((key, name))

    # ---- signals and candidates
    signals: dict[str, dict[int, int]] = {}
    for proto in ("replacement", "interchange"):
        if proto in ctx.scores:
            s = layer_scores(ctx.scores[proto], ctx.partners)
            signals[proto] = _ranks([float(x) for x in s], cands_all)
    if "bi" in seed_info:
        signals["bi"] = _ranks(seed_info["bi"]["bi"], cands_all)
    if "taylor" in seed_info:
        signals["taylor"] = _ranks(seed_info["taylor"]["taylor"], cands_all)
    if "cka" in seed_info:
        signals["cka"] = _ranks(seed_info["cka"]["cka"], cands_all, descending=True)
    protos = [x for x in ("replacement", "interchange") if x in signals]
    if protos:
        pool = {i for pr in protos for i in cands_all if signals[pr][i] <= top_k}
    else:  # no swap scores: fall back to the calibrated signals
        pool = {i for pr in ("bi", "taylor") if pr in signals for i in cands_all if signals[pr][i] <= top_k}
        pool = pool or set(cands_all[:top_k])
    big = len(cands_all) + 1
    candidates = sorted(pool, key=lambda i: (min(signals[pr][i] for pr in protos) if protos else big,
                                             signals.get("bi", {}).get(i, big), i))

    # ---- the beam
    evaluated: dict[frozenset, float] = {}
    sources: dict[frozenset, list[str]] = {}
    cost = {"evals": 0}
    calib_k = int(p("calib_k", max(1, top_k // 2)))

    def calib(s: frozenset) -> float:
        if s not in evaluated:
            evaluated[s] = float(ctx.calib_ppl(sorted(s), calib_tokens))
            cost["evals"] += 1
        return evaluated[s]

    def add_source(s: frozenset, label: str) -> None:
        lst = sources.setdefault(s, [])
        found = any(x.startswith("beam:") or x.startswith("candidate") or x.startswith("single") for x in lst)
        if label not in lst and not (found and (label.startswith("beam:") or label.startswith("single"))):
            lst.append(label)

    def fits(s: Sequence[int]) -> bool:
        return all(abs(a - b) > spacing for a in s for b in s if a != b)

    base = calib(frozenset())
    beam: list[frozenset] = [frozenset()]
    chosen: list[dict] = []
    for n in range(1, budget + 1):
        level_seeds = [(s, src) for s, src in seeds.get(n, []) if len(s) == n and fits(s)]
        for s, src in level_seeds:
            add_source(s, src)
        if n == 1 and singles:
            # SLEB's first step: every single layer on calibration text; the calib_k best join the candidates
            greedy = [frozenset([c]) for c in candidates] + \
                     [frozenset([c]) for c in cands_all if c not in set(candidates)]
            for g in greedy:
                add_source(g, f"single layer {next(iter(g))}")
        else:
            greedy = [beam[0] | {c} for c in candidates if c not in beam[0]
                      and all(abs(c - k) > spacing for k in beam[0])]
            for c in candidates:
                g = beam[0] | {c}
                if g in greedy:
                    add_source(g, f"beam: {_fmt(beam[0])} + {c}" if beam[0] else f"candidate {c}")
        rest = []
        for rank, b in enumerate(beam[1:], start=1):
            for ci, c in enumerate(candidates):
                if c in b or any(abs(c - k) <= spacing for k in b):
                    continue
                rest.append((ci, rank, b | {c}, b, c))
        rest.sort(key=lambda t: (t[0], t[1]))
        for _, _, s_, b, c in rest:
            add_source(s_, f"beam: {_fmt(b)} + {c}")
        # evaluation order: the greedy step (SLEB's, over the candidates), the seeds, the other members' expansions
        queue = list(dict.fromkeys(greedy + [s_ for s_, _ in level_seeds] + [t[2] for t in rest]))
        queue = [q for q in queue if q not in evaluated]
        n_greedy = len([g for g in dict.fromkeys(greedy) if g not in evaluated])
        if cap is None:
            allowance = len(queue)
        else:
            left = cap - cost["evals"]
            k_now = len(candidates) + (calib_k if n == 1 and singles else 0)
            reserve = sum(max(0, k_now - m) for m in range(n, budget))  # future greedy steps
            slack = max(0, left - n_greedy - reserve)
            allowance = min(left, n_greedy + slack // (budget - n + 1))  # a hard cap
        spent0 = cost["evals"]
        for q in queue:
            if cost["evals"] - spent0 >= allowance:
                break
            calib(q)
        if n == 1 and singles:
            ranked = sorted((c for c in cands_all if frozenset([c]) in evaluated),
                            key=lambda c: (evaluated[frozenset([c])], c))
            signals["calibration"] = {c: r + 1 for r, c in enumerate(ranked)}
            extra = [c for c in ranked[:calib_k] if c not in candidates]
            candidates = candidates + extra
        level = sorted((s for s in evaluated if len(s) == n), key=lambda s: (evaluated[s], sorted(s)))
        if not level:
            notes.append(f"no removal set of size {n} could be formed (spacing Δ={spacing})")
            break
        beam = level[:width]
        best = level[0]
        layers = {}
        for i in sorted(best):
            layers[str(i)] = {k: v.get(i) for k, v in signals.items()}
        chosen.append({"n": n, "removed": sorted(best), "calib_ppl": evaluated[best],
                       "calib_delta_pct": 100.0 * (evaluated[best] / base - 1.0),
                       "sources": list(sources.get(best, [])), "layer_ranks": layers,
                       "beam": [{"removed": sorted(s), "calib_ppl": evaluated[s]} for s in beam],
                       "seed_calib": {src: {"removed": sorted(s), "calib_ppl": evaluated.get(s)}
                                      for s, src in level_seeds},
                       "evaluations": cost["evals"], "seconds": time.perf_counter() - t0})
        if ctx.progress is not None:
            ctx.progress(None, None, f"recommend n={n}: {sorted(best)} (calibration PPL {evaluated[best]:.4g}, "
                                     f"{cost['evals']} evaluations)")
    info = {"recommendation": {"levels": chosen, "candidates": candidates, "signals":
                               {k: {str(i): r for i, r in v.items()} for k, v in signals.items()},
                               "calib_base_ppl": base, "evaluations": cost["evals"], "max_evals": cap,
                               "sleb_evaluations": sleb_cost(len(cands_all), budget),
                               "seconds": time.perf_counter() - t0, "notes": notes}}
    st = settings | {"width": width, "top_k": top_k, "calib_tokens": calib_tokens, "max_evals": cap,
                     "seeds": seed_names, "label": LABEL,
                     "calibration": "corpus prompt region (disjoint from the test text)",
                     "choice": "lowest calibration PPL among every evaluated set of that size"}
    return MethodOutput(sets=[c["removed"] for c in chosen], info=info, settings=st,
                        notes=[x for x in notes if not x.startswith("seed ")])


@register("recommend", description="recommended: beam search over removal sets seeded by every method, "
                                   "chosen by calibration PPL", rule_candidates=False,
          label="recommended", offered=True, order=20,  # last: drawn over the other curves
          style={"color": "#111111", "width": 4.5, "marker": 12})
def recommend_method(ctx, budget):
    return search(ctx, budget)


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
        """The recommended layers (0-based slots) to remove at budget ``n``."""
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
            how.append("also proposed by " + ", ".join(_method_label(s) for s in seeds))
        if found:
            how.append("found by the beam (" + found[0].replace("beam: ", "from ") + ")")
        held = ""
        if e.get("delta_pct") is not None:
            ci = e.get("delta_pct_ci")
            held = (f", held-out ΔPPL {e['delta_pct']:+.1f} %" +
                    (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else ""))
        return (f"Remove layers {e['removed']} (n={n}): calibration PPL {e['calib_ppl']:.4g} "
                f"({e['calib_delta_pct']:+.1f} % vs {self.calib_base_ppl:.4g}){held}; "
                + "; ".join(parts) + ("; " + "; ".join(how) if how else "")
                + f"; chosen by calibration PPL only after {e['evaluations']} calibration evaluations "
                  f"({e['seconds']:.0f} s).")

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
        return cls(**{k: d.get(k, [] if k in ("notes", "baseline_ppl_ci") else {} if k == "stats" else None)
                      for k in cls.__dataclass_fields__})

    @classmethod
    def from_json(cls, s_or_path) -> Recommendation:
        s = s_or_path
        if not (isinstance(s, str) and s.lstrip().startswith("{")):
            s = Path(s).read_text()
        return cls.from_dict(json.loads(s))

    @classmethod
    def from_curves(cls, curves) -> Recommendation:
        """From a :class:`~swapkl.removal.CurvesResult` (or its dict) that ran the ``"recommend"`` method: the
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
                   notes=list(rec.get("notes", [])))


def _method_label(name: str) -> str:
    return {"replacement": "replacement-guided", "interchange": "interchange-guided", "bi": "BI", "cka": "CKA",
            "taylor": "Taylor", "laco": "LaCo-merge (as removal)", "sleb": "SLEB"}.get(name, name)


def recommend(model, tokenizer, scores: dict | None, budget: int, corpus=None, evaluator="matched", *,
              width: int = DEFAULT_WIDTH, top_k: int | None = None, calib_tokens: int = DEFAULT_CALIB_TOKENS,
              max_evals="sleb", seeds: Sequence[str] = SEED_METHODS, constrained: bool = False,
              memo=None, identity: dict | None = None, progress=None, should_stop=None, kl: bool = True,
              method_params: dict | None = None, batch_size: int | None = None) -> Recommendation:
    """Recommend the layers to remove for n = 1..``budget`` (see the module docstring) and evaluate each choice on
    the held-out test text (the evaluator's text from the corpus's evaluation region, ``evaluator``) once, after
    the choice.  ``scores``: ``{"replacement": L×L, "interchange": L×L}`` nats (either may be missing).  ``memo``:
    a :class:`~swapkl.removal.EvalMemo` (default: the model's disk memo when ``identity`` names the weights).
    Returns a :class:`Recommendation`."""
    # deferred: swapkl.curves imports the method registry, whose discovery imports this module (methods/recommended)
    from swapkl.curves import removal_curves

    params = dict(method_params or {})
    params["recommend"] = {"width": width, "calib_tokens": calib_tokens, "max_evals": max_evals,
                           "seeds": list(seeds), "constrained": constrained} | (
        {"top_k": top_k} if top_k is not None else {}) | params.get("recommend", {})
    res = removal_curves(model, tokenizer, scores, budget, ["recommend"], evaluator, corpus, progress=progress,
                         should_stop=should_stop, memo=memo, identity=identity, kl=kl, method_params=params,
                         batch_size=batch_size)
    rec = Recommendation.from_curves(res)
    rec.notes = list(res.notes) + [n for n in rec.notes if n not in res.notes]
    return rec
