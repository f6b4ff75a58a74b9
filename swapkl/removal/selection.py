"""From pair scores to removal sets (docs/method.md §4): pure numpy over an L×L score matrix ``d`` (nats;
symmetric; NaN where a pair was not scored).

1. layer score ``s(i) = min over scored partners j != i of d(i, j)`` (lower = more removable);
2. candidates (default: all but the first and last layer) sorted by ascending ``s`` (ties by index;
   ``anti=True``: descending, the anti-guided baseline);
3. scan, adding ``i`` when ``|i - k| > spacing`` for every selected ``k``; stop at ``n``.

The scan order is fixed, so the sets are nested: the set for budget ``n`` is the first ``n`` picks, and one
selection gives a whole curve.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from swapkl.errors import ContractError, SwapklError
from swapkl.scoring.verdict import as_matrix


class BudgetError(ContractError):
    """A removal budget the candidates cannot satisfy under the spacing rule."""


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
    d = as_matrix(d)
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
    """The score-to-removal rule (docs/method.md §4).  Returns nested sets: element ``k-1`` is the sorted set for budget k.

    ``d``: (L, L) pair scores in nats, NaN where not scored.  ``candidates``: layers allowed (default: all but
    the first and last when ``exclude_boundary``).  ``partners``: see :func:`partner_mask`.  ``anti``: highest
    score first.  Raises :class:`BudgetError` when ``n`` exceeds the max feasible number under the spacing rule,
    or (``strict``) when the score order stops short of ``n`` (every remaining candidate is too close to a
    selected layer); with ``strict=False`` the shorter list is returned.
    """
    d = as_matrix(d)
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
