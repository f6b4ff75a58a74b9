"""The demo bundle (docs/compare.md §4): every finished result of one analysis -- scores, curves, evidence, task
accuracy, healed curves, the contract -- in one JSON file, with where it was computed, so the dashboard shows a GPU
analysis on a laptop with no model and no computation.  A bundle is validated like every upload
(:func:`swapkl.schema.bundle.bundle_fields`: size, depth, every field; JSON only, nothing executable) before anything
is built from it."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from dataclasses import dataclass

from swapkl import __version__, schema
from swapkl.contract import Provenance
from swapkl.errors import SwapklError
from swapkl.removal.checks import check_same_model
from swapkl.removal.curves import CurvesResult
from swapkl.schema.bundle import BUNDLE_FORMAT, PARTS, bundle_fields
from swapkl.scoring.results import SwapResult, finite_json
from swapkl.store import dump_json

MAX_BUNDLE_BYTES = schema.MAX_BYTES


@dataclass
class Bundle:
    """A validated bundle: the parts as result objects (``evidence`` as its dict, ``tasks`` / ``heal`` as
    :class:`~swapkl.removal.tasks.TasksResult` / :class:`~swapkl.healing.curves.HealCurves`, or None)."""

    computed_on: dict
    model: dict
    contract: dict
    scores: SwapResult
    curves: CurvesResult | None = None
    evidence: dict | None = None
    tasks: object | None = None
    heal: object | None = None

    def where(self) -> str:
        c = self.computed_on or {}
        bits = [str(c[k]) for k in ("host", "device", "time") if c.get(k)]
        return ", ".join(bits) or "an unknown machine"

    def caption(self) -> str:
        """One line: that this is a bundle, where and when it was computed, by which swapkl."""
        v = (self.computed_on or {}).get("swapkl_version")
        return f"bundle computed on {self.where()}" + (f" by swapkl {v}" if v else "") + "; nothing recomputed here"

    def provenance(self) -> Provenance:
        return Provenance(model=self.model, contract=self.contract, extra=(f"bundle from {self.where()}",))

    def parts(self) -> list[str]:
        return [p for p in PARTS if getattr(self, "scores" if p == "scores" else p) is not None]


def _same_model(scores: SwapResult, curves: CurvesResult, what: str) -> None:
    """The curves are of the scores' model: identity (:func:`~swapkl.removal.checks.check_same_model`) and depth."""
    check_same_model(scores, curves.model, what=what)
    n = (curves.model or {}).get("num_layers")
    if n is not None and n != scores.num_layers:
        raise SwapklError(f"{what} (the scores have {scores.num_layers} layers, the curves' model {n})")


def _device() -> str:
    """The accelerator of this process when torch is already loaded (never imported here), else ``cpu``."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return "cpu"


def computed_on(device: str | None = None) -> dict:
    """Where this process runs: host name, platform, the device (the caller's, else :func:`_device`), the UTC time,
    swapkl's version."""
    return {"host": platform.node() or "?", "platform": platform.platform(terse=True), "device": device or _device(),
            "time": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "swapkl_version": __version__}


def make_bundle(scores: SwapResult, curves: CurvesResult | None = None, evidence: dict | None = None,
                tasks: dict | None = None, heal: dict | None = None, device: str | None = None) -> dict:
    """The bundle dict of one analysis (the parts as their ``to_dict()`` JSON); the curves must be of the scores'
    model (:func:`~swapkl.removal.checks.check_same_model`).  Validated before it is returned, so a bundle that
    cannot be opened is never written."""
    if curves is not None:
        _same_model(scores, curves, "the scores and the curves are for different models")
    parts = {"scores": scores.to_dict()}
    for name, part in (("curves", curves), ("evidence", evidence), ("tasks", tasks), ("heal", heal)):
        if part is not None:
            parts[name] = finite_json(part.to_dict() if hasattr(part, "to_dict") else part)
    d = {"format": BUNDLE_FORMAT, "swapkl_version": __version__, "computed_on": computed_on(device),
         "model": dict(scores.identity or {}), "contract": dict(scores.contract or {}), "parts": parts}
    from_dict(d)  # what read_bundle would refuse is refused now
    return d


def write_bundle(path: str | os.PathLike, bundle: dict) -> str:
    """Write ``bundle`` as strict JSON, atomically (a failed write leaves nothing)."""
    return dump_json(bundle, path)


def from_dict(d: dict, what: str = "bundle") -> Bundle:
    """A :class:`Bundle` from a parsed bundle document, validated first (one-line :class:`SwapklError`)."""
    f = bundle_fields(d, what)
    p = f["parts"]
    scores = SwapResult.from_dict(p["scores"], f"{what}: part scores")
    curves = CurvesResult.from_dict(p["curves"], f"{what}: part curves") if "curves" in p else None
    if curves is not None:
        _same_model(scores, curves, f"{what}: the scores and the curves are for different models")
    tasks = heal = None
    if "tasks" in p:
        from swapkl.removal.tasks import TasksResult

        tasks = TasksResult.from_dict(p["tasks"])
    if "heal" in p:
        from swapkl.healing.curves import HealCurves

        heal = HealCurves.from_dict(p["heal"], f"{what}: part heal")
    evidence = p.get("evidence")
    if evidence is not None and "ground_truth" not in evidence:
        raise SwapklError(f"{what}: part evidence has no ground_truth (not a 'swapkl evidence --json' result)")
    return Bundle(computed_on=f["computed_on"], model=f["model"], contract=f["contract"], scores=scores,
                  curves=curves, evidence=evidence, tasks=tasks, heal=heal)


def read_bundle(source, what: str = "bundle", max_bytes: int = MAX_BUNDLE_BYTES) -> Bundle:
    """A bundle from its bytes / text or a path: at most ``max_bytes``, JSON only, validated (:func:`from_dict`)."""
    if isinstance(source, (bytes, bytearray)) or (isinstance(source, str) and source.lstrip().startswith("{")):
        d = schema.parse_json(source, what, max_bytes, keep_constants=True)
    else:
        d = schema.read_json_file(source, what, max_bytes, keep_constants=True)
        what = f"{what} {source}"
    return from_dict(d, what)
