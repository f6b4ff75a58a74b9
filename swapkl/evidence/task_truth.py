"""The second ground truth of the evidence (docs/evidence.md, "Task ground truth"): the lm-eval task accuracy lost by
removing each block alone.

:func:`measure` evaluates the base model and every single-block removal through lm-evaluation-harness itself (the
task runner of :mod:`swapkl.measure.task_runner`, as ``swapkl tasks`` does: the same cache, prefix sharing and
per-document scores).  :class:`TaskTruth` holds the per-document scores and gives, per block and task, the change
``ΔAcc = acc(pruned) − acc(base)`` with its paired per-document bootstrap interval
(:func:`swapkl.measure.task_docs.delta`), and the ranked ground truth ``ground_truth_acc``: the accuracy **loss**
``−ΔAcc`` (higher = costlier, as ΔPPL), the mean over tasks where several.  :meth:`TaskTruth.resampled` recomputes the
loss on resampled documents, so the agreement's joint bootstrap (:func:`swapkl.evidence.agreement.replicate_vectors`)
draws documents in the same replicate as the prompts and the windows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swapkl.measure import lmeval
from swapkl.measure.task_docs import accuracy_key, delta, paired
from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, finite_ci

GT_ACC = "ground_truth_acc"
EVALUATOR = "lm-eval simple_evaluate on HFLM(in-memory pruned copy), one block removed at a time"


@dataclass
class TaskTruth:
    """Per-document scores of the base model and of each single-block removal: ``base_docs`` and ``docs[i]`` are
    the ``docs`` tables of :meth:`~swapkl.measure.task_runner.TaskRunner.variant`; ``tasks`` the leaf tasks ranked
    (each with its accuracy ``metric``); ``contract`` what the numbers were measured under."""

    layers: list
    tasks: list
    metric: dict
    base_docs: dict
    docs: dict
    contract: dict

    def scores(self, task: str) -> tuple[np.ndarray, np.ndarray]:
        """``(base (n,), pruned (L, n))``: the per-document scores of ``task``, paired document by document."""
        rows = [paired(self.base_docs, self.docs[i], task, self.metric[task]) for i in self.layers]
        return np.asarray(rows[0][0], float), np.asarray([r[1] for r in rows], float)

    def n_docs(self, task: str) -> int:
        return len(self.base_docs[task]["doc_id"])

    def loss(self) -> dict:
        """``{task: (L,), "mean": (L,)}``: accuracy lost by each removal (base − pruned; higher = costlier)."""
        out = {}
        for t in self.tasks:
            a, b = self.scores(t)
            out[t] = (a[None, :] - b).mean(1)  # exactly −ΔAcc of task_docs.delta (the same sum, negated)
        out["mean"] = np.mean([out[t] for t in self.tasks], axis=0)
        return out

    def resampled(self, didx: dict) -> dict:
        """``{task: (B, L), "mean": (B, L)}``: :meth:`loss` on the document draws ``didx`` ({task: (B, n)})."""
        out = {}
        for t in self.tasks:
            a, b = self.scores(t)
            d = a[None, :] - b  # (L, n): per-document loss of each removal
            out[t] = np.stack([d[k][didx[t]].mean(1) for k in range(len(d))], axis=1)  # (B, L)
        out["mean"] = np.mean([out[t] for t in self.tasks], axis=0)
        return out

    def record(self) -> dict:
        """The ``task_truth`` entry's per-block part: per task ``delta_acc`` (pruned − base, as ``swapkl tasks``
        reads it) with ``delta_acc_ci`` (:func:`~swapkl.measure.task_docs.delta`: 1,000 per-document resamples,
        seed 0), the base accuracy and the documents; ``acc_loss`` (the ranked ground truth: the mean over tasks of
        −ΔAcc) with ``acc_loss_ci`` (1,000 resamples of every task's documents from one stream seeded 0: with one
        task, the same draws as ``delta_acc_ci``, negated)."""
        per = {t: [delta(self.base_docs, self.docs[i], t, self.metric[t]) for i in self.layers] for t in self.tasks}
        loss = self.loss()["mean"]
        rng = np.random.default_rng(BOOT_SEED)
        draws = self.resampled({t: bootstrap_indices(self.n_docs(t), N_BOOT, rng) for t in self.tasks})["mean"]
        ci = [finite_ci(draws[:, k]) for k in range(len(self.layers))]
        return {"tasks": list(self.tasks), "metric": dict(self.metric),
                "base": {t: float(self.scores(t)[0].mean()) for t in self.tasks},
                "n_docs": {t: self.n_docs(t) for t in self.tasks},
                "delta_acc": {t: [r["delta"] for r in per[t]] for t in self.tasks},
                "delta_acc_ci": {t: [r["ci"] for r in per[t]] for t in self.tasks},
                "acc_loss": loss.tolist(), "acc_loss_ci": ci,
                "orientation": "acc_loss = acc(base) − acc(block removed), mean over tasks: higher = costlier, "
                               "as ΔPPL; delta_acc = −acc_loss per task"}


def entry(tt: TaskTruth, vectors: dict, agree: dict, reps: dict, signal_names) -> dict:
    """The evidence result's ``task_truth`` entry: :meth:`TaskTruth.record`, ``truths_agreement`` (ΔPPL % against the accuracy loss: Spearman and Kendall with their CIs,
    windows and documents resampled jointly: "do blocks that cost perplexity cost accuracy?") and, with several
    tasks, ``per_task`` {task: {"spearman": {signal: ρ}, "spearman_ci": {signal: [lo, hi]}}} against each task's
    own accuracy loss."""
    from swapkl.stats import spearman, spearman_rows

    out = tt.record()
    out["truths_agreement"] = {k: agree[k]["ground_truth_ppl"][GT_ACC]
                               for k in ("spearman", "spearman_ci", "kendall", "kendall_ci")}
    if len(tt.tasks) > 1:
        loss = tt.loss()
        out["per_task"] = {}
        for t in tt.tasks:
            rho, ci = {}, {}
            for s in signal_names:
                m = np.isfinite(vectors[s]) & np.isfinite(loss[t])
                rho[s] = spearman(vectors[s], loss[t])
                ci[s] = finite_ci(spearman_rows(reps[s][:, m], reps[f"{GT_ACC}:{t}"][:, m]))
            out["per_task"][t] = {"spearman": rho, "spearman_ci": ci}
    return out


def _contract(run, loaded, settings, base) -> dict:
    return {"evaluator": EVALUATOR, "lm_eval_version": run.lm_eval_version, "limit": settings.limit,
            "num_fewshot": settings.num_fewshot, "batch_size": settings.batch_size,
            "include_path": settings.include_path,
            "tasks": {t["name"]: {"versions": t["versions"], "config_sha": t["config_sha"],
                                  "output_types": t["output_types"], "chance": lmeval.chance(t, settings.limit)}
                      for t in loaded},
            "n-shot": base["n-shot"], "n-samples": base["n-samples"],
            "bootstrap": "per-document paired; in the agreement, documents drawn in the same replicate as the "
                         "scoring prompts and the evaluation windows"}


def measure(ck, settings, progress=None, should_stop=None) -> TaskTruth:
    """The base model and each block removed alone, through the task runner (``settings``: a
    :class:`~swapkl.measure.task_runner.TaskSettings`; the tasks are loaded through :func:`lmeval.load_tasks`, so a
    command's :func:`lmeval.preloaded` block serves them)."""
    from swapkl.measure.task_runner import TaskRunner
    from swapkl.removal.plan import RunHooks

    L = ck.num_layers
    tm, loaded = lmeval.load_tasks(settings.include_path, settings.tasks)
    run = TaskRunner(ck.model, ck.tokenizer, loaded, tm, identity=ck.identity, settings=settings,
                     hooks=RunHooks(progress=progress, should_stop=should_stop), total=L + 1)
    sets = [[i] for i in range(L)]
    if settings.share_prefix:
        from swapkl.measure.prefix import PrefixStore

        run.prefix = PrefixStore(range(L))
        run.record_base = run.worth_recording(sets)
    base = run.variant(())
    run.tick("task ground truth: base")
    docs = {}
    for i in range(L):
        docs[i] = run.variant([i])["docs"]
        run.tick(f"task ground truth: block {i} removed")
    tasks = sorted(base["docs"])
    metric = {t: accuracy_key(base["docs"][t]) for t in tasks}
    return TaskTruth(list(range(L)), tasks, metric, base["docs"], docs,
                     dict(_contract(run, loaded, settings, base), stats=dict(run.stats)))


def check_disjoint(ck, settings, contract, corpus, heldout_words: int, bridged: bool) -> list[str]:
    """Every task's documents (``settings``: :class:`~swapkl.measure.task_runner.TaskSettings`) against the text this
    evidence reads (:func:`swapkl.measure.task_regions.check_run`): the first ``heldout_words`` words of the held-out
    ``corpus``, the scoring prompts of ``contract`` and the signals' calibration reserve of its corpus, its whole
    prompt region when ``bridged`` (the bridges' calibration windows).  One-line
    :class:`~swapkl.measure.task_regions.TaskOverlapError` before anything is computed; one note per task and text."""
    from swapkl.measure import task_regions as TR

    _tm, loaded = lmeval.load_tasks(settings.include_path, settings.tasks)
    return TR.check_contract(loaded, contract, ck.tokenizer, heldout=corpus, heldout_words=heldout_words,
                             whole_prompt_region=bridged)
