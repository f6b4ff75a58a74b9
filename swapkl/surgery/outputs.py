"""Output paths, checked before any computation: nothing an earlier run or the user made is destroyed.

Every command checks all of its output paths up front (:func:`swapkl.commands.common.check_outputs`), so a bad
path fails in one line before minutes of work, not after:

* a file output (``--json``, ``--out report.html``) must not be a folder or another non-regular file
  (``/dev/null``), must not be one of the run's inputs (a scores file, the corpus, a file of the model folder),
  and must sit below a writable folder (created if missing) with no regular file in the way.  An existing
  regular file of that name is replaced atomically (readers see the old or the whole new one);
* a folder output (``prune --out``) must not be the source model folder or inside it (symlinks resolved), and an
  existing non-empty folder is refused unless ``force``; :func:`write_model_folder` then fills a temporary folder
  beside it and moves the files in, after deleting the old weight files, so no stale weights stay behind.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from swapkl.errors import OutputPathError
from swapkl.store import atomic_write_text, temp_folder

# what transformers loads as weights from a folder: replaced as a whole, never left beside new ones
STALE_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")

#: the record every pruned folder carries (:mod:`swapkl.surgery.prune`, :mod:`swapkl.surgery.sublayer_export`)
PRUNE_FILE = "swapkl_prune.json"


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_parent(path: Path, flag: str) -> None:
    """The nearest existing ancestor of ``path`` is a writable folder (missing folders below it are created)."""
    anc = _nearest_existing(path.parent)
    if not anc.is_dir():
        raise OutputPathError(f"cannot write {flag} {path}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {flag} {path}: the folder {anc} is not writable")


def _inside(p: Path, folder: Path) -> bool:
    return p == folder or folder in p.parents


def check_output_file(path: str | os.PathLike, flag: str = "--out", inputs: Iterable = ()) -> Path:
    """Check that ``path`` can receive a file (see the module docstring) and return it, expanded.

    ``inputs``: files and folders the run reads (paths that do not exist are ignored); the output may not be
    one of the files, nor replace an existing file inside one of the folders.  Raises :class:`OutputPathError`."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise OutputPathError(f"{flag} {p} is a folder; give a file name")
    if p.exists() and not p.is_file():
        raise OutputPathError(f"{flag} {p} exists and is not a regular file")
    _check_parent(p, flag)
    real = p.resolve()
    for inp in inputs or ():
        if not inp or not Path(inp).expanduser().exists():
            continue
        q = Path(inp).expanduser().resolve()
        if real == q or (q.is_dir() and p.exists() and _inside(real, q)):
            what = f"the input {q}" if real == q else f"{real.name} of the input folder {q}"
            raise OutputPathError(f"{flag} {p} would overwrite {what}; choose another file")
    return p


