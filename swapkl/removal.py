"""From pair scores to removal sets (METHOD §4), the regime verdict (METHOD §5), and removal curves.

Selection is pure numpy over an L×L score matrix ``d`` (nats; symmetric; NaN where a pair was not scored):

1. layer score ``s(i) = min over scored partners j != i of d(i, j)`` (lower = more removable);
2. candidates (default: all but the first and last layer) sorted by ascending ``s`` (ties by index;
   ``anti=True``: descending, the anti-guided baseline);
3. scan, adding ``i`` when ``|i - k| > spacing`` for every selected ``k``; stop at ``n``.

The scan order is fixed, so the sets are nested: the set for budget ``n`` is the first ``n`` picks, and one
selection gives a whole curve.

:func:`removal_curves` evaluates every method's nested sets with one memo of perplexity evaluations keyed by the
frozenset of removed layers (see ``docs/removal.md``).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from swapkl.errors import ComputeInterrupted, ContractError, SwapklError
from swapkl.results import CONDITIONAL, STRONG, atomic_write_text  # thresholds in nats (METHOD §1)
from swapkl.results import finite_json as _jsonable


class BudgetError(ContractError):
    """A removal budget the candidates cannot satisfy under the spacing rule."""


class ScoresMismatch(SwapklError):
    """A scores file that belongs to a different model (or layer count)."""


# --------------------------------------------------------------------------------------------------- selection
def _as_matrix(d) -> np.ndarray:
    d = np.asarray(d, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise SwapklError(f"score matrix must be square L×L, got shape {d.shape}")
    return d


def partner_mask(num_layers: int, partners=None) -> np.ndarray:
    """(L, L) bool: which pairs may serve as partners.  ``partners``: None (every scored pair), ``"adjacent"``
    (|i-j| = 1), an int k (|i-j| <= k), or an iterable of (i, j) pairs."""
    L = num_layers
    ii, jj = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    off = ii != jj
    if partners is None or partners == "all":
        return off
    if partners == "adjacent":
        return np.abs(ii - jj) == 1
    if isinstance(partners, (int, np.integer)):
        return off & (np.abs(ii - jj) <= int(partners))
    m = np.zeros((L, L), dtype=bool)
    for i, j in partners:
        m[i, j] = m[j, i] = True
    return m & off


def layer_scores(d, partners=None) -> np.ndarray:
    """``s(i) = min_j d(i, j)`` over scored partners (nats), shape (L,); NaN for a layer without a scored partner.

    The matrix is read symmetrically: a pair scored only in one triangle counts for both layers."""
    d = _as_matrix(d)
    dd = np.where(np.isnan(d), d.T, d)  # fill a missing triangle from the other one
    dd = np.where(partner_mask(len(dd), partners), dd, np.nan)
    with np.errstate(all="ignore"):
        out = np.full(len(dd), np.nan)
        for i in range(len(dd)):
            row = dd[i][~np.isnan(dd[i])]
            if row.size:
                out[i] = row.min()
    return out


def default_candidates(num_layers: int, exclude_boundary: bool = True) -> list[int]:
    return list(range(1, num_layers - 1)) if exclude_boundary else list(range(num_layers))


def max_feasible(candidates: Iterable[int], spacing: int = 1) -> int:
    """The largest number of candidates that can be selected with pairwise distance > ``spacing``
    (greedy from the lowest index, which is optimal on a line)."""
    n, last = 0, None
    for c in sorted(set(candidates)):
        if last is None or c - last > spacing:
            n, last = n + 1, c
    return n


def check_budget(n: int, candidates: Sequence[int], spacing: int = 1) -> None:
    """Raise :class:`BudgetError` when ``n`` exceeds what ``candidates`` allow under ``spacing``."""
    if n < 1:
        raise BudgetError(f"budget must be at least 1 (got {n})")
    m = max_feasible(candidates, spacing)
    if n > m:
        raise BudgetError(
            f"budget {n} is larger than the candidate layers allow: at most {m} of {len(set(candidates))} "
            f"candidates can be removed with spacing Δ={spacing} (no two removed layers within {spacing} slots)")


def scan(order: Sequence[int], n: int, spacing: int = 1) -> list[int]:
    """Steps 3: walk ``order``, keep a layer when it is more than ``spacing`` away from every kept one; stop at n.
    Returns the picks in pick order."""
    picked: list[int] = []
    for i in order:
        if len(picked) >= n:
            break
        if all(abs(i - k) > spacing for k in picked):
            picked.append(int(i))
    return picked


def nested(picks: Sequence[int]) -> list[list[int]]:
    """Pick order → nested sets (sorted) for n = 1..len(picks)."""
    return [sorted(picks[:k]) for k in range(1, len(picks) + 1)]


def select(d, n: int, spacing: int = 1, exclude_boundary: bool = True, candidates: Iterable[int] | None = None,
           anti: bool = False, partners=None, strict: bool = True) -> list[list[int]]:
    """The score-to-removal rule (METHOD §4).  Returns nested sets: element ``k-1`` is the sorted set for budget k.

    ``d``: (L, L) pair scores in nats, NaN where not scored.  ``candidates``: layers allowed (default: all but
    the first and last when ``exclude_boundary``).  ``partners``: see :func:`partner_mask`.  ``anti``: highest
    score first.  Raises :class:`BudgetError` when ``n`` exceeds the max feasible number under the spacing rule,
    or (``strict``) when the score order stops short of ``n`` (every remaining candidate is too close to a
    selected layer); with ``strict=False`` the shorter list is returned.
    """
    d = _as_matrix(d)
    L = len(d)
    cands = sorted(set(candidates)) if candidates is not None else default_candidates(L, exclude_boundary)
    bad = [c for c in cands if not 0 <= c < L]
    if bad:
        raise SwapklError(f"candidate layer(s) {bad} out of range 0..{L - 1}")
    check_budget(n, cands, spacing)
    s = layer_scores(d, partners)
    ranked = [c for c in cands if not np.isnan(s[c])]
    if not ranked:
        raise BudgetError("no candidate layer has a scored partner; score more pairs")
    ranked.sort(key=lambda i: ((-s[i]) if anti else s[i], i))
    picks = scan(ranked, n, spacing)
    if len(picks) < n and strict:
        unscored = len(cands) - len(ranked)
        extra = f" ({unscored} candidates have no scored partner)" if unscored else ""
        raise BudgetError(
            f"the score order stops after {len(picks)} layers {sorted(picks)}: every remaining candidate is within "
            f"Δ={spacing} of a selected layer{extra}; use a budget <= {len(picks)} or a smaller spacing")
    return nested(picks)


def random_sets(candidates: Sequence[int], n: int, spacing: int = 1, seed: int = 0) -> list[list[int]]:
    """Nested random sets under the spacing rule: each step draws uniformly among the candidates that keep the
    rest of the budget feasible, so every seed reaches ``n``.  Raises :class:`BudgetError` if ``n`` is infeasible."""
    cands = sorted(set(candidates))
    check_budget(n, cands, spacing)
    rng = np.random.default_rng(seed)
    picks: list[int] = []
    for step in range(n):
        allowed = [c for c in cands if all(abs(c - k) > spacing for k in picks)]
        ok = [c for c in allowed
              if max_feasible([a for a in allowed if abs(a - c) > spacing], spacing) >= n - step - 1]
        picks.append(int(ok[int(rng.integers(len(ok)))]))
    return nested(picks)


# --------------------------------------------------------------------------------------------------- verdict
def adjacent_pairs(num_layers: int) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(num_layers - 1)]


def _sym(d: np.ndarray, i: int, j: int) -> float:
    v = d[i, j]
    return float(d[j, i]) if np.isnan(v) else float(v)


def regime_verdict(d_repl, d_inter, pairs: Sequence[tuple[int, int]] | None = None,
                   threshold: float = CONDITIONAL) -> dict:
    """The paper's decision rule (METHOD §5) on the adjacent pairs (or ``pairs``).

    A protocol is *low* when at least one of the pairs scores below ``threshold`` (0.10 nats, "conditional"),
    *high* otherwise.  high replacement + low interchange → ``"divergent"`` (prefer interchange-guided removal);
    low + low → ``"tied"`` (either protocol; calibrated iterative methods may win at large budgets); high + high →
    ``"weak"`` (swap scores alone are weak).  The unusual low replacement + high interchange is reported as
    ``"divergent"`` with ``prefer="replacement"``.  Returns a JSON-able dict with ``regime``, ``prefer``,
    ``sentence`` and ``evidence`` (per protocol: pairs scored, counts < 0.05 / < 0.10, min, median, best pair; KL
    ratio d_inter/d_repl: median over pairs and best-to-best).
    """
    dr, di = _as_matrix(d_repl), _as_matrix(d_inter)
    if dr.shape != di.shape:
        raise SwapklError(f"replacement {dr.shape} and interchange {di.shape} matrices differ in shape")
    pairs = list(pairs) if pairs is not None else adjacent_pairs(len(dr))
    ev: dict = {"pairs": "adjacent" if pairs == adjacent_pairs(len(dr)) else [list(p) for p in pairs],
                "threshold": threshold, "strong_threshold": STRONG}
    vals = {}
    for name, d in (("replacement", dr), ("interchange", di)):
        v = np.array([_sym(d, i, j) for i, j in pairs])
        ok = ~np.isnan(v)
        scored = [(p, x) for p, x, o in zip(pairs, v, ok) if o]
        vals[name] = v
        if not scored:
            raise SwapklError(f"no {name} scores on the pairs the verdict needs (adjacent pairs); score them first")
        xs = np.array([x for _, x in scored])
        best_pair, best = min(scored, key=lambda t: t[1])
        ev[name] = {"n_pairs": int(ok.sum()), "below_0.05": int((xs < STRONG).sum()),
                    "below_threshold": int((xs < threshold).sum()), "min": float(xs.min()),
                    "median": float(np.median(xs)), "best_pair": list(best_pair)}
    both = ~np.isnan(vals["replacement"]) & ~np.isnan(vals["interchange"]) & (vals["replacement"] > 0)
    ratio = vals["interchange"][both] / vals["replacement"][both]
    ev["kl_ratio_median"] = float(np.median(ratio)) if ratio.size else None
    ev["kl_ratio_best"] = (ev["interchange"]["min"] / ev["replacement"]["min"]
                           if ev["replacement"]["min"] > 0 else None)
    r_low = ev["replacement"]["below_threshold"] > 0
    i_low = ev["interchange"]["below_threshold"] > 0
    t = f"{threshold:g} nats"
    rmin, imin = ev["replacement"]["min"], ev["interchange"]["min"]
    if not r_low and i_low:
        regime, prefer = "divergent", "interchange"
        sentence = (f"Divergent regime: no adjacent pair is replacement-similar (best d_repl {rmin:.3g}) but "
                    f"{ev['interchange']['below_threshold']} are interchange-similar (best d_inter {imin:.3g}) "
                    f"below {t}; prefer interchange-guided removal.")
    elif r_low and i_low:
        regime, prefer = "tied", "either"
        sentence = (f"Tied regime: both protocols find adjacent pairs below {t} (best d_repl {rmin:.3g}, best "
                    f"d_inter {imin:.3g}); either protocol is fine, calibrated iterative methods may win at large "
                    f"budgets.")
    elif not r_low and not i_low:
        regime, prefer = "weak", "neither"
        sentence = (f"Weak regime: no adjacent pair is below {t} under either protocol (best d_repl {rmin:.3g}, "
                    f"best d_inter {imin:.3g}); swap scores alone are a weak guide, add calibration data or "
                    f"another signal.")
    else:
        regime, prefer = "divergent", "replacement"
        sentence = (f"Divergent regime (unusual direction): adjacent pairs are replacement-similar (best d_repl "
                    f"{rmin:.3g}) but none is interchange-similar (best d_inter {imin:.3g}) below {t}; prefer "
                    f"replacement-guided removal.")
    kr = ev["kl_ratio_best"]
    if regime == "divergent" and prefer == "interchange" and kr is not None and kr > 0.5:
        sentence += f" Borderline: the best-pair KL ratio is {kr:.2f}, not << 1."
    return {"regime": regime, "prefer": prefer, "sentence": sentence, "evidence": ev}


# --------------------------------------------------------------------------------------------------- curves
@dataclass
class CurvesResult:
    """Everything a removal-curve run produced (JSON-able).

    ``methods[name]``: list of ``{n, removed, ppl, ppl_ci, delta_pct, delta_pct_ci, kl_to_base}`` (ppl: perplexity;
    delta_pct: ΔPPL % vs ``baseline_ppl``; kl_to_base: mean KL(base || pruned) per scored token, nats).  For
    ``random``: entries hold the mean over seeds in ``ppl``/``delta_pct``/``kl_to_base``, ``removed`` is None and
    ``delta_pct_min``/``delta_pct_max``/``delta_pct_std``/``per_seed`` give the spread; the per-seed curves are
    in ``random_seeds``.  ``delta_ratio``: per n, ΔPPL%(interchange) / ΔPPL%(replacement).
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

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def to_json(self, path=None, indent: int = 2) -> str:
        s = json.dumps(_jsonable(self.to_dict()), indent=indent, allow_nan=False)
        if path is not None:
            atomic_write_text(path, s)
        return s

    @classmethod
    def from_json(cls, s_or_path, what: str = "curves file") -> CurvesResult:
        """From :meth:`to_json`'s text (``str`` starting with ``{``, or ``bytes``), its parsed dict, or a path.
        Validated by :func:`swapkl.schema.curves_fields` before anything is built; a bad file raises
        :class:`~swapkl.errors.UploadError` naming ``what`` and the field."""
        from swapkl import schema

        s = s_or_path
        if isinstance(s, (bytes, bytearray)) or (isinstance(s, str) and s.lstrip().startswith("{")):
            d = schema.parse_json(s, what, keep_constants=True)
        elif isinstance(s, dict):
            d = s
        else:
            d = schema.read_json_file(s, what, keep_constants=True)
            what = f"{what} {s}"
        return cls(**schema.curves_fields(d, what))

    def curve(self, method: str) -> list[dict]:
        return self.methods[method]


