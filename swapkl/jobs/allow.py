"""The demo allow-list: which checkpoints, at which revisions, a visitor may load (no Streamlit, no filesystem).

An entry is one of

* ``default`` (or ``builtin``): the built-in SmolLM2; it has no revisions;
* ``org/name``: that hub model on its default branch only (no revision, or ``main``);
* ``org/name@REV``: that hub model at exactly ``REV``;
* ``org/name@PATTERN``: any revision matching the glob ``PATTERN`` (``step*``: ``*``, ``?`` and ``[...]`` as in
  :mod:`fnmatch`), e.g. every Pythia training checkpoint;
* ``org/name@A|B|C``: exactly the listed revisions;
* a folder or a ``.gguf`` path: that exact string (the operator's), never resolved against a visitor's text.

In ``.streamlit/swapkl.toml`` an entry may also be a table, ``{id = "org/name", revisions = ["step0", "step1000"]}``
or ``{id = "org/name", revisions = "step*"}``, which reads as the string forms above.

A pull-request ref (``refs/pr/N``: anyone can open one on the hub and fill it with their own files) or any other
``refs/...`` revision is allowed only when an entry lists it exactly; a pattern never matches one.  Every revision a
visitor sends must look like a revision name (``[A-Za-z0-9._/-]``, no ``..``, at most 100 characters).
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import PurePath

DEFAULT_ALIASES = ("default", "builtin")
DEFAULT_BRANCH = "main"
_REV = re.compile(r"[A-Za-z0-9._/-]{1,100}")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_GLOB = re.compile(r"[*?\[]")


def _looks_like_revision(rev: str) -> bool:
    return bool(_REV.fullmatch(rev)) and ".." not in rev and not rev.startswith("/")


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` has the shape of a hub id ``org/name`` (compared as a string; nothing is looked up)."""
    return bool(_HUB_ID.fullmatch(spec)) and not spec.startswith((".", "~"))


@dataclass(frozen=True)
class AllowEntry:
    """One allow-list entry, parsed from its string form (:func:`parse_entry`).

    ``label``: the entry as the operator wrote it (the select box shows it); ``kind``: ``builtin``, ``hub`` or
    ``path``; ``spec``: what the loader is given (the hub id without its revision part, the path as written);
    ``revisions``: the exact revisions allowed (a list entry or ``@REV``), None when a pattern or the default branch
    decides; ``pattern``: the glob of ``@PATTERN``, else None."""

    label: str
    kind: str
    spec: str
    revisions: tuple | None = None
    pattern: str | None = None

    @property
    def revision_choice(self) -> str:
        """How a visitor picks this entry's revision: ``none`` (no revision: a path, the built-in, the default
        branch or one fixed revision), ``list`` (one of :attr:`revisions`) or ``pattern`` (typed, then matched)."""
        if self.pattern is not None:
            return "pattern"
        if self.revisions is not None and len(self.revisions) > 1:
            return "list"
        return "none"

    @property
    def display(self) -> str:
        """A name for messages that shows no server path: a folder or file entry by its last part."""
        if self.kind == "builtin":
            return "default"
        if self.kind == "path":
            return PurePath(self.spec.rstrip("/\\") or self.spec).name or "model folder"
        return self.label

    def allows_revision(self, revision: str | None) -> bool:
        """Whether this (hub) entry allows ``revision`` (None: the default branch)."""
        if revision is None or revision == "":
            return self.revisions is None and self.pattern is None or DEFAULT_BRANCH in (self.revisions or ())
        if not _looks_like_revision(revision):
            return False
        if self.revisions is not None:
            return revision in self.revisions
        if self.pattern is not None:
            return not revision.startswith("refs/") and fnmatch.fnmatchcase(revision, self.pattern)
        return revision == DEFAULT_BRANCH

    def allows(self, spec: str, revision: str | None) -> bool:
        """Whether a visitor's ``spec`` (optionally ``id@rev``) with ``revision`` is this entry (strings only)."""
        s = str(spec or "").strip()
        rev = (str(revision).strip() or None) if revision else None
        if self.kind == "builtin":
            return s.lower() in DEFAULT_ALIASES and rev is None
        if self.kind == "path":
            return s == self.spec and rev is None
        hub, at, inline = s.partition("@")
        if hub != self.spec:
            return False
        if at:
            if rev is not None and rev != inline:
                return False
            if s == self.label and self.revision_choice == "none":  # a one-revision entry, as the select box offers it
                return rev is None or rev == inline
            rev = inline
        return self.allows_revision(rev)


def parse_entry(raw) -> AllowEntry:
    """An :class:`AllowEntry` from a string entry or a TOML table ``{id, revisions}``; a malformed entry raises
    ``ValueError`` (the policy turns it into one line at start-up)."""
    if isinstance(raw, dict):
        ident = str(raw.get("id") or raw.get("model") or "").strip()
        revs = raw.get("revisions")
        if not is_hub_id(ident):
            raise ValueError(f"an allow-list table names a hub id (id = \"org/name\"); got {raw!r}")
        if revs is None:
            raw = ident
        elif isinstance(revs, str):
            raw = f"{ident}@{revs}"
        else:
            raw = f"{ident}@" + "|".join(str(r).strip() for r in revs)
    label = str(raw).strip()
    if not label:
        raise ValueError("an empty allow-list entry")
    if label.lower() in DEFAULT_ALIASES:
        return AllowEntry(label, "builtin", "default")
    hub, at, rest = label.partition("@")
    if not is_hub_id(hub) or label.lower().endswith(".gguf"):
        return AllowEntry(label, "path", label)
    if not at:
        return AllowEntry(label, "hub", hub)
    if _GLOB.search(rest):
        return AllowEntry(label, "hub", hub, pattern=rest)
    revs = tuple(r.strip() for r in rest.split("|") if r.strip())
    if not revs or not all(_looks_like_revision(r) for r in revs):
        raise ValueError(f"allow-list entry {label!r}: a revision is [A-Za-z0-9._/-], without '..'")
    return AllowEntry(label, "hub", hub, revisions=revs)
