"""What a download button of an AppTest run serves: the bytes and file name a click would get.  AppTest builds a new
in-memory media file manager for every run; :func:`record_media` keeps the latest one, :func:`served` reads a
button's file from it (a deferred callable is called, as a click does)."""
from __future__ import annotations

_LATEST: list = []


def record_media(monkeypatch) -> None:
    """Make every AppTest run keep its media file manager (the latest one is what :func:`served` reads)."""
    import streamlit.testing.v1.app_test as app_test
    from streamlit.runtime.media_file_manager import MediaFileManager

    class Recording(MediaFileManager):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            _LATEST[:] = [self]

    monkeypatch.setattr(app_test, "MediaFileManager", Recording)


def served(at, key: str) -> tuple[str, bytes]:
    """``(file name, bytes)`` that the download button ``key`` of ``at``'s last run serves."""
    [button] = [b for b in at.get("download_button") if b.proto.id.endswith(f"-{key}")
                or f"-{key}-" in b.proto.id or b.proto.id == key]
    mgr = _LATEST[-1]
    p = button.proto
    if p.deferred_file_id:
        entry = mgr._deferred_callables[p.deferred_file_id]
        data = entry["callable"]()
        return entry["filename"], data.encode() if isinstance(data, str) else bytes(data)
    f = mgr._storage.get_file(p.url.rsplit("/", 1)[-1])
    return f.filename, f.content
