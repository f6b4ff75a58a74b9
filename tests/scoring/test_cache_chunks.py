"""The score cache writes one durable file per chunk of pairs (not one per pair), an interrupted or killed run loses
at most the chunk in flight and resumes, and a cache entry made on other prompts is never deleted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT
from swapkl import store
from swapkl.contract import Contract, pair_list
from swapkl.scoring import score as api
from swapkl.scoring.entries import ScoreEntry
from swapkl.scoring.score import score

ALL = Contract(pairs="all", prompts=4, tokens=16)


def _chunks(cache_dir) -> list[list[tuple[int, int]]]:
    files = sorted(cache_dir.glob("scores/*/pairs/chunk-*.json"))
    return [[tuple(p) for p in json.loads(f.read_text())["data"]["pairs"]] for f in files]


def test_one_durable_write_per_chunk_of_pairs(stories, cache_dir, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(store.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    # max_live=6: two pairs per chunk; 10 pairs -> 5 chunks
    res = score(stories, ALL, engine_kw={"max_live": 6})
    chunks = _chunks(cache_dir)
    assert len(chunks) == 5 and all(len(c) == 2 for c in chunks)
    assert sorted(p for c in chunks for p in c) == sorted(pair_list("all", 5))
    assert len(synced) == 5 + 1  # one per chunk, one for meta.json (was one per pair: 10 + 1)
    again = score(stories, ALL)
    assert again.meta["computed_pairs"] == 0 and again.meta["cached_pairs"] == 10
    np.testing.assert_array_equal(again.interchange(), res.interchange())  # the cache holds the exact floats


def test_interrupt_inside_a_chunk_loses_only_that_chunk(stories, cache_dir):
    def ctrl_c_in_third_chunk(rows, where):
        # the first block call after two chunks are on disk: Ctrl-C in the middle of the third
        if where == "block" and len(_chunks(cache_dir)) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score(stories, ALL, engine_kw={"max_live": 6, "fault": ctrl_c_in_third_chunk})
    chunks = _chunks(cache_dir)
    order = pair_list("all", 5)
    assert sorted(p for c in chunks for p in c) == sorted(order[:4])  # two whole chunks, nothing of the third
    resumed = score(stories, ALL, engine_kw={"max_live": 6})
    assert resumed.meta["cached_pairs"] == 4 and resumed.meta["computed_pairs"] == 6
    fresh = score(stories, ALL, use_cache=False)
    np.testing.assert_allclose(resumed.interchange(), fresh.interchange(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(resumed.replacement_directed(), fresh.replacement_directed(), atol=1e-6, rtol=0)


KILLED = """
import sys, time
sys.path.insert(0, {root!r})
from swapkl.contract import Contract
from swapkl.model.checkpoints import load_checkpoint
from swapkl.scoring.score import score
ck = load_checkpoint({model!r}, device="cpu")
slow = lambda rows, where: time.sleep(0.05) if where == "block" else None
score(ck, Contract(pairs="all", prompts=4, tokens=16), engine_kw={{"max_live": 3, "fault": slow}})
"""


def test_a_killed_run_keeps_its_finished_chunks_and_resumes(stories_path, stories, cache_dir):
    env = dict(os.environ, SWAPKL_CACHE=str(cache_dir), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(root=str(ROOT), model=str(stories_path))],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while len(_chunks(cache_dir)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup, no finally: what a power cut or the OOM killer does
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    kept = {p for c in _chunks(cache_dir) for p in c}
    assert 2 <= len(kept) < 10
    resumed = score(stories, ALL)
    assert resumed.meta["cache_problems"] == [] and resumed.meta["cached_pairs"] == len(kept)
    assert resumed.meta["computed_pairs"] == 10 - len(kept)
    fresh = score(stories, ALL, use_cache=False)
    np.testing.assert_allclose(resumed.interchange(), fresh.interchange(), atol=1e-6, rtol=0)


def test_other_prompts_under_the_same_key_delete_nothing(stories, cache_dir, monkeypatch):
    """Another tokenizer gives other prompts under the same cache key: its pairs are computed and filed apart,
    the first prompts' pairs stay on disk and are found again."""
    adj = ALL.with_(pairs="adjacent")
    first = score(stories, adj)
    files = sorted(cache_dir.glob("scores/*/pairs/chunk-*.json"))
    assert len(files) == 1
    real = api.make_prompts

    def other_tokenizer(*a, **kw):
        pr = real(*a, **kw)
        return type(pr)(ids=torch.flip(pr.ids, [1]), description=pr.description)

    monkeypatch.setattr(api, "make_prompts", other_tokenizer)
    other = score(stories, adj)
    assert other.meta["cached_pairs"] == 0 and other.meta["computed_pairs"] == 4
    assert other.meta["cache_key"] == first.meta["cache_key"]
    assert all(f.is_file() for f in files)  # nothing deleted
    assert not np.allclose(other.interchange()[0, 1], first.interchange()[0, 1])
    monkeypatch.setattr(api, "make_prompts", real)
    back = score(stories, adj)
    assert back.meta["cached_pairs"] == 4 and back.meta["computed_pairs"] == 0
    np.testing.assert_array_equal(back.interchange(), first.interchange())
    assert back.noise_floor == pytest.approx(first.noise_floor)  # the meta was rewritten for these prompts