def check_output_dir(path: str | os.PathLike, flag: str = "--out", force: bool = False, protected: Iterable = (),
                     force_hint: str = "--force") -> Path:
    """Check that ``path`` can become a model folder and return it, expanded.

    ``protected``: source model folders or files (symlinks resolved); ``path`` may not be one of them or lie
    inside one.  An existing non-empty folder is refused unless ``force``.  Raises :class:`OutputPathError`."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{flag} {p} exists and is not a folder")
    real = p.resolve()
    for src in protected or ():
        if not src or not Path(src).expanduser().exists():
            continue
        q = Path(src).expanduser().resolve()
        if q.is_dir() and _inside(real, q):
            where = (f"is the source model folder{'' if str(p) == str(q) else f' {q}'}" if real == q
                     else f"is inside the source model folder {q}")
            raise OutputPathError(f"{flag} {p} {where}; writing there would overwrite the model: choose another "
                                  "folder")
    if p.is_dir():
        n = sum(1 for _ in p.iterdir())
        if n and not force:
            raise OutputPathError(f"{flag} {p} is not empty ({n} {'entry' if n == 1 else 'entries'}); choose a new "
                                  "or empty folder, or "
                                  f"{force_hint} to replace the model files in it")
    _check_parent(p, flag)
    return p


def check_file_out(out: str | os.PathLike, suffixes: tuple, what: str, force: bool = False, inputs: Iterable = (),
                   flag: str = "--out", force_hint: str = "--force") -> Path:
    """The rules of ``prune --out`` for an export that is one file (a mergekit YAML, a pruned GGUF): the right
    suffix, never one of the run's ``inputs`` nor inside an input folder (the source model file or folder), an existing file
    replaced only with ``force`` (:func:`check_output_file` for the rest).  Raises :class:`OutputPathError`."""
    p = Path(out).expanduser()
    if not p.name.lower().endswith(tuple(suffixes)):
        raise OutputPathError(f"{flag} {p}: {what} is one file; give a name ending in {' or '.join(suffixes)}")
    p = check_output_file(p, flag, inputs)
    for src in inputs or ():
        q = Path(src).expanduser().resolve() if src and Path(src).expanduser().is_dir() else None
        if q is not None and _inside(p.resolve(), q):
            raise OutputPathError(f"{flag} {p} is inside the source model folder {q}; choose another folder")
    if p.exists() and not force:
        raise OutputPathError(f"{flag} {p} exists; choose a new file name, or {force_hint} to replace it")
    return p


def write_model_folder(out: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Run ``write(folder)`` on a temporary folder beside ``out``, then put the result at ``out``: a new ``out``
    is one rename; into an existing (empty or forced) one, the old weight files (:data:`STALE_WEIGHT_GLOBS`) are
    deleted first and the new files moved in (other files there stay).  If ``write`` fails, ``out`` is
    untouched.  Returns ``out``."""
    out = Path(out).expanduser()
    with temp_folder(out.parent, f".{out.name}.") as tmp:
        write(tmp)
        if not out.exists():
            os.replace(tmp, out)
            return out
        for pattern in STALE_WEIGHT_GLOBS:
            for f in out.glob(pattern):
                if f.is_file() or f.is_symlink():
                    f.unlink()
        for f in tmp.iterdir():
            dest = out / f.name
            if f.is_dir() and dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            os.replace(f, dest)
        tmp.rmdir()
    return out


def save_model_folder(out: str | os.PathLike, model, tokenizer, record: dict,
                      wrap: Callable | None = None, extra: dict | None = None) -> Path:
    """Save ``model`` (safetensors) and ``tokenizer`` (when given) as a Hugging Face folder at ``out`` with the
    export's ``record`` as :data:`PRUNE_FILE`, atomically (:func:`write_model_folder`).  ``wrap``: a function of the
    model's config, as saving left it (its dtype set), giving the config to write in its place (the wrapper stock
    ``transformers`` reloads the model's class from: :func:`swapkl.model.config_cut.reload_config`).  ``extra``:
    ``{file name: JSON-able}`` written beside the record (a bridged export's provenance).  Returns ``out``."""
    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        if wrap is not None:
            wrap(model.config).save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        for name, content in {PRUNE_FILE: record, **(extra or {})}.items():
            atomic_write_text(folder / name, json.dumps(content, indent=2, default=str))

    return write_model_folder(out, write)


def write_folder_zip(folder: str | os.PathLike, target, max_bytes: int = 4 << 30) -> None:
    """The regular files of ``folder`` (recursively, no symlinks followed) as a stored (uncompressed) zip written to
    ``target`` (a path or a binary file), members ``<folder name>/<relative path>`` -- a pruned model offered as a
    download.  Refuses a folder larger than ``max_bytes``."""
    root = Path(folder)
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()]
    total = sum(p.stat().st_size for p in files)
    if total > max_bytes:
        raise OutputPathError(f"{root.name} has {total / 1e9:.1f} GB; too large to offer as a download "
                              f"(at most {max_bytes / 1e9:.1f} GB)")
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as z:
        for p in files:
            z.write(p, f"{root.name}/{p.relative_to(root).as_posix()}")


def folder_zip(folder: str | os.PathLike, max_bytes: int = 4 << 30) -> bytes:
    """:func:`write_folder_zip` in memory: the zip's bytes."""
    buf = io.BytesIO()
    write_folder_zip(folder, buf, max_bytes)
    return buf.getvalue()
