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
    tasks = ["tinystories_mc"]        # lm-eval task names a visitor may run (task accuracy after removal)
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
server derives, and offered as a download.  No Streamlit here; the pages ask this module.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from swapkl.errors import SwapklError
from swapkl.store import PROJECT_ROOT

CONFIG_FILE = PROJECT_ROOT / ".streamlit" / "swapkl.toml"
DEFAULT_ALIASES = ("default", "builtin")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
#: demo mode: calibration tokens of a bridge after removal, and the blocks a last-k heal trains in full, at most
DEMO_MAX_BRIDGE_TOKENS = 16_384
DEMO_MAX_LAST_K = 4


class PolicyError(SwapklError):
    """A request that the server's policy (demo mode) does not allow."""


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
    tasks: tuple = ("tinystories_mc",)
    task_include_path: str | None = "tests/fixtures/tasks"
    max_task_limit: int = 100
    max_fewshot: int = 5
    max_heal_steps: int = 50  # LoRA updates of one healing recipe
    max_heal_tokens: int = 51_200  # training tokens of one recipe (steps x batch x seq_len), each set and the control
    max_heal_rank: int = 16
    max_heal_sets: int = 8  # heals of one request (methods x n)
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, environ: dict | None = None, config_file: str | os.PathLike | None = None) -> Policy:
        """The policy of this server: ``[demo]`` of ``.streamlit/swapkl.toml`` (when present), then the
        environment.  A malformed file or value is a :class:`PolicyError` (the server refuses to start in a
        state its operator did not ask for)."""
        env = os.environ if environ is None else environ
        path = Path(config_file) if config_file is not None else CONFIG_FILE
        conf: dict = {}
        if path.is_file():
            try:
                conf = dict(tomllib.loads(path.read_text(encoding="utf-8")).get("demo") or {})
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                raise PolicyError(f"cannot read {path}: {e}") from e
        demo = _flag(env.get("SWAPKL_DEMO")) if env.get("SWAPKL_DEMO") is not None else bool(conf.get("enabled", False))
        models = conf.get("models", cls.models)
        if env.get("SWAPKL_DEMO_MODELS"):
            models = [m for m in env["SWAPKL_DEMO_MODELS"].split(",")]
        kw = {"demo": demo, "models": _models(models)}
        for key, var in (("max_jobs_per_session", "SWAPKL_DEMO_MAX_JOBS"), ("max_queued", "SWAPKL_DEMO_MAX_QUEUED"),
                         ("max_prompt_tokens", "SWAPKL_DEMO_MAX_PROMPT_TOKENS"),
                         ("max_budget", "SWAPKL_DEMO_MAX_BUDGET"),
                         ("max_evidence_boot", "SWAPKL_DEMO_MAX_EVIDENCE_BOOT"), ("upload_mb", "SWAPKL_DEMO_UPLOAD_MB"),
                         ("max_task_limit", "SWAPKL_DEMO_MAX_TASK_LIMIT"), ("max_heal_steps", "SWAPKL_DEMO_MAX_HEAL_STEPS"),
                         ("max_heal_tokens", "SWAPKL_DEMO_MAX_HEAL_TOKENS")):
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
        return cls(**kw)

    # ------------------------------------------------------------------ checks
    def check_model(self, spec: str, revision: str | None = None) -> None:
        """Raise :class:`PolicyError` unless ``spec`` (with ``revision``) is allowed.  Demo mode compares
        strings with the allow-list only; nothing of the visitor's text touches the filesystem."""
        if not self.demo:
            return
        s = str(spec or "").strip()
        rev = (str(revision).strip() or None) if revision else None
        if s.lower() in DEFAULT_ALIASES and any(m.lower() in DEFAULT_ALIASES for m in self.models):
            if rev:
                raise PolicyError("the built-in default model has no revisions")
            return
        hub, _, at = s.partition("@")
        rev = rev or (at or None)
        for m in self.models:
            m_id, _, m_rev = m.partition("@")
            if s == m and not revision:
                return
            if m_id == hub and ((not m_rev) or (m_rev == rev)) and hub.count("/") == 1 and not hub.startswith((".", "/", "~")):
                return
        raise PolicyError(f"this demo server offers only these checkpoints: {', '.join(self.models)}")

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
        elif not getattr(request, "train_demo", False):
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
        current = None
        for t in toks:
            if t.startswith("@"):
                if current is None:
                    raise PolicyError(f"'{t}' has no model before it")
                self.check_model(current, t[1:])
            else:
                self.check_model(t)
                current = t.partition("@")[0] if "/" in t else None

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


