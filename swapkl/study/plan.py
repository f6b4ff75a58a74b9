"""One study decided once: the models (:class:`StudyModel`) and the one contract every model is analysed under
(:class:`StudyPlan`: swap-KL contract, held-out evaluator and text, removal budget and methods, repair, bootstrap
sizes).  Built and checked at the edge (the command, the dashboard's form), carried through the run unchanged; its
:meth:`StudyPlan.key` names the contract (models excluded), so shares of one study can be merged and a finished
model's cached analysis found again."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from swapkl.contract import Contract, stable_hash
from swapkl.errors import SwapklError
from swapkl.removal import methods as M
from swapkl.removal.methods.random import MIN_SEEDS
from swapkl.schema.text import plain_text

#: the guided methods every study needs (the I/R ratio)
GUIDED = ("replacement", "interchange")
#: every evidence signal a study ranks against the removal cost (besides both protocols)
DEFAULT_SIGNALS = ("bi", "cka")
FORMAT = "swapkl.study/1"
#: held-out words of a study by default (docs/study.md, "How much held-out text"): ~30 matched windows on a
#: GPT-2-like tokenizer, so window-bootstrap CIs separate protocols whose ΔPPL differ 2x; at most 15,000 (the
#: shipped offline task reads WikiText-2 words 15,000 on)
DEFAULT_HELDOUT_WORDS = 6000


@dataclass(frozen=True)
class StudyModel:
    """One row of a study: ``spec`` (hub id, folder, ``.gguf``, ``default``), an optional hub ``revision`` and
    the ``label`` the table shows (default: the spec)."""

    spec: str
    revision: str | None = None
    label: str | None = None

    def __post_init__(self):
        if not str(self.spec or "").strip():
            raise SwapklError("a study model needs a spec (hub id, folder, .gguf or 'default')")
        object.__setattr__(self, "spec", str(self.spec).strip())
        # drawn in figures and reports: plain text (a label from a visitor's text or link carries no markup)
        object.__setattr__(self, "label", plain_text(self.label or self.name) or plain_text(self.name) or "model")

    @property
    def name(self) -> str:
        """``spec@revision`` (what the cache and the table key the model by)."""
        return f"{self.spec}@{self.revision}" if self.revision else self.spec

    def to_dict(self) -> dict:
        return {"spec": self.spec, "revision": self.revision, "label": self.label}

    @classmethod
    def from_any(cls, item) -> StudyModel:
        """From a spec string (``id@rev`` splits off the revision) or a mapping ``{spec|model, revision, label}``."""
        if isinstance(item, StudyModel):
            return item
        if isinstance(item, str):
            spec, _, rev = item.partition("@")
            return cls(spec, rev or None)
        if isinstance(item, dict):
            unknown = set(item) - {"spec", "model", "revision", "label"}
            if unknown:
                raise SwapklError(f"unknown key(s) {sorted(unknown)} in a study model entry (spec, revision, label)")
            return cls(item.get("spec") or item.get("model") or "", item.get("revision"), item.get("label"))
        raise SwapklError(f"a study model is a spec or a mapping, not {type(item).__name__}")


@dataclass(frozen=True)
class StudyPlan:
    """Every setting of a study but its models' list (which :meth:`with_models` sets).

    ``contract``: the swap-KL :class:`~swapkl.contract.Contract`; ``evaluator``: the held-out evaluator's dict
    (:meth:`~swapkl.measure.evaluate.Evaluator.to_dict`); ``eval_text``: the text file of held-out perplexity
    (None: the default corpus); ``budget``: n = 1..budget removed blocks; ``methods``: removal methods (both
    guided ones always); ``seeds``: random-baseline seeds; ``repair``: ``none`` or ``bridge`` (the evidence also
    after each block's bridge); ``n_boot``: bootstrap resamples of every CI; ``signals``: evidence signals
    besides both protocols; ``evidence``: whether the predictor-validity part runs at all; ``tasks``: None, or
    the lm-eval settings of the task-accuracy part (``{"tasks": [...], "include_path", "limit", "num_fewshot"}``,
    the flags of ``swapkl tasks``; :mod:`swapkl.study.tasks`)."""

    contract: Contract = field(default_factory=Contract)
    evaluator: dict = field(default_factory=lambda: {"name": f"matched@{DEFAULT_HELDOUT_WORDS}w",
                                                     "max_words": DEFAULT_HELDOUT_WORDS, "window": 512,
                                                     "stride": 256, "drop_first_target": False})
    eval_text: str | None = None
    budget: int = 3
    methods: tuple = field(default_factory=lambda: M.default_set("study"))  # both guided protocols, the baselines
    seeds: int = 5
    repair: str = "none"
    n_boot: int = 1000
    signals: tuple = DEFAULT_SIGNALS
    evidence: bool = True
    tasks: dict | None = None
    models: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "methods", tuple(dict.fromkeys([*GUIDED, *self.methods])))
        object.__setattr__(self, "models", tuple(StudyModel.from_any(m) for m in self.models))
        for m in self.methods:
            M.get(m)  # an unknown method: the registry's one line
        if self.budget < 1:
            raise SwapklError(f"--budget must be at least 1 (got {self.budget})")
        if self.repair not in ("none", "bridge"):
            raise SwapklError(f"--repair must be none or bridge (got {self.repair!r})")
        if self.n_boot < 10:
            raise SwapklError(f"--n-boot must be at least 10 (got {self.n_boot})")
        if "random" in self.methods and self.seeds < MIN_SEEDS:
            raise SwapklError(f"--seeds must be at least {MIN_SEEDS} with the random baseline (got {self.seeds})")
        if getattr(self.contract, "unit", "block") != "block":
            raise SwapklError("a study removes whole blocks: use --unit block")
        if self.tasks is not None:
            _check_tasks(self.tasks)
        labels = [m.label for m in self.models]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise SwapklError(f"two study models share the label {dup[0]!r}: give each its own label")

    def with_models(self, models) -> StudyPlan:
        return dataclasses.replace(self, models=tuple(models))

    def contract_dict(self) -> dict:
        """The contract every model shares (the models excluded), JSON-able: what a merge compares."""
        return {"scoring": self.contract.to_dict(), "evaluator": dict(self.evaluator),
                "eval_text": Path(self.eval_text).name if self.eval_text else None,
                "eval_text_sha256": _sha(self.eval_text), "budget": self.budget, "methods": list(self.methods),
                "seeds": self.seeds, "repair": self.repair, "n_boot": self.n_boot, "signals": list(self.signals),
                "evidence": self.evidence, "tasks": _tasks_key(self.tasks)}

    def key(self) -> str:
        """A short hash of :meth:`contract_dict` (the cache folder of this study's per-model analyses)."""
        return stable_hash(self.contract_dict())[:16]

    def to_dict(self) -> dict:
        return self.contract_dict() | {"models": [m.to_dict() for m in self.models]}


def _check_tasks(t: dict) -> None:
    if not t.get("tasks"):
        raise SwapklError("--tasks names no task")
    for flag, key, lo in (("--limit", "limit", 1), ("--num-fewshot", "num_fewshot", 0)):
        if t.get(key) is not None and t[key] < lo:
            raise SwapklError(f"{flag} must be at least {lo} (got {t[key]})")


def _tasks_key(t: dict | None) -> dict | None:
    """The task settings as the contract (and so the row cache) records them: the include folder by its task
    YAMLs' content, not its path."""
    if t is None:
        return None
    out = {k: t.get(k) for k in ("tasks", "limit", "num_fewshot")} | {"tasks": list(t["tasks"])}
    ip = t.get("include_path")
    if ip:
        from swapkl.contract import stable_hash as h

        files = sorted(Path(ip).rglob("*.y*ml"))
        out["include_path"] = Path(ip).name
        out["include_sha"] = h([(str(f.relative_to(ip)), _sha(f)) for f in files])[:16]
    return out


def _sha(path) -> str | None:
    if not path:
        return None
    from swapkl.store import file_sha256

    return file_sha256(path)


def read_model_list(path: str) -> list[StudyModel]:
    """The models of a list file: YAML (``.yaml``/``.yml``) or TOML (``.toml``) holding a list, or a mapping
    with a ``models`` list, of specs or ``{spec, revision, label}`` mappings; any other file: one spec per line
    (``#`` starts a comment).  A bad file is refused in one line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SwapklError(f"cannot read the model list {path}: {type(e).__name__}") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif p.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10: the standard library reads TOML from 3.11 on
                raise SwapklError(f"reading the TOML model list {path} needs Python 3.11 or later; "
                                  "give the list as YAML or text") from None
            data = tomllib.loads(text)
        else:
            data = [ln.split("#")[0].strip() for ln in text.splitlines() if ln.split("#")[0].strip()]
    except SwapklError:
        raise
    except Exception as e:  # a YAML or TOML syntax error: one line
        raise SwapklError(f"the model list {path} is not valid {p.suffix[1:].upper()}: {str(e).splitlines()[0]}") \
            from None
    if isinstance(data, dict):
        data = data.get("models")
    if not isinstance(data, list) or not data:
        raise SwapklError(f"the model list {path} holds no list of models (a list, or a 'models' list)")
    return [StudyModel.from_any(x) for x in data]


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``"K/N"`` (1 <= K <= N) -> (K, N); None passes through."""
    if spec is None:
        return None
    k, _, n = str(spec).partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        raise SwapklError(f"--shard must be K/N, e.g. 2/4 (got {spec!r})") from None
    if not 1 <= k <= n:
        raise SwapklError(f"--shard K/N needs 1 <= K <= N (got {spec!r})")
    return k, n


def shard(models, k: int, n: int) -> list:
    """Share K of N: every N-th model starting at the K-th (1-based), so shares balance depths in a sorted list."""
    return list(models)[k - 1::n]
