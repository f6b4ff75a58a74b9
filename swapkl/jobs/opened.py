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
from swapkl.store import file_sha256, folder_fingerprint

from .job import Job
from .requests import AnalysisRequest


def served_model(identity: dict | None, policy=None) -> tuple[str, str | None, bool]:
    """``(model, revision, browse_only)`` of an opened file whose model identity is ``identity``.

    A local server (``policy`` None or not demo) takes the identity's own spec, as before.  A demo server never
    takes a spec from a file: the model is the allow-list entry that the identity names (the built-in default, a
    hub id at an allowed revision, or a folder or file entry whose string the identity repeats exactly: compared as
    strings, never looked up), or, when none does, the file's display name with ``browse_only`` True (the pages
    show it; nothing loads or exports it)."""
    ident = identity or {}
    model = str(ident.get("id") or ident.get("display") or "result file")
    revision = ident.get("revision") if ident.get("kind") == "hub" else None
    if policy is None or not policy.demo:
        return model, revision, False
    kind = ident.get("kind")
    entry = None
    if kind == "builtin":
        entry = policy.allowed_entry("default")
    elif kind == "hub":
        entry = policy.allowed_entry(model, revision)
    elif kind in ("local", "gguf"):
        entry = next((e for e in policy.entries if e.kind == "path" and (
            e.spec == model or (ident.get("fingerprint") and entry_fingerprint(e.spec) == ident["fingerprint"]))),
            None)
    if entry is None:
        return str(ident.get("display") or "result file")[:200], None, True
    return entry.spec, (revision if entry.kind == "hub" else None), False


def entry_fingerprint(path: str) -> str | None:
    """The content fingerprint of an allow-listed folder or GGUF file (the operator's path, never a visitor's), as a
    loaded checkpoint's identity records it (the sha256s are memoised on disk); None when it cannot be read."""
    try:
        return file_sha256(path) if path.lower().endswith(".gguf") else folder_fingerprint(path)
    except OSError:
        return None


def opened_job(result_json: str | bytes | dict, curves_json: str | bytes | dict | None = None,
               owner: str | None = None, policy=None) -> Job:
    """A done job holding the result (and curves) of these files, private to ``owner`` (a browser session).
    ``policy``: the server's (:func:`served_model` decides which model the job names and whether it is browse-only).
    Raises :class:`~swapkl.errors.SwapklError` for a file that is not a result, or curves of another model."""
    def as_dict(x, what):
        return x if isinstance(x, dict) else parse_json(x, what, keep_constants=True)

    rd = as_dict(result_json, "result file")
    if isinstance(rd, dict) and rd.get("format") == BUNDLE_FORMAT:
        return bundle_job(rd, owner, policy)
    result = SwapResult.from_json(rd)
    curves = None
    if curves_json is not None:
        try:
            curves = CurvesResult.from_json(as_dict(curves_json, "curves file"))
        except (TypeError, KeyError) as e:
            raise SwapklError(f"not a swapkl curves file ({e})") from e
        check_same_model(result, curves.model)
    model, revision, browse_only = served_model(result.identity, policy)
    request = AnalysisRequest(model=model, revision=revision, contract=Contract.from_dict(result.contract),
                              budget=int(curves.budget) if curves is not None else 0,
                              methods=tuple(curves.methods) if curves is not None else (),
                              evaluator=curves.evaluator if curves is not None else None)
    key = "file-" + stable_hash({"result": rd, "curves": None if curves is None else curves.to_dict(),
                                 "owner": owner})[:16]
    job = Job(key, request)
    job.owner, job.browse_only = owner, browse_only
    job.done_from("opened from file", result=result, curves=curves)
    return job


def bundle_job(bundle: dict, owner: str | None = None, policy=None) -> Job:
    """A done job holding every part of a demo bundle (:mod:`swapkl.compare.bundle`: validated first), private to
    ``owner``; ``job.bundle`` is its caption (a bundle, and where it was computed); its model as
    :func:`served_model` decides.  Nothing is computed or written."""
    from swapkl.compare.bundle import from_dict

    b = from_dict(bundle)
    curves = b.curves
    model, revision, browse_only = served_model(b.scores.identity or {"display": "bundle"}, policy)
    request = AnalysisRequest(model=model, revision=revision, contract=Contract.from_dict(b.scores.contract),
                              budget=int(curves.budget) if curves is not None else 0,
                              methods=tuple(curves.methods) if curves is not None else (),
                              evaluator=curves.evaluator if curves is not None else None)
    job = Job("bundle-" + stable_hash({"bundle": bundle, "owner": owner})[:16], request)
    job.owner, job.browse_only = owner, browse_only
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