def check_heal(self: Policy, request) -> None:
    """A healing request (:class:`~swapkl.jobs.requests.HealRequest`) against policy ``self`` in demo mode
    (training runs on the server's CPU): offered deterministic methods only, n up to ``max_budget``, at most
    ``max_heal_sets`` heals, a recipe of at most ``max_heal_steps`` updates, ``max_heal_tokens`` training tokens and
    rank ``max_heal_rank``, no QLoRA, the server's evaluator.  A bound passed: :class:`PolicyError` naming it."""
    if not self.demo:
        return
    from swapkl.healing.multi import MERGING  # torch-free
    from swapkl.removal import methods as M  # the registry: torch-free

    for m in request.methods:
        spec = M.find(m)
        if spec is None or not spec.offered or spec.seeded or m in M.GROUPS or m in MERGING:
            raise PolicyError(f"this demo server heals only the sets of its offered deterministic methods; "
                              f"not '{m}'")
    if not request.methods or not request.ns:
        raise PolicyError("choose at least one method and one n to heal")
    if max(request.ns) > self.max_budget:
        raise PolicyError(f"this demo server removes at most {self.max_budget} layers; n = {max(request.ns)} "
                          "asked")
    sets = len(request.methods) * len(request.ns)
    if sets > self.max_heal_sets:
        raise PolicyError(f"this demo server heals at most {self.max_heal_sets} sets per request (methods x n); "
                          f"{sets} asked")
    r = request.recipe
    tokens = int(r["steps"]) * int(r["batch"]) * int(r["seq_len"])
    if int(r["steps"]) > self.max_heal_steps:
        raise PolicyError(f"this demo server trains at most {self.max_heal_steps} steps per heal; "
                          f"{r['steps']} asked")
    if tokens > self.max_heal_tokens:
        raise PolicyError(f"this demo server trains on at most {self.max_heal_tokens} tokens per heal (steps x "
                          f"batch x sequence length); {r['steps']} x {r['batch']} x {r['seq_len']} = {tokens}")
    if int(r["rank"]) > self.max_heal_rank:
        raise PolicyError(f"this demo server allows LoRA rank at most {self.max_heal_rank}; {r['rank']} asked")
    if r.get("qlora"):
        raise PolicyError("this demo server has no QLoRA (it needs CUDA and bitsandbytes)")
    check_repair(request)  # a heal from the bridged model fits the same bridge
    if r.get("part") == "last-k" and int(r.get("last_k") or 0) > DEMO_MAX_LAST_K:
        raise PolicyError(f"this demo server trains at most the last {DEMO_MAX_LAST_K} blocks in full; "
                          f"k = {r['last_k']} asked")
    if request.evaluator is not None:
        raise PolicyError("this demo server evaluates healing with its own evaluator (matched)")
    if getattr(request, "tasks", ()) or getattr(request, "include_path", None) is not None:
        self.check_tasks(request)  # task accuracy after healing: the task panel's bounds


def check_repair(request) -> None:
    """An analysis's (a heal's, an evidence's) repair after removal in demo mode: at most
    :data:`DEMO_MAX_BRIDGE_TOKENS` calibration tokens (the fit streams them through the model; every setting is checked again by the plan)."""
    tokens = (getattr(request, "bridge", None) or {}).get("calib_tokens")
    if getattr(request, "repair", "none") != "none" and tokens is not None and int(tokens) > DEMO_MAX_BRIDGE_TOKENS:
        raise PolicyError(f"this demo server fits a bridge on at most {DEMO_MAX_BRIDGE_TOKENS} calibration tokens; "
                          f"{tokens} asked")


def _flag(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _models(models) -> tuple:
    if isinstance(models, str):
        models = [models]
    out = tuple(dict.fromkeys(str(m).strip() for m in (models or []) if str(m).strip()))
    if not out:
        raise PolicyError("the demo allow-list of models is empty")
    return out


def check_study(pol: Policy, request) -> None:
    """A study in demo mode: allow-listed models only, the server's held-out text, the budget and bootstrap bounds
    of an evidence request (5 x its stability bound: the study's CIs are the agreement's)."""
    if request.plan.eval_text:
        raise PolicyError("this demo server uses its own held-out text; a file cannot be chosen")
    for m in request.plan.models:
        pol.check_model(m.spec, m.revision)
    if request.budget > pol.max_budget or request.plan.n_boot > 5 * pol.max_evidence_boot:
        raise PolicyError(f"this demo server removes at most {pol.max_budget} layers with at most "
                          f"{5 * pol.max_evidence_boot} bootstrap resamples")
