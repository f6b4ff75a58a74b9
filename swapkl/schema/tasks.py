"""Validation of a task-accuracy file (``swapkl tasks --json``, :class:`swapkl.removal.tasks.TasksResult`) that comes
from outside (``report --tasks``): the tables the report draws are checked field by field before anything is built.

Checked: ``base`` and every entry's ``metrics`` / ``stderr`` are ``{task: {metric: number or null}}``; ``methods`` is
``{method: [{"n", "removed", "metrics", "stderr", ...}]}`` with ``n`` >= 1 and ``removed`` null (a mean over seeds)
or layer indices; per-document scores (``docs``, where present) one number per listed document; a seeded entry's ``per_seed`` rows have a seed, a set and metrics; ``contract`` names the lm-eval
version, the limit, the few-shot count and per task its versions and chance accuracy.  Everything else must be plain
JSON (bounded depth, finite numbers).
"""
from __future__ import annotations

from typing import Any

from swapkl.schema.fields import (MAX_INT, MAX_LAYERS, MAX_METHODS, MAX_SEEDS, _array, _at, _bool, _document, _fail, _fields,
                                  _int, _json, _number, _object, _text)

MAX_TASKS = 512      # task (and group) rows of one file
MAX_METRICS = 64     # metrics of one task row
MAX_DOCS = 200_000   # documents of one task's per-document scores


def _table(x, where: str) -> dict:
    """``{task: {metric: number or null}}``."""
    x = _object(x, where)
    if len(x) > MAX_TASKS:
        _fail(where, x, f"has more than {MAX_TASKS} tasks")
    out = {}
    for task, row in x.items():
        row = _object(row, _at(where, task))
        if len(row) > MAX_METRICS:
            _fail(_at(where, task), row, f"has more than {MAX_METRICS} metrics")
        _text(task, f"{where} key")
        out[task] = {m: _number(v, _at(_at(where, task), m), -MAX_INT, MAX_INT, null=True) for m, v in row.items()}
    return out


def _docs(x, where: str) -> dict:
    """``{task: {"doc_id": [ints], "doc_sha": text, metric: [number or null per document]}}`` (the per-document
    scores of :func:`swapkl.measure.lmeval.doc_rows`), every list as long as ``doc_id``."""
    x = _object(x, where)
    if len(x) > MAX_TASKS:
        _fail(where, x, f"has more than {MAX_TASKS} tasks")
    out = {}
    for task, row in x.items():
        w = _at(where, _text(task, f"{where} key"))
        row = _object(row, w)
        if len(row) > MAX_METRICS + 2:
            _fail(w, row, f"has more than {MAX_METRICS} metrics")
        ids = [_int(i, f"{_at(w, 'doc_id')}[{k}]", 0, MAX_INT) for k, i in enumerate(_array(row.get("doc_id"),
                                                                                          _at(w, "doc_id"), MAX_DOCS))]
        t = {"doc_id": ids, "doc_sha": _text(row.get("doc_sha"), _at(w, "doc_sha"))}
        for m, v in row.items():
            if m in t:
                continue
            vals = _array(v, _at(w, m), MAX_DOCS)
            if len(vals) != len(ids):
                _fail(_at(w, m), v, f"holds {len(vals)} scores for {len(ids)} documents")
            t[_text(m, f"{w} key")] = [_number(e, f"{_at(w, m)}[{k}]", -MAX_INT, MAX_INT, null=True)
                                       for k, e in enumerate(vals)]
        out[task] = t
    return out


def _removed(x, where: str, null: bool = False):
    if x is None and null:
        return None
    return [_int(i, f"{where}[{k}]", 0, MAX_LAYERS - 1) for k, i in enumerate(_array(x, where, MAX_LAYERS))]


def _seed_row(x, where: str) -> dict:
    return _fields(x, where, {"seed": lambda v, w: _int(v, w, 0, MAX_INT), "removed": _removed,
                              "metrics": _table}, required=("seed", "removed", "metrics"), extra=_json)


def _entry(x, where: str) -> dict:
    spec = {"n": lambda v, w: _int(v, w, 1, MAX_LAYERS), "removed": lambda v, w: _removed(v, w, null=True),
            "metrics": _table, "stderr": _table, "seed_min": _table, "seed_max": _table, "docs": _docs,
            "per_seed": lambda v, w: [_seed_row(r, f"{w}[{k}]") for k, r in enumerate(_array(v, w, MAX_SEEDS))]}
    return _fields(x, where, spec, required=("n", "removed", "metrics", "stderr"), extra=_json)


def _methods(x, where: str) -> dict:
    x = _object(x, where)
    if len(x) > MAX_METHODS:
        _fail(where, x, f"has more than {MAX_METHODS} methods")
    return {_text(k, f"{where} key"): [_entry(e, _at(_at(where, k), i)) for i, e in enumerate(_array(v, _at(where, k),
                                                                                                   MAX_LAYERS))]
            for k, v in x.items()}


def _task_info(x, where: str) -> dict:
    return _fields(x, where, {"versions": lambda v, w: _json(_object(v, w), w),
                              "chance": lambda v, w: _number(v, w, 0.0, 1.0, null=True)}, required=("versions",),
                   extra=_json)


def _contract(x, where: str) -> dict:
    def tasks(v, w):
        v = _object(v, w)
        if len(v) > MAX_TASKS:
            _fail(w, v, f"has more than {MAX_TASKS} tasks")
        return {_text(k, f"{w} key"): _task_info(t, _at(w, k)) for k, t in v.items()}

    spec = {"lm_eval_version": lambda v, w: _text(v, w, null=True), "tasks": tasks,
            "limit": lambda v, w: _int(v, w, 1, MAX_INT, null=True),
            "num_fewshot": lambda v, w: _int(v, w, 0, MAX_INT, null=True),
            "budget": lambda v, w: _int(v, w, 1, MAX_LAYERS, null=True), "evaluator": lambda v, w: _text(v, w, null=True)}
    return _fields(x, where, spec, required=("lm_eval_version", "tasks"), extra=_json)


def tasks_fields(d: Any, what: str = "tasks file") -> dict:
    """The checked fields of a ``swapkl tasks --json`` document (raises :class:`~swapkl.errors.UploadError`, one
    line naming ``what`` and the field)."""
    with _document(what):
        _object(d, "document", "(expected the JSON written by 'python -m swapkl tasks --json')")
        base = {"metrics": _table, "stderr": _table, "docs": _docs}
        spec = {"base": lambda v, w: _fields(v, w, base, required=("metrics", "stderr")), "methods": _methods,
                "contract": _contract, "model": lambda v, w: _json(_object(v, w), w),
                "notes": lambda v, w: [_text(n, _at(w, i)) for i, n in enumerate(_array(v, w, 10_000))],
                "complete": _bool, "repaired": _methods, "repair": lambda v, w: _json(_object(v, w), w)}
        return _fields(d, "document", spec, required=("base", "methods", "contract"), extra=_json)
