"""Files a visitor uploads (every ``st.file_uploader`` of the dashboard): the server's size limit first
(:meth:`~swapkl.jobs.policy.Policy.check_upload`: demo mode refuses a file over ``upload_mb`` in one line, before
anything reads it as JSON), then its parse, done once per session and content: the parsed value (or the one-line
refusal) is kept under the sha256 of the bytes, the last :data:`KEEP` of them, so a rerun (every click, every poll)
does not parse the file again."""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Callable

import streamlit as st

from dashboard.session import policy
from swapkl.errors import SwapklError

#: parsed uploads kept per session (each holds what its parse returned)
KEEP = 4


def checked(*uploads) -> list[bytes]:
    """The bytes of ``uploads`` (Streamlit ``UploadedFile`` objects; None skipped, as b"") once this server's policy
    allows their total size; raises :class:`~swapkl.errors.PolicyError` before any is read."""
    policy().check_upload(sum(int(u.size) for u in uploads if u is not None))
    return [u.getvalue() if u is not None else b"" for u in uploads]


def parsed(upload, parse: Callable[[bytes], Any], what: str) -> Any:
    """``parse(bytes of upload)``, computed once per session for the same content and ``what`` (a name of the kind
    of file: the same bytes read as another kind are parsed again).  The size is checked first
    (:func:`checked`).  Raises the parse's :class:`~swapkl.errors.SwapklError` (kept too: a refused file is
    refused again without a second parse)."""
    (data,) = checked(upload)
    key = (what, hashlib.sha256(data).hexdigest())
    store = st.session_state.setdefault("_uploads", OrderedDict())
    if key in store:
        store.move_to_end(key)
    else:
        try:
            store[key] = (parse(data), None)
        except SwapklError as e:
            store[key] = (None, e)
        while len(store) > KEEP:
            store.popitem(last=False)
    value, err = store[key]
    if err is not None:
        raise err
    return value
