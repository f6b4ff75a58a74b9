"""lm-evaluation-harness as swapkl uses it: task loading with one-line errors, and one evaluation of an in-memory
model (``lm_eval.simple_evaluate`` on an ``HFLM`` wrapped around the model object: no export, no model load).

Metric names are kept exactly as lm-eval writes them (``"acc,none"``, ``"acc_norm,none"``: the metric, then the
filter), each with its stderr (``"acc_stderr,none"`` in lm-eval's results, stored here under the metric's own key
in a separate ``stderr`` table).  lm-eval and its task registry are imported inside the functions: importing this
module costs nothing (the CLI's ``--help``, the dashboard's first paint).

An lm-eval task YAML can run Python (``!function``, ``process_docs``, ``custom_dataset``): a task from
``include_path`` is the local user's own code.  Nothing here takes an include path or a YAML from a browser (see
``docs/security.md``).
"""
from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from pathlib import Path

from swapkl.contract import stable_hash
from swapkl.errors import SwapklError, require_extra

#: what :func:`swapkl.errors.require_extra` says needs the ``tasks`` extra
WHAT = "task accuracy (lm-evaluation-harness)"

#: keys of an lm-eval result row that are not metrics
NOT_METRICS = ("alias", "name", "sample_len", "samples", " ")

_MANAGERS: dict = {}
_MANAGERS_LOCK = threading.Lock()


class _Held(threading.local):
    """The tasks of the ``preloaded`` blocks open in this thread: (include path, names) -> load_tasks' result.
    Per thread, so that concurrent runs (a server's job threads, a test's) never see each other's task objects."""

    def __init__(self):
        self.tasks: dict = {}


_HELD = _Held()


class TaskError(SwapklError):
    """A task that cannot be named, found or loaded (one line, exit 2 at the command line)."""


def lm_eval_version() -> str:
    require_extra("tasks", WHAT)
    try:
        from importlib.metadata import version

        return version("lm_eval")
    except Exception:  # not installed under that distribution name
        import lm_eval

        return getattr(lm_eval, "__version__", "?")


def check_include_path(path) -> str:
    """The resolved folder of ``--include-path``, or :class:`TaskError` when it is missing, not a folder, or holds
    no task YAML (lm-eval itself would skip it silently and then not know the task)."""
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise TaskError(f"--include-path {path} does not exist")
    if not p.is_dir():
        raise TaskError(f"--include-path {path} is not a folder of task YAML files")
    if not any(p.rglob("*.yaml")) and not any(p.rglob("*.yml")):
        raise TaskError(f"--include-path {path} holds no task YAML files (*.yaml)")
    return str(p.resolve())


def parse_task_names(text: str) -> list[str]:
    """Comma-separated task names, stripped, duplicates dropped; :class:`TaskError` for none or a bad name."""
    names = list(dict.fromkeys(t.strip() for t in str(text or "").split(",") if t.strip()))
    if not names:
        raise TaskError("--tasks names no task (e.g. --tasks hellaswag,arc_easy)")
    for n in names:
        if len(n) > 200 or any(c in n for c in "\n\r\0"):
            raise TaskError(f"bad task name {n[:40]!r}")
    return names


def task_manager(include_path: str | None = None, defaults: bool = True):
    """One ``lm_eval.tasks.TaskManager`` per include path (and ``defaults``) for the process.  With ``defaults``
    it indexes lm-eval's own ~15,000 task YAMLs as well as ``include_path`` (seconds of CPU; a CLI run of ``lm_eval``
    pays it every time); without, only ``include_path``'s (milliseconds).  swapkl's own tasks
    (:data:`swapkl.measure.lastword.TASKS_DIR`: ``wikitext_lastword``) are always on the path, before
    ``include_path``."""
    require_extra("tasks", WHAT)
    key = (include_path or "", defaults)
    with _MANAGERS_LOCK:
        if key not in _MANAGERS:
            from lm_eval.tasks import TaskManager

            from swapkl.measure.lastword import TASKS_DIR

            paths = [str(TASKS_DIR)] + ([include_path] if include_path else [])  # the user's folder last: it wins
            _MANAGERS[key] = TaskManager(include_path=paths, include_defaults=defaults)
        return _MANAGERS[key]


