"""A user's family description (:mod:`swapkl.model.user_family`): accepted for a model only when the generic
fallback's own checks pass on it, then what ``locate`` finds for that model, scoring as the fallback does; refused in
one line when it does not describe the model or is malformed; the CLI's ``--family FILE`` end to end."""
from __future__ import annotations

import json

import pytest
import torch

from swapkl.model.architectures import locate
from swapkl.model.families import UnsupportedArchitecture
from swapkl.model.knowledge import KnowledgeError
from swapkl.model.tiny import tiny_model
from swapkl.model.user_family import parse_description, read_description, register_family

#: StableLM is not in the family table (the generic fallback finds it); this describes it as a listed family would
STABLELM = {"name": "stablelm-by-hand", "blocks": "model.layers", "final_norm": "model.norm", "head": "lm_head",
        "embed": "model.embed_tokens", "layer_idx_attrs": ["self_attn.layer_idx", "layer_idx"],
        "num_layers_keys": ["num_hidden_layers"], "context_keys": ["max_position_embeddings"], "units": "pre-norm",
        "mlp_out": "mlp.down_proj"}


def _stablelm():
    """A tiny StableLM whose norms differ (their weights and biases drawn too, the same each call): a norm that is
    not the final one computes something else."""
    model = tiny_model("stablelm", 3, seed=1)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def stablelm():
    return _stablelm


