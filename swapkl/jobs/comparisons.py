"""What the Compare page shows, decided here (the page only draws): which finished analyses can be compared, their
labels, the comparison of two of them (:func:`swapkl.compare.result.compare`: the rank agreement; the transfer table
from an uploaded ``swapkl compare --json`` of the same two models), and the shared link's ``a`` / ``b`` keys."""
from __future__ import annotations

from swapkl.compare.result import CompareResult, compare
from swapkl.errors import SwapklError
from swapkl.schema import parse_json


def comparable(jobs) -> list:
    """The finished analysis jobs that hold a score result (newest first, as given)."""
    return [j for j in jobs if getattr(j.request, "kind", None) == "analysis" and j.status == "done"
            and j.result is not None and j.result.pairs]


def choice_label(job) -> str:
    """One line naming a job in the picker: its request, and where it came from (a bundle, a file, computed)."""
    where = "bundle" if getattr(job, "bundle", None) else "opened file" if job.key.startswith("file-") else "computed"
    return f"{job.request.label()} ({where}, {job.key[:10]})"


def pick(jobs, key: str | None, default: int) -> int:
    """The index of the job ``key`` (from the address bar) among ``jobs``, else ``default`` (clipped)."""
    for k, j in enumerate(jobs):
        if key and j.key == key:
            return k
    return min(default, max(0, len(jobs) - 1))


def transfer_file(raw: bytes | str) -> CompareResult:
    """A ``swapkl compare --json`` file (the Compare page's upload), parsed and validated; one-line
    :class:`SwapklError` otherwise."""
    return CompareResult.from_dict(parse_json(raw, "comparison file", keep_constants=True), "comparison file")


def compare_jobs(job_a, job_b, transfer_json: bytes | str | CompareResult | None = None,
                 n_boot: int = 1000) -> CompareResult:
    """The comparison of two analysis jobs: the rank agreement of their results; with ``transfer_json`` (a
    ``swapkl compare --json`` file, or the :func:`transfer_file` of one) its transfer table, when the file compares the same two models under the same
    contract.  Raises one-line :class:`SwapklError` (different depth, contract, or a file of other models)."""
    out = compare(job_a.result, job_b.result, source_a=choice_label(job_a), source_b=choice_label(job_b),
                  n_boot=n_boot)
    for job in (job_a, job_b):
        if getattr(job, "bundle", None):
            out.notes.append(f"{'A' if job is job_a else 'B'}: {job.bundle}")
    if transfer_json is not None:
        f = transfer_json if isinstance(transfer_json, CompareResult) else transfer_file(transfer_json)
        for side, res in (("a", job_a.result), ("b", job_b.result)):
            mine, theirs = dict(res.identity or {}, num_layers=res.num_layers), f.__dict__[side]["model"] or {}
            for k in ("fingerprint", "commit", "id", "num_layers"):
                if mine.get(k) is not None and theirs.get(k) is not None and mine.get(k) != theirs.get(k):
                    raise SwapklError(f"the comparison file's {side.upper()} is another model ({k} "
                                      f"{theirs.get(k)} != {mine.get(k)}); compare the same two analyses")
        if f.transfer is None:
            raise SwapklError("the comparison file has no transfer table (run swapkl compare A B --budget N)")
        out.transfer = f.transfer
    return out


def transfer_request(job_a, job_b, budget: int):
    """The :class:`~swapkl.jobs.requests.CompareRequest` that computes the transfer table of two analyses computed
    in this dashboard (their models and contract; A's evaluator).  Opened files and bundles carry no loadable model
    here: a one-line :class:`SwapklError` says so."""
    from swapkl.compare.agreement import check_comparable
    from swapkl.jobs.requests import CompareRequest

    for side, job in (("A", job_a), ("B", job_b)):
        if getattr(job, "bundle", None) or job.key.startswith("file-"):
            raise SwapklError(f"{side} was opened from a file: its model is not loaded here; run swapkl compare "
                              "A B --budget N where the models are, and upload its JSON")
    check_comparable(job_a.result, job_b.result)
    ra, rb = job_a.request, job_b.request
    return CompareRequest(model_a=ra.model, revision_a=ra.revision, model_b=rb.model, revision_b=rb.revision,
                          contract=ra.contract.with_(device=rb.contract.device), budget=budget,
                          evaluator=ra.evaluator)


def query(job_a, job_b) -> dict[str, str]:
    """The Compare page's shared link: the two analyses' job keys."""
    return {"a": job_a.key, "b": job_b.key}
