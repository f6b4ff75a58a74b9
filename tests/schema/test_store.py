"""The one storage layer: atomic, checksummed, versioned entries in one cache root."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from swapkl import store
from swapkl.store import CorruptEntry, read_entry, read_entry_or_empty, write_entry
from swapkl.removal.plan import RemovalPlan, RunHooks


def test_entry_roundtrip_and_every_kind_of_damage(tmp_path):
    p = tmp_path / "a" / "e.json"
    data = {"x": [1.5, 2.25], "name": "pair 0-1", "nested": {"k": None}}
    assert read_entry(p, "demo") is None                      # nothing stored yet
    write_entry(p, "demo", data)
    assert read_entry(p, "demo") == data
    assert [f.name for f in p.parent.iterdir()] == ["e.json"]  # no temporary file left behind
    raw = json.loads(p.read_text())
    assert raw["swapkl_store"] == "demo" and raw["version"] == store.STORE_VERSION
    cases = {
        "torn": p.read_text()[:25],
        "edited": json.dumps({**raw, "data": {**data, "x": [1.5, 2.5]}}),
        "other kind": json.dumps({**raw, "swapkl_store": "other"}),
        "old version": json.dumps({**raw, "version": 0}),
        "not an entry": json.dumps(data),
        "not UTF-8": b"\xff\xfe\x00",
    }
    why = {"torn": "unreadable", "edited": "checksum mismatch", "other kind": "'other' entry",
           "old version": "store version 0", "not an entry": "not a swapkl store entry", "not UTF-8": "unreadable"}
    for name, text in cases.items():
        (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
        with pytest.raises(CorruptEntry, match=why[name]):
            read_entry(p, "demo")
        assert read_entry_or_empty(p, "demo") == {}


def test_one_cache_root(monkeypatch, tmp_path):
    from swapkl import store as cache
    from swapkl.model import gguf

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path))
    assert store.cache_root() == cache.cache_root() == gguf.default_cache_root() == tmp_path
    monkeypatch.delenv("SWAPKL_CACHE")
    assert store.cache_root() == store.PROJECT_ROOT / "cache"  # a checkout
    # an installed package (no pyproject.toml above it: site-packages) caches in the user's cache folder
    monkeypatch.setattr(store, "PROJECT_ROOT", tmp_path / "site-packages")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_root() == tmp_path / "xdg" / "swapkl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store.cache_root() == tmp_path / "home" / ".cache" / "swapkl"


def test_every_store_writes_entries(stories, cache_dir):
    """Scores, evaluations, snapshots and the sha256 memo are all store entries of their kind."""
    from swapkl.scoring.score import score
    from swapkl.contract import Contract
    from swapkl.removal.curves import removal_curves
    from swapkl.measure.evaluate import Evaluator
    from swapkl.measure.memo import disk_memo

    ck = stories
    res = score(ck, Contract(pairs="adjacent", prompts=2, tokens=8))
    scores = {"replacement": res.replacement(), "interchange": res.interchange()}
    removal_curves(ck.model, ck.tokenizer, scores, RemovalPlan(budget=1, methods=["replacement"], evaluator=Evaluator("tiny", 120, 64, 32)),
                   RunHooks(corpus=None, memo=disk_memo(ck.identity), identity=ck.identity))
    kinds = {}
    for f in cache_dir.rglob("*.json"):
        d = json.loads(f.read_text())
        kinds.setdefault(d.get("swapkl_store"), []).append(f.relative_to(cache_dir).parts[0])
    assert set(kinds) >= {"score-meta", "score-chunk", "ppl-eval"} and None not in kinds, kinds
    assert set(kinds["score-chunk"]) == {"scores"} and set(kinds["ppl-eval"]) == {"ppl"}


#: a score cache written by swapkl before the layout change (commit 27731ad, the flat package): stories260K with
#: ``identity["id"]`` set to "fixture:stories260K" (the key does not depend on where the model lies), contract
#: pairs=gap:1, prompts=3, tokens=12 on CPU, the local WikiText-2 copy (then read from beside the checkout, now shipped in tests/fixtures); ``expected.json`` holds the matrices that run returned
OLD_CACHE = Path(__file__).resolve().parents[1] / "data" / "cache-before-layout"


def test_cache_written_before_the_layout_is_read(stories, tmp_path, monkeypatch):
    import shutil

    import numpy as np

    from swapkl.contract import Contract
    from swapkl.scoring.score import score

    root = tmp_path / "cache"
    shutil.copytree(OLD_CACHE / "scores", root / "scores")
    monkeypatch.setenv("SWAPKL_CACHE", str(root))
    ck = dataclasses.replace(stories, identity=dict(stories.identity, id="fixture:stories260K"))
    res = score(ck, Contract(pairs="gap:1", prompts=3, tokens=12, device="cpu"))
    assert res.meta["cache_key"] == "a727d2846cc8df7d57f4"  # the same key, so the same entry
    assert res.meta["cached_pairs"] == 4 and res.meta["computed_pairs"] == 0 and not res.meta["cache_problems"]
    expected = json.loads((OLD_CACHE / "expected.json").read_text())
    for m in ("replacement", "interchange"):
        want = np.array([[np.nan if v is None else v for v in row] for row in expected[m]])
        np.testing.assert_array_equal(getattr(res, m)(), want)