def test_a_chunk_of_the_wrong_shape_is_reported_and_removed(cache_dir):
    entry = ScoreEntry({"kind": "folder", "id": "x"}, {"k": 1}, root=cache_dir)
    vec = {"repl_ij": [0.1, 0.2], "repl_ji": [0.3, 0.4], "inter": [0.5, 0.6]}
    entry.write_pairs({(0, 1): vec, (1, 2): vec}, "digest-a")
    assert entry.read_pairs(2, prompts="digest-a") == {(0, 1): vec, (1, 2): vec}
    assert entry.read_pairs(2, prompts="digest-b") == {}  # other prompts: skipped, kept
    assert entry.read_pairs(2, wanted=[(1, 2)], prompts="digest-a") == {(1, 2): vec}
    with pytest.warns(UserWarning, match="corrupt cache entry"):
        assert entry.read_pairs(3, prompts="digest-a") == {}  # three prompts wanted, two stored
    assert not list(entry.pairs_dir.glob("chunk-*.json")) and entry.problems


def test_pair_files_of_earlier_versions_stay_tied_to_their_prompts(stories, tmp_path, monkeypatch):
    """A cache written before chunks (one file per pair, no prompt digest: tests/data/cache-before-layout) is read
    for its own prompts only, also after a run on other prompts rewrote the entry's meta."""
    import dataclasses
    import shutil

    from test_store import OLD_CACHE

    root = tmp_path / "cache"
    shutil.copytree(OLD_CACHE / "scores", root / "scores")
    monkeypatch.setenv("SWAPKL_CACHE", str(root))
    ck = dataclasses.replace(stories, identity=dict(stories.identity, id="fixture:stories260K"))
    c = Contract(pairs="gap:1", prompts=3, tokens=12, device="cpu")
    old_files = sorted(root.glob("scores/*/pairs/*-*.json"))
    assert len(old_files) == 4 and not any(f.name.startswith("chunk-") for f in old_files)
    real = api.make_prompts
    monkeypatch.setattr(api, "make_prompts", lambda *a, **kw: (lambda pr: type(pr)(
        ids=torch.flip(pr.ids, [1]), description=pr.description))(real(*a, **kw)))
    other = score(ck, c)
    assert other.meta["cached_pairs"] == 0 and other.meta["computed_pairs"] == 4  # not its prompts' pairs
    assert all(f.is_file() for f in old_files)
    monkeypatch.setattr(api, "make_prompts", real)
    back = score(ck, c)
    assert back.meta["cached_pairs"] == 4 and back.meta["computed_pairs"] == 0 and not back.meta["cache_problems"]
    expected = json.loads((OLD_CACHE / "expected.json").read_text())
    want = np.array([[np.nan if v is None else v for v in row] for row in expected["interchange"]])
    np.testing.assert_array_equal(back.interchange(), want)
