"""The dashboard's exports of a pruned or merged model, decided here and drawn by the pages: the formats a model
exports to (:func:`export_formats`), the name a server derives for an export (:func:`export_name`), the model a
demo server's mergekit YAML names (:func:`demo_model_ref`), what to do with a saved export (:data:`SAVED_HOW`), and
which removal set of a curves result or an evidence result is exported (:func:`curve_export`,
:func:`evidence_export`), and the gate before a healed model's export (:func:`heal_gate`, :func:`worse_heals`,
:func:`heal_exportable`).  The writing itself is :meth:`swapkl.jobs.JobManager.export_pruned`
(:mod:`swapkl.surgery.exports`)."""
from __future__ import annotations

from swapkl.contract import stable_hash
from swapkl.surgery.exports import FILE_SUFFIX, gguf_source, mergekit_model_ref
from swapkl.views.captions import safe_name

#: per format, what to do with a saved export (shown with its path)
SAVED_HOW = {"hf": "reload with AutoModelForCausalLM.from_pretrained", "mergekit": "run: mergekit-yaml FILE OUT_DIR",
             "gguf": "runs in llama.cpp; transformers reads it with gguf_file="}


def export_identity(job, identity: dict | None = None) -> dict:
    """The model identity an export of ``job`` records: ``identity`` when given (an evidence job has no score
    result), else the job's result's, else empty."""
    return identity or (job.result.identity if job.result is not None else None) or {}


def export_formats(identity: dict | None, merge: dict | None = None) -> list[str]:
    """The formats this export can take: a merge only a Hugging Face folder (its blocks have new weights), a removal
    also a mergekit YAML, and a pruned GGUF when the model came from a GGUF file (:func:`gguf_source`)."""
    if merge:
        return ["hf"]
    return ["hf", "mergekit"] + (["gguf"] if gguf_source(identity) is not None else [])


def model_tail(request) -> str:
    """The last part of a request's model spec, with its revision: ``pythia-160m@step1000``."""
    return request.model.rstrip("/").split("/")[-1] + (f"@{request.revision}" if request.revision else "")


#: characters of a name's hash (hex of :func:`swapkl.contract.stable_hash`), kept when the readable head is cut
HASH_CHARS = 8
#: characters of a name before its format's suffix (:func:`swapkl.views.captions.safe_name`'s bound)
NAME_CHARS = 60
#: characters of the model part a name keeps when the layers are many
MODEL_MIN = 12


def export_key(request, identity: dict | None, removed, fmt: str, merge: dict | None = None,
               heal: dict | None = None) -> str:
    """:data:`HASH_CHARS` hex characters of the hash of the whole export request: model, revision, the identity's
    full fingerprint (and commit), the removed set, the format, the merge's groups and mode, and ``heal`` (a healed
    export's recipe and set).  Two different exports never share it (the name's readable head may be cut)."""
    ident = identity or {}
    what = {"model": request.model, "revision": request.revision, "fingerprint": ident.get("fingerprint"),
            "commit": ident.get("commit"), "removed": sorted(int(i) for i in (removed or ())), "format": fmt,
            "merge": {"mode": merge["mode"], "groups": [list(map(int, g)) for g in merge["groups"]]} if merge else None,
            "heal": heal}
    return stable_hash(what)[:HASH_CHARS]


def export_name(request, identity: dict | None, removed, fmt: str, merge: dict | None = None,
                heal: dict | None = None, tag: str = "") -> str:
    """The file (or folder) name of an export: ``<model tail>-<fingerprint[:8]>-minus-<layers><tag>-<hash>`` (a
    merge: ``merged-<mode>-<group>-<group>``, a group's layers joined by ``+``), made safe (:func:`safe_name`), at
    most :data:`NAME_CHARS` characters, then the format's suffix.  When it is too long the model part is cut first
    (to :data:`MODEL_MIN` characters), then the layers; the hash (:func:`export_key`, of the full request) always ends it, so no two different exports
    share a name and one request always gets the same one.  A demo server writes it under ``<cache>/exports/``."""
    what = (f"merged-{merge['mode']}-" + "-".join("+".join(map(str, g)) for g in merge["groups"])) if merge else \
        f"minus-{'-'.join(map(str, removed))}"
    fp = str((identity or {}).get("fingerprint") or "")[:8]
    key = export_key(request, identity, removed, fmt, merge, heal)
    room = NAME_CHARS - HASH_CHARS - 1
    what = safe_name(what + tag)[: room - 1 - MODEL_MIN]
    model = safe_name(f"{model_tail(request)}-{fp}")[: max(0, room - len(what) - 1)].strip("-")
    head = f"{model}-{what}" if model else what
    return f"{head.strip('-')}-{key}" + FILE_SUFFIX.get(fmt, "")


