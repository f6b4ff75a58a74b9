"""What a dashboard visitor may ask for: everything (the local default, a server on 127.0.0.1) or **demo mode**
(a server shown to colleagues, where everything that arrives from a browser is hostile until validated).

Demo mode is on with ``SWAPKL_DEMO=1`` (``./run.sh --demo`` sets it) or ``enabled = true`` under ``[demo]`` in
``.streamlit/swapkl.toml``; the same file (or environment variables) sets its limits::

    [demo]
    enabled = true
    models = ["default", "EleutherAI/pythia-160m", "../shared/models/stories260K"]   # the allow-list
    max_jobs_per_session = 2          # computations queued or running per browser session
    max_queued = 8                    # computations queued or running on the whole server
    max_prompt_tokens = 4096          # prompts x tokens of one contract
    pair_sets = ["adjacent", "gap:2", "gap:3"]
    max_budget = 6                    # layers removed at most (removal curves, evidence stability)
    max_evidence_boot = 200           # bootstrap resamples of one evidence request
    upload_mb = 16                    # size of an opened result file
    tasks = ["tinystories_mc", "wikitext_lastword"]  # lm-eval task names a visitor may run (task accuracy after removal)
    task_include_path = "tests/fixtures/tasks"  # the operator's folder of task YAMLs (never a visitor's)
    max_task_limit = 100              # documents per task at most (a limit is required)
    max_heal_steps = 50               # healing: LoRA updates per heal
    max_heal_tokens = 51200           # healing: training tokens per heal (steps x batch x seq_len)

Environment variables override the file: ``SWAPKL_DEMO_MODELS`` (comma-separated), ``SWAPKL_DEMO_MAX_JOBS``,
``SWAPKL_DEMO_MAX_QUEUED``, ``SWAPKL_DEMO_MAX_PROMPT_TOKENS``, ``SWAPKL_DEMO_MAX_BUDGET``, ``SWAPKL_DEMO_UPLOAD_MB``,
``SWAPKL_DEMO_TASKS`` (comma-separated), ``SWAPKL_DEMO_MAX_TASK_LIMIT``, ``SWAPKL_DEMO_MAX_HEAL_STEPS``,
``SWAPKL_DEMO_MAX_HEAL_TOKENS``.

An lm-eval task YAML can run Python (``!function``, ``process_docs``), and lm-eval takes a YAML *path* where a task
name goes: in demo mode a task is one of the allow-listed names (compared as strings), its include path is the
operator's ``task_include_path`` and never a visitor's, and a limit of at most ``max_task_limit`` documents is
required.

In demo mode a checkpoint is one of the allow-list's entries, matched as a string (a visitor's text never
reaches the filesystem: nothing reveals whether a path exists); ``org/name`` allows every revision of that hub
model, ``org/name@rev`` only that one.  Exports are written only below ``<cache>/exports/`` under a name the
server derives, by an export job of the queue under the folder's quota (:mod:`swapkl.jobs.export_job`), and
offered as a download.  No Streamlit here; the pages ask this module.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from swapkl.errors import PolicyError
from swapkl.store import PROJECT_ROOT, cache_root

from .allow import DEFAULT_ALIASES, AllowEntry, parse_entry
from .bounds import DEMO_MAX_BRIDGE_TOKENS, DEMO_MAX_LAST_K, check_heal, check_repair, check_study

__all__ = ["DEMO_MAX_BRIDGE_TOKENS", "DEMO_MAX_LAST_K", "INT_SETTINGS", "LOCAL_MAX_OPENED", "Policy", "PolicyError"]

CONFIG_FILE = PROJECT_ROOT / ".streamlit" / "swapkl.toml"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


#: the integer settings: ``[demo]`` key -> environment variable
INT_SETTINGS = {
    "max_jobs_per_session": "SWAPKL_DEMO_MAX_JOBS", "max_queued": "SWAPKL_DEMO_MAX_QUEUED",
    "max_prompt_tokens": "SWAPKL_DEMO_MAX_PROMPT_TOKENS", "max_budget": "SWAPKL_DEMO_MAX_BUDGET",
    "max_evidence_boot": "SWAPKL_DEMO_MAX_EVIDENCE_BOOT", "upload_mb": "SWAPKL_DEMO_UPLOAD_MB",
    "max_task_limit": "SWAPKL_DEMO_MAX_TASK_LIMIT", "max_heal_steps": "SWAPKL_DEMO_MAX_HEAL_STEPS",
    "max_heal_tokens": "SWAPKL_DEMO_MAX_HEAL_TOKENS", "max_jobs_per_client": "SWAPKL_DEMO_MAX_JOBS_PER_CLIENT",
    "max_study_models": "SWAPKL_DEMO_MAX_STUDY_MODELS",
    "max_trajectory_checkpoints": "SWAPKL_DEMO_MAX_TRAJECTORY_CHECKPOINTS",
    "max_heldout_words": "SWAPKL_DEMO_MAX_HELDOUT_WORDS", "max_job_s": "SWAPKL_DEMO_MAX_JOB_S",
    "max_opened_per_session": "SWAPKL_DEMO_MAX_OPENED", "export_quota_mb": "SWAPKL_DEMO_EXPORT_QUOTA_MB",
    "export_max_age_h": "SWAPKL_DEMO_EXPORT_MAX_AGE_H",
}
#: opened files kept per session on a local server (it refuses nothing; this only bounds memory)
LOCAL_MAX_OPENED = 32


@dataclass(frozen=True)
class Policy:
    """The server's limits.  ``demo=False``: no limits beyond the library's own validation (a local server).

    ``models``: the demo allow-list (specs as :func:`swapkl.model.checkpoints.load_checkpoint` takes them);
    ``max_jobs_per_session``: computations queued or running per browser session; ``max_queued``: computations
    queued or running on the whole server (the one worker runs them one at a time); ``max_prompt_tokens``:
    P x T of one contract (tokens); ``pair_sets``: pair sets offered; ``max_budget``: layers removed at most;
    ``upload_mb``: largest opened result file (MB)."""

    demo: bool = False
    models: tuple = ("default",)
    max_jobs_per_session: int = 2
    max_queued: int = 8
    max_prompt_tokens: int = 4096
    pair_sets: tuple = ("adjacent", "gap:2", "gap:3")
    max_budget: int = 6
    upload_mb: int = 16
    max_evidence_boot: int = 200  # prompt resamples of one evidence request (its agreement CIs use 5x)
    tasks: tuple = ("tinystories_mc", "wikitext_lastword")
    task_include_path: str | None = "tests/fixtures/tasks"
    max_task_limit: int = 100
    max_fewshot: int = 5
    max_heal_steps: int = 50  # LoRA updates of one healing recipe
    max_heal_tokens: int = 51_200  # training tokens of one recipe (steps x batch x seq_len), each set and the control
    max_heal_rank: int = 16
    max_heal_sets: int = 8  # heals of one request (methods x n)
    max_jobs_per_client: int = 4  # computations queued or running per client address (all its sessions)
    max_study_models: int = 3  # models of one study
    max_trajectory_checkpoints: int = 8  # checkpoints of one trajectory
    max_heldout_words: int = 20_000  # held-out words of one study's evaluator
    max_job_s: int = 1800  # wall seconds of one job; past it the job ends with its reason, finished parts kept
    max_opened_per_session: int = 4  # opened files / bundles kept per session, least recently used dropped first
    export_quota_mb: int = 2048  # size of <cache>/exports; the oldest exports are removed past it
    export_max_age_h: int = 24  # an export older than this is removed before the next one is written
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, environ: dict | None = None, config_file: str | os.PathLike | None = None) -> Policy:
        """The policy of this server: ``[demo]`` of ``.streamlit/swapkl.toml`` (when present), then the
        environment.  A malformed file or value is a :class:`PolicyError` (the server refuses to start in a
        state its operator did not ask for)."""
        return cls(**settings_from(environ, config_file, cls.models))

    # ------------------------------------------------------------------ checks
    @property
    def entries(self) -> tuple:
        """The allow-list as :class:`~swapkl.jobs.allow.AllowEntry` objects, in the operator's order."""
        return tuple(parse_entry(m) for m in self.models)

    def entry(self, label: str) -> AllowEntry | None:
        """The allow-list entry whose label is ``label`` (the select box's value), or None."""
        return next((e for e in self.entries if e.label == label), None)

    def allowed_entry(self, spec: str, revision: str | None = None) -> AllowEntry | None:
        """The entry that allows ``spec`` at ``revision`` (strings only), or None."""
        return next((e for e in self.entries if e.allows(spec, revision)), None)

    def check_model(self, spec: str, revision: str | None = None) -> None:
        """Raise :class:`PolicyError` unless ``spec`` (with ``revision``) is allowed.  Demo mode compares
        strings with the allow-list only (:mod:`swapkl.jobs.allow`); nothing of the visitor's text touches the
        filesystem, and the refusal names neither the visitor's text nor a server path."""
        if not self.demo or self.allowed_entry(spec, revision) is not None:
            return
        s = str(spec or "").strip()
        if s.lower() in DEFAULT_ALIASES and revision:
            raise PolicyError("the built-in default model has no revisions")
        hub = s.partition("@")[0]
        if any(e.kind == "hub" and e.spec == hub for e in self.entries):
            raise PolicyError(f"this demo server does not offer that revision of {hub} "
                              f"(it offers: {', '.join(e.label for e in self.entries if e.spec == hub)})")
        raise PolicyError(f"this demo server offers only these checkpoints: "
                          f"{', '.join(e.display for e in self.entries)}")

    def check_contract(self, contract) -> None:
        """Bound one visitor's contract: prompts x tokens and the pair set."""
        if not self.demo:
            return
        pt = int(contract.prompts) * int(contract.tokens)
        if pt > self.max_prompt_tokens:
            raise PolicyError(f"this demo server allows at most {self.max_prompt_tokens} prompt tokens "
                              f"(prompts x tokens); {contract.prompts} x {contract.tokens} = {pt}")
        if contract.pairs not in self.pair_sets:
            raise PolicyError(f"this demo server offers the pair sets {', '.join(self.pair_sets)}; "
                              f"got {contract.pairs}")
        if getattr(contract, "corpus", None):
            raise PolicyError("this demo server uses its own corpus; a corpus path cannot be chosen")

    def check_request(self, request) -> None:
        """A whole dashboard request (analysis or trajectory) against the policy."""
        if not self.demo:
            return
        if request.kind == "export":  # a demo export (swapkl.jobs.export_job): of an offered model only
            self.check_model(request.model, request.revision)
            return
        self.check_contract(request.contract)
        if request.kind == "analysis":
            self.check_model(request.model, request.revision)
            if request.budget > self.max_budget:
                raise PolicyError(f"this demo server removes at most {self.max_budget} layers; budget "
                                  f"{request.budget} asked")
            check_repair(request)
        elif request.kind in ("evidence", "tasks"):
            self.check_model(request.model, request.revision)
            if request.budget > self.max_budget:
                raise PolicyError(f"this demo server removes at most {self.max_budget} layers; budget "
                                  f"{request.budget} asked")
            if request.kind == "tasks":
                self.check_tasks(request)
            elif request.n_boot > self.max_evidence_boot:
                raise PolicyError(f"this demo server allows at most {self.max_evidence_boot} bootstrap resamples; "
                                  f"{request.n_boot} asked")
            else:
                check_repair(request)  # the evidence's bridge streams its calibration tokens the same way
                if request.tasks:  # the task ground truth: the same task bounds as task accuracy after removal
                    self.check_tasks(request)
        elif request.kind == "heal":
            self.check_model(request.model, request.revision)
            check_heal(self, request)
        elif request.kind == "compare":
            self.check_model(request.model_a, request.revision_a)
            self.check_model(request.model_b, request.revision_b)
            if request.budget > self.max_budget:
                raise PolicyError(f"this demo server removes at most {self.max_budget} layers; budget "
                                  f"{request.budget} asked")
        elif request.kind == "study":
            check_study(self, request)
        elif getattr(request, "train_demo", False):
            own = cache_root() / "demo-trajectory"  # the server's folder, as a path or relative to the project
            if str(request.checkpoints) not in (str(own), os.path.relpath(own, PROJECT_ROOT)):
                raise PolicyError("the demo trajectory is trained into this server's own folder only")
        else:
            self.check_checkpoint_list(request.checkpoints)

    def check_tasks(self, request) -> None:
        """A task-accuracy request in demo mode: allow-listed task names only (strings; lm-eval would also take a
        YAML path there, and a task YAML can run code), the operator's include path only, a limit required and
        bounded, a bounded few-shot count."""
        if not self.demo:
            return
        if not request.tasks:
            raise PolicyError("no task chosen")
        for t in request.tasks:
            if t not in self.tasks:
                raise PolicyError(f"this demo server runs only these tasks: {', '.join(self.tasks)}")
        if request.include_path is not None and request.include_path != self.task_include_path:
            raise PolicyError("this demo server never takes a task folder (include path) from a browser")
        if request.limit is None or not 1 <= int(request.limit) <= self.max_task_limit:
            raise PolicyError(f"this demo server evaluates at most {self.max_task_limit} documents per task; "
                              f"choose a limit from 1 to {self.max_task_limit}")
        if request.num_fewshot is not None and not 0 <= int(request.num_fewshot) <= self.max_fewshot:
            raise PolicyError(f"this demo server allows 0 to {self.max_fewshot} few-shot examples")

    def check_checkpoint_list(self, text: str) -> None:
        """A trajectory's checkpoint list in demo mode: tokens (split on commas and blanks, never looked up on
        disk) that are allow-listed checkpoints, or ``@REV`` revisions of the allow-listed hub model before
        them."""
        if not self.demo:
            return
        toks = [t for t in re.split(r"[,\s]+", str(text or "")) if t]
        if not toks:
            raise PolicyError("no checkpoints given")
        if len(toks) > self.max_trajectory_checkpoints:
            raise PolicyError(f"this demo server follows at most {self.max_trajectory_checkpoints} checkpoints per "
                              f"trajectory; {len(toks)} given")
        current = None
        for t in toks:
            if t.startswith("@"):
                if current is None:
                    raise PolicyError(f"'{t}' has no model before it")
                self.check_model(current, t[1:])
            else:
                self.check_model(t)
                current = t.partition("@")[0] if "/" in t else None

    @property
    def max_opened(self) -> int:
        """Opened files kept per session (demo: ``max_opened_per_session``; local: :data:`LOCAL_MAX_OPENED`)."""
        return max(1, self.max_opened_per_session) if self.demo else LOCAL_MAX_OPENED

    @property
    def job_seconds(self) -> float | None:
        """A job's wall-time limit in seconds (demo mode; None: no limit)."""
        return float(self.max_job_s) if self.demo and self.max_job_s > 0 else None

    def check_upload(self, size_bytes: int) -> None:
        if self.demo and size_bytes > self.upload_mb * 1024 * 1024:
            raise PolicyError(f"this demo server opens result files up to {self.upload_mb} MB; the file has "
                              f"{size_bytes / 1e6:.1f} MB")

    def export_dir(self, name: str, cache: str | os.PathLike) -> Path:
        """The folder an export called ``name`` goes to: ``<cache>/exports/<safe name>``.  The name is
        reduced to ``[A-Za-z0-9._-]`` (no separators, no leading dots), so it cannot leave that folder."""
        safe = _SAFE_NAME.sub("-", str(name)).strip(".-")[:80] or "export"
        root = (Path(cache) / "exports").resolve()
        out = (root / safe).resolve()
        if out.parent != root:  # pragma: no cover - the name has no separators left
            raise PolicyError(f"export name {name!r} is not allowed")
        return out


