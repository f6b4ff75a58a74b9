"""``swapkl heal ... --tasks T [--include-path DIR] [--limit K] [--num-fewshot F]``: lm-eval task accuracy of the
fine-tuned base and of every healed model, next to the same tasks before healing, added to the heal's JSON under
``tasks`` (:func:`swapkl.healing.tasks.heal_task_accuracy`; docs/healing.md)."""
from __future__ import annotations

import contextlib

from swapkl.commands.common import add_task_args, check_task_numbers
from swapkl.errors import SwapklError
from swapkl.measure import lmeval
from swapkl.removal.plan import RunHooks


def register_args(p) -> None:
    g = p.add_argument_group("task accuracy after healing (lm-evaluation-harness): evaluated on the base, the "
                             "fine-tuned base, each pruned and each healed model (added to the JSON under 'tasks')")
    add_task_args(g, required=False, batch=False)  # --batch-size is the heal's own (training)
    g.add_argument("--task-batch-size", type=int, default=16, help="lm-eval batch size (default %(default)s)")


def check_args(a) -> None:
    """Every task check that needs no model and loads nothing (the names, the include path, the bounds); sets
    ``a.task_names`` (None without ``--tasks``).  :func:`loaded_once` loads the tasks."""
    a.task_names = None
    if a.tasks is None:
        for flag, v in (("--include-path", a.include_path), ("--limit", a.limit), ("--num-fewshot", a.num_fewshot)):
            if v is not None:
                raise SwapklError(f"{flag} goes with --tasks (task accuracy after healing)")
        return
    check_task_numbers(a)
    if a.task_batch_size < 1:
        raise SwapklError(f"--task-batch-size must be at least 1 (got {a.task_batch_size})")
    names = lmeval.parse_task_names(a.tasks)
    a.include_path = lmeval.check_include_path(a.include_path) if a.include_path else None
    a.task_names = names


def loaded_once(a):
    """The block of a heal run with ``--tasks``: the tasks loaded on entry (a bad task fails before the model is
    loaded and before any training) and every evaluation inside it uses them (:func:`lmeval.preloaded`)."""
    if a.task_names is None:
        return contextlib.nullcontext()
    return lmeval.preloaded(a.include_path, a.task_names)


def check_disjoint(a, ev, corpus) -> list[str]:
    """Every task's documents against the text a heal reads (:func:`swapkl.measure.task_regions.check_run`): the
    evaluator's held-out words and the whole prompt region of ``corpus`` (scoring prompts, calibration, training
    chunks) and of a scoring corpus of its own, and a ``--train-text`` or ``--heldout-text`` file whole.  One-line refusal before
    the model is loaded; one note per task and text (none without ``--tasks``)."""
    if a.task_names is None:
        return []
    from swapkl.measure import task_regions as TR
    from swapkl.scoring import corpora

    _tm, loaded = lmeval.load_tasks(a.include_path, a.task_names)
    notes = TR.check_run(loaded, corpus, heldout_words=int(ev.max_words), whole_prompt_region=True)
    scoring = getattr(a, "corpus", None)  # a scoring corpus of its own, where the heal takes one
    texts = [corpora.load_corpus(scoring)] if scoring else []
    texts += [corpora.from_file(p) for p in (a.train_text, a.heldout_text) if p]
    for text in texts:  # a file used whole: its evaluation region and its prompt region
        notes += TR.check_run(loaded, text, heldout_words=text.split_point, whole_prompt_region=True)
    return notes


def evaluate(a, ck, hc, recipe, shared: dict) -> dict:
    """The tasks block of healed curves ``hc`` (adapters and, after ``--repair bridge``, the bridges from this run's
    ``shared`` session)."""
    from swapkl.healing.tasks import heal_task_accuracy
    from swapkl.measure.task_runner import TaskSettings

    settings = TaskSettings(tuple(a.task_names), include_path=a.include_path, limit=a.limit, num_fewshot=a.num_fewshot,
                            batch_size=a.task_batch_size, use_cache=not a.no_cache)
    return heal_task_accuracy(ck.model, ck.tokenizer, hc, settings, recipe, adapters=shared.get("adapters"),
                              bridges=shared.get("bridges"), hooks=RunHooks(identity=ck.identity))


def render(ht: dict) -> str:
    """Text lines: per task, the base and fine-tuned base, then per method and n before (the raw cut and, after a
    bridge, the bridged model) → healed (± stderr)."""
    from swapkl.views.tasks import default_metric

    from swapkl.healing.task_figures import heal_task_results, caption

    before, _ = heal_task_results(ht)
    metric = default_metric(before)

    def cell(rows, t):
        v, s = (rows["metrics"].get(t) or {}).get(metric), (rows["stderr"].get(t) or {}).get(metric)
        return "–" if v is None else f"{v:.4f}" + ("" if s is None else f" ± {s:.4f}")

    lines = []
    for t in ht["base"]["metrics"]:
        lines.append(f"task {t} ({metric}): base {cell(ht['base'], t)}, "
                     f"fine-tuned base {cell(ht['base_finetuned'], t)}")
        for m, entries in ht["methods"].items():
            for e in entries:
                bridged = f", bridged {cell(e['bridged'], t)}" if e.get("bridged") else ""
                lines.append(f"  {m:<12} n={e['n']} {e['removed']}: before healing {cell(e['pruned'], t)}{bridged} → "
                             f"healed {cell(e['healed'], t)}")
    st = ht.get("stats") or {}
    lines.append(f"tasks: {st.get('evaluations', 0)} lm-eval runs, {st.get('cache_hits', 0)} from the cache; "
                 f"contract: {caption(ht)}")
    return "\n".join(lines)