class EvalMemo:
    """Perplexity evaluations keyed by (text key, frozenset of removed layers).

    One instance serves a whole run (all budgets, all methods, SLEB's trial sets); pass the same instance to
    another :func:`removal_curves` call on the same model and text to reuse it across calls.  With ``disk`` (a
    folder, see :func:`disk_memo`) every evaluation is also written there atomically as it finishes and read
    back by later runs, so an interrupted curves run loses nothing (a folder that cannot be written is warned about
once, :func:`swapkl.cache.warn_unwritable`, and the memo goes on in memory).  ``hits``/``misses`` count lookups
    (``disk_hits`` those served from the folder)."""

    def __init__(self, fingerprint: object = None, disk: str | os.PathLike | None = None):
        self.fingerprint = fingerprint
        self.store: dict = {}
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0
        self.seconds = 0.0
        self.disk = Path(disk) if disk is not None else None
        self.disk_writable = True  # False after the first failed write (the rest stays in memory)

    def _file(self, key) -> Path:
        from swapkl.contract import stable_hash

        return self.disk / f"{stable_hash([key[0], sorted(key[1])])[:24]}.json"

    def _load(self, key):
        import warnings

        from swapkl.evaluate import PPLResult

        f = self._file(key)
        if not f.is_file():
            return None
        try:
            d = json.loads(f.read_text())
            if d["text_key"] != key[0] or sorted(d["removed"]) != sorted(key[1]):
                raise ValueError("key mismatch")
            return PPLResult(nll=np.asarray(d["window_nll"], float), counts=np.asarray(d["window_counts"], np.int64),
                             n_tokens=int(d["n_tokens"]), window=int(d["window"]), stride=int(d["stride"]),
                             drop_first_target=bool(d["drop_first_target"]),
                             kl=np.asarray(d["window_kl"], float) if d.get("window_kl") is not None else None,
                             seconds=float(d.get("seconds", 0.0)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            from swapkl.cache import CacheWarning

            warnings.warn(f"corrupt cache entry {f}: {e}; it will be recomputed", CacheWarning, stacklevel=3)
            with contextlib.suppress(OSError):
                f.unlink(missing_ok=True)
            return None

    def _save(self, key, val) -> None:
        if not self.disk_writable:
            return
        d = val.to_dict(with_windows=True) | {"text_key": key[0], "removed": sorted(key[1])}
        try:
            atomic_write_text(self._file(key), json.dumps(d))
        except OSError as e:  # an unwritable cache: say so once, keep going in memory
            from swapkl.cache import warn_unwritable

            self.disk_writable = False
            warn_unwritable(self._file(key), e)

    def get(self, text_key: str, removed: Iterable[int], compute: Callable[[], object]):
        key = (text_key, frozenset(int(i) for i in removed))
        if key in self.store:
            self.hits += 1
            return self.store[key]
        if self.disk is not None:
            val = self._load(key)
            if val is not None:
                self.hits += 1
                self.disk_hits += 1
                self.store[key] = val
                return val
        self.misses += 1
        t = time.perf_counter()
        val = compute()
        self.seconds += time.perf_counter() - t
        self.store[key] = val
        if self.disk is not None:
            self._save(key, val)
        return val


def disk_memo(identity: dict | None, kl: bool = True) -> EvalMemo:
    """An :class:`EvalMemo` backed by ``<cache>/ppl/<key>/``, keyed by the model identity (id + revision +
    commit, or content fingerprint), whether KL to base is recorded, and the swapkl version; a plain in-memory
    memo when the identity cannot name the weights."""
    from swapkl import __version__
    from swapkl.cache import cache_root
    from swapkl.contract import stable_hash

    ident = {k: (identity or {}).get(k) for k in ("kind", "id", "revision", "commit", "fingerprint", "dtype")}
    if not (ident["fingerprint"] or ident["commit"] or (ident["kind"] == "hub" and ident["revision"])):
        return EvalMemo()
    key = stable_hash({"model": ident, "kl": bool(kl), "version": __version__})[:20]
    return EvalMemo(disk=cache_root() / "ppl" / key)


def check_scores(scores: dict, num_layers: int, identity: dict | None = None, model_identity: dict | None = None,
                 what: str = "the scores file is for a different model"):
    """Raise :class:`ScoresMismatch` when score matrices do not fit the model (layer count; identity when both
    sides give one).  ``what`` starts the identity message."""
    for name, d in scores.items():
        d = np.asarray(d)
        if d.shape != (num_layers, num_layers):
            raise ScoresMismatch(
                f"the {name} scores are for a {d.shape[0]}-layer model; this model has {num_layers} layers "
                f"(a scores file from a different model?)")
    if identity and model_identity:
        keys = ["model_type", "num_layers", "fingerprint", "commit"]
        if identity.get("kind") == "hub" and model_identity.get("kind") == "hub":
            keys += ["id", "revision"]
        for key in keys:
            a, b = identity.get(key), model_identity.get(key)
            if a is not None and b is not None and a != b:
                name = identity.get("display") or identity.get("id") or "?"
                raise ScoresMismatch(f"{what} ({name}; {key} {a} != {b})")


def check_same_model(result, curves_model: dict | None,
                     what: str = "the scores and the removal curves are for different models") -> None:
    """Raise :class:`ScoresMismatch` when removal curves (their ``model`` identity) were computed on another model
    than the score result ``result`` (a :class:`~swapkl.results.SwapResult`): the one check for every place that
    shows the two together (the dashboard's file upload, ``report --scores --curves``)."""
    check_scores({"replacement": result.replacement(), "interchange": result.interchange()}, result.num_layers,
                 result.identity, curves_model, what=what)


def check_evaluator_context(model, evaluator, name: str | None = None) -> None:
    """Raise :class:`ContractError` when the perplexity evaluator's window (tokens) exceeds the model's context."""
    from swapkl import architectures as arch
    from swapkl.evaluate import get_evaluator

    ev = get_evaluator(evaluator)
    arch.check_context(model, ev.window, f"the '{ev.name}' evaluator's window of {ev.window} tokens",
                       "use an evaluator whose window is at most {limit} tokens", name=name)


def removal_curves(model, tokenizer, scores: dict | None, budget: int, methods: Sequence[str] = (
        "replacement", "interchange", "random"), evaluator="matched", corpus=None, progress=None,
        should_stop=None, *, spacing: int = 1, exclude_boundary: bool = True, candidates=None, partners=None,
        seeds: Sequence[int] = (0, 1, 2, 3, 4), kl: bool = True, memo: EvalMemo | None = None,
        identity: dict | None = None, eval_ids=None, batch_size: int | None = None,
        method_params: dict | None = None) -> CurvesResult:
    """Removal curves for n = 1..``budget`` for each method of ``methods`` (see :mod:`swapkl.methods`).

    ``scores``: ``{"replacement": L×L, "interchange": L×L}`` (nats, NaN = not scored); needed by the guided and
    anti-guided methods and by the verdict.  ``evaluator``: ``"matched"`` / ``"standard"`` or an
    :class:`swapkl.evaluate.Evaluator`.  ``corpus``: a :class:`swapkl.corpora.Corpus` (default: auto);
    evaluation text = its eval region, calibration text for BI/SLEB = its prompt region (disjoint).
    ``progress(done, total, message)`` is called after every curve point (``total`` = planned points +
    baseline; a curve that stops early leaves ``done < total`` until the end); ``should_stop()`` → True raises
    :class:`ComputeInterrupted` with the partial result in ``.partial``.  ``memo``: an :class:`EvalMemo` to
    reuse across calls.  Returns a :class:`CurvesResult`.
    """
    from swapkl import architectures as arch
    from swapkl import evaluate as E
    from swapkl import methods as M
    from swapkl.prune import pruned_copy
    import torch

    t_start = time.perf_counter()
    loc = arch.locate(model)
    L = loc.num_layers
    scores = {k: _as_matrix(v) for k, v in (scores or {}).items() if v is not None}
    check_scores(scores, L)
    method_list = [m.strip() for m in methods if m and m.strip()]
    specs = M.resolve(method_list, scores)  # unknown names / missing scores fail before any work
    cands = sorted(set(candidates)) if candidates is not None else default_candidates(L, exclude_boundary)
    if any(s.rule_candidates for s in specs):  # fail before any evaluation
        check_budget(budget, cands, spacing)
    ev = E.get_evaluator(evaluator)
    check_evaluator_context(model, ev, name=(identity or {}).get("display"))
    if corpus is None:
        from swapkl.corpora import load_corpus
        corpus = load_corpus()
    ids = eval_ids if eval_ids is not None else E.eval_ids(corpus, tokenizer, ev)
    ids = torch.as_tensor(ids).reshape(-1).long()
    text_key = f"test:{getattr(corpus, 'sha256', '?')}:{ev.max_words}:{ev.window}:{ev.stride}:{ev.drop_first_target}"
    memo = memo if memo is not None else disk_memo(identity, kl)
    fingerprint = (id(model), L, int(ids.numel()))
    if memo.fingerprint is None:
        memo.fingerprint = fingerprint
    elif memo.fingerprint != fingerprint:
        raise SwapklError("this evaluation memo belongs to another model or text; use a new EvalMemo")

    counter = {"evals": 0, "points": 0}
    # planned curve points (an upper bound: memo hits count as done at once); +1 for the baseline
    planned = 1 + sum(budget * (len(seeds) if s.name == "random" else 1) for s in specs)

    def report(msg: str):
        if progress is not None:
            progress(min(counter["points"], planned), planned, msg)

    def stop_check():
        if should_stop is not None and should_stop():
            raise ComputeInterrupted("removal curves stopped")

    baseline = memo.get(text_key, (), lambda: E.evaluate_ppl(model, ids, ev.window, ev.stride,
                                                              ev.drop_first_target, batch_size=batch_size,
                                                              capture_reference=kl, should_stop=should_stop))
    if kl and baseline.reference is None:  # a memo filled without KL: redo the baseline with a reference
        baseline = E.evaluate_ppl(model, ids, ev.window, ev.stride, ev.drop_first_target, batch_size=batch_size,
                                  capture_reference=True, should_stop=should_stop)
        memo.store[(text_key, frozenset())] = baseline
    reference = baseline.reference if kl else None
    base_ci = baseline.ci()
    counter["points"] += 1
    report(f"baseline PPL {baseline.ppl:.4g}")

    def evaluate_set(removed: Sequence[int]) -> E.PPLResult:
        stop_check()

        def compute():
            counter["evals"] += 1
            pm = pruned_copy(model, removed)
            r = E.evaluate_ppl(pm, ids, ev.window, ev.stride, ev.drop_first_target, batch_size=batch_size,
                               reference=reference, should_stop=should_stop)
            return r
        return memo.get(text_key, removed, compute)

    def entry(n: int, removed: Sequence[int]) -> dict:
        r = evaluate_set(removed)
        counter["points"] += 1
        report(f"n={n} removed {sorted(int(i) for i in removed)}: PPL {r.ppl:.4g}")
        return {"n": n, "removed": sorted(int(i) for i in removed), "ppl": r.ppl, "ppl_ci": list(r.ci()),
                "delta_pct": E.delta_pct(r, baseline), "delta_pct_ci": list(E.delta_pct_ci(r, baseline)),
                "kl_to_base": r.kl_to_base}

    result = CurvesResult(
        model=identity or {"name_or_path": getattr(model, "name_or_path", None), "model_type":
                           getattr(model.config, "model_type", None), "num_layers": L},
        evaluator=ev.to_dict(), corpus=corpus.describe() if hasattr(corpus, "describe") else {},
        budget=budget,
        selection={"spacing": spacing, "exclude_boundary": exclude_boundary, "candidates": cands,
                   "partners": partners if partners is None or isinstance(partners, (str, int)) else
                   [list(p) for p in partners], "seeds": list(seeds)},
        baseline_ppl=baseline.ppl, baseline_ppl_ci=list(base_ci), baseline=baseline.to_dict(), complete=False)

    ctx = M.MethodContext(model=model, tokenizer=tokenizer, scores=scores, num_layers=L, candidates=cands,
                          spacing=spacing, partners=partners, corpus=corpus, evaluator=ev, seeds=list(seeds),
                          memo=memo, batch_size=batch_size, should_stop=should_stop,
                          progress=lambda d, t, msg: report(msg),
                          params=method_params or {})
    try:
        for spec in specs:
            stop_check()
            t0 = time.perf_counter()
            out = spec.func(ctx, budget)
            if out.notes:
                result.notes.extend(f"{spec.name}: {n}" for n in out.notes)
            info = dict(out.info)
            info["settings"] = out.settings
            info["selection_seconds"] = time.perf_counter() - t0
            if out.runs is None:
                entries = [entry(k + 1, s) for k, s in enumerate(out.sets)]
                if len(entries) < budget and not out.notes:
                    result.notes.append(f"{spec.name}: curve stops at n={len(entries)}")
                result.methods[spec.name] = entries
            else:
                per_seed = {}
                for seed, sets in out.runs.items():
                    per_seed[str(seed)] = [entry(k + 1, s) for k, s in enumerate(sets)]
                result.random_seeds[spec.name] = per_seed
                result.methods[spec.name] = _aggregate(per_seed)
            info["seconds"] = time.perf_counter() - t0
            result.method_info[spec.name] = info
    except ComputeInterrupted as e:
        _finish(result, scores, memo, counter, t_start)
        report("stopped")
        e.partial = result
        raise
    _finish(result, scores, memo, counter, t_start)
    result.complete = True
    counter["points"] = planned
    report("done")
    return result


def _aggregate(per_seed: dict) -> list[dict]:
    out = []
    n_max = max(len(v) for v in per_seed.values())
    for k in range(n_max):
        rows = [v[k] for v in per_seed.values() if len(v) > k]
        d = np.array([r["delta_pct"] for r in rows])
        p = np.array([r["ppl"] for r in rows])
        kls = [r["kl_to_base"] for r in rows if r["kl_to_base"] is not None]
        out.append({"n": k + 1, "removed": None, "ppl": float(p.mean()), "ppl_min": float(p.min()),
                    "ppl_max": float(p.max()), "ppl_ci": None, "delta_pct": float(d.mean()),
                    "delta_pct_min": float(d.min()), "delta_pct_max": float(d.max()),
                    "delta_pct_std": float(d.std(ddof=1)) if len(d) > 1 else 0.0, "delta_pct_ci": None,
                    "kl_to_base": float(np.mean(kls)) if kls else None, "n_seeds": len(rows),
                    "per_seed": [{"seed": int(s), "removed": v[k]["removed"], "ppl": v[k]["ppl"],
                                  "delta_pct": v[k]["delta_pct"]} for s, v in per_seed.items() if len(v) > k]})
    return out


def _finish(result: CurvesResult, scores: dict, memo: EvalMemo, counter: dict, t_start: float) -> None:
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
                    "eval_seconds": memo.seconds, "seconds": time.perf_counter() - t_start}
