"""The ``"recommend"`` removal method (label "recommended"): which n layers to remove, chosen on calibration text.

The search (:func:`search`):

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
   prompt region** (:meth:`MethodContext.calib_ppl`, never the test text), in the held-out evaluator's windows
   and stride (so each calibration token is scored with the context a test token gets), through the run's memo so
   no set is evaluated twice.  The ``width`` best sets of size n form the next beam.
4. The set recommended for n is the best calibration PPL among every size-n set evaluated.

Cost cap: ``max_evals`` distinct calibration evaluations (default: what SLEB-iterative spends for the same budget,
``1 + Σ_{s<budget} (C - s)`` over its ``C`` candidates), shared over the levels; seeds are evaluated first at
each level.  ``max_evals=None`` removes the cap: with ``width`` at least the number of size-(n-1) subsets of the
candidates the search is exhaustive over them.

:func:`swapkl.removal.recommend.recommend` runs this method through the curves runner (so the held-out ΔPPL of each
chosen set, with its paired bootstrap CI, comes from the same evaluator and memo as every other curve) and returns
a :class:`swapkl.removal.recommend.Recommendation`.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

from swapkl.errors import SwapklError
from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import get
from swapkl.removal.selection import BudgetError, layer_scores

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "recommend", "run": "recommend_method",
     "description": "recommended: beam search over removal sets seeded by every method, chosen by calibration PPL",
     "label": "recommended", "rule_candidates": False, "offered": True, "order": 20,
     "style": {"color": "#111111", "width": 4.5, "marker": 12}},
]


#: methods whose proposed sets seed the beam (those that cannot run are skipped)
SEED_METHODS = ("replacement", "interchange", "bi", "cka", "taylor", "laco")
LABEL = METHODS[0]["label"]
DEFAULT_WIDTH = 4
DEFAULT_CALIB_TOKENS = 1024  # the same calibration text as SLEB-iterative's default
#: calibration windows: the held-out evaluator's window and stride ("evaluator") or non-overlapping ("disjoint")
DEFAULT_CALIB_WINDOWS = "evaluator"


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
    """The search described in the module docstring, on ``ctx`` (a :class:`swapkl.removal.methods.MethodContext`).

    Parameters (``ctx.params["recommend"]``): ``width`` (beam width, default 4), ``top_k`` (best layers per
    protocol, default :func:`default_top_k`), ``calib_tokens`` (default 1024), ``calib_windows`` (``"evaluator"``,
    the default: the held-out evaluator's window and stride; ``"disjoint"``: non-overlapping windows), ``max_evals`` (default
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
    windows = str(p("calib_windows", DEFAULT_CALIB_WINDOWS))
    if windows not in ("evaluator", "disjoint"):
        raise SwapklError(f"recommend calib_windows must be 'evaluator' or 'disjoint', not {windows!r}")
    # "evaluator": the held-out evaluator's window and stride, so a calibration number is scored like the held-out
    # one (each token with the same context); "disjoint": non-overlapping windows (SLEB's calibration, shared memo)
    calib_stride = getattr(ctx.evaluator, "stride", None) if windows == "evaluator" else None
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
    merged: list[str] = []  # seeds that merge rather than remove
    for name in seed_names:
        try:
            spec = get(name)
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
        if out.variant is not None:  # a merge: its removed layers seed the beam as plain removal
            merged.append(name)
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
            evaluated[s] = float(ctx.calib_ppl(sorted(s), calib_tokens, stride=calib_stride))
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
    st = settings | {"width": width, "top_k": top_k, "calib_tokens": calib_tokens, "calib_windows": windows,
                     "calib_stride": calib_stride, "max_evals": cap,
                     "seeds": seed_names, "merged_seeds": merged, "label": LABEL,
                     "calibration": "corpus prompt region (disjoint from the test text)",
                     "choice": "lowest calibration PPL among every evaluated set of that size"}
    return MethodOutput(sets=[c["removed"] for c in chosen], info=info, settings=st,
                        notes=[x for x in notes if not x.startswith("seed ")])


def recommend_method(ctx, budget):
    return search(ctx, budget)