def demo_model_ref(request, identity: dict | None) -> str:
    """What a demo server's mergekit YAML names as its model: the hub id (with its commit) for a hub model, else a
    folder the user fills in (``./<model tail>``) -- never a path of the server's."""
    ident = identity or {}
    return mergekit_model_ref(ident) if ident.get("kind") == "hub" else f"./{safe_name(model_tail(request))}"


def curve_export_methods(curves) -> list[str]:
    """The methods of a curves result with a deterministic removal set at every n (the ones that can be exported)."""
    return [m for m, entries in curves.methods.items() if entries and all(e.get("removed") is not None for e in entries)]


def curve_export(curves, method: str, n: int) -> tuple[dict, dict | None]:
    """``(entry, merge)`` of ``method`` at ``n`` in a curves result: its curve entry (``removed``: the layers) and,
    for a merging method (LaCo: its merged blocks are written, not just the others kept), ``{"groups", "mode"}``
    for :meth:`~swapkl.jobs.JobManager.export_pruned`, else None."""
    entry = next(e for e in curves.methods[method] if e["n"] == n)
    groups = ((curves.method_info.get(method) or {}).get("groups") or [None] * n)[n - 1] if entry.get("merge") else None
    if groups:
        return entry, {"groups": groups, "mode": str(entry["merge"]).split(":")[0]}
    return entry, None


def evidence_export(evidence: dict, signal: str, n: int) -> list[int]:
    """The set a signal's rule chose for ``n`` on the full sample of an evidence result's dict (its stability
    table; the same set as ``swapkl prune --from evidence.json``), sorted."""
    return sorted(int(i) for i in evidence["stability"][signal][str(n)]["set"])


def heal_gate(entry: dict) -> str | None:
    """The gate before exporting a healed model, on one entry of healed curves (or a heal result's dict): one line
    when the healed model's perplexity is above the pruned model's with the paired CI of ``healed_vs_pruned`` above
    0, on the evaluation windows or the held-out domain (:meth:`swapkl.healing.result.HealResult.gate_line`,
    the rule of ``heal --out`` without ``--force``), else None."""
    worse = []
    for what, d in (("evaluation", entry.get("delta_pct")), ("held-out", (entry.get("held_out") or {}).get("delta_pct"))):
        x = (d or {}).get("healed_vs_pruned")
        if x and x.get("ci") and x["ci"][0] is not None and x["ci"][0] > 0:
            worse.append(f"{what} PPL {x['value']:+.4g} % [{x['ci'][0]:+.4g}, {x['ci'][1]:+.4g}] vs the pruned model")
    return ("the healed model is worse than the pruned model it heals: " + "; ".join(worse)) if worse else None


def worse_heals(heal_curves) -> dict:
    """``{(method, n): gate line}`` for every heal of healed curves (:class:`~swapkl.healing.curves.HealCurves` or
    its dict) that made its model worse (:func:`heal_gate`); {} when none did."""
    methods = heal_curves["methods"] if isinstance(heal_curves, dict) else heal_curves.methods
    return {(m, int(e["n"])): line for m, entries in methods.items() for e in entries
            if (line := heal_gate(e)) is not None}


def heal_exportable(heal_curves, method: str, n: int, force: bool = False) -> bool:
    """Whether the export button of ``method``'s healed model at ``n`` is offered: always when the heal did not make
    it worse, else only with ``force`` (the panel's "export anyway", like ``heal --force``)."""
    return force or (method, int(n)) not in worse_heals(heal_curves)
