"""What a demo server's downloads may say about its own disk: nothing.  A model identity records where a local model
was loaded from (``id``: an absolute folder or GGUF file; transformers writes ``_name_or_path`` into a saved
config), so a result JSON, a bundle or an export's provenance file would hand a visitor the server's paths.
:func:`scrub` replaces, in any JSON-able value, every absolute path (a string that starts with ``/``, ``~`` or a
drive letter, or such a token inside a longer string) and every occurrence of the server's own folders (``roots``:
the cache, the project) with the model's public name (:func:`public_name`); :func:`scrub_json_text` does the same
to a JSON document, :func:`scrub_folder` to the text files of a written export.  No Streamlit here."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: an absolute path token inside a longer string (POSIX, home-relative or a Windows drive)
_ABS = re.compile(r"(?<![\w.~/:-])(?:~|[A-Za-z]:[\\/]|/)[^\s'\"<>,;)\]}]+")
#: the text files of an export that are read back and scrubbed (its weights are never touched), at most 4 MB each
TEXT_SUFFIXES = (".json", ".md", ".yaml", ".yml", ".txt")
TEXT_MAX_BYTES = 4 << 20


def public_name(identity: dict | None, fallback: str = "model") -> str:
    """The name a download gives the model: the identity's ``display`` (the allow-list's label), else its ``id``;
    a value that is itself an absolute path is reduced to its last part."""
    ident = identity or {}
    name = str(ident.get("display") or ident.get("id") or fallback)
    return Path(name).name or fallback if _is_abs(name) else name


def _is_abs(s: str) -> bool:
    return s.startswith(("/", "~", "\\")) or bool(re.match(r"^[A-Za-z]:[\\/]", s))


def scrub_text(s: str, name: str, roots=()) -> str:
    """``s`` with every server folder of ``roots`` and every absolute path token replaced by ``name``."""
    if _is_abs(s):
        return name
    s = _ABS.sub(name, s)
    for r in sorted((str(r) for r in roots if r and len(str(r)) > 1), key=len, reverse=True):
        s = s.replace(r, name)
    return s


def scrub(obj, name: str, roots=()):
    """A copy of the JSON-able ``obj`` with every string scrubbed (:func:`scrub_text`); keys too."""
    if isinstance(obj, str):
        return scrub_text(obj, name, roots)
    if isinstance(obj, dict):
        return {scrub_text(str(k), name, roots): scrub(v, name, roots) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, name, roots) for v in obj]
    return obj


def scrub_json_text(text: str, name: str, roots=(), indent: int | None = 1) -> str:
    """The JSON document ``text`` scrubbed (:func:`scrub`) and written again (strict JSON)."""
    return json.dumps(scrub(json.loads(text), name, roots), indent=indent, allow_nan=False)


def server_roots() -> tuple:
    """The server's own folders a download must not name: the cache, the project and the user's home."""
    from swapkl.store import PROJECT_ROOT, cache_root

    out = []
    for r in (cache_root(), PROJECT_ROOT, Path.home()):
        try:
            out += [str(Path(r)), str(Path(r).resolve())]
        except (OSError, RuntimeError):
            pass
    return tuple(dict.fromkeys(out))


def scrub_folder(path: str | os.PathLike, name: str, roots=()) -> list[str]:
    """Scrub the text files (:data:`TEXT_SUFFIXES`, at most :data:`TEXT_MAX_BYTES` bytes each) of the export at
    ``path`` (a folder, or one file) in place; JSON files are parsed and written again.  Returns the files
    changed (relative names).  Meant for an export that is not yet at its final name (nobody reads it)."""
    root = Path(path)
    files = [root] if root.is_file() else [p for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()]
    changed = []
    for f in files:
        if f.suffix.lower() not in TEXT_SUFFIXES or f.stat().st_size > TEXT_MAX_BYTES:
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix.lower() == ".json":
            obj = json.loads(text)
            new_obj = scrub(obj, name, roots)
            new = text if new_obj == obj else json.dumps(new_obj, indent=2, ensure_ascii=False)
        else:
            new = "\n".join(scrub_text(line, name, roots) for line in text.split("\n"))
        if new != text:
            f.write_text(new, encoding="utf-8")
            changed.append(f.name if f == root else f.relative_to(root).as_posix())
    return changed
