"""Results computed elsewhere (a cluster run's merged ``score --json``, a colleague's files) as a finished job,
so the pages can browse them on a machine that has neither the model nor the cache.  Every file is validated
(:mod:`swapkl.schema`: size, depth, NaN limits and every field) before anything is built from it."""
from __future__ import annotations

import itertools

from swapkl.contract import Contract, stable_hash
from swapkl.removal.checks import check_same_model
from swapkl.removal.curves import CurvesResult
from swapkl.errors import SwapklError
from swapkl.scoring.results import SwapResult
from swapkl.schema import parse_json
from swapkl.schema.bundle import BUNDLE_FORMAT

from .job import Job
from .requests import AnalysisRequest


def opened_job(result_json: str | bytes | dict, curves_json: str | bytes | dict | None = None,
               owner: str | None = None) -> Job:
    """A done job holding the result (and curves) of these files, private to ``owner`` (a browser session).
    Raises :class:`~swapkl.errors.SwapklError` for a file that is not a result, or curves of another model."""
    def as_dict(x, what):
        return x if isinstance(x, dict) else parse_json(x, what, keep_constants=True)

    rd = as_dict(result_json, "result file")
    if isinstance(rd, dict) and rd.get("format") == BUNDLE_FORMAT:
        return bundle_job(rd, owner)
    result = SwapResult.from_json(rd)
    curves = None
    if curves_json is not None:
        try:
            curves = CurvesResult.from_json(as_dict(curves_json, "curves file"))
        except (TypeError, KeyError) as e:
            raise SwapklError(f"not a swapkl curves file ({e})") from e
        check_same_model(result, curves.model)
    ident = result.identity or {}
    model = str(ident.get("id") or ident.get("display") or "result file")
    request = AnalysisRequest(model=model, revision=ident.get("revision") if ident.get("kind") == "hub" else None,
                              contract=Contract.from_dict(result.contract),
                              budget=int(curves.budget) if curves is not None else 0,
                              methods=tuple(curves.methods) if curves is not None else (),
                              evaluator=curves.evaluator if curves is not None else None)
    key = "file-" + stable_hash({"result": rd, "curves": None if curves is None else curves.to_dict(),
                                 "owner": owner})[:16]
    job = Job(key, request)
    job.owner = owner
    job.done_from("opened from file", result=result, curves=curves)
    return job


def bundle_job(bundle: dict, owner: str | None = None) -> Job:
    """A done job holding every part of a demo bundle (:mod:`swapkl.compare.bundle`: validated first), private to
    ``owner``; ``job.bundle`` is its caption (a bundle, and where it was computed).  Nothing is computed or written."""
    from swapkl.compare.bundle import from_dict

    b = from_dict(bundle)
    curves, ident = b.curves, b.scores.identity or {}
    request = AnalysisRequest(model=str(ident.get("id") or ident.get("display") or "bundle"),
                              revision=ident.get("revision") if ident.get("kind") == "hub" else None,
                              contract=Contract.from_dict(b.scores.contract),
                              budget=int(curves.budget) if curves is not None else 0,
                              methods=tuple(curves.methods) if curves is not None else (),
                              evaluator=curves.evaluator if curves is not None else None)
    job = Job("bundle-" + stable_hash({"bundle": bundle, "owner": owner})[:16], request)
    job.owner = owner
    job.bundle = b.caption()
    evidence = None
    if b.evidence is not None:
        from swapkl.evidence.run import EvidenceResult

        evidence = EvidenceResult(b.evidence)
    job.done_from(f"opened from a {job.bundle}", result=b.scores, curves=curves, evidence=evidence, tasks=b.tasks,
                  heal=b.heal)
    return job


class OpenedLRU:
    """The opened files (private jobs: ``Job.owner`` set) a job manager keeps: at most ``limit`` per owner (a browser
    session), the least recently used dropped first.  Opening a file or viewing its job (``JobManager.get`` with a
    viewer) is a use.  A dropped job is gone from the manager (``jobs()``, ``get()``); opening its file again
    rebuilds it.  Demo mode keeps 4 per session, a local server 32 (:attr:`~swapkl.jobs.policy.Policy.max_opened`):
    a visitor who opens file after file holds a bounded amount of the server's memory."""

    def __init__(self, limit: int):
        self.limit = max(1, int(limit))
        self._tick = itertools.count()
        self._used: dict[str, int] = {}  # key -> tick of its last use

    def touch(self, job: Job | None) -> Job | None:
        """Record a use of ``job`` (nothing for a shared job or None); returns it."""
        if job is not None and job.owner is not None:
            self._used[job.key] = next(self._tick)
        return job

    def use(self, job: Job, jobs: dict, order: list) -> Job:
        """Record a use of ``job`` and drop its owner's least recently used opened jobs beyond :attr:`limit` from
        ``jobs`` (key -> Job) and ``order`` (keys), the manager's own (the caller holds its lock); returns ``job``."""
        self.touch(job)
        if job.owner is None:
            return job
        mine = sorted((k for k, j in jobs.items() if j.owner == job.owner), key=lambda k: self._used.get(k, -1))
        for key in mine[:max(0, len(mine) - self.limit)]:
            del jobs[key]
            order.remove(key)
            self._used.pop(key, None)
        return job
