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
4. The rule (``docs/recommend-rule.md``, ``rule="confirmed"``, the default): the set recommended for n is the
   protocol rule's zero-evaluation set (the anchor) unless the best calibration set among every size-n set evaluated
   beats it on each of ``calib_regions`` (3) disjoint calibration regions with a pooled paired CI below 0
   (:mod:`swapkl.removal.recommend.confirm`).  ``rule="calibration"``: the set with the best calibration PPL.

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

from swapkl.contract import BLOCK
from swapkl.errors import SwapklError
from swapkl.removal.recommend.confirm import DEFAULT_REGIONS, DEFAULT_RULE, RULES, confirm, pick_anchor
from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens, get, supports
from swapkl.removal.selection import BudgetError, layer_scores

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "recommend", "run": "recommend_method",
     "description": "recommended: beam search over removal sets seeded by every method, chosen by calibration PPL",
     "label": "recommended", "rule_candidates": False, "offered": True, "order": 20,
     "units": "any", "calibration": 1024,
     "style": {"color": "#111111", "width": 4.5, "marker": 12}},
]


#: methods whose proposed sets seed the beam (those that cannot run are skipped)
SEED_METHODS = ("replacement", "interchange", "bi", "cka", "taylor", "laco")
LABEL = METHODS[0]["label"]
DEFAULT_WIDTH = 4
DEFAULT_CALIB_TOKENS = METHODS[0]["calibration"]  # the same calibration text as SLEB-iterative's default
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
    return BeamSearch(ctx, budget).run()


def collect_seeds(ctx, names: Sequence[str], budget: int, notes: list[str]) -> tuple[dict, dict, list]:
    """Every other method's proposed sets: ``({n: [(set, method), ...]}, {method: its info}, [methods that merge
    rather than remove])``; a method that cannot run is skipped with a note."""
    seeds: dict[int, list[tuple[frozenset, str]]] = {}
    seed_info: dict[str, dict] = {}
    merged: list[str] = []
    for name in names:
        out = seed_output(ctx, name, budget, notes)
        if out is None:
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
    return seeds, seed_info, merged


def seed_output(ctx, name: str, budget: int, notes: list[str]) -> MethodOutput | None:
    """The sets method ``name`` proposes at the largest budget it accepts, or None (noted) when it cannot run."""
    try:
        spec = get(name)
        if any(need not in ctx.scores for need in spec.needs):
            notes.append(f"seed {name} skipped: needs {', '.join(spec.needs)} scores")
            return None
    except SwapklError as e:
        notes.append(f"seed {name} skipped: {e}")
        return None
    err = None
    for b in range(budget, 0, -1):  # the largest budget the method accepts (a spacing rule may refuse some)
        try:
            return spec.func(ctx, b)
        except (BudgetError, SwapklError) as e:
            err = err or e
    notes.append(f"seed {name} skipped: {err}")
    return None


