"""What a session's jobs add up to for download: the dashboard's result JSON of an analysis (:func:`result_json`),
the one-click HTML report of the finished jobs (:func:`report_html`: each job's sections, :func:`job_sections`;
task accuracy only for the analysis's model, :func:`tasks_sections`) and the evidence that speaks for an analysis
(:func:`matching_evidence`), and the demo bundle of an analysis (:func:`bundle_json`).  Jobs are read by their parts (``result``, ``curves``, ``trajectory``, ``evidence``,
``heal``, ``tasks``), so anything with those attributes reads as a job."""
from __future__ import annotations

import time


def result_json(job, public: bool = False) -> dict:
    """The whole analysis as one JSON object (swap-KL result, removal curves, request), contract included.
    ``public`` (a demo server): no absolute path of the server in it -- path-like identity fields and any path
    token become the model's display name (:func:`swapkl.jobs.scrub.scrub`)."""
    out = {"format": "swapkl.dashboard/1", "request": job.request.to_dict(), "created": time.time()}
    if job.result is not None:
        out["result"] = job.result.to_dict()
    if job.curves is not None:
        out["curves"] = job.curves.to_dict()
    return _public(out, job) if public else out


def _public(obj, job):
    """``obj`` scrubbed of the server's paths, named by the model of ``job`` (:mod:`swapkl.jobs.scrub`)."""
    from swapkl.jobs.scrub import public_name, scrub, server_roots

    ident = job.result.identity if job.result is not None else None
    return scrub(obj, public_name(ident, job.request.model), server_roots())


def evidence_done(job) -> bool:
    """Whether ``job`` is a finished evidence job with its result."""
    return job is not None and job.status == "done" and getattr(job, "evidence", None) is not None


def same_model(identity: dict | None, other: dict | None) -> bool:
    """The report's fingerprint rule: two model identities are of one model unless both carry a fingerprint and
    the fingerprints differ (an identity without one -- an opened file of an older version -- cannot tell)."""
    fp, fp_other = (identity or {}).get("fingerprint"), (other or {}).get("fingerprint")
    return not (fp and fp_other and fp != fp_other)


def tasks_sections(analysis, tasks_job) -> list:
    """The report section of ``tasks_job`` (:func:`swapkl.views.tasks.section`): none while it runs, before the base
    model's accuracy exists, or when it is for another model than ``analysis`` (:func:`same_model`)."""
    t = tasks_job.tasks if tasks_job is not None and not tasks_job.running else None
    if t is None or not t.base:
        return []
    res = analysis.result if analysis is not None else None
    if not same_model(res.identity if res is not None else None, t.model):
        return []
    from swapkl.views.tasks import section

    return [section(t)]


def job_sections(job, analysis=None) -> list:
    """The report sections a finished job adds (tiers above views build them): evidence, healed curves, task
    accuracy (only for the model of ``analysis``, when given)."""
    if evidence_done(job):
        from swapkl.evidence.section import section

        return [section(job.evidence)]
    if job is not None and getattr(job, "heal", None) is not None:
        from swapkl.healing.figures import section

        return [section(job.heal)]
    if job is not None and getattr(job, "tasks", None) is not None:
        return tasks_sections(analysis, job)
    return []


def report_html(job, traj_job=None, *others) -> str:
    """The one-click demo report (:func:`swapkl.views.report.build_report`) of what a session has: the analysis
    ``job``, the trajectory ``traj_job``, and a section for each finished job in ``others`` that has one (evidence,
    healing, task accuracy)."""
    from swapkl.views.report import build_report

    return build_report(result=job.result if job else None, curves=job.curves if job else None,
                        trajectory=traj_job.trajectory if traj_job else None,
                        sections=[sec for j in others for sec in job_sections(j, job)])


def bundle_json(job, *others, public: bool = False) -> str:
    """The demo bundle (:mod:`swapkl.compare.bundle`) of the analysis ``job``: its scores and curves, and from the
    finished jobs ``others`` (evidence, healed curves, task accuracy) those of the same model
    (:func:`same_model`); validated before it is returned.  ``public`` (a demo server): no absolute path of the
    server in it (as :func:`result_json`)."""
    from swapkl.compare.bundle import make_bundle, write_bundle

    ident = job.result.identity
    parts = {}
    for j in others:
        if j is None or j.running:
            continue
        if evidence_done(j) and "evidence" not in parts and same_model(ident, (j.evidence.data.get("contract") or {}).get("model")):
            parts["evidence"] = j.evidence
        elif getattr(j, "heal", None) is not None and "heal" not in parts and same_model(ident, j.heal.contract.get("model")):
            parts["heal"] = j.heal
        elif getattr(j, "tasks", None) is not None and "tasks" not in parts and same_model(ident, j.tasks.model):
            parts["tasks"] = j.tasks
    bundle = make_bundle(job.result, job.curves, **parts)
    return write_bundle(None, _public(bundle, job) if public else bundle)


def matching_evidence(jobs, request) -> dict | None:
    """The evidence result (its dict) of the first job in ``jobs`` that is an evidence job for the model, revision
    and contract of ``request`` and has finished its result, else None."""
    for j in jobs:
        r = j.request
        if (r.kind == "evidence" and j.evidence is not None and r.model == request.model
                and r.revision == request.revision and r.contract == request.contract):
            return j.evidence
    return None
