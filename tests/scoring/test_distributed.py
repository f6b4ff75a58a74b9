"""The sweep split over ranks: torchrun with 2 gloo processes on the CPU, each with its own cache folder, equals one
process (the pairs reach rank 0 over the process group); shares are disjoint and complete; a missing pair, a rank
with other prompts and a failing rank are clear errors, and nothing in a cache is deleted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from swapkl.scoring.score import score
from swapkl.model.checkpoints import load_checkpoint
from swapkl.contract import Contract, pair_list
from swapkl.scoring.distributed import (DistributedError, RankInfo, check_agreement, merge_shares, rank_device,
                                        rank_info, restrict_gpus, score_distributed)
from swapkl.scoring.entries import ScoreEntry
from swapkl.scoring.results import SwapResult

ARGS = ["--pairs", "all", "--prompts", "4", "--tokens", "16", "--device", "cpu"]
CONTRACT = Contract(pairs="all", prompts=4, tokens=16)


def _torchrun(stories_path, out, env_extra: dict, args=ARGS):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)) | env_extra
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "support" / "dist_rank.py"), str(stories_path), *args, "--json", str(out), "--quiet"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_torchrun_two_gloo_ranks_with_their_own_caches_equal_one_process(stories_path, tmp_path, cache_dir):
    caches = tmp_path / "caches"  # rank r uses caches/rank<r>: nothing on disk is shared
    out = tmp_path / "merged.json"
    p = _torchrun(stories_path, out, {"SWAPKL_TEST_CACHES": str(caches)})
    assert p.returncode == 0, p.stderr[-3000:]
    merged = SwapResult.load(out)
    d = merged.meta["distributed"]
    assert d["world"] == 2 and d["backend"] == "gloo" and [r["rank"] for r in d["ranks"]] == [0, 1]
    # each rank computed its own share: disjoint, together every pair, the fixed round-robin split
    shares = [{tuple(p) for p in r["computed"]} for r in d["ranks"]]
    everything = pair_list("all", 5)
    assert shares[0] == set(everything[0::2]) and shares[1] == set(everything[1::2])
    assert merged.meta["computed_pairs"] == 10 and merged.meta["cached_pairs"] == 0
    # rank 1's pairs reached rank 0 over the process group; one writer of meta.json (rank 0)
    r0, r1 = caches / "rank0", caches / "rank1"
    assert not list(r1.glob("scores/*/meta.json")) and len(list(r0.glob("scores/*/meta.json"))) == 1
    stored0 = ScoreEntry.__new__(ScoreEntry)
    stored0.dir, stored0.problems = next(r0.glob("scores/*")), []
    assert set(stored0.read_pairs(4)) == set(everything)  # rank 0 keeps the merged entry (a later run reuses it)
    stored1 = ScoreEntry.__new__(ScoreEntry)
    stored1.dir, stored1.problems = next(r1.glob("scores/*")), []
    assert set(stored1.read_pairs(4)) == shares[1]
    # the same numbers as one process computing everything (cache_dir is a different, empty cache)
    ck = load_checkpoint(str(stories_path), device="cpu")
    single = score(ck, CONTRACT)
    assert single.meta["computed_pairs"] == 10
    for m in ("replacement_directed", "interchange"):
        a, b = getattr(merged, m)(), getattr(single, m)()
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    assert np.nanmin(single.interchange()) > 1e-3
    for p_ in everything:
        np.testing.assert_allclose(merged.per_prompt["inter"][p_], single.per_prompt["inter"][p_], atol=1e-6)
    assert merged.noise_floor == pytest.approx(single.noise_floor, abs=1e-9)
    assert merged.prompt_token_ids == single.prompt_token_ids
    # a laptop browses the merged file: it is an ordinary result JSON
    assert json.loads(out.read_text())["contract"]["pairs"] == "all"
    # run again: every rank resumes from its own cache, nothing is computed
    again = tmp_path / "again.json"
    p = _torchrun(stories_path, again, {"SWAPKL_TEST_CACHES": str(caches)})
    assert p.returncode == 0, p.stderr[-3000:]
    res = SwapResult.load(again)
    assert res.meta["computed_pairs"] == 0 and res.meta["cached_pairs"] == 10
    np.testing.assert_array_equal(res.interchange(), merged.interchange())


def test_a_rank_with_another_tokenizer_stops_every_rank_and_deletes_nothing(stories_path, tmp_path):
    shared = tmp_path / "shared-cache"
    ck = load_checkpoint(str(stories_path), device="cpu")
    old = os.environ.get("SWAPKL_CACHE")
    os.environ["SWAPKL_CACHE"] = str(shared)
    try:
        score(ck, CONTRACT.with_(pairs="adjacent"))  # an entry both ranks' cache key points at
    finally:
        os.environ.pop("SWAPKL_CACHE") if old is None else os.environ.__setitem__("SWAPKL_CACHE", old)
    entries = shared / "scores"
    before = {f: (entries / f).read_bytes() for f in _files(entries)}
    assert any(f.endswith("meta.json") for f in before) and any("chunk-" in f for f in before)
    out = tmp_path / "never.json"
    p = _torchrun(stories_path, out, {"SWAPKL_CACHE": str(shared), "SWAPKL_TEST_OTHER_TOKENIZER": "1"})
    assert p.returncode != 0, p.stderr[-3000:]  # torchrun's own code (1) for a child that exited with 2
    for r in (0, 1):  # every rank says it in one line (torchrun then prints its own report of the failed child)
        assert f"error (rank {r}): rank 1 disagrees with rank 0: its prompt token ids differ" in p.stderr
    assert f'File "{ROOT / "swapkl"}' not in p.stderr and not out.exists()  # no traceback from swapkl
    assert {f: (entries / f).read_bytes() for f in _files(entries)} == before  # nothing deleted or rewritten


def test_merge_names_a_missing_pair_and_its_rank():
    pairs = pair_list("all", 4)
    vec = {"repl_ij": [0.1], "repl_ji": [0.2], "inter": [0.3]}
    shares = [{p: vec for p in pairs[0::2]}, {p: vec for p in pairs[1::2]}]
    assert set(merge_shares(pairs, shares)) == set(pairs)
    del shares[1][pairs[3]]
    with pytest.raises(DistributedError, match=r"pair \(0, 2\) of rank 1's share is missing .* does not compute"):
        merge_shares(pairs, shares)


def test_agreement_names_each_rank_and_what_differs():
    fp = {"prompts": "a", "contract": {"k": 1}, "num_layers": 5, "weights": "w"}
    check_agreement([fp, dict(fp), dict(fp)])
    with pytest.raises(DistributedError, match="rank 2 disagrees with rank 0: its prompt token ids differ .*"
                                               "its weights differ"):
        check_agreement([fp, dict(fp), fp | {"prompts": "b", "weights": "v"}])


def test_no_cache_is_accepted_now_that_nothing_merges_through_the_disk(stories_path, cache_dir, tmp_path):
    res = score_distributed(str(stories_path), CONTRACT.with_(pairs="adjacent"), device="cpu", use_cache=False,
                            info=RankInfo(0, 1, 0, 1))
    assert res.meta["computed_pairs"] == 4 and not (cache_dir / "scores").exists()


def test_shards_are_fixed_shares_even_with_a_partly_filled_cache(stories_path, cache_dir):
    ck = load_checkpoint(str(stories_path), device="cpu")
    everything = pair_list("all", 5)
    # someone already computed two pairs, one of each rank's share
    score(ck, CONTRACT, pairs=[everything[0], everything[3]])
    r0 = score(ck, CONTRACT, shard=(0, 2))
    r1 = score(ck, CONTRACT, shard=(1, 2))
    c0 = {tuple(p) for p in r0.meta["computed_pair_list"]}
    c1 = {tuple(p) for p in r1.meta["computed_pair_list"]}
    assert c0 == set(everything[0::2]) - {everything[0]}
    assert c1 == set(everything[1::2]) - {everything[3]}
    merged = score(ck, CONTRACT)
    assert merged.meta["computed_pairs"] == 0 and len(merged.pairs) == 10


def test_one_process_without_torchrun_is_plain_score(stories_path, cache_dir, tmp_path):
    out = tmp_path / "one.json"
    res = score_distributed(str(stories_path), CONTRACT.with_(pairs="adjacent"), device="cpu",
                            json_out=str(out), info=RankInfo(0, 1, 0, 1))
    assert out.is_file() and res.meta["distributed"]["world"] == 1
    assert [tuple(p) for p in res.meta["distributed"]["ranks"][0]["computed"]] == pair_list("adjacent", 5)
    assert np.isfinite(res.interchange()[0, 1])


def test_a_failing_rank_is_one_clear_error(cache_dir, tmp_path):
    with pytest.raises(DistributedError, match="rank 0: ModelLoadError: no such file or folder"):
        score_distributed(str(tmp_path / "nope"), CONTRACT, device="cpu", info=RankInfo(0, 1, 0, 1))


def test_rank_environment_and_devices():
    assert rank_info({}) == RankInfo(0, 1, 0, 1)
    info = rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert info == RankInfo(3, 4, 1, 2)
    with pytest.raises(DistributedError):
        rank_info({"RANK": "4", "WORLD_SIZE": "4"})
    assert rank_device(info, "cpu") == "cpu"
    assert rank_device(info, "auto", device_map="auto") == "auto"
    env = {}
    assert restrict_gpus(info, 2, env) == ["2", "3"] and env["CUDA_VISIBLE_DEVICES"] == "2,3" == env["SWAPKL_GPU_GROUP"]
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert restrict_gpus(info, 2, env) == ["6", "7"]
    with pytest.raises(DistributedError):
        restrict_gpus(info, 3, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