def load_tasks(include_path: str | None, names) -> tuple[object, list[dict]]:
    """``(task manager, [load_task(manager, name) for name in names])``.  When every name is a task or group of
    ``include_path`` or of swapkl's own tasks that loads from them alone, the manager indexes only those folders; otherwise (a name of lm-eval's
    registry, or a local group that needs a registry task) it is the full one.  The tasks are the same YAMLs either
    way: the choice changes the time taken, not what is evaluated."""
    names = list(names)
    held = _HELD.tasks.get(_preload_key(include_path, names))
    if held is not None:
        return held
    if names:
        local = task_manager(include_path, defaults=False)
        if all(n in local.all_tasks for n in names):
            try:
                return local, [load_task(local, n) for n in names]
            except TaskError:
                pass
    tm = task_manager(include_path)
    return tm, [load_task(tm, n) for n in names]


def _preload_key(include_path: str | None, names) -> tuple:
    return include_path or "", tuple(names)


@contextmanager
def preloaded(include_path: str | None, names):
    """Load the tasks now -- an unknown or unloadable task fails here, before a command loads its model -- and let
    every :func:`load_tasks` of the same include path and names inside the block, in the same thread, return them: a
    command's run or a server's job loads each task once.  (Outside a block every call loads afresh; another thread
    never sees this block's tasks.)"""
    key = _preload_key(include_path, names)
    if key in _HELD.tasks:  # a nested block of the same tasks: the outer one owns them
        yield _HELD.tasks[key]
        return
    _HELD.tasks[key] = load_tasks(include_path, names)
    try:
        yield _HELD.tasks[key]
    finally:
        _HELD.tasks.pop(key, None)


def load_task(tm, name: str) -> dict:
    """Load task (or group) ``name`` once: ``{"name", "spec": what simple_evaluate takes, "leaves": {task name:
    Task}, "versions": {name: version}, "config_sha": hash of every leaf's configuration, "output_types"}``.
    Raises :class:`TaskError` for an unknown name or a dataset that cannot be loaded (offline hub, bad path)."""
    try:
        with _no_custom_dataset_note():
            loaded = tm.load([name])
    except KeyError:
        raise TaskError(f"unknown lm-eval task '{name}' (not in lm-eval's registry nor under --include-path)") \
            from None
    except Exception as e:  # dataset download, YAML or dataset errors of any kind
        msg = " ".join(str(e).split())[:300] or type(e).__name__
        if _is_offline(e):
            raise TaskError(f"lm-eval task '{name}': its data is not available offline ({msg[:160]}); use the "
                            f"shipped offline task {SHIPPED_TASK}, or a local task with --include-path DIR") from None
        raise TaskError(f"cannot load lm-eval task '{name}': {type(e).__name__}: {msg}") from None
    leaves = dict(loaded["tasks"])
    if not leaves:
        raise TaskError(f"lm-eval task '{name}' has no tasks to evaluate")
    versions = {t: _version(obj) for t, obj in leaves.items()}
    for g, obj in loaded.get("groups", {}).items():
        versions[str(g)] = _version(obj)
    configs = {t: portable_config(obj.dump_config()) for t, obj in leaves.items()}
    objs = list(loaded["groups"].values()) or list(leaves.values())
    top = [o for o in objs if str(getattr(o, "name", "")) == name] or objs
    return {"name": name, "spec": top, "leaves": leaves, "versions": versions, "config_sha": stable_hash(configs)[:16],
            "output_types": {t: obj.get_config("output_type") for t, obj in leaves.items()}}