class BeamSearch:
    """One run of :func:`search`: its settings, the seeds every other method proposes, the per-layer signals and
    the candidates, then one beam step per n, each under its share of the evaluation budget."""

    def __init__(self, ctx, budget: int):
        self.t0 = time.perf_counter()
        self.ctx, self.budget = ctx, budget
        p = lambda k, d: ctx.param("recommend", k, d)
        self.cands_all, self.spacing, self.settings = ctx.literature_candidates("recommend", budget)
        self.width = int(p("width", DEFAULT_WIDTH))
        self.top_k = int(p("top_k", default_top_k(ctx.num_layers)))
        self.calib_tokens = calib_tokens(ctx, "recommend")
        self.windows = str(p("calib_windows", DEFAULT_CALIB_WINDOWS))
        if self.windows not in ("evaluator", "disjoint"):
            raise SwapklError(f"recommend calib_windows must be 'evaluator' or 'disjoint', not {self.windows!r}")
        # "evaluator": the held-out evaluator's window and stride, so a calibration number is scored like the
        # held-out one (each token with the same context); "disjoint": non-overlapping windows (SLEB's calibration,
        # shared memo)
        self.calib_stride = getattr(ctx.evaluator, "stride", None) if self.windows == "evaluator" else None
        self.seed_names = list(p("seeds", SEED_METHODS))
        if ctx.unit != BLOCK:  # a sublayer search: only the methods defined on that unit propose sets
            dropped = [s for s in self.seed_names if not supports(s, ctx.unit) or s == "recommend"]
            self.seed_names = [s for s in self.seed_names if s not in dropped]
            self.seed_notes = [f"seeds {', '.join(dropped)} skipped: they remove whole blocks only"] if dropped else []
        else:
            self.seed_notes = []
        self.singles = bool(p("singles", True))
        cap = p("max_evals", "sleb")
        self.cap = sleb_cost(len(self.cands_all), budget) if cap == "sleb" else (None if cap is None else int(cap))
        if self.width < 1 or self.top_k < 1 or self.calib_tokens < 16:
            raise SwapklError("recommend needs width >= 1, top_k >= 1 and calib_tokens >= 16")
        self.calib_k = int(p("calib_k", max(1, self.top_k // 2)))
        self.rule, self.regions = str(p("rule", DEFAULT_RULE)), int(p("calib_regions", DEFAULT_REGIONS))
        if self.rule not in RULES or self.regions < 1:
            raise SwapklError(f"recommend rule must be one of {', '.join(RULES)} and calib_regions >= 1")
        self.notes: list[str] = list(self.seed_notes)
        self.signals: dict[str, dict[int, int]] = {}
        self.evaluated: dict[frozenset, float] = {}
        self.sources: dict[frozenset, list[str]] = {}
        self.evals = 0
        self.rule_evals = 0  # region-1 evaluations of anchors the search had not evaluated (regions 2..K: memo only)

    def run(self) -> MethodOutput:
        self.seeds, self.seed_info, self.merged = collect_seeds(self.ctx, self.seed_names, self.budget, self.notes)
        self.candidates = self.rank_candidates()
        self.base = self.calib(frozenset())
        beam: list[frozenset] = [frozenset()]
        chosen: list[dict] = []
        for n in range(1, self.budget + 1):
            level, level_seeds = self.step(n, beam)
            if not level:
                self.notes.append(f"no removal set of size {n} could be formed (spacing Δ={self.spacing})")
                break
            beam = level[:self.width]
            chosen.append(apply_rule(self, self.level_entry(n, beam, level_seeds), level_seeds))
            if self.ctx.progress is not None:
                best = level[0]
                self.ctx.progress(None, None, f"recommend n={n}: {sorted(best)} (calibration PPL "
                                              f"{self.evaluated[best]:.4g}, {self.evals} evaluations)")
        return self.output(chosen)

    # ---- signals and candidates
    def rank_candidates(self) -> list[int]:
        ctx, cands_all, signals, top_k = self.ctx, self.cands_all, self.signals, self.top_k
        for proto in ("replacement", "interchange"):
            if proto in ctx.scores:
                s = layer_scores(ctx.scores[proto], ctx.partners)
                signals[proto] = _ranks([float(x) for x in s], cands_all)
        for name, descending in (("bi", False), ("taylor", False), ("cka", True)):
            if name in self.seed_info:
                signals[name] = _ranks(self.seed_info[name][name], cands_all, descending=descending)
        protos = [x for x in ("replacement", "interchange") if x in signals]
        if protos:
            pool = {i for pr in protos for i in cands_all if signals[pr][i] <= top_k}
        else:  # no swap scores: fall back to the calibrated signals
            pool = {i for pr in ("bi", "taylor") if pr in signals for i in cands_all if signals[pr][i] <= top_k}
            pool = pool or set(cands_all[:top_k])
        big = len(cands_all) + 1
        return sorted(pool, key=lambda i: (min(signals[pr][i] for pr in protos) if protos else big,
                                           signals.get("bi", {}).get(i, big), i))

    # ---- the beam
    def calib(self, s: frozenset) -> float:
        if s not in self.evaluated:
            self.evaluated[s] = float(self.ctx.calib_ppl(sorted(s), self.calib_tokens, stride=self.calib_stride))
            self.evals += 1
        return self.evaluated[s]

    def add_source(self, s: frozenset, label: str) -> None:
        lst = self.sources.setdefault(s, [])
        found = any(x.startswith("beam:") or x.startswith("candidate") or x.startswith("single") for x in lst)
        if label not in lst and not (found and (label.startswith("beam:") or label.startswith("single"))):
            lst.append(label)

    def fits(self, s: Sequence[int]) -> bool:
        return all(abs(a - b) > self.spacing for a in s for b in s if a != b)

    def proposals(self, n: int, beam: list[frozenset]) -> tuple[list, list, list]:
        """(greedy sets, the seeds of size n, the other beam members' expansions) for step n, with their sources."""
        spacing, candidates = self.spacing, self.candidates
        level_seeds = [(s, src) for s, src in self.seeds.get(n, []) if len(s) == n and self.fits(s)]
        for s, src in level_seeds:
            self.add_source(s, src)
        if n == 1 and self.singles:
            # SLEB's first step: every single layer on calibration text; the calib_k best join the candidates
            greedy = [frozenset([c]) for c in candidates] + \
                     [frozenset([c]) for c in self.cands_all if c not in set(candidates)]
            for g in greedy:
                self.add_source(g, f"single layer {next(iter(g))}")
        else:
            greedy = [beam[0] | {c} for c in candidates if c not in beam[0]
                      and all(abs(c - k) > spacing for k in beam[0])]
            for c in candidates:
                g = beam[0] | {c}
                if g in greedy:
                    self.add_source(g, f"beam: {_fmt(beam[0])} + {c}" if beam[0] else f"candidate {c}")
        rest = []
        for rank, b in enumerate(beam[1:], start=1):
            for ci, c in enumerate(candidates):
                if c in b or any(abs(c - k) <= spacing for k in b):
                    continue
                rest.append((ci, rank, b | {c}, b, c))
        rest.sort(key=lambda t: (t[0], t[1]))
        for _, _, s_, b, c in rest:
            self.add_source(s_, f"beam: {_fmt(b)} + {c}")
        return greedy, level_seeds, rest

    def allowance(self, n: int, queue: list, greedy: list) -> int:
        """How many of step n's ``queue`` it may evaluate: all without a cap, else the greedy step plus an even share
        of what is left after reserving the future greedy steps (a hard cap)."""
        if self.cap is None:
            return len(queue)
        n_greedy = len([g for g in dict.fromkeys(greedy) if g not in self.evaluated])
        left = self.cap - self.evals
        k_now = len(self.candidates) + (self.calib_k if n == 1 and self.singles else 0)
        reserve = sum(max(0, k_now - m) for m in range(n, self.budget))  # future greedy steps
        slack = max(0, left - n_greedy - reserve)
        return min(left, n_greedy + slack // (self.budget - n + 1))

    def step(self, n: int, beam: list[frozenset]) -> tuple[list[frozenset], list]:
        """Evaluate step n's proposals within its allowance; the evaluated sets of size n, best first."""
        greedy, level_seeds, rest = self.proposals(n, beam)
        # evaluation order: the greedy step (SLEB's, over the candidates), the seeds, the other members' expansions
        queue = list(dict.fromkeys(greedy + [s_ for s_, _ in level_seeds] + [t[2] for t in rest]))
        queue = [q for q in queue if q not in self.evaluated]
        allowance = self.allowance(n, queue, greedy)
        spent0 = self.evals
        for q in queue:
            if self.evals - spent0 >= allowance:
                break
            self.calib(q)
        if n == 1 and self.singles:
            ranked = sorted((c for c in self.cands_all if frozenset([c]) in self.evaluated),
                            key=lambda c: (self.evaluated[frozenset([c])], c))
            self.signals["calibration"] = {c: r + 1 for r, c in enumerate(ranked)}
            self.candidates = self.candidates + [c for c in ranked[:self.calib_k] if c not in self.candidates]
        level = sorted((s for s in self.evaluated if len(s) == n), key=lambda s: (self.evaluated[s], sorted(s)))
        return level, level_seeds

    def level_entry(self, n: int, beam: list[frozenset], level_seeds: list) -> dict:
        best, ev = beam[0], self.evaluated
        self.calib(best)
        layers = {str(i): {k: v.get(i) for k, v in self.signals.items()} for i in sorted(best)}
        return {"n": n, "removed": sorted(best), "calib_ppl": ev[best],
                "calib_delta_pct": 100.0 * (ev[best] / self.base - 1.0),
                "sources": list(self.sources.get(best, [])), "layer_ranks": layers,
                "beam": [{"removed": sorted(s), "calib_ppl": ev[s]} for s in beam],
                "seed_calib": {src: {"removed": sorted(s), "calib_ppl": ev.get(s)} for s, src in level_seeds},
                "evaluations": self.evals, "seconds": time.perf_counter() - self.t0, "beam_sets": list(beam[1:])}

    def output(self, chosen: list[dict]) -> MethodOutput:
        for c in chosen:
            c.pop("beam_sets", None)
        info = {"recommendation": {"levels": chosen, "candidates": self.candidates, "signals":
                                   {k: {str(i): r for i, r in v.items()} for k, v in self.signals.items()},
                                   "calib_base_ppl": self.base, "evaluations": self.evals,
                                   "rule_evaluations": self.rule_evals, "max_evals": self.cap,
                                   "sleb_evaluations": sleb_cost(len(self.cands_all), self.budget),
                                   "seconds": time.perf_counter() - self.t0, "notes": self.notes}}
        st = self.settings | {"width": self.width, "top_k": self.top_k,
                              "calib_tokens": int(self.ctx.calib_ids(self.calib_tokens).numel()),
                              "calib_windows": self.windows, "calib_stride": self.calib_stride, "max_evals": self.cap,
                              "seeds": self.seed_names, "merged_seeds": self.merged, "label": LABEL,
                              "unit": self.ctx.unit,
                              "calibration": "corpus prompt region (disjoint from the test text)",
                              "rule": self.rule, "calib_regions": self.regions,
                              "choice": ("the protocol rule's zero-evaluation set unless the search's best calibration "
                                         f"set wins on all {self.regions} disjoint calibration regions "
                                         "(docs/recommend-rule.md)") if self.rule == "confirmed" else
                              "lowest calibration PPL among every evaluated set of that size"}
        return MethodOutput(sets=[c["removed"] for c in chosen], info=info, settings=st,
                            notes=[x for x in self.notes if not x.startswith("seed ")])


def apply_rule(bs: BeamSearch, entry: dict, level_seeds: list) -> dict:
    """The recommendation rule (docs/recommend-rule.md) on one level's entry of the search ``bs``: keep the search's set, or replace
    it by the anchor; ``entry["rule"]`` records the anchor, the challenger and the decision."""
    if bs.rule != "confirmed":
        return entry
    spent = bs.evals
    try:
        return _apply_rule(bs, entry, level_seeds)
    finally:  # the rule's calibration evaluations are its own: they do not eat into the search's cap
        bs.rule_evals += bs.evals - spent
        bs.evals = spent


def _apply_rule(bs: BeamSearch, entry: dict, level_seeds: list) -> dict:
    best = frozenset(entry["removed"])
    anchor, src, why = pick_anchor(level_seeds, bs.ctx.scores, bs.calib)
    rule = {"name": bs.rule, "anchor": None if anchor is None else sorted(anchor), "anchor_method": src,
            "why": why, "challenger": sorted(best)}
    if anchor is None:
        entry["rule"] = rule | {"outcome": "search (no anchor)"}
        return entry
    if anchor == best:
        entry["rule"] = rule | {"outcome": "anchor, confirmed by the search"}
        return entry
    dec = confirm(bs.ctx, anchor, best, bs.calib_tokens, bs.calib_stride, bs.regions)
    entry["rule"] = rule | {"decision": dec, "outcome": "departed" if dec["depart"] else "anchor"}
    if not dec["depart"]:
        n = entry["n"]
        entry.update({k: v for k, v in bs.level_entry(n, [anchor] + entry["beam_sets"], []).items()
                      if k in ("removed", "calib_ppl", "calib_delta_pct", "layer_ranks")})
        entry["sources"] = list(dict.fromkeys([src] + bs.sources.get(anchor, [])))
    return entry


def recommend_method(ctx, budget):
    return search(ctx, budget)
