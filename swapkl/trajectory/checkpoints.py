"""Which checkpoints a trajectory covers: a user's list (hub revisions, folders, a folder of step folders, a
manifest) parsed into :class:`CheckpointSpec` s in training order (:func:`parse_checkpoints`)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


from swapkl.errors import SwapklError

# Deferred imports: pandas, torch and the torch-based swapkl modules are imported inside the functions that use
# them: the CLI and the dashboard import this module without them.


MANIFEST = "trajectory.json"


class CheckpointListError(SwapklError):
    """A checkpoint list that cannot be parsed (no model for a revision, missing folder, empty list)."""


# ============================================================================================ parsing

@dataclass(frozen=True)
class CheckpointSpec:
    """One checkpoint of a trajectory: ``spec`` and ``revision`` are what
    :func:`swapkl.model.checkpoints.load_checkpoint` takes; ``step`` is the training step (None if unknown)."""

    spec: str
    revision: str | None = None
    step: int | None = None
    label: str = ""

    def display(self) -> str:
        return self.label or (f"{self.spec}@{self.revision}" if self.revision else self.spec)


_STEP_PATTERNS = (
    re.compile(r"(?:^|[^a-z0-9])(?:global[_-]?)?step[_-]?(\d+)$", re.I),
    re.compile(r"^(?:global[_-]?)?step[_-]?(\d+)$", re.I),
    re.compile(r"(?:^|[^a-z0-9])checkpoint[_-]?(\d+)$", re.I),
    re.compile(r"^checkpoint[_-]?(\d+)$", re.I),
    re.compile(r"^(\d+)$"),
)
_REVISION = re.compile(r"^((?:global[_-]?)?step[_-]?\d+|checkpoint[_-]?\d+|main|[0-9a-f]{7,40}|v\d+(?:\.\d+)*)$",
                       re.I)
_SUBFOLDER = re.compile(r"^(?:(?:global[_-]?)?step[_-]?\d+|checkpoint[_-]?\d+)$", re.I)


def step_from_name(name: str | None) -> int | None:
    """Training step from a revision or folder name: ``step1000``, ``global_step1000``, ``checkpoint-500``,
    ``run/step_20``, ``42`` -> the number; anything else (``main``, a commit hash) -> None."""
    if not name:
        return None
    base = str(name).rstrip("/\\").rsplit("/", 1)[-1]
    for pat in _STEP_PATTERNS:
        m = pat.search(base)
        if m:
            return int(m.group(1))
    return None


def _is_revision(token: str) -> bool:
    return bool(_REVISION.match(token)) and not Path(token).expanduser().exists()


def _looks_like_path(token: str) -> bool:
    return token.startswith(("/", "./", "../", "~", ".\\")) or token.count("/") > 1 or os.sep in token.replace("/", "")


def read_manifest(folder: str | os.PathLike) -> list[CheckpointSpec]:
    """The checkpoints listed in ``<folder>/trajectory.json`` (as written by :mod:`swapkl.trajectory.demo`):
    ``{"checkpoints": [{"step": int, "folder": "step0"}, ...]}``, folders relative to ``folder``."""
    folder = Path(folder)
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        items = data["checkpoints"]
        out = []
        for it in items:
            sub = (folder / it["folder"]).resolve()
            if not (sub / "config.json").is_file():
                raise CheckpointListError(f"{folder / MANIFEST} lists {it['folder']}, which is not a model folder")
            step = it.get("step")
            out.append(CheckpointSpec(str(sub), None, int(step) if step is not None else step_from_name(sub.name),
                                      sub.name))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointListError(f"cannot read {folder / MANIFEST}: {type(e).__name__}: {e}") from e
    return out


def checkpoints_in_folder(folder: str | os.PathLike) -> list[CheckpointSpec]:
    """A folder's checkpoints, sorted by step: its ``trajectory.json`` if present, else its ``step*`` /
    ``checkpoint-*`` / ``global_step*`` subfolders holding a ``config.json``, else the folder itself if it is a
    model folder (one checkpoint).  Raises :class:`CheckpointListError` when there is none."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise CheckpointListError(f"no such folder: {folder}")
    if (folder / MANIFEST).is_file():
        specs = read_manifest(folder)
    else:
        specs = [CheckpointSpec(str(sub.resolve()), None, step_from_name(sub.name), sub.name)
                 for sub in folder.iterdir()
                 if sub.is_dir() and _SUBFOLDER.match(sub.name) and (sub / "config.json").is_file()]
        if not specs and (folder / "config.json").is_file():
            specs = [CheckpointSpec(str(folder.resolve()), None, step_from_name(folder.name),
                                    folder.resolve().name)]
    if not specs:
        raise CheckpointListError(f"{folder} holds no checkpoints (no trajectory.json, no step*/checkpoint-* "
                                  f"subfolders with a config.json, and no config.json of its own)")
    return sorted(specs, key=lambda s: (s.step if s.step is not None else -1, s.label))


