"""How the replacement / interchange gap evolves over training checkpoints.

Inputs are checkpoints in training order, each giving two L x L matrices (nats) and the scored pairs:

* ``d_repl`` [L, L]: symmetric replacement swap-KL (``SwapResult.replacement()``, Definition 1: max of the
  two directed means), read at ``[i, j]`` for each pair ``i < j``;
* ``d_inter`` [L, L]: symmetric interchange swap-KL (``SwapResult.interchange()``);
* ``pairs``: the scored ``(i, j)`` pairs; a pair with NaN in either matrix is left out.

Per checkpoint (:func:`checkpoint_stats`) the gap ``g = d_repl - d_inter`` (nats; may be negative, docs/method.md §1)
is summarised by its mean, median, 75th percentile (numpy's linear interpolation) and max over the pairs,
the per-pair KL ratio ``d_inter / d_repl`` (dimensionless; NaN where ``d_repl <= 0``, left out of the mean and
median) by its mean and median, and the two protocols' per-pair vectors by their Pearson correlation (NaN
with fewer than 3 pairs or a constant vector).  :func:`gap_vs_depth` gives, for one checkpoint (the last by
default), each pair's gap against its normalised depth ``(i + j) / 2 / (L - 1)`` in [0, 1].

:func:`parse_checkpoints` turns a user's checkpoint list into :class:`CheckpointSpec` s;
:func:`compute_trajectory` loads and scores each through the engine's cache (the dashboard's entry point).
No Streamlit here.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable


from swapkl.contract import Provenance
from swapkl.errors import ComputeInterrupted, UploadError
from swapkl.scoring.results import SwapResult
from swapkl.store import dump_json

# Deferred imports: pandas, torch and the torch-based swapkl modules are imported inside the functions that use
# them: the CLI and the dashboard import this module without them.
from swapkl.trajectory.checkpoints import CheckpointListError, CheckpointSpec, parse_checkpoints
from swapkl.trajectory.stats import point_from_result, checkpoint_stats, gap_vs_depth, pair_frame, TrajectoryPoint


# ============================================================================================ computing

def trajectory_provenance(d: dict) -> Provenance:
    """The :class:`~swapkl.contract.Provenance` of a trajectory dict (:meth:`Trajectory.to_dict`): its contract,
    and "N checkpoints (first …)" as the model."""
    cks = d.get("checkpoints") or []
    first = cks[0].get("label", "?") if cks else "?"
    return Provenance(model={"display": f"{len(cks)} checkpoints ({first} …)" if len(cks) > 1 else first},
                      contract=dict(d.get("contract") or {}))


@dataclass
class Trajectory:
    """Scores of a list of checkpoints under one contract (``results[k]`` belongs to ``specs[k]``)."""

    specs: list[CheckpointSpec]
    results: list = field(default_factory=list)
    contract: dict = field(default_factory=dict)

    def points(self) -> list[TrajectoryPoint]:
        return [point_from_result(s.step if s.step is not None else k, r, s.display())
                for k, (s, r) in enumerate(zip(self.specs, self.results))]

    def summary(self):
        """:func:`checkpoint_stats` of the finished checkpoints."""
        return checkpoint_stats(self.points())

    def pairs(self):
        return pair_frame(self.points())

    def depth(self):
        """:func:`gap_vs_depth` of the last finished checkpoint."""
        return gap_vs_depth(self.points())

    def provenance(self) -> Provenance:
        """The shared contract and the checkpoints scored so far (:func:`trajectory_provenance`)."""
        return trajectory_provenance({"contract": self.contract,
                                      "checkpoints": [{"label": s.display()} for s in self.specs[:len(self.results)]]})

    @classmethod
    def from_dict(cls, d: dict, what: str = "trajectory") -> Trajectory:
        """Inverse of :meth:`to_dict`: the checkpoint specs and every checkpoint's result (each validated as
        :meth:`swapkl.scoring.results.SwapResult.from_dict`); the summary and depth rows are recomputed from them."""
        if not isinstance(d, dict) or not isinstance(d.get("checkpoints"), list) or not isinstance(
                d.get("results"), list) or len(d["results"]) > len(d["checkpoints"]):
            raise UploadError(f"{what}: not a swapkl trajectory (checkpoints and results lists expected)")
        try:
            specs = []
            for c in d["checkpoints"]:
                sp = CheckpointSpec(str(c["spec"]), c.get("revision"), c.get("step"))
                label = c.get("label") or ""  # to_dict writes display(): keep only a label that was given
                specs.append(sp if label == sp.display() else dataclasses.replace(sp, label=str(label)))
        except (KeyError, TypeError) as e:
            raise UploadError(f"{what}: a checkpoint entry lacks its spec ({e})") from None
        results = [SwapResult.from_dict(r, f"{what} result {k}") for k, r in enumerate(d["results"])]
        return cls(specs=specs, results=results, contract=dict(d.get("contract") or {}))

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """:meth:`to_dict` as strict JSON text (written atomically to ``path`` when given)."""
        return dump_json(self.to_dict(), path)

    def to_dict(self) -> dict:
        """JSON-able (:meth:`from_dict` is its inverse): contract, checkpoints (spec, revision, step, label),
        per-checkpoint summary, last checkpoint's gap-vs-depth rows, and every checkpoint's full result
        (``SwapResult.to_dict()``)."""
        def clean(df):
            return json.loads(df.to_json(orient="records"))

        done = self.specs[: len(self.results)]
        return {
            "format": "swapkl.trajectory/1",
            "contract": self.contract,
            "checkpoints": [{"spec": s.spec, "revision": s.revision, "step": s.step, "label": s.display()}
                            for s in done],
            "summary": clean(self.summary()) if self.results else [],
            "gap_vs_depth": clean(self.depth()) if self.results else [],
            "results": [r.to_dict() if hasattr(r, "to_dict") else None for r in self.results],
        }


ProgressFn = Callable[[int, int, str], None]


def compute_trajectory(checkpoint_specs, contract, progress: ProgressFn | None = None,
                       should_stop: Callable[[], bool] | None = None, use_cache: bool = True,
                       on_checkpoint: Callable[[int, CheckpointSpec, Any], None] | None = None,
                       load_kw: dict | None = None, loader: Callable[..., Any] | None = None) -> Trajectory:
    """Score every checkpoint under ``contract`` (both protocols), one model in memory at a time.

    ``checkpoint_specs``: a string / list for :func:`parse_checkpoints`, or :class:`CheckpointSpec` s.  Each
    checkpoint is loaded with ``loader`` (None: :func:`swapkl.model.checkpoints.load_checkpoint`; the dashboard passes
    its gated :meth:`swapkl.jobs.models.ModelCache.load`) (``dtype``/``device`` from the contract, plus ``load_kw``) and scored with :func:`swapkl.scoring.score.score`, whose cache holds each checkpoint's pairs on
    their own (a rerun, or a longer list, recomputes nothing that finished).
    ``progress(done, total, what)``: the engine's variant counts for the current checkpoint, ``what``
    prefixed with ``[k/n label]``.  ``on_checkpoint(k, spec, result)`` after each finished checkpoint.
    ``should_stop()`` is polled between checkpoints and inside the sweep; when it says stop,
    :class:`~swapkl.errors.ComputeInterrupted` is raised with the finished part as ``.partial``
    (a :class:`Trajectory`).
    """
    from swapkl.scoring.score import score  # deferred: pulls torch; the CLI and the dashboard import this module without it
    if loader is None:
        from swapkl.model.checkpoints import load_checkpoint as loader

    if isinstance(checkpoint_specs, (str, os.PathLike)) or (
            isinstance(checkpoint_specs, (list, tuple)) and checkpoint_specs
            and not all(isinstance(s, CheckpointSpec) for s in checkpoint_specs)):
        specs = parse_checkpoints(checkpoint_specs)
    else:
        specs = list(checkpoint_specs)
    if not specs:
        raise CheckpointListError("no checkpoints given")
    traj = Trajectory(specs=specs, contract=contract.to_dict() if hasattr(contract, "to_dict") else dict(contract))
    n = len(specs)
    kw = {"dtype": contract.dtype, "device": contract.device} | (load_kw or {})

    def stopped(k: int) -> ComputeInterrupted:
        e = ComputeInterrupted(f"trajectory stopped after {k} of {n} checkpoints; finished pairs are cached")
        e.partial = traj
        return e

    for k, sp in enumerate(specs):
        if should_stop is not None and should_stop():
            raise stopped(k)
        tag = f"[{k + 1}/{n} {sp.display()}]"
        if progress is not None:
            progress(0, 1, f"{tag} loading")
        ck = loader(sp.spec, revision=sp.revision, **kw)
        prog = (lambda d, t, what, _tag=tag: progress(d, t, f"{_tag} {what}")) if progress is not None else None
        try:
            res = score(ck, contract, progress=prog, should_stop=should_stop, use_cache=use_cache)
        except ComputeInterrupted as e:
            raise stopped(k) from e
        finally:
            del ck
            gc.collect()
        traj.results.append(res)
        if on_checkpoint is not None:
            on_checkpoint(k, sp, res)
    return traj
