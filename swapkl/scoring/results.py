"""Swap-KL results: matrices, per-prompt vectors, statistics, save/load.

All KL values are nats.  Matrices are L x L numpy float64 arrays with NaN where a pair was not computed
(and on the diagonal).  ``R[i][j]`` (``replacement_directed``) is the mean over prompts of
``KL(base || M[i<-j])`` (slot i runs block j); ``d_repl = max(R[i][j], R[j][i])`` (Definition 1, or the
contract's aggregation); ``d_inter`` is symmetric.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from swapkl.stats import bootstrap_indices, percentile_ci

from swapkl import __version__, schema
from swapkl.contract import Provenance
from swapkl.store import dump_json

# Deferred imports: pandas is imported by pair_table() only: the CLI and the dashboard import this module without
# it.

STRONG = 0.05       # nats: "strong" swap-similarity
CONDITIONAL = 0.10  # nats: "conditional" swap-similarity (cumulative)
def matrix_json(m) -> list:
    """An L x L array as nested lists, None where a value is not finite (not computed): what JSON exports and
    figure specs hold."""
    a = np.asarray(m, dtype=float)
    return [[float(v) if math.isfinite(v) else None for v in row] for row in a.tolist()]


def finite_json(x):
    """``x`` with numpy scalars/arrays as Python values, tuples as lists, keys as strings and every non-finite
    float as None: what ``json.dumps(..., allow_nan=False)`` accepts and :mod:`swapkl.schema` reads back."""
    if isinstance(x, dict):
        return {str(k): finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.ndarray):
        return finite_json(x.tolist())
    return x


@dataclass
class SwapResult:
    """Both protocols' swap-KL on one model under one contract.

    ``per_prompt["repl"][(i, j)]``: KL per prompt [P] of ``M[i<-j]`` (directed, both i<j and i>j keys);
    ``per_prompt["inter"][(i, j)]``, i<j: KL per prompt [P] of ``M[i<->j]``.
    ``undefined[(i, j)]``, i<j: why a pair of the contract's pair set has no value under its per-layer definition
    (``slot``: blocks of different structure); its cells are NaN, like a pair not computed.
    """

    num_layers: int
    pairs: list[tuple[int, int]]
    per_prompt: dict
    contract: dict
    identity: dict
    prompt_token_ids: list[list[int]] = field(default_factory=list)
    prompts_info: dict = field(default_factory=dict)
    noise_floor: float | None = None
    meta: dict = field(default_factory=dict)
    undefined: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pair_vectors(cls, num_layers, pair_vectors: dict, **kw) -> SwapResult:
        """From ``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` (as the engine and cache give them)."""
        repl, inter = {}, {}
        pairs = sorted(pair_vectors, key=lambda p: (p[1] - p[0], p[0]))
        for i, j in pairs:
            v = pair_vectors[(i, j)]
            repl[(i, j)] = np.asarray(v["repl_ij"], dtype=float)
            repl[(j, i)] = np.asarray(v["repl_ji"], dtype=float)
            inter[(i, j)] = np.asarray(v["inter"], dtype=float)
        return cls(num_layers=num_layers, pairs=[tuple(p) for p in pairs],
                   per_prompt={"repl": repl, "inter": inter}, **kw)

    @property
    def num_prompts(self) -> int:
        for v in self.per_prompt["inter"].values():
            return len(v)
        return 0

    @property
    def aggregation(self) -> str:
        return self.contract.get("aggregation", "max")

    # ------------------------------------------------------------------ matrices
    def _empty(self) -> np.ndarray:
        return np.full((self.num_layers, self.num_layers), np.nan)

    def replacement_directed(self) -> np.ndarray:
        """``R[i][j]``: mean KL (nats) when slot i runs block j; NaN where not computed."""
        m = self._empty()
        for (i, j), v in self.per_prompt["repl"].items():
            m[i, j] = float(np.mean(v))
        return m

    def replacement(self, aggregation: str | None = None) -> np.ndarray:
        """Symmetric ``d_repl`` (nats): ``max`` of the two directed means (Definition 1), ``mean`` of them,
        or ``forward`` (slot i <- block j for i<j only, the paper's one-direction variant)."""
        agg = aggregation or self.aggregation
        r = self.replacement_directed()
        m = self._empty()
        for i, j in self.pairs:
            a, b = r[i, j], r[j, i]
            v = max(a, b) if agg == "max" else (a + b) / 2 if agg == "mean" else a
            m[i, j] = m[j, i] = v
        return m

    def protocol_scores(self) -> dict[str, np.ndarray]:
        """``{"replacement": L x L, "interchange": L x L}`` (nats, NaN where not computed): the two protocols'
        symmetric matrices, under this result's aggregation, as the removal methods take them."""
        return {"replacement": self.replacement(), "interchange": self.interchange()}

    def interchange(self) -> np.ndarray:
        """Symmetric ``d_inter`` (nats)."""
        m = self._empty()
        for (i, j), v in self.per_prompt["inter"].items():
            m[i, j] = m[j, i] = float(np.mean(v))
        return m

    def gap(self) -> np.ndarray:
        """``d_repl - d_inter`` (nats), symmetric; may be negative."""
        return self.replacement() - self.interchange()

    # ------------------------------------------------------------------ per-pair statistics
    def pair_table(self, ci: bool = True):
        """pandas DataFrame, one row per pair: i, j, gap_layers, R_ij, R_ji, d_repl, d_inter, gap, kl_ratio
        (d_inter/d_repl), and 95 % bootstrap CIs over prompts (``*_lo``, ``*_hi``)."""
        import pandas as pd

        r, rep, inter = self.replacement_directed(), self.replacement(), self.interchange()
        rows = []
        for i, j in self.pairs:
            d_r = rep[i, j]
            d_i = inter[i, j]
            rows.append({"i": i, "j": j, "distance": j - i, "R_ij": r[i, j], "R_ji": r[j, i],
                         "d_repl": d_r, "d_inter": d_i, "gap": d_r - d_i,
                         "kl_ratio": d_i / d_r if d_r > 0 else np.nan})
        df = pd.DataFrame(rows)
        if ci and self.pairs and self.num_prompts > 1:
            Rb, Ib = pair_draws(self, bootstrap_indices(self.num_prompts), self.aggregation)
            for name, arr in (("d_repl", Rb), ("d_inter", Ib), ("gap", Rb - Ib)):
                df[f"{name}_lo"], df[f"{name}_hi"] = percentile_ci(arr, axis=0)
        return df

    def summary(self, ci: bool = True) -> dict:
        """Gap distribution (mean/median/p75/max, nats), KL ratio (mean/median), strong (<0.05) and
        conditional (<0.10) counts per protocol, best pairs, bootstrap CIs (prompts resampled)."""
        if not self.pairs:
            return {"pairs": 0}
        rep, inter = self.replacement(), self.interchange()
        dr = np.array([rep[i, j] for i, j in self.pairs])
        di = np.array([inter[i, j] for i, j in self.pairs])
        g = dr - di
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(dr > 0, di / dr, np.nan)
        best_r = int(np.argmin(dr))
        best_i = int(np.argmin(di))
        out = {
            "pairs": len(self.pairs),
            "gap": {"mean": float(g.mean()), "median": float(np.median(g)), "p75": float(np.percentile(g, 75)),
                    "max": float(g.max()), "min": float(g.min()), "negative_pairs": int((g < 0).sum())},
            "kl_ratio": {"mean": float(np.nanmean(ratio)), "median": float(np.nanmedian(ratio))},
            "replacement": {"strong": int((dr < STRONG).sum()), "conditional": int((dr < CONDITIONAL).sum()),
                            "best_pair": list(self.pairs[best_r]), "best": float(dr[best_r]),
                            "median": float(np.median(dr))},
            "interchange": {"strong": int((di < STRONG).sum()), "conditional": int((di < CONDITIONAL).sum()),
                            "best_pair": list(self.pairs[best_i]), "best": float(di[best_i]),
                            "median": float(np.median(di))},
            "pearson": float(np.corrcoef(dr, di)[0, 1]) if len(dr) > 2 and dr.std() > 0 and di.std() > 0 else None,
            "noise_floor": self.noise_floor,
        }
        if ci and self.num_prompts > 1:
            Rb, Ib = pair_draws(self, bootstrap_indices(self.num_prompts), self.aggregation)
            gb = Rb - Ib
            out["gap"]["mean_ci"] = percentile_ci(gb.mean(-1))
            out["gap"]["median_ci"] = percentile_ci(np.median(gb, -1))
        return out

    def to_frame(self):
        return self.pair_table()

    # ------------------------------------------------------------------ serialisation
    def provenance(self):
        """The model identity and contract of these scores (:class:`~swapkl.contract.Provenance`)."""
        return Provenance(model=dict(self.identity or {}), contract=dict(self.contract or {}))

    def to_dict(self) -> dict:
        """A JSON-able dict: the documented fields (num_layers, pairs, replacement_directed, replacement,
        interchange, prompt_token_ids, contract) plus identity, per-prompt vectors, summary, noise floor."""
        pp = {name: {f"{i},{j}": list(map(float, v)) for (i, j), v in self.per_prompt[key].items()}
              for name, key in (("replacement_directed", "repl"), ("interchange", "inter"))}
        return {"format": "swapkl.result/1", "swapkl_version": __version__, "num_layers": self.num_layers,
                "pairs": [list(p) for p in self.pairs],
                "replacement_directed": matrix_json(self.replacement_directed()),
                "replacement": matrix_json(self.replacement()), "interchange": matrix_json(self.interchange()),
                "gap": matrix_json(self.gap()), "contract": self.contract, "model": self.identity,
                "prompt_token_ids": self.prompt_token_ids, "prompts": self.prompts_info,
                "noise_floor": finite_json(self.noise_floor),
                "summary": finite_json(self.summary()),  # e.g. a KL ratio of all-zero replacement KLs is NaN
                "per_prompt": pp, "meta": finite_json(self.meta),
                "undefined": [[i, j, why] for (i, j), why in sorted(self.undefined.items())]}

    @classmethod
    def from_dict(cls, d: dict, what: str = "result") -> SwapResult:
        """Inverse of :meth:`to_dict`, validated (:func:`swapkl.schema.result_fields`)."""
        return cls(**schema.result_fields(d, what))

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """:meth:`to_dict` as strict JSON text (written atomically to ``path`` when given)."""
        return dump_json(self.to_dict(), path)

    @classmethod
    def from_json(cls, d, what: str = "result file") -> SwapResult:
        """From :meth:`to_json`'s text (``str``/``bytes``) or :meth:`to_dict`'s dict.  Everything is validated by
        :func:`swapkl.schema.result_fields` before anything is built; a bad file raises
        :class:`~swapkl.errors.UploadError` naming ``what`` and the field."""

        if isinstance(d, (str, bytes, bytearray)):
            d = schema.parse_json(d, what, keep_constants=True)
        return cls.from_dict(d, what)

    def save(self, path: str | os.PathLike) -> Path:
        self.to_json(path)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, max_bytes: int | None = None) -> SwapResult:
        """Read a :meth:`save` / ``score --json`` file (at most ``max_bytes``, default
        :data:`swapkl.schema.MAX_BYTES`), validated as :meth:`from_json`."""

        d = schema.read_json_file(path, "result file", max_bytes or schema.MAX_BYTES, keep_constants=True)
        return cls.from_json(d, f"result file {path}")


def pair_draws(result: SwapResult, idx: np.ndarray, agg: str) -> tuple[np.ndarray, np.ndarray]:
    """``d_repl`` (under aggregation ``agg``) and ``d_inter`` of every pair of ``result`` under prompt resamples
    ``idx`` [B, P] (:func:`swapkl.stats.bootstrap_indices`): two arrays [B, npairs], nats."""
    reps, inters = [], []
    for i, j in result.pairs:
        a = result.per_prompt["repl"][(i, j)][idx].mean(-1)
        b = result.per_prompt["repl"][(j, i)][idx].mean(-1)
        reps.append(np.maximum(a, b) if agg == "max" else (a + b) / 2 if agg == "mean" else a)
        inters.append(result.per_prompt["inter"][(i, j)][idx].mean(-1))
    return np.stack(reps, -1), np.stack(inters, -1)