def _flag(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _models(models) -> tuple:
    """The allow-list's labels (a TOML table entry as its string form), each parsed once to refuse a malformed
    entry at start-up."""
    if isinstance(models, (str, dict)):
        models = [models]
    try:
        out = tuple(dict.fromkeys(parse_entry(m).label for m in (models or [])
                                  if isinstance(m, dict) or str(m).strip()))
    except ValueError as e:
        raise PolicyError(f"the demo allow-list: {e}") from None
    if not out:
        raise PolicyError("the demo allow-list of models is empty")
    return out


def settings_from(environ: dict | None, config_file: str | os.PathLike | None, models: tuple) -> dict:
    """The keyword arguments of :meth:`Policy.from_env`: ``[demo]`` of ``config_file`` (default
    ``.streamlit/swapkl.toml``, when present), then the environment ``environ`` (default ``os.environ``);
    ``models``: the allow-list when neither names one."""
    env = os.environ if environ is None else environ
    path = Path(config_file) if config_file is not None else CONFIG_FILE
    conf: dict = {}
    if path.is_file():
        try:
            conf = dict(tomllib.loads(path.read_text(encoding="utf-8")).get("demo") or {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise PolicyError(f"cannot read {path}: {e}") from e
    demo = _flag(env.get("SWAPKL_DEMO")) if env.get("SWAPKL_DEMO") is not None else bool(conf.get("enabled", False))
    models = conf.get("models", models)
    if env.get("SWAPKL_DEMO_MODELS"):
        models = [m for m in env["SWAPKL_DEMO_MODELS"].split(",")]
    kw = {"demo": demo, "models": _models(models)}
    for key, var in INT_SETTINGS.items():
        raw = env.get(var, conf.get(key))
        if raw is not None:
            try:
                kw[key] = int(raw)
            except (TypeError, ValueError):
                raise PolicyError(f"{var} / [demo] {key} must be an integer, got {raw!r}") from None
            if kw[key] < 0:
                raise PolicyError(f"{var} / [demo] {key} must be >= 0, got {kw[key]}")
    if "pair_sets" in conf:
        kw["pair_sets"] = tuple(str(p) for p in conf["pair_sets"])
    tasks = env["SWAPKL_DEMO_TASKS"].split(",") if env.get("SWAPKL_DEMO_TASKS") else conf.get("tasks")
    if tasks is not None:
        kw["tasks"] = tuple(t.strip() for t in ([tasks] if isinstance(tasks, str) else tasks) if str(t).strip())
    if "task_include_path" in conf:
        kw["task_include_path"] = str(conf["task_include_path"]) or None
    return kw
