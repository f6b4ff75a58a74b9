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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from swapkl.contract import Provenance
from swapkl.errors import ComputeInterrupted, SwapklError, UploadError
from swapkl.scoring.results import SwapResult
from swapkl.store import dump_json

# Deferred imports: pandas, torch and the torch-based swapkl modules are imported inside the functions that use
# them: the CLI and the dashboard import this module without them.

MANIFEST = "trajectory.json"


class CheckpointListError(SwapklError):
    """A checkpoint list that cannot be parsed (no model for a revision, missing folder, empty list)."""


# ============================================================================================ parsing

@dataclass(frozen=True)
class CheckpointSpec:
    """One checkpoint of a trajectory: ``spec`` and ``revision`` are what
    :func:`swapkl.model.checkpoints.load_checkpoint` takes; ``step`` is the training step (None if unknown)."""

    spec: str
    revision: str | None = None
    step: int | None = None
    label: str = ""

    def display(self) -> str:
        return self.label or (f"{self.spec}@{self.revision}" if self.revision else self.spec)


_STEP_PATTERNS = (
    re.compile(r"(?:^|[^a-z0-9])(?:global[_-]?)?step[_-]?(\d+)$", re.I),
    re.compile(r"^(?:global[_-]?)?step[_-]?(\d+)$", re.I),
    re.compile(r"(?:^|[^a-z0-9])checkpoint[_-]?(\d+)$", re.I),
    re.compile(r"^checkpoint[_-]?(\d+)$", re.I),
    re.compile(r"^(\d+)$"),
)
_REVISION = re.compile(r"^((?:global[_-]?)?step[_-]?\d+|checkpoint[_-]?\d+|main|[0-9a-f]{7,40}|v\d+(?:\.\d+)*)$",
                       re.I)
_SUBFOLDER = re.compile(r"^(?:(?:global[_-]?)?step[_-]?\d+|checkpoint[_-]?\d+)$", re.I)


def step_from_name(name: str | None) -> int | None:
    """Training step from a revision or folder name: ``step1000``, ``global_step1000``, ``checkpoint-500``,
    ``run/step_20``, ``42`` -> the number; anything else (``main``, a commit hash) -> None."""
    if not name:
        return None
    base = str(name).rstrip("/\\").rsplit("/", 1)[-1]
    for pat in _STEP_PATTERNS:
        m = pat.search(base)
        if m:
            return int(m.group(1))
    return None


def _is_revision(token: str) -> bool:
    return bool(_REVISION.match(token)) and not Path(token).expanduser().exists()


def _looks_like_path(token: str) -> bool:
    return token.startswith(("/", "./", "../", "~", ".\\")) or token.count("/") > 1 or os.sep in token.replace("/", "")


def read_manifest(folder: str | os.PathLike) -> list[CheckpointSpec]:
    """The checkpoints listed in ``<folder>/trajectory.json`` (as written by :mod:`swapkl.trajectory.demo`):
    ``{"checkpoints": [{"step": int, "folder": "step0"}, ...]}``, folders relative to ``folder``."""
    folder = Path(folder)
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        items = data["checkpoints"]
        out = []
        for it in items:
            sub = (folder / it["folder"]).resolve()
            if not (sub / "config.json").is_file():
                raise CheckpointListError(f"{folder / MANIFEST} lists {it['folder']}, which is not a model folder")
            step = it.get("step")
            out.append(CheckpointSpec(str(sub), None, int(step) if step is not None else step_from_name(sub.name),
                                      sub.name))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointListError(f"cannot read {folder / MANIFEST}: {type(e).__name__}: {e}") from e
    return out