#: swapkl's own offline task (:mod:`swapkl.measure.lastword`), always on the include path
SHIPPED_TASK = "wikitext_lastword"
_OFFLINE_HINTS = ("offlinemodeisenabled", "offline mode", "couldn't reach", "could not reach", "localentrynotfound",
                  "connection", "max retries", "name resolution", "network is unreachable")


def _is_offline(e: Exception) -> bool:
    """Whether a task's load failed because its dataset needs a hub that is off (``HF_HUB_OFFLINE``) or
    unreachable."""
    text = f"{type(e).__name__} {e}".lower()
    return isinstance(e, (ConnectionError, TimeoutError)) or any(h in text for h in _OFFLINE_HINTS)


class _DropNote(logging.Filter):
    def filter(self, record) -> bool:
        return "Custom kwargs can be passed" not in record.getMessage()


@contextmanager
def _no_custom_dataset_note():
    """Without lm-eval's note, printed on every load of a task with a ``custom_dataset`` (the shipped task), that
    custom kwargs can be passed on lm-eval's command line: it is not swapkl's command line."""
    log, note = logging.getLogger("lm_eval.api.task"), _DropNote()
    log.addFilter(note)
    try:
        yield
    finally:
        log.removeFilter(note)


def portable_config(config: dict) -> dict:
    """A task's configuration as JSON without where its YAML lies on this machine (lm-eval's
    ``metadata.config_source``: a checkout's or site-packages' path), so that its hash, part of every task cache key,
    names the task and not the installation."""
    c = json.loads(json.dumps(config, sort_keys=True, default=str))
    meta = c.get("metadata")
    if isinstance(meta, dict) and "config_source" in meta:
        c["metadata"] = {k: v for k, v in meta.items() if k != "config_source"}
    return c


def _version(obj):
    v = getattr(obj, "VERSION", None)
    if v is None:
        meta = getattr(getattr(obj, "config", None), "metadata", None) or {}
        v = meta.get("version") if isinstance(meta, dict) else None
    return v if isinstance(v, (int, float, str)) or v is None else str(v)


def chance(task: dict, limit: int | None = None) -> float | None:
    """Chance accuracy of a multiple-choice task: the mean over the evaluated documents (the first ``limit``) of
    1 / number of choices; of another task whose documents each state their ``chance`` (the shipped last-word task:
    1 / the distinct candidate words of its passage), their mean; None for other tasks or a group of several."""
    if len(task["leaves"]) != 1:
        return None
    obj = next(iter(task["leaves"].values()))
    docs = list(obj.eval_docs)
    docs = docs[:limit] if limit else docs
    if obj.get_config("output_type") != "multiple_choice":
        per = [d.get("chance") if isinstance(d, dict) else None for d in docs]
        ok = per and all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in per)
        return sum(per) / len(per) if ok else None
    inv = [1.0 / len(obj.doc_to_choice(d)) for d in docs]
    return sum(inv) / len(inv) if inv else None


def evaluate(model, tokenizer, task: dict, tm, *, limit: int | None = None, num_fewshot: int | None = None,
             batch_size: int = 16) -> dict:
    """lm-eval's own evaluation of the in-memory ``model`` on ``task`` (from :func:`load_task`):
    ``{"metrics": {task: {metric: value}}, "stderr": {task: {metric: stderr}}, "versions", "n-shot",
    "n-samples", "docs"}`` for every task and group row lm-eval reports; ``docs`` holds every leaf task's
    per-document scores (:func:`doc_rows`), what a per-document bootstrap resamples."""
    require_extra("tasks", WHAT)
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    with _no_environment_report():
        out = lm_eval.simple_evaluate(model=lm, tasks=list(task["spec"]), task_manager=tm, limit=limit,
                                      num_fewshot=num_fewshot, log_samples=True, verbosity="ERROR")
    return rows_of(out)


