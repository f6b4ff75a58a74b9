"""``prune --repair bridge``: the folded bridged folder reloads with stock transformers and equals swapkl's bridged
model; its provenance; the ΔPPL gate; refusals (one line, nothing written)."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import WIKITEXT
from swapkl.repair.bridge import Bridge, bridged_model
from swapkl.repair.calibration import CalibrationText, fit_bridges
from swapkl.repair.export import BRIDGE_FILE, save_bridged

COMMON = ["--calib-tokens", "512", "--calib-window", "64", "--max-words", "1500", "--eval-text", str(WIKITEXT),
          "--device", "cpu"]


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "gpt2", "qwen3"])
def test_folded_export_reloads_equal_every_family(kind, tmp_path):
    from conftest import tiny_model

    model = tiny_model(kind)
    calib = CalibrationText(torch.randint(1, 96, (6, 16), generator=torch.Generator().manual_seed(0)), [], {})
    fits = fit_bridges(model, calib, [(1, 3)], "folded", ridge=1e-3)
    out = save_bridged(model, [fits[(1, 3)]], tmp_path / "m", provenance={"note": "t"})
    back = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(1, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = bridged_model(model, [fits[(1, 3)]])(input_ids=ids, use_cache=False).logits
        got = back(input_ids=ids, use_cache=False).logits
    assert back.config.num_hidden_layers == 2
    assert (want - got).abs().max() <= 1e-4 * want.abs().max()
    prov = json.loads((out / BRIDGE_FILE).read_text())
    assert prov["removed"] == [1, 2] and prov["bridges"][0]["form"] == "folded" and prov["note"] == "t"


def test_no_exact_fold_writes_nothing(tmp_path):
    from conftest import tiny_model

    from swapkl.errors import SwapklError

    from swapkl.model.tiny import tiny_model as tiny_of

    gemma2 = tiny_of("gemma2")  # a norm after each MLP output projection: no exact fold
    model = tiny_model("llama")
    for m, br, why in ((model, Bridge(0, 1, "folded", None), "starts at block 0"),
                       (model, Bridge(1, 2, "residual", None), "residual form"),
                       (gemma2, Bridge(1, 2, "folded", None), "generic:gemma2 family has no MLP output projection")):
        with pytest.raises(SwapklError, match=why) as e:
            save_bridged(m, [br], tmp_path / "m")
        assert "\n" not in str(e.value)
        assert not (tmp_path / "m").exists()


def test_prune_repair_bridge_cli(cli, stories_path, tmp_path):
    out = tmp_path / "bridged"
    rc, so, se = cli("prune", stories_path, "--remove", "2,3", "--repair", "bridge", "--out", out, "--verify", *COMMON)
    assert rc == 0, se
    assert "verified: the reloaded folder's logits equal swapkl's bridged model" in so
    prov = json.loads((out / BRIDGE_FILE).read_text())
    h = prov["heldout"]
    assert h["delta_ppl_pct_bridged"] < h["delta_ppl_pct_raw"]  # the bridge repairs (stories260K)
    assert prov["contract"]["calibration"]["tokens"] == 512 and prov["contract"]["bridge"]["form"] == "folded"
    fit = prov["bridges"][0]
    assert fit["span"] == [2, 4] and fit["tokens"] == 512 and fit["eps"] > 0 and 0 < fit["residual"] < 1
    record = json.loads((out / "swapkl_prune.json").read_text())
    assert record["removed"] == [2, 3] and record["repair"]["kind"] == "bridge"
    # the gate: above the threshold nothing is written and the figure is said
    gated = tmp_path / "gated"
    rc, so, se = cli("prune", stories_path, "--remove", "2,3", "--repair", "bridge", "--out", gated,
                     "--max-ppl-increase", "0.001", *COMMON)
    assert rc != 0 and not gated.exists()
    assert f"{h['delta_ppl_pct_bridged']:+.2f} %" in se and "--max-ppl-increase" in se


def test_prune_repair_refusals(cli, stories_path, tmp_path):
    out = tmp_path / "x"
    rc, so, se = cli("prune", stories_path, "--remove", "0,1", "--repair", "bridge", "--out", out, *COMMON)
    assert rc != 0 and "starts at block 0" in se and not out.exists()
    rc, so, se = cli("prune", stories_path, "--remove", "2", "--repair", "bridge", "--form", "residual", "--out", out)
    assert rc != 0 and "folded form only" in se and not out.exists()
    rc, so, se = cli("prune", stories_path, "--remove", "2", "--max-ppl-increase", "5", "--out", out)
    assert rc != 0 and "goes with --repair bridge" in se
