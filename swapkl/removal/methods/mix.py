"""The best mix: removal over MIXED units -- the attention and MLP sublayers of any layers (both sublayers of one layer
are its block) -- chosen for a target of non-embedding parameters removed, the common axis of block and sublayer
curves (:mod:`swapkl.surgery.sizes`).  Budget n means n blocks' worth of parameters: the target is n times the
mean block size.

* ``mix`` (greedy, SLEB-style): from nothing removed, at each step skip the unit with the least calibration-PPL
  increase per non-embedding parameter removed, ``(PPL(S ∪ {u}) - PPL(S)) / params(u)`` on calibration text (the
  corpus's prompt region, asserted disjoint from the held-out evaluation words), until the parameters removed reach
  the target; the set for n is the first set that reaches n blocks' worth.  ``pool`` (optional): after the first
  step, which evaluates every unit, only the ``pool`` units cheapest per parameter alone stay candidates (cost
  control on a big model; recorded).
* ``mix-guided`` (zero calibration evaluations): every unit ranked by its own swap-KL layer score
  ``s(i) = min_j d_unit(i, j)`` (the replacement protocol by default) per parameter, taken in that order until the
  target; the unit matrices come in ``params["mix-guided"]["unit_scores"] = {"attention": {protocol: L×L}, "mlp":
  {...}}``.

A unit ``(layer, unit)`` has the code ``2·layer + (0 attention | 1 mlp)`` (:func:`code`, :func:`decode`): a set of
codes is what the memo keys (calibration here, held-out in the curves runner, text keys ending ``|unit:mixed``).
The method returns, for the curves runner, ``variant = {"kind": "units", "sets": [codes for n = 1, 2, ...]}`` and
``sets`` = the whole blocks of each set; the runner evaluates the mixed set (:mod:`swapkl.surgery.skip`)."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from swapkl.contract import SUBLAYERS
from swapkl.errors import SwapklError
from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "mix", "run": "mix_greedy",
     "description": "best mix: greedy over the attention and MLP sublayers of every layer, the least calibration-PPL "
                    "increase per non-embedding parameter removed, to n blocks' worth of parameters",
     "label": "best mix (greedy)", "rule_candidates": False, "order": 30, "variants": ["units"],
     "calibration": 1024},
    {"name": "mix-guided", "run": "mix_guided",
     "description": "guided mix: sublayers ranked by their own swap-KL per parameter, to n blocks' worth of "
                    "parameters (zero evaluations)",
     "label": "guided mix", "rule_candidates": False, "order": 31, "variants": ["units"]},
]

MIXED_KEY = "|unit:mixed"


def code(layer: int, unit: str) -> int:
    """The memo code of one sublayer unit: ``2·layer`` (attention) or ``2·layer + 1`` (mlp)."""
    return 2 * int(layer) + SUBLAYERS.index(unit)


def decode(codes: Iterable[int]):
    """The :class:`~swapkl.surgery.removal_set.RemovalSet` of a set of codes (both sublayers of a layer: its block)."""
    from swapkl.surgery.removal_set import RemovalSet

    return RemovalSet((int(c) // 2, SUBLAYERS[int(c) % 2]) for c in codes)


def unit_size(sizes: dict, c: int) -> int:
    return int(sizes[SUBLAYERS[c % 2]][c // 2])


def targets(sizes: dict, budget: int) -> list[int]:
    """Parameters to remove for n = 1..budget: n times the mean block size (rounded)."""
    mean = sum(sizes["block"]) / len(sizes["block"])
    return [int(round(n * mean)) for n in range(1, budget + 1)]


def check_disjoint(corpus, evaluator, calib_words: int) -> tuple[int, int]:
    """Word ranges: the held-out text is words ``[0, max_words)`` of the corpus, calibration words
    ``[split_point, split_point + calib_words)`` (:meth:`~swapkl.scoring.corpora.Corpus.prompt_text`); raises
    :class:`SwapklError` unless they are disjoint.  Returns the calibration range."""
    held = int(getattr(evaluator, "max_words", 0) or 0)
    start = int(corpus.split_point)
    if held > start:
        raise SwapklError(f"calibration text (words from {start}) overlaps the held-out text (words 0..{held - 1})")
    return start, start + int(calib_words)


def calib_ppl(ctx, codes: Sequence[int], tokens: int, stride: int | None) -> float:
    """PPL, memoised on the set of codes, of the model with the mixed set ``codes`` skipped, on the first
    ``tokens`` calibration tokens (the held-out evaluator's window, ``stride``: default non-overlapping)."""
    from swapkl.measure import evaluate as E  # deferred: pulls torch
    from swapkl.surgery.skip import removed_copy

    ids = ctx.calib_ids(tokens)
    win = min(ctx.evaluator.window, ids.numel())
    step = min(stride or win, win)
    key = (f"calib:{getattr(ctx.corpus, 'sha256', '?')}:{ids.numel()}:{win}" + (f":s{step}" if step != win else "")
           + MIXED_KEY)
    rs = decode(codes)
    return ctx.memo.get(key, list(codes), lambda: E.evaluate_ppl(
        removed_copy(ctx.model, rs) if len(rs) else ctx.model, ids, win, step, batch_size=ctx.batch_size)).ppl


def _nested(order: list[int], sizes: dict, goal: list[int]) -> tuple[list[list[int]], list[int]]:
    """The first prefix of ``order`` reaching each target: (code sets, parameters removed)."""
    sets, got, total, k = [], [], 0, 0
    for i, c in enumerate(order):
        total += unit_size(sizes, c)
        while k < len(goal) and total >= goal[k]:
            sets.append(sorted(order[:i + 1]))
            got.append(total)
            k += 1
    return sets, got


def _output(ctx, sets: list, got: list, goal: list, settings: dict, info: dict, budget: int) -> MethodOutput:
    from swapkl.surgery.sizes import params_removed

    rs = [decode(s) for s in sets]
    got = [params_removed(ctx_sizes(ctx), r) for r in rs]  # the set's own count (a layer's two sublayers: its block)
    info = info | {"sets": [{"n": k + 1, "removal": r.to_list(), "label": r.label(), "params_removed": g,
                             "target": goal[k]} for k, (r, g) in enumerate(zip(rs, got))]}
    out = MethodOutput(sets=[r.blocks for r in rs], info=info, settings=settings,
                       variant={"kind": "units", "sets": [list(s) for s in sets]})
    if len(sets) < budget:
        out.notes.append(f"the units run out at n={len(sets)} blocks' worth of parameters")
    return out


def ctx_sizes(ctx) -> dict:
    """:func:`swapkl.surgery.sizes.unit_sizes` of the context's model, computed once per context."""
    if getattr(ctx, "_mix_sizes", None) is None:
        from swapkl.surgery.sizes import unit_sizes

        sizes = unit_sizes(ctx.model)
        if sizes.get("attention") is None:
            raise SwapklError("this model family has no validated attention/MLP units; the mix needs them")
        ctx._mix_sizes = sizes
    return ctx._mix_sizes


def all_codes(ctx) -> list[int]:
    return [code(layer, u) for layer in range(ctx.num_layers) for u in SUBLAYERS]


def keeps_a_layer(codes: Iterable[int], num_layers: int) -> bool:
    """False when the codes remove every block (a model must keep one)."""
    return len(decode(codes).blocks) < num_layers


def mix_greedy(ctx, budget: int) -> MethodOutput:
    """The greedy best mix (module docstring).  ``params["mix"]``: ``calib_tokens`` (default: the registry's, 1024),
    ``calib_windows`` (``"disjoint"``, the default, or ``"evaluator"``: its stride), ``pool`` (None: every unit)."""
    p = lambda k, d: ctx.param("mix", k, d)
    tokens = calib_tokens(ctx, "mix")
    windows = str(p("calib_windows", "disjoint"))
    if windows not in ("disjoint", "evaluator") or tokens < 16:
        raise SwapklError("mix needs calib_tokens >= 16 and calib_windows 'disjoint' or 'evaluator'")
    stride = getattr(ctx.evaluator, "stride", None) if windows == "evaluator" else None
    pool = p("pool", None)
    sizes = ctx_sizes(ctx)
    calib_range = check_disjoint(ctx.corpus, ctx.evaluator, tokens)
    goal = targets(sizes, budget)
    cands = all_codes(ctx)
    picks: list[int] = []
    cur = base = calib_ppl(ctx, [], tokens, stride)
    total, steps = 0, []
    while total < goal[-1]:
        trial = [c for c in cands if c not in picks and keeps_a_layer(picks + [c], ctx.num_layers)]
        if not trial:
            break
        ppl = {c: calib_ppl(ctx, picks + [c], tokens, stride) for c in trial}
        rate = {c: (ppl[c] - cur) / unit_size(sizes, c) for c in trial}
        best = min(trial, key=lambda c: (rate[c], c))
        if not steps and pool is not None:  # the cheapest units per parameter alone stay candidates
            cands = sorted(trial, key=lambda c: (rate[c], c))[:max(1, int(pool))]
        picks.append(best)
        total += unit_size(sizes, best)
        cur = ppl[best]
        steps.append({"step": len(steps) + 1, "unit": [best // 2, SUBLAYERS[best % 2]], "calib_ppl": cur,
                      "params_removed": total, "trials": {str(c): ppl[c] for c in trial}})
        if ctx.progress is not None:
            ctx.progress(None, None, f"mix step {len(steps)}: skip {SUBLAYERS[best % 2]} {best // 2} (calibration "
                                     f"PPL {cur:.4g}, {total} parameters)")
    sets, got = _nested(picks, sizes, goal)
    settings = {"calib_tokens": int(ctx.calib_ids(tokens).numel()), "calib_windows": windows, "calib_stride": stride, "pool": pool,
                "calibration": "corpus prompt region (disjoint from the test text)",
                "calib_words": list(calib_range), "targets": goal, "rule": "least calibration-PPL increase per "
                "non-embedding parameter removed"}
    return _output(ctx, sets, got, goal, settings, {"steps": steps, "calib_base_ppl": base,
                                                    "evaluations": sum(len(s["trials"]) for s in steps) + 1}, budget)


def guided_order(unit_scores: dict, sizes: dict, protocol: str, partners=None) -> tuple[list[int], dict]:
    """Every unit's code, ascending by its own layer score ``s(i)`` per parameter (ties by code), and the rates."""
    import numpy as np

    from swapkl.removal.selection import layer_scores

    rate = {}
    for u in SUBLAYERS:
        d = (unit_scores.get(u) or {}).get(protocol)
        if d is None:
            raise SwapklError(f"mix-guided needs the {u} unit's {protocol} swap-KL matrix (params['mix-guided']"
                              f"['unit_scores']['{u}']['{protocol}'])")
        s = layer_scores(np.asarray(d, dtype=float), partners)
        for layer, v in enumerate(s):
            v = float(v)
            rate[code(layer, u)] = math.inf if math.isnan(v) else v / unit_size(sizes, code(layer, u))
    return sorted(rate, key=lambda c: (rate[c], c)), rate


def mix_guided(ctx, budget: int) -> MethodOutput:
    """The guided mix (module docstring).  ``params["mix-guided"]``: ``unit_scores`` (required), ``protocol``
    (``replacement``, the default, or ``interchange``)."""
    p = lambda k, d: ctx.param("mix-guided", k, d)
    protocol = str(p("protocol", "replacement"))
    if protocol not in ("replacement", "interchange"):
        raise SwapklError(f"mix-guided protocol must be replacement or interchange, not {protocol!r}")
    sizes = ctx_sizes(ctx)
    order, rate = guided_order(p("unit_scores", {}) or {}, sizes, protocol, ctx.partners)
    picks: list[int] = []
    for c in order:
        if keeps_a_layer(picks + [c], ctx.num_layers) and rate[c] != math.inf:
            picks.append(c)
    goal = targets(sizes, budget)
    sets, got = _nested(picks, sizes, goal)
    settings = {"protocol": protocol, "targets": goal, "rule": "own swap-KL layer score per parameter, ascending"}
    return _output(ctx, sets, got, goal, settings, {"rates": {str(c): r for c, r in rate.items()}}, budget)
