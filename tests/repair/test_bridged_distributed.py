"""The bridged matrix split over ranks: torchrun with 2 gloo processes on the CPU, each with its own cache folder,
equals one process computing every span (matrices, CIs, fits, calibration); the shares are the fixed round-robin
split of the spans; rank 0 keeps every span in its cache; a rank with another tokenizer stops every rank and
deletes nothing; a missing span names its rank."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from swapkl.contract import Contract
from swapkl.model.checkpoints import load_checkpoint
from swapkl.repair.bridged_distributed import bridged_distributed
from swapkl.repair.bridged_kl import BridgedResult, BridgeSettings, bridge_spans, bridged_scores
from swapkl.scoring.distributed import DistributedError, RankInfo, merge_shares

ARGS = ["bridge", "--pairs", "adjacent", "--prompts", "4", "--tokens", "16", "--calib-tokens", "256",
        "--calib-window", "32", "--form", "folded", "--device", "cpu"]
CONTRACT = Contract(pairs="adjacent", prompts=4, tokens=16)
SETTINGS = BridgeSettings(form="folded", calib_tokens=256, calib_window=32)


def _torchrun(stories_path, out, env_extra: dict):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)) | env_extra
    args = [ARGS[0], str(stories_path), *ARGS[1:]]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "support" / "dist_rank.py"), *args, "--json", str(out), "--quiet"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _assert_same(got: BridgedResult, want: BridgedResult):
    assert sorted(got.spans) == sorted(want.spans)
    for which in ("bridged", "raw"):
        a, b = got.matrix(which), want.matrix(which)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
        for s in want.spans:
            np.testing.assert_allclose(got.spans[s][which], want.spans[s][which], atol=1e-6, rtol=0)
            np.testing.assert_allclose(got.ci(s, which), want.ci(s, which), atol=1e-6, rtol=0)
    for s in want.spans:
        gf, wf = got.spans[s]["fit"], want.spans[s]["fit"]
        assert gf["form"] == wf["form"] and gf["tokens"] == wf["tokens"] and gf.get("form_note") == wf.get("form_note")
        assert gf["residual"] == pytest.approx(wf["residual"], abs=1e-6)
    def same(c):  # the contract records the --device asked for (cpu on the command line, auto in-process)
        return {k: v for k, v in c.items() if k != "device"}

    assert same(got.contract) == same(want.contract) and got.settings == want.settings
    assert got.calibration == want.calibration and got.calibration.get("tokens") == got.settings["calib_tokens"]
    assert got.num_layers == want.num_layers


def test_torchrun_two_gloo_ranks_with_their_own_caches_equal_one_process(stories_path, tmp_path, cache_dir):
    caches = tmp_path / "caches"  # rank r uses caches/rank<r>: nothing on disk is shared
    out = tmp_path / "merged.json"
    p = _torchrun(stories_path, out, {"SWAPKL_TEST_CACHES": str(caches)})
    assert p.returncode == 0, p.stderr[-3000:]
    raw = json.loads(out.read_text())
    assert raw["format"] == "swapkl.bridged/1"
    merged = BridgedResult.from_dict(raw)  # the same validated file as the one-process command writes
    d = merged.meta["distributed"]
    assert d["world"] == 2 and d["backend"] == "gloo" and [r["rank"] for r in d["ranks"]] == [0, 1]
    everything = bridge_spans(CONTRACT, 5)
    shares = [{tuple(s) for s in r["spans"]} for r in d["ranks"]]
    assert shares[0] == set(everything[0::2]) and shares[1] == set(everything[1::2])
    assert [r["computed_spans"] for r in d["ranks"]] == [len(shares[0]), len(shares[1])]
    assert merged.meta["computed_spans"] == len(everything) and merged.meta["cached_spans"] == 0
    # one process computing every span in a different, empty cache
    ck = load_checkpoint(str(stories_path), device="cpu")
    single = bridged_scores(ck, CONTRACT, SETTINGS)
    assert single.meta["computed_spans"] == len(everything)
    assert all(single.mean(s, "raw") > 1e-3 for s in everything)  # the comparison is not of zeros
    _assert_same(merged, single)
    # rank 0's cache holds every span (rank 1's came over the process group); rank 1's only its share
    for rank, n in ((0, len(everything)), (1, len(shares[1]))):
        os.environ["SWAPKL_CACHE"] = str(caches / f"rank{rank}")  # cache_dir's monkeypatch restores it
        again = bridged_scores(ck, CONTRACT, SETTINGS, shard=None if rank == 0 else (1, 2))
        assert again.meta["cached_spans"] == n and again.meta["computed_spans"] == len(again.spans) - n
        if rank == 0:
            _assert_same(BridgedResult(again.num_layers, again.spans, again.contract, again.settings,
                                       calibration=single.calibration), single)


@pytest.mark.slow
def test_a_rank_with_another_tokenizer_stops_every_rank_and_deletes_nothing(stories_path, tmp_path, monkeypatch):
    shared = tmp_path / "shared-cache"
    monkeypatch.setenv("SWAPKL_CACHE", str(shared))
    ck = load_checkpoint(str(stories_path), device="cpu")
    bridged_scores(ck, CONTRACT, SETTINGS)  # an entry both ranks' cache key points at
    before = {f: (shared / f).read_bytes() for f in _files(shared)}
    assert any("bridged/" in f and "chunk-" in f for f in before)
    out = tmp_path / "never.json"
    p = _torchrun(stories_path, out, {"SWAPKL_CACHE": str(shared), "SWAPKL_TEST_OTHER_TOKENIZER": "1"})
    assert p.returncode != 0, p.stderr[-3000:]
    for r in (0, 1):
        assert f"error (rank {r}): rank 1 disagrees with rank 0: its prompt token ids differ" in p.stderr
    assert f'File "{ROOT / "swapkl"}' not in p.stderr and not out.exists()
    assert {f: (shared / f).read_bytes() for f in _files(shared)} == before  # nothing deleted or rewritten


def test_one_process_without_torchrun_is_plain_bridge(stories_path, cache_dir, tmp_path):
    contract = CONTRACT.with_(prompts=2)
    settings = BridgeSettings(form="residual", calib_tokens=128, calib_window=32)
    out = tmp_path / "one.json"
    res = bridged_distributed(str(stories_path), contract, settings, load_kw={"device": "cpu"}, json_out=str(out),
                              info=RankInfo(0, 1, 0, 1))
    d = res.meta["distributed"]
    assert d["world"] == 1 and d["backend"] is None and d["ranks"][0]["computed_spans"] == len(res.spans)
    ck = load_checkpoint(str(stories_path), device="cpu")
    want = bridged_scores(ck, contract, settings, use_cache=False)
    _assert_same(BridgedResult.from_json(out), want)


def test_a_failing_rank_is_one_clear_error(cache_dir, tmp_path):
    with pytest.raises(DistributedError, match="rank 0: ModelLoadError: no such file or folder"):
        bridged_distributed(str(tmp_path / "nope"), CONTRACT, SETTINGS, load_kw={"device": "cpu"},
                            info=RankInfo(0, 1, 0, 1))


def test_a_missing_span_names_it_and_its_rank():
    spans = bridge_spans(CONTRACT, 5)
    vec = {"bridged": [0.1], "raw": [0.2], "fit": {}}
    shares = [{s: vec for s in spans[0::2]}, {s: vec for s in spans[1::2]}]
    assert set(merge_shares(spans, shares)) == set(spans)
    del shares[1][spans[1]]
    with pytest.raises(DistributedError, match=rf"pair {tuple(spans[1])} of rank 1's share is missing".replace(
            "(", r"\(").replace(")", r"\)")):
        merge_shares(spans, shares)


def test_distributed_entry_point_parses_bridge_and_refuses_a_sublayer_unit(stories_path, tmp_path, capsys):
    from swapkl.commands.distributed import main

    rc = main(["bridge", str(stories_path), "--unit", "mlp", "--device", "cpu"])
    assert rc == 2 and "error (rank 0): 'bridge' works on whole blocks only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bridge", str(stories_path), "--form", "nope"])


def test_bridge_distributed_cli_without_torchrun_equals_bridge(cli, stories_path, tmp_path):
    flags = ["--pairs", "adjacent", "--prompts", "2", "--tokens", "16", "--calib-tokens", "128", "--calib-window", "32",
             "--form", "residual", "--device", "cpu", "--no-cache"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    rc, so, se = cli("bridge-distributed", stories_path, *flags, "--json", one)
    assert rc == 0, se
    spans = len(bridge_spans(CONTRACT, 5))
    assert f"rank 0 on cpu: {spans} of its {spans} spans computed" in so and "bridge form=residual" in so
    rc, _, se = cli("bridge", stories_path, *flags, "--json", two)
    assert rc == 0, se
    _assert_same(BridgedResult.from_json(one), BridgedResult.from_json(two))
