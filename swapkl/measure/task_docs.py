"""Per-document task scores (:func:`swapkl.measure.lmeval.doc_rows`) paired between two evaluations, and the
accuracy change between them with its per-document bootstrap interval (:func:`swapkl.stats.mean_diff`).

Two evaluations pair when they scored the same documents of the same task in the same order (their ``doc_sha``
agree): the base model and a pruned copy under one task configuration, limit and few-shot count.
"""
from __future__ import annotations

from swapkl.errors import SwapklError
from swapkl.stats import BOOT_SEED, N_BOOT, mean_diff

#: the metric a task's accuracy change is read from, in order of preference (lm-eval's keys: metric, then filter)
ACCURACY_KEYS = ("acc,none", "acc_norm,none", "exact_match,none")


class UnpairedDocuments(SwapklError):
    """Two evaluations whose documents differ (another task configuration, limit or order)."""


def accuracy_key(table: dict) -> str | None:
    """The first key of :data:`ACCURACY_KEYS` one task's per-document table holds, else its first metric key."""
    keys = [k for k in table if k not in ("doc_id", "doc_sha")]
    return next((k for k in ACCURACY_KEYS if k in table), keys[0] if keys else None)


def paired(a_docs: dict, b_docs: dict, task: str, metric: str) -> tuple[list, list]:
    """The per-document ``metric`` scores of ``task`` in two evaluations' ``docs`` tables, document by document;
    raises :class:`UnpairedDocuments` (one line) when their documents differ or a score is missing."""
    a, b = a_docs.get(task), b_docs.get(task)
    if a is None or b is None:
        raise UnpairedDocuments(f"task {task}: an evaluation holds no per-document scores (computed by an older "
                                "swapkl: run it again)")
    if a.get("doc_sha") != b.get("doc_sha") or a.get("doc_id") != b.get("doc_id"):
        raise UnpairedDocuments(f"task {task}: the two evaluations scored different documents "
                                "(another limit, few-shot count or task version)")
    x, y = a.get(metric), b.get(metric)
    if x is None or y is None or any(v is None for v in (*x, *y)):
        raise UnpairedDocuments(f"task {task}: no per-document {metric} in both evaluations")
    return list(x), list(y)


def delta(a_docs: dict, b_docs: dict, task: str, metric: str | None = None, n_boot: int = N_BOOT,
          seed: int = BOOT_SEED) -> dict:
    """``{"task", "metric", "delta", "ci", "n"}``: the change of ``task``'s mean ``metric`` (default: its accuracy,
    :func:`accuracy_key`) from evaluation ``a`` to ``b`` (a fraction: −0.05 = five points lost), with the 95 %
    interval of a paired per-document bootstrap (``n_boot`` resamples of the documents from ``seed``)."""
    metric = metric or accuracy_key(a_docs.get(task) or {})
    x, y = paired(a_docs, b_docs, task, metric)
    return {"task": task, "metric": metric, **mean_diff(x, y, n_boot, seed)}