def _tokens(text: str | Sequence[str]) -> list[str]:
    items = [text] if isinstance(text, (str, os.PathLike)) else list(text)
    out: list[str] = []
    for item in items:
        s = str(item).strip()
        if not s:
            continue
        if Path(s).expanduser().exists():  # a path (may contain blanks or commas): one token
            out.append(s)
        else:
            out.extend(t for t in re.split(r"[,\s]+", s) if t)
    return out


def parse_checkpoints(text: str | Sequence[str]) -> list[CheckpointSpec]:
    """Parse a checkpoint list (a string, or the CLI's list of arguments) in training order.

    Tokens are separated by commas, blanks or newlines:

    * ``MODEL@REV`` -- a hub model at a revision, e.g. ``EleutherAI/pythia-410m@step1000``;
    * ``@REV`` -- the same model as the previous token, another revision:
      ``EleutherAI/pythia-410m@step0, @step1000, @step16000``;
    * ``MODEL REV REV ...`` -- a model followed by bare revisions (``stepN``, ``checkpoint-N``, ``main``, a
      commit hash, ``vX.Y``): ``EleutherAI/pythia-410m step0 step1000``;
    * a local folder with ``step*`` / ``checkpoint-*`` subfolders or a ``trajectory.json`` -- expanded to its
      checkpoints, sorted by step number (parsed from the folder name);
    * anything else (a model folder, a ``.gguf`` file, ``default``, a hub id) -- one checkpoint.

    Steps come from the revision / folder name (``step1000`` -> 1000), else None.  An explicit list keeps the
    order given; only a folder's own checkpoints are sorted.
    """
    specs: list[CheckpointSpec] = []
    current: str | None = None       # the model the next bare revision / @rev refers to
    pending: str | None = None       # a bare model not (yet) followed by a revision

    def flush():
        nonlocal pending
        if pending is not None:
            specs.append(CheckpointSpec(pending, None, None, pending))
            pending = None

    def add_rev(model: str, rev: str):
        nonlocal pending
        if not rev:
            raise CheckpointListError(f"empty revision after '{model}@'")
        specs.append(CheckpointSpec(model, rev, step_from_name(rev), f"{model}@{rev}"))
        pending = None

    for tok in _tokens(text):
        p = Path(tok).expanduser()
        if tok.startswith("@"):
            if current is None:
                raise CheckpointListError(f"'{tok}' has no model before it; write MODEL@REV first")
            add_rev(current, tok[1:])
        elif p.is_dir() and not (p / "config.json").is_file() or (p / MANIFEST).is_file() or (
                p.is_dir() and any(_SUBFOLDER.match(c.name) for c in p.iterdir() if c.is_dir())):
            flush()
            specs.extend(checkpoints_in_folder(p))
            current = None
        elif p.exists():
            flush()
            specs.append(CheckpointSpec(str(p.resolve()), None, step_from_name(p.resolve().name) if p.is_dir()
                                        else None, p.name))
            current = None
        elif "@" in tok:
            flush()
            model, _, rev = tok.partition("@")
            if _looks_like_path(model):
                raise CheckpointListError(f"no such folder: {model}")
            current = model
            add_rev(model, rev)
        elif current is not None and _is_revision(tok):
            add_rev(current, tok)
        else:
            flush()
            if _looks_like_path(tok) or tok.lower().endswith(".gguf"):
                raise CheckpointListError(f"no such file or folder: {tok}")
            current = pending = tok
    flush()
    if not specs:
        raise CheckpointListError("no checkpoints given")
    return specs
