"""Does a redundancy ranking computed on model A hold on model B? (docs/compare.md §1)

Per protocol (replacement, interchange): the two models' swap-KL over the pairs both scored, their Spearman ρ and
Kendall τ-b (:mod:`scipy.stats`, on the emitted vectors) with 95 % percentile bootstrap CIs over prompts, and the
regime verdict of each model (:func:`swapkl.scoring.verdict.regime_verdict`).  When both results scored the same
prompt tokens, each replicate draws one set of prompt indices for both models (a paired bootstrap); otherwise (two
prompt seeds) the two draws are independent.  Replicate coefficients come from
:func:`swapkl.evidence.agreement.spearman_rows` / ``kendall_rows`` (the same definitions, vectorised).

Two results are comparable when they have the same depth and the same contract; the model may differ, and so may
the prompt seed (reported as a difference, and the bootstrap is then unpaired).
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from swapkl.errors import SwapklError
from swapkl.scoring.verdict import regime_verdict
from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, kendall_rows, percentile_ci, spearman_rows

PROTOCOLS = ("replacement", "interchange")
#: contract fields that may differ between A and B: where it ran, and the prompt seed (other prompts, same
#: distribution; reported in ``differs``)
MAY_DIFFER = ("device", "seed")
#: contract fields that name the text rather than define the number (the corpus's hash decides)
LABELS = ("corpus", "corpus_label")


class CompareError(SwapklError):
    """Two analyses that cannot be compared."""


class DepthMismatch(CompareError):
    """Models of different depth."""


class ContractMismatch(CompareError):
    """Two results scored under different contracts."""


def _name(res) -> str:
    ident = res.identity or {}
    return str(ident.get("display") or ident.get("id") or "?")


def check_comparable(a, b) -> dict:
    """Raise :class:`DepthMismatch` / :class:`ContractMismatch` (one line) unless the two
    :class:`~swapkl.scoring.results.SwapResult` s can be compared; return the fields that differ but may
    (``{field: [a, b]}``)."""
    if a.num_layers != b.num_layers:
        raise DepthMismatch(f"A ({_name(a)}) has {a.num_layers} layers and B ({_name(b)}) {b.num_layers}: models of "
                            "different depth are not compared (layer pairs have no common meaning)")
    ca, cb = dict(a.contract or {}), dict(b.contract or {})
    skip = set(MAY_DIFFER) | set(LABELS) if ca.get("corpus_sha256") and cb.get("corpus_sha256") else set(MAY_DIFFER)
    for key in sorted(set(ca) | set(cb)):
        if key not in skip and ca.get(key) != cb.get(key):
            raise ContractMismatch(f"the contracts differ in {key}: A has {ca.get(key)!r}, B has {cb.get(key)!r}; "
                                   "score both models with the same contract")
    return {k: [ca.get(k), cb.get(k)] for k in MAY_DIFFER if ca.get(k) != cb.get(k)}


def common_pairs(a, b) -> list[tuple[int, int]]:
    """The pairs both results scored, in A's order."""
    mine = set(map(tuple, b.pairs))
    return [tuple(p) for p in a.pairs if tuple(p) in mine]


def matrix(res, protocol: str) -> np.ndarray:
    """The protocol's symmetric L×L matrix (nats, NaN where not scored)."""
    if protocol not in PROTOCOLS:
        raise CompareError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    return res.replacement() if protocol == "replacement" else res.interchange()


def pair_vector(res, protocol: str, pairs) -> np.ndarray:
    m = matrix(res, protocol)
    return np.array([m[i, j] for i, j in pairs], dtype=float)


def pair_replicates(res, protocol: str, pairs, idx: np.ndarray) -> np.ndarray:
    """(B, len(pairs)): the protocol's per-pair score on each prompt resample of ``idx`` (B, P)."""
    pp, agg = res.per_prompt, res.aggregation
    cols = []
    for i, j in pairs:
        if protocol == "interchange":
            cols.append(pp["inter"][(i, j)][idx].mean(-1))
            continue
        x, y = pp["repl"][(i, j)][idx].mean(-1), pp["repl"][(j, i)][idx].mean(-1)
        cols.append(np.maximum(x, y) if agg == "max" else (x + y) / 2 if agg == "mean" else x)
    return np.stack(cols, -1)


def shared_prompts(a, b) -> bool:
    """Whether the two results scored the same prompt tokens (then the bootstrap is paired)."""
    ta, tb = a.prompt_token_ids or [], b.prompt_token_ids or []
    return bool(ta) and len(ta) == len(tb) and all(list(x) == list(y) for x, y in zip(ta, tb))


def coefficients(x, y) -> dict:
    """Spearman ρ and Kendall τ-b of two vectors (scipy), NaN when either is constant or shorter than 3."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"spearman": float("nan"), "kendall": float("nan")}
    return {"spearman": float(stats.spearmanr(x, y).statistic), "kendall": float(stats.kendalltau(x, y).statistic)}


def _ci(draws: np.ndarray) -> list:
    draws = draws[np.isfinite(draws)]
    return percentile_ci(draws) if len(draws) else [None, None]


def verdict(res) -> dict:
    """The regime verdict of one result, or ``{"regime": None, "sentence": why not}``."""
    try:
        return regime_verdict(res.replacement(), res.interchange())
    except SwapklError as e:
        return {"regime": None, "prefer": None, "sentence": f"no regime verdict: {e}"}


def rank_agreement(a, b, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """Per protocol ``{"pairs", "a", "b" (the emitted vectors, nats), "spearman": {"value", "ci"}, "kendall": {...}}``,
    plus ``"verdicts": {"a", "b"}``, ``"shared_prompts"``, ``"differs"``, ``"n_boot"``.  Raises :class:`CompareError`
    when the results are not comparable or share fewer than 3 pairs."""
    differs = check_comparable(a, b)
    pairs = common_pairs(a, b)
    if len(pairs) < 3:
        raise CompareError(f"A and B share {len(pairs)} scored pair(s); a rank agreement needs at least 3")
    paired = shared_prompts(a, b)
    if paired:
        ia = ib = bootstrap_indices(a.num_prompts, n_boot, seed)
    else:
        rng = np.random.default_rng(seed)
        ia = bootstrap_indices(a.num_prompts, n_boot, rng)
        ib = bootstrap_indices(b.num_prompts, n_boot, rng)
    out: dict = {"shared_prompts": paired, "differs": differs, "n_boot": n_boot, "n_pairs": len(pairs)}
    for protocol in PROTOCOLS:
        va, vb = pair_vector(a, protocol, pairs), pair_vector(b, protocol, pairs)
        ra, rb = pair_replicates(a, protocol, pairs, ia), pair_replicates(b, protocol, pairs, ib)
        point = coefficients(va, vb)
        out[protocol] = {"pairs": [list(p) for p in pairs], "a": va.tolist(), "b": vb.tolist(),
                         "spearman": {"value": point["spearman"], "ci": _ci(spearman_rows(ra, rb))},
                         "kendall": {"value": point["kendall"], "ci": _ci(kendall_rows(ra, rb))}}
    out["verdicts"] = {"a": verdict(a), "b": verdict(b)}
    return out
