"""Results semantics, JSON round trip, and the on-disk cache (resume, corruption, reuse across pair sets)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.scoring.score import score
from swapkl.contract import Contract, pair_list, parse_pairs
from swapkl.errors import ComputeInterrupted, ContractError
from swapkl.scoring.results import SwapResult


SMALL = dict(prompts=4, tokens=16)


def test_pair_sets():
    assert parse_pairs("adjacent") == ("gap", 1)
    assert len(pair_list("adjacent", 6)) == 5
    assert len(pair_list("gap:3", 24)) == 3 * 24 - 6
    assert len(pair_list("all", 24)) == 276
    assert pair_list("all", 4)[:3] == [(0, 1), (1, 2), (2, 3)]  # adjacent first
    for bad in ("gap:0", "gap:-1", "nearby"):
        with pytest.raises(ContractError):
            parse_pairs(bad)


def test_matrices_from_vectors():
    vec = {(0, 1): {"repl_ij": [1.0, 3.0], "repl_ji": [0.5, 0.5], "inter": [0.2, 0.4]},
           (1, 2): {"repl_ij": [0.1, 0.1], "repl_ji": [0.2, 0.4], "inter": [0.5, 0.7]}}
    r = SwapResult.from_pair_vectors(3, vec, contract={"aggregation": "max"}, identity={})
    R = r.replacement_directed()
    assert R[0, 1] == 2.0 and R[1, 0] == 0.5 and np.isnan(R[0, 2]) and np.isnan(R[0, 0])
    assert r.replacement()[0, 1] == r.replacement()[1, 0] == 2.0          # max of the two means
    assert r.replacement("mean")[1, 2] == pytest.approx(0.2)              # (0.1 + 0.3) / 2
    assert r.interchange()[2, 1] == pytest.approx(0.6)
    s = r.summary()
    assert s["gap"]["max"] == pytest.approx(2.0 - 0.3)
    assert s["gap"]["min"] == pytest.approx(0.3 - 0.6) and s["gap"]["negative_pairs"] == 1
    assert s["interchange"]["best_pair"] == [0, 1]
    back = SwapResult.from_json(r.to_json())
    np.testing.assert_array_equal(back.replacement_directed(), R)
    d = r.to_dict()
    assert d["replacement"][0][2] is None and d["replacement_directed"][1][0] == 0.5


def test_cache_reuse_and_wider_pair_sets(stories, cache_dir):
    a = score(stories, Contract(pairs="adjacent", **SMALL))
    assert a.meta["computed_pairs"] == 4 and a.meta["cached_pairs"] == 0
    b = score(stories, Contract(pairs="gap:2", **SMALL))
    assert b.meta["cached_pairs"] == 4 and b.meta["computed_pairs"] == 3
    for (i, j) in a.pairs:
        assert b.interchange()[i, j] == a.interchange()[i, j]
    c = score(stories, Contract(pairs="gap:2", **SMALL))
    assert c.meta["computed_pairs"] == 0
    np.testing.assert_array_equal(c.replacement_directed(), b.replacement_directed())


def test_interrupted_run_resumes(stories, cache_dir):
    seen = []

    def stop():
        return len(seen) >= 1

    # max_live=3 -> one pair per chunk, so the stop check runs between pairs
    with pytest.raises(ComputeInterrupted):
        score(stories, Contract(pairs="all", **SMALL), on_partial=lambda r: seen.append(len(r.pairs)),
              should_stop=stop, engine_kw={"max_live": 3})
    assert seen == [1]
    full = score(stories, Contract(pairs="all", **SMALL))
    assert full.meta["cached_pairs"] == 1 and full.meta["computed_pairs"] == 9
    fresh = score(stories, Contract(pairs="all", **SMALL), use_cache=False)
    np.testing.assert_allclose(full.interchange(), fresh.interchange(), rtol=0, atol=1e-6)


def test_corrupt_entry_is_reported_and_recomputed(stories, cache_dir):
    # max_live=3: one pair per chunk, so one chunk file per pair
    first = score(stories, Contract(pairs="adjacent", **SMALL), engine_kw={"max_live": 3})
    files = sorted(cache_dir.glob("scores/*/pairs/chunk-*.json"))
    assert len(files) == 4
    files[0].write_text('{"swapkl_store": "score-chunk", "data": {"pairs": [[0, 1]], "repl_ij": [1, 2')  # truncated
    d = json.loads(files[1].read_text())  # tampered
    d["data"]["inter"][0][0] += 1.0
    files[1].write_text(json.dumps(d))
    with pytest.warns(UserWarning, match="corrupt cache entry"):
        again = score(stories, Contract(pairs="adjacent", **SMALL))
    assert again.meta["computed_pairs"] == 2 and len(again.meta["cache_problems"]) == 2
    np.testing.assert_allclose(again.interchange(), first.interchange(), atol=1e-6)


def test_contract_change_is_a_new_entry(stories, cache_dir):
    score(stories, Contract(pairs="adjacent", **SMALL))
    other = score(stories, Contract(pairs="adjacent", positions="last", **SMALL))
    assert other.meta["cached_pairs"] == 0
    assert len(list(cache_dir.glob("scores/*"))) == 2