def test_a_correct_description_is_used_and_scores_as_the_fallback(stablelm):
    from swapkl.contract import pair_list
    from swapkl.model.units import layout_for
    from swapkl.scoring.engine import SwapEngine

    generic, mine = stablelm(), stablelm()
    assert locate(generic).family.generic
    fam = register_family(mine, parse_description(STABLELM, "stablelm.json"))
    loc = locate(mine)
    assert loc.family is fam and fam.name == "stablelm-by-hand" and not fam.generic and fam.model_types == ("stablelm",)
    assert (fam.output, fam.mlp_out, fam.mlp_out_layout) == ("head", "mlp.down_proj", "linear")
    assert layout_for(mine, loc).name == "pre-norm"
    ids = torch.randint(2, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    pairs = pair_list("all", 3)
    for unit in ("block", "attention"):
        got = SwapEngine(mine, ids, unit=unit).sweep(pairs)
        ref = SwapEngine(generic, ids, unit=unit).sweep(pairs)
        for p in pairs:
            for k in ref[p]:
                assert torch.equal(got[p][k], ref[p][k]), (unit, p, k)
        assert min(ref[p][k].mean().item() for p in pairs for k in ref[p]) > 1e-4


def test_an_inline_layout_is_checked_and_used(stablelm):
    from swapkl.model.units import layout_for

    inline = {"attention": {"modules": ["input_layernorm", "self_attn"], "out": ["self_attn.o_proj"], "core": "self_attn"},
              "mlp": {"modules": ["post_attention_layernorm", "mlp"], "out": ["mlp.down_proj"], "core": "mlp"}}
    model = stablelm()
    register_family(model, parse_description({**STABLELM, "units": inline}, "stablelm.json"))
    layout = layout_for(model, locate(model))
    assert layout.name == "user" and layout.mlp.out == ("mlp.down_proj",)
    wrong = {**inline, "attention": {**inline["attention"], "out": ["self_attn.q_proj"]}}  # not its output
    with pytest.raises(UnsupportedArchitecture, match=r"units: a block with both output projections zeroed"):
        register_family(stablelm(), parse_description({**STABLELM, "units": wrong}, "stablelm.json"))


@pytest.mark.parametrize(("change", "says"), [
    ({"final_norm": "model.layers.0.post_attention_layernorm"}, "the output function (head: "
                                                               "model.layers.0.post_attention_layernorm and the head) "
                                                               "does not reproduce the logits"),
    ({"final_norm": "model.nrm"}, "whose modules do not match the 'stablelm-by-hand' family"),
    ({"blocks": "model.embed_tokens"}, "whose modules do not match"),
    ({"blocks": "model.layers.0.mlp"}, "whose modules do not match"),
    ({"num_layers_keys": ["vocab_size"]}, "config says"),
    ({"mlp_out": "mlp.up_proj"}, "mlp_out mlp.up_proj: doubling it does not add its output"),
    ({"mlp_out_layout": "conv1d"}, "mlp_out_layout: mlp.down_proj is linear, not conv1d"),
    ({"embed": "model.wte"}, "embed: the model has no module model.wte"),
    ({"output": "tail", "final_norm": ""}, None),  # the model's own tail after the blocks is its output function too
])
def test_a_wrong_description_is_refused_in_one_line(stablelm, change, says):
    desc = parse_description({**STABLELM, **change}, "stablelm.json")
    model = stablelm()
    if says is None:
        assert register_family(model, desc).output == "tail"
        return
    with pytest.raises(UnsupportedArchitecture) as e:
        register_family(model, desc)
    msg = str(e.value)
    assert msg.startswith("the family in stablelm.json does not describe StableLmForCausalLM (stablelm): ")
    assert says in msg and "\n" not in msg
    assert locate(model).family.generic  # nothing registered: the fallback still decides


@pytest.mark.parametrize(("text", "suffix", "says"), [
    ("{not json", ".json", "fam.json: not JSON"),
    ('{"blocks": "model.layers", "final_norm": "model.norm", "colour": 1}', ".json", "unknown key 'colour'"),
    ('{"blocks": ["model.layers"], "final_norm": "model.norm"}', ".json", "key 'blocks' must be str, not list"),
    ('{"final_norm": "model.norm"}', ".json", "key 'blocks' is missing"),
    ('{"blocks": "model.layers", "final_norm": "model.norm", "units": "post-norm"}', ".json", "key 'units' must name one of"),
    ('{"blocks": "model.layers", "final_norm": "model.norm", "units": {"attention": {}}}', ".json", "units: key 'mlp' is missing"),
    ('{"blocks": "model.layers", "final_norm": "model.norm", "generic": true}', ".json", "key 'generic'"),
    ("[1, 2]", ".json", "a family description is an object, not list"),
    ("blocks: [unclosed", ".yaml", "fam.yaml: not YAML"),
])
def test_a_malformed_file_is_refused_in_one_line_naming_the_key(tmp_path, text, suffix, says):
    path = tmp_path / f"fam{suffix}"
    path.write_text(text)
    with pytest.raises(KnowledgeError) as e:
        read_description(path)
    assert says in str(e.value) and str(e.value).startswith(path.name) and "\n" not in str(e.value)


def test_a_yaml_description_reads_as_the_json_one(tmp_path):
    import yaml

    (tmp_path / "f.yaml").write_text(yaml.safe_dump(STABLELM))
    (tmp_path / "f.json").write_text(json.dumps(STABLELM))
    a, b = read_description(tmp_path / "f.yaml"), read_description(tmp_path / "f.json")
    assert a.family == b.family and a.layout == b.layout and a.family.units == "pre-norm"
    with pytest.raises(KnowledgeError, match="cannot be read"):
        read_description(tmp_path / "missing.json")


def test_the_cli_flag_end_to_end(tmp_path, cli):
    """``swapkl score FOLDER --family FILE`` uses the file's family and gives the fallback's scores; a file that does
    not describe the model is a one-line error."""
    from support.tiny_folder import tiny_checkpoint

    folder = tmp_path / "stablelm"
    tiny_checkpoint("stablelm", folder)
    fam = tmp_path / "stablelm.json"
    fam.write_text(json.dumps(STABLELM))
    args = ("--prompts", "2", "--tokens", "8", "--device", "cpu", "--no-cache")
    runs = {}
    for name, extra in (("user", ("--family", str(fam))), ("generic", ())):
        out = tmp_path / f"{name}.json"
        code, _, err = cli("score", str(folder), *extra, *args, "--json", str(out))
        assert code == 0, err
        runs[name] = json.loads(out.read_text())
    assert runs["user"]["model"]["family"] == "stablelm-by-hand" and runs["generic"]["model"]["family"] == "generic:stablelm"
    assert runs["user"]["replacement"] == runs["generic"]["replacement"]
    assert any(v for row in runs["user"]["replacement"] for v in row if v)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**STABLELM, "blocks": "model.embed_tokens"}))
    code, _, err = cli("score", str(folder), "--family", str(bad), *args)
    assert code != 0 and "the family in bad.json does not describe" in err and "do not match" in err and len(err.strip().splitlines()) == 1


def test_the_dashboard_takes_no_family_file():
    """Only the CLI and the library read a family file: no dashboard module reaches the user-family reader, and the
    dashboard's model loads pass no family."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*(root / "dashboard").glob("*.py"), *(root / "pages").glob("*.py"), root / "app.py",
             *(root / "swapkl" / "jobs").glob("*.py")]
    for f in files:
        text = f.read_text()
        assert "user_family" not in text and "family=" not in text and "--family" not in text, f
