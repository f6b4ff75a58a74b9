"""The sweep split over ranks: torchrun with 2 gloo processes on the CPU equals one process; shares are
disjoint and complete; a failing rank is a clear error."""
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
from swapkl.scoring.distributed import (DistributedError, RankInfo, rank_device, rank_info, restrict_gpus,
                                        score_distributed)
from swapkl.scoring.results import SwapResult

ARGS = ["--pairs", "all", "--prompts", "4", "--tokens", "16", "--device", "cpu"]
CONTRACT = Contract(pairs="all", prompts=4, tokens=16)


def test_torchrun_two_gloo_ranks_equal_one_process(stories_path, tmp_path, cache_dir):
    shared = tmp_path / "shared-cache"
    out = tmp_path / "merged.json"
    env = dict(os.environ, SWAPKL_CACHE=str(shared), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "swapkl.commands.distributed", str(stories_path), *ARGS, "--json", str(out), "--quiet"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    merged = SwapResult.load(out)
    d = merged.meta["distributed"]
    assert d["world"] == 2 and d["backend"] == "gloo" and [r["rank"] for r in d["ranks"]] == [0, 1]
    # each rank computed its own share: disjoint, together every pair, the fixed round-robin split
    shares = [{tuple(p) for p in r["computed"]} for r in d["ranks"]]
    everything = pair_list("all", 5)
    assert shares[0] & shares[1] == set() and shares[0] | shares[1] == set(everything)
    assert shares[0] == set(everything[0::2]) and shares[1] == set(everything[1::2])
    assert merged.meta["computed_pairs"] == 0 and merged.meta["cached_pairs"] == 10  # rank 0 only merged
    assert len(list(shared.glob("scores/*/pairs/*.json"))) == 10
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
    # a laptop browses the merged file: it is an ordinary result JSON
    assert json.loads(out.read_text())["contract"]["pairs"] == "all"


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