_SKIP_ENV = threading.local()
_ENV_PATCH_LOCK = threading.Lock()
#: what the results' ``pretty_env_info`` says when swapkl's evaluation left the report out
NO_ENV_REPORT = "not collected (swapkl records its own evaluation contract)"


@contextmanager
def _no_environment_report():
    """Within the block, this thread's ``simple_evaluate`` leaves out lm-eval's environment report.

    ``simple_evaluate`` ends every evaluation with ``add_env_info``, whose ``torch.utils.collect_env`` report runs
    ``python -m pip list`` and a few system commands in subprocesses for every evaluated model, for a text swapkl
    never reads (:func:`rows_of` keeps the metrics; the contract records the versions).  lm-eval's function is wrapped once
    (``lm_eval.evaluator.add_env_info``); the wrapper calls it as before in every other thread and outside the
    block, so other code that uses lm-eval in the same process gets the full report."""
    require_extra("tasks", WHAT)
    import lm_eval.evaluator as ev

    with _ENV_PATCH_LOCK:
        real = getattr(ev, "add_env_info", None)
        if real is not None and not getattr(real, "_swapkl_wrapped", False):
            def add_env_info(storage, *args, **kwargs):
                if getattr(_SKIP_ENV, "on", False):
                    storage.update({"pretty_env_info": NO_ENV_REPORT, "lm_eval_version": lm_eval_version()})
                    return None
                return real(storage, *args, **kwargs)

            add_env_info._swapkl_wrapped = True
            ev.add_env_info = add_env_info
    before = getattr(_SKIP_ENV, "on", False)
    _SKIP_ENV.on = True
    try:
        yield
    finally:
        _SKIP_ENV.on = before


def rows_of(out: dict) -> dict:
    """The metric and stderr tables of an lm-eval results dict (``simple_evaluate``'s return, or the JSON file the
    ``lm_eval`` CLI writes with ``--output_path``)."""
    metrics, stderr = {}, {}
    for t, row in (out.get("results") or {}).items():
        m, s = {}, {}
        for k, v in row.items():
            if k in NOT_METRICS or "_stderr," in k:
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                m[k] = float(v)
                name, _, filt = k.partition(",")
                e = row.get(f"{name}_stderr,{filt}")
                s[k] = float(e) if isinstance(e, (int, float)) and not isinstance(e, bool) else None
        metrics[t], stderr[t] = m, s
    return {"metrics": metrics, "stderr": stderr, "versions": dict(out.get("versions") or {}),
            "n-shot": dict(out.get("n-shot") or {}), "n-samples": dict(out.get("n-samples") or {}),
            "docs": doc_rows(out.get("samples") or {})}


def doc_rows(samples: dict) -> dict:
    """Per-document scores of lm-eval's logged samples (``simple_evaluate(..., log_samples=True)["samples"]``):
    ``{task: {"doc_id": [ids, ascending], "doc_sha": hash of the documents' hashes in that order,
    metric key ("acc,none"): [score per document]}}``, for every leaf task and every per-document metric whose
    scores are numbers (accuracy: 0 or 1).  Two evaluations of one task on one document list pair document by
    document when their ``doc_sha`` agree."""
    docs: dict = {}
    for task, rows in samples.items():
        rows = sorted(rows, key=lambda r: (r.get("doc_id", 0), str(r.get("filter", ""))))
        ids = sorted({int(r.get("doc_id", 0)) for r in rows})
        where = {d: k for k, d in enumerate(ids)}
        table: dict = {"doc_id": ids}
        hashes = [""] * len(ids)
        for r in rows:
            k = where[int(r.get("doc_id", 0))]
            hashes[k] = str(r.get("doc_hash", ""))
            for name in r.get("metrics") or ():
                v = r.get(name)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    table.setdefault(f"{name},{r.get('filter', 'none')}", [None] * len(ids))[k] = float(v)
        table["doc_sha"] = stable_hash(hashes)[:16]
        docs[str(task)] = table
    return docs