def checkpoints_in_folder(folder: str | os.PathLike) -> list[CheckpointSpec]:
    """A folder's checkpoints, sorted by step: its ``trajectory.json`` if present, else its ``step*`` /
    ``checkpoint-*`` / ``global_step*`` subfolders holding a ``config.json``, else the folder itself if it is a
    model folder (one checkpoint).  Raises :class:`CheckpointListError` when there is none."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise CheckpointListError(f"no such folder: {folder}")
    if (folder / MANIFEST).is_file():
        specs = read_manifest(folder)
    else:
        specs = [CheckpointSpec(str(sub.resolve()), None, step_from_name(sub.name), sub.name)
                 for sub in folder.iterdir()
                 if sub.is_dir() and _SUBFOLDER.match(sub.name) and (sub / "config.json").is_file()]
        if not specs and (folder / "config.json").is_file():
            specs = [CheckpointSpec(str(folder.resolve()), None, step_from_name(folder.name),
                                    folder.resolve().name)]
    if not specs:
        raise CheckpointListError(f"{folder} holds no checkpoints (no trajectory.json, no step*/checkpoint-* "
                                  f"subfolders with a config.json, and no config.json of its own)")
    return sorted(specs, key=lambda s: (s.step if s.step is not None else -1, s.label))


def _tokens(text: str | Sequence[str]) -> list[str]:
    items = [text] if isinstance(text, (str, os.PathLike)) else list(text)
    out: list[str] = []
    for item in items:
        s = str(item).strip()
        if not s:
            continue
        if Path(s).expanduser().exists():  # a path (may contain blanks or commas): one token
            out.append(s)
        else:
            out.extend(t for t in re.split(r"[,\s]+", s) if t)
    return out


def parse_checkpoints(text: str | Sequence[str]) -> list[CheckpointSpec]:
    """Parse a checkpoint list (a string, or the CLI's list of arguments) in training order.

    Tokens are separated by commas, blanks or newlines:

    * ``MODEL@REV`` -- a hub model at a revision, e.g. ``EleutherAI/pythia-410m@step1000``;
    * ``@REV`` -- the same model as the previous token, another revision:
      ``EleutherAI/pythia-410m@step0, @step1000, @step16000``;
    * ``MODEL REV REV ...`` -- a model followed by bare revisions (``stepN``, ``checkpoint-N``, ``main``, a
      commit hash, ``vX.Y``): ``EleutherAI/pythia-410m step0 step1000``;
    * a local folder with ``step*`` / ``checkpoint-*`` subfolders or a ``trajectory.json`` -- expanded to its
      checkpoints, sorted by step number (parsed from the folder name);
    * anything else (a model folder, a ``.gguf`` file, ``default``, a hub id) -- one checkpoint.

    Steps come from the revision / folder name (``step1000`` -> 1000), else None.  An explicit list keeps the
    order given; only a folder's own checkpoints are sorted.
    """
    specs: list[CheckpointSpec] = []
    current: str | None = None       # the model the next bare revision / @rev refers to
    pending: str | None = None       # a bare model not (yet) followed by a revision

    def flush():
        nonlocal pending
        if pending is not None:
            specs.append(CheckpointSpec(pending, None, None, pending))
            pending = None

    def add_rev(model: str, rev: str):
        nonlocal pending
        if not rev:
            raise CheckpointListError(f"empty revision after '{model}@'")
        specs.append(CheckpointSpec(model, rev, step_from_name(rev), f"{model}@{rev}"))
        pending = None

    for tok in _tokens(text):
        p = Path(tok).expanduser()
        if tok.startswith("@"):
            if current is None:
                raise CheckpointListError(f"'{tok}' has no model before it; write MODEL@REV first")
            add_rev(current, tok[1:])
        elif p.is_dir() and not (p / "config.json").is_file() or (p / MANIFEST).is_file() or (
                p.is_dir() and any(_SUBFOLDER.match(c.name) for c in p.iterdir() if c.is_dir())):
            flush()
            specs.extend(checkpoints_in_folder(p))
            current = None
        elif p.exists():
            flush()
            specs.append(CheckpointSpec(str(p.resolve()), None, step_from_name(p.resolve().name) if p.is_dir()
                                        else None, p.name))
            current = None
        elif "@" in tok:
            flush()
            model, _, rev = tok.partition("@")
            if _looks_like_path(model):
                raise CheckpointListError(f"no such folder: {model}")
            current = model
            add_rev(model, rev)
        elif current is not None and _is_revision(tok):
            add_rev(current, tok)
        else:
            flush()
            if _looks_like_path(tok) or tok.lower().endswith(".gguf"):
                raise CheckpointListError(f"no such file or folder: {tok}")
            current = pending = tok
    flush()
    if not specs:
        raise CheckpointListError("no checkpoints given")
    return specs


# ============================================================================================ statistics

@dataclass
class TrajectoryPoint:
    """One checkpoint's scores: ``d_repl``, ``d_inter`` [L, L] float (nats), ``pairs`` [(i, j), i < j]."""

    step: int | None
    d_repl: np.ndarray
    d_inter: np.ndarray
    pairs: list[tuple[int, int]]
    label: str = ""

    def __post_init__(self):
        self.d_repl = np.asarray(self.d_repl, dtype=float)
        self.d_inter = np.asarray(self.d_inter, dtype=float)
        L = self.d_repl.shape[0] if self.d_repl.ndim == 2 else -1
        if self.d_repl.shape != (L, L) or self.d_inter.shape != (L, L):
            raise ValueError(f"d_repl and d_inter must both be L x L, got {self.d_repl.shape} and "
                             f"{self.d_inter.shape}")
        pairs = []
        for p in self.pairs:
            i, j = sorted((int(p[0]), int(p[1])))
            if i == j or i < 0 or j >= L:
                raise ValueError(f"pair {tuple(p)} is not a pair of distinct layers of a {L}-layer model")
            pairs.append((i, j))
        self.pairs = pairs

    @property
    def num_layers(self) -> int:
        return int(self.d_repl.shape[0])

    def values(self) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        """``(d_repl [n], d_inter [n], pairs)`` over the pairs with finite values in both matrices."""
        keep = [(i, j) for i, j in self.pairs
                if np.isfinite(self.d_repl[i, j]) and np.isfinite(self.d_inter[i, j])]
        r = np.array([self.d_repl[i, j] for i, j in keep], dtype=float)
        d = np.array([self.d_inter[i, j] for i, j in keep], dtype=float)
        return r, d, keep


def _is_result(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("replacement", "interchange", "pairs", "num_layers"))


def _point_from_result(step, res, label="") -> TrajectoryPoint:
    return TrajectoryPoint(step, res.replacement(), res.interchange(), list(res.pairs), label)


def as_point(item: Any, index: int = 0) -> TrajectoryPoint:
    """Coerce one checkpoint: a :class:`TrajectoryPoint`; ``(step, d_repl, d_inter, pairs)``; ``(step, result)``;
    a result object (``.replacement()``, ``.interchange()``, ``.pairs``, ``.num_layers``; step = ``index``);
    or a dict with ``step``, ``d_repl``, ``d_inter``, ``pairs`` (optional ``label``)."""
    if isinstance(item, TrajectoryPoint):
        return item
    if isinstance(item, dict):
        return TrajectoryPoint(item.get("step"), item["d_repl"], item["d_inter"], item["pairs"],
                               item.get("label", ""))
    if _is_result(item):
        return _point_from_result(index, item)
    if isinstance(item, (tuple, list)):
        if len(item) == 4:
            return TrajectoryPoint(item[0], item[1], item[2], item[3])
        if len(item) == 2 and _is_result(item[1]):
            return _point_from_result(item[0], item[1])
    raise TypeError(f"cannot read a trajectory checkpoint from {type(item).__name__}")


def as_points(items: Iterable[Any]) -> list[TrajectoryPoint]:
    return [as_point(it, k) for k, it in enumerate(items)]


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def point_stats(point: Any) -> dict:
    """The summary of one checkpoint (see :func:`checkpoint_stats` for the fields)."""
    pt = as_point(point)
    r, d, pairs = pt.values()
    g = r - d
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(r > 0, d / np.where(r > 0, r, 1.0), np.nan)
    n = len(pairs)
    finite_ratio = ratio[np.isfinite(ratio)]

    def agg(fn, a):
        return float(fn(a)) if len(a) else float("nan")

    return {
        "step": pt.step, "label": pt.label, "num_layers": pt.num_layers, "pairs": n,
        "gap_mean": agg(np.mean, g), "gap_median": agg(np.median, g),
        "gap_p75": agg(lambda a: np.percentile(a, 75), g), "gap_max": agg(np.max, g), "gap_min": agg(np.min, g),
        "negative_gaps": int((g < 0).sum()),
        "ratio_mean": agg(np.mean, finite_ratio), "ratio_median": agg(np.median, finite_ratio),
        "pearson": _pearson(r, d),
        "d_repl_mean": agg(np.mean, r), "d_repl_median": agg(np.median, r),
        "d_inter_mean": agg(np.mean, d), "d_inter_median": agg(np.median, d),
    }


def checkpoint_stats(items: Iterable[Any]):
    """pandas DataFrame, one row per checkpoint in the given order, columns:

    ``step`` (Int64, may be <NA>), ``label``, ``num_layers``, ``pairs`` (count used), ``gap_mean``,
    ``gap_median``, ``gap_p75``, ``gap_max``, ``gap_min`` (nats), ``negative_gaps`` (count of g < 0),
    ``ratio_mean``, ``ratio_median`` (d_inter / d_repl), ``pearson`` (r of d_repl vs d_inter over pairs),
    ``d_repl_mean``, ``d_repl_median``, ``d_inter_mean``, ``d_inter_median`` (nats)."""
    import pandas as pd

    df = pd.DataFrame([point_stats(p) for p in as_points(items)])
    if not df.empty:
        df["step"] = df["step"].astype("Int64")
    return df


def pair_frame(items: Iterable[Any]):
    """pandas DataFrame, one row per (checkpoint, pair): ``checkpoint`` (0-based position), ``step``,
    ``label``, ``i``, ``j``, ``depth`` ((i+j)/2/(L-1)), ``d_repl``, ``d_inter``, ``gap`` (nats), ``ratio``."""
    import pandas as pd

    rows = []
    for k, pt in enumerate(as_points(items)):
        r, d, pairs = pt.values()
        L = pt.num_layers
        for (i, j), a, b in zip(pairs, r, d):
            rows.append({"checkpoint": k, "step": pt.step, "label": pt.label, "i": i, "j": j,
                         "depth": (i + j) / 2 / (L - 1), "d_repl": a, "d_inter": b, "gap": a - b,
                         "ratio": b / a if a > 0 else float("nan")})
    df = pd.DataFrame(rows, columns=["checkpoint", "step", "label", "i", "j", "depth", "d_repl", "d_inter", "gap",
                                     "ratio"])
    df["step"] = df["step"].astype("Int64")
    return df


def gap_vs_depth(items: Any, which: int = -1):
    """Per-pair gap against normalised depth for one checkpoint (default: the last of ``items``; a single
    point or result is accepted too).  DataFrame columns ``i``, ``j``, ``depth`` = (i+j)/2/(L-1) in [0, 1],
    ``gap`` (nats), ``d_repl``, ``d_inter``, sorted by depth then i."""
    single_tuple = isinstance(items, tuple) and len(items) == 4 and np.ndim(items[1]) == 2
    if _is_result(items) or isinstance(items, (TrajectoryPoint, dict)) or single_tuple:
        points = [as_point(items)]
    else:
        points = as_points(items)
    if not points:
        raise ValueError("no checkpoints")
    df = pair_frame([points[which]])
    return df[["i", "j", "depth", "gap", "d_repl", "d_inter"]].sort_values(["depth", "i"]).reset_index(drop=True)


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
        return [_point_from_result(s.step if s.step is not None else k, r, s.display())
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
                       load_kw: dict | None = None) -> Trajectory:
    """Score every checkpoint under ``contract`` (both protocols), one model in memory at a time.

    ``checkpoint_specs``: a string / list for :func:`parse_checkpoints`, or :class:`CheckpointSpec` s.  Each
    checkpoint is loaded with :func:`swapkl.model.checkpoints.load_checkpoint` (``dtype``/``device`` from the contract,
    plus ``load_kw``) and scored with :func:`swapkl.scoring.score.score`, whose cache holds each checkpoint's pairs on
    their own (a rerun, or a longer list, recomputes nothing that finished).
    ``progress(done, total, what)``: the engine's variant counts for the current checkpoint, ``what``
    prefixed with ``[k/n label]``.  ``on_checkpoint(k, spec, result)`` after each finished checkpoint.
    ``should_stop()`` is polled between checkpoints and inside the sweep; when it says stop,
    :class:`~swapkl.errors.ComputeInterrupted` is raised with the finished part as ``.partial``
    (a :class:`Trajectory`).
    """
    from swapkl.scoring.score import score  # deferred: pulls torch; the CLI and the dashboard import this module without it
    from swapkl.model.checkpoints import load_checkpoint

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
        ck = load_checkpoint(sp.spec, revision=sp.revision, **kw)
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
