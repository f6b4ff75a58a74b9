"""The architecture knowledge as data (``swapkl/model/data/*.json`` through :mod:`swapkl.model.knowledge`): every
table says what it holds and who reads it, parses into the module-level names the code had (tuples stay tuples,
dicts of dataclasses stay so) whose entries all construct and agree with each other and with real models, a
malformed table is refused in one line naming the file and the key, and the wheel ships every table."""
from __future__ import annotations

import fnmatch
import importlib
import json
import tomllib
from pathlib import Path
from types import MappingProxyType

import pytest

from swapkl.model import knowledge
from swapkl.model.knowledge import KnowledgeError

ROOT = Path(__file__).resolve().parents[2]
TABLES = sorted(p.stem for p in knowledge.DATA.glob("*.json"))


def test_the_tables_are_the_ones_the_loader_documents():
    assert TABLES == ["config_keys", "families", "generic", "layouts", "support", "tiny"]
    doc = knowledge.__doc__
    for name in TABLES:
        assert f"``{name}.json``" in doc


@pytest.mark.parametrize("name", TABLES)
def test_every_table_says_what_it_holds_and_its_readers_read_it_through_the_loader(name):
    t = knowledge.table(name)
    assert isinstance(t, MappingProxyType)
    readers = [w.rstrip(".,;:)") for w in t["about"].split() if w.startswith("swapkl.")]
    assert readers, f"{name}.json's about names no module"
    for mod in readers:
        path = ROOT / (mod.replace(".", "/") + ".py")
        assert path.is_file(), f"{name}.json names {mod}, which is no module"
    readers = [m for m in readers if "knowledge" in (ROOT / (m.replace(".", "/") + ".py")).read_text()]
    assert readers, f"no module {name}.json names reads it through swapkl.model.knowledge"
    with pytest.raises(TypeError):
        t["about"] = "changed"  # immutable
    assert knowledge.table(name) is t  # parsed once


def test_frozen_and_thawed_round_trip_json():
    raw = {"a": [1, {"b": [2, "c"]}], "d": {}}
    f = knowledge.frozen(raw)
    assert f["a"] == (1, MappingProxyType({"b": (2, "c")}))
    assert knowledge.thawed(f) == raw and json.dumps(knowledge.thawed(f)) == json.dumps(raw)


def test_families_construct_with_the_types_the_code_had():
    from swapkl.model.families import FAMILIES, Family
    from swapkl.model.layouts import LAYOUTS
    from swapkl.model.outputs import OUTPUTS

    assert isinstance(FAMILIES, tuple) and [f.name for f in FAMILIES] == ["llama", "gpt_neox", "gpt2"]
    types = [t for f in FAMILIES for t in f.model_types]
    assert len(types) == len(set(types))
    assert {"llama", "mistral", "qwen2", "qwen3", "gpt_neox", "gpt2"} <= set(types)
    for f in FAMILIES:
        assert isinstance(f, Family) and not f.generic
        for name in ("model_types", "layer_idx_attrs", "num_layers_keys", "per_layer_keys", "context_keys"):
            assert isinstance(getattr(f, name), tuple) and all(isinstance(s, str) for s in getattr(f, name))
        assert f.units in LAYOUTS and f.output in OUTPUTS and f.mlp_out
    assert dict((f.name, f.mlp_out_layout) for f in FAMILIES) == {"llama": "linear", "gpt_neox": "linear",
                                                                  "gpt2": "conv1d"}


def test_layouts_construct_as_a_dict_of_dataclasses():
    from swapkl.model.layouts import LAYOUTS, SublayerSpec, UnitLayout

    assert type(LAYOUTS) is dict and list(LAYOUTS) == ["sandwich", "pre-norm", "gpt-neox", "gpt2", "opt"]
    for name, layout in LAYOUTS.items():
        assert isinstance(layout, UnitLayout) and layout.name == name and layout.notes
        for unit in (layout.attention, layout.mlp):
            assert isinstance(unit, SublayerSpec)
            assert all(isinstance(x, tuple) for x in (unit.modules, unit.out, unit.shared))
            assert unit.core in unit.modules or any(o.startswith(unit.core) for o in unit.out)


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "gpt2"])
def test_each_family_names_modules_a_model_has_and_the_one_layout_helper_agrees(kind):
    """The family table's paths and its layout exist on a tiny model of the family; the MLP output's weight layout
    in the table is what :func:`swapkl.model.projections.weight_layout` says of the module."""
    from conftest import tiny_model

    from swapkl.model.architectures import get_path, locate
    from swapkl.model.layouts import LAYOUTS
    from swapkl.model.projections import weight_layout
    from swapkl.model.units import validate_layout

    model = tiny_model(kind, num_layers=2)
    loc = locate(model)
    fam = loc.family
    assert get_path(model, fam.embed) is not None
    assert weight_layout(get_path(loc.blocks[0], fam.mlp_out)) == fam.mlp_out_layout
    assert validate_layout(model, loc.blocks, LAYOUTS[fam.units]) is None


def test_generic_spellings_are_unique_tuples_that_cover_the_listed_families():
    from swapkl.model import discovery, unit_discovery
    from swapkl.model.families import FAMILIES

    names = ("GENERIC_BLOCK_PATHS", "GENERIC_NORM_NAMES", "GENERIC_LAYER_IDX", "GENERIC_LAYER_KEYS",
             "GENERIC_CONTEXT_KEYS", "KV_SHARING_KEYS", "LOGIT_MODIFIERS", "GENERIC_MLP_OUTS")
    for name in names:
        value = getattr(discovery, name)
        assert isinstance(value, tuple) and value and len(set(value)) == len(value), name
    for name in ("ATTENTION_WORDS", "MLP_WORDS", "EXPERT_OUTS"):
        assert isinstance(getattr(unit_discovery, name), tuple) and getattr(unit_discovery, name)
    for f in FAMILIES:
        assert f.blocks in discovery.GENERIC_BLOCK_PATHS and f.mlp_out in discovery.GENERIC_MLP_OUTS
        assert f.final_norm.rpartition(".")[2] in discovery.GENERIC_NORM_NAMES
        assert set(f.layer_idx_attrs) <= set(discovery.GENERIC_LAYER_IDX)
        assert set(f.context_keys) <= set(discovery.GENERIC_CONTEXT_KEYS)
    assert discovery.GENERIC_BLOCK_PATHS[0] == "model.layers"


def test_config_keys_have_the_types_the_code_had():
    from swapkl.model import config_cut as c
    from swapkl.surgery.reload_form import TIE_ATTRS

    for name in ("LAYER_COUNT_KEYS", "INDEX_LISTS", "PREFIX_COUNTS", "CYCLES", "INDEX_DICTS", "INDEX_KEYED_ATTRS"):
        value = getattr(c, name)
        assert isinstance(value, tuple) and value and all(isinstance(s, str) for s in value), name
    assert type(c.COUNT_SCALED) is dict and c.COUNT_SCALED == {"scale_depth": 0.5}
    assert type(c.READ_BY) is dict and c.READ_BY == {"store_full_length_kv": "is_kv_shared_layer"}
    assert type(c.BUILD_ONLY) is dict and all(isinstance(v, tuple) and v for v in c.BUILD_ONLY.values())
    assert all(k.count(".") == 1 for k in c.BUILD_ONLY)
    assert isinstance(c.INDEX_ATTRS, frozenset) and "layer_idx" in c.INDEX_ATTRS
    assert isinstance(c.PERIODIC, tuple) and all(
        isinstance(k, tuple) and 1 <= len(k) <= 2 and form in ("mod", "step") and isinstance(e, str)
        for k, form, e in c.PERIODIC)
    assert ("sliding_window_pattern",) in [k for k, _, _ in c.PERIODIC]
    assert TIE_ATTRS == ("_tied_weights_keys", "all_tied_weights_keys")
    from swapkl.model.discovery import GENERIC_LAYER_KEYS

    assert set(GENERIC_LAYER_KEYS) <= set(c.LAYER_COUNT_KEYS)


def test_the_config_cut_still_follows_the_tables():
    """A rule read from the table acts: an index list renumbered, a prefix count cut, a periodic key re-fitted."""
    from swapkl.model.config_cut import cut_dict

    d = {"num_hidden_layers": 6, "mlp_only_layers": [1, 4], "first_k_dense_replace": 2, "decoder_sparse_step": 2,
         "scale_depth": 1.0}
    cut_dict(d, [1, 3, 5], 6)  # every kept layer was an every-second-layer one: the step becomes 1
    assert d["mlp_only_layers"] == [0] and d["first_k_dense_replace"] == 1 and d["num_hidden_layers"] == 3
    assert d["decoder_sparse_step"] == 1 and d["scale_depth"] == pytest.approx((3 / 6) ** 0.5)


def test_tiny_sizes_are_the_types_the_code_had():
    from swapkl.model import tiny
    from swapkl.model.config_cut import LAYER_COUNT_KEYS

    assert type(tiny.SIZES) is dict and isinstance(tiny.FILL_NONE, frozenset) and type(tiny.TOKEN_IDS) is dict
    assert {k for k, v in tiny.SIZES.items() if v == "L"} <= set(LAYER_COUNT_KEYS)
    assert all(isinstance(v, (int, float)) for v in tiny.SIZES.values() if v != "L")
    assert tiny.FILL_NONE <= set(tiny.SIZES)
    assert max(tiny.TOKEN_IDS.values()) < tiny.SIZES["vocab_size"]
    assert set(tiny.not_decoder_only()) and all(isinstance(r, str) and r for r in tiny.not_decoder_only().values())


@pytest.mark.parametrize(("text", "says"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"block_paths": ["model.layers"]}', "key 'about'"),
    ('{"about": "x", "block_paths": "model.layers"}', "key 'block_paths' must be a list of non-empty strings"),
    ('{"about": "x"}', "key 'block_paths' is missing"),
])
def test_a_malformed_table_is_refused_in_one_line_naming_file_and_key(tmp_path, monkeypatch, text, says):
    (tmp_path / "generic.json").write_text(text)
    monkeypatch.setattr(knowledge, "DATA", tmp_path)
    knowledge.table.cache_clear()
    try:
        with pytest.raises(KnowledgeError) as e:
            knowledge.strings("generic", "block_paths")
    finally:
        knowledge.table.cache_clear()
    assert str(e.value).startswith("generic.json: ") and says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("entry", "says"), [
    ({"name": "x", "model_types": ["x"], "blocks": "model.layers", "final_norm": "model.norm", "colour": "red"},
     "unknown key 'colour'"),
    ({"name": "x", "model_types": "x", "blocks": "model.layers", "final_norm": "model.norm"},
     "key 'model_types' must be a list of non-empty strings"),
    ({"name": "x", "model_types": ["x"], "blocks": 3, "final_norm": "model.norm"}, "key 'blocks' must be str"),
    ({"name": "x", "model_types": ["x"], "blocks": "model.layers"}, "key 'final_norm' is missing"),
    ({"name": "x", "model_types": ["x"], "blocks": "b", "final_norm": "n", "block_tuple": True}, "key 'block_tuple'"),
    ({"name": "x", "model_types": ["x"], "blocks": "b", "final_norm": "n", "mlp_out_layout": "fused"},
     "key 'mlp_out_layout' must be one of linear, conv1d"),
    ({"name": "x", "model_types": ["x"], "blocks": "b", "final_norm": "n", "output": "softmax"}, "key 'output'"),
])
def test_a_malformed_family_entry_is_refused_in_one_line_naming_the_key(entry, says):
    from swapkl.model.families import family_from

    with pytest.raises(KnowledgeError) as e:
        family_from(entry, "families.json: families[0]")
    assert str(e.value).startswith("families.json: families[0]: ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_a_malformed_layout_is_refused_in_one_line_naming_the_key():
    from swapkl.model.layouts import layout_from

    good = {"modules": ["ln", "attn"], "out": ["attn.o"], "core": "attn"}
    with pytest.raises(KnowledgeError, match=r"^l: key 'mlp' is missing$"):
        layout_from("x", {"attention": good}, "l")
    with pytest.raises(KnowledgeError, match=r"^l\.mlp: key 'out' must be a list"):
        layout_from("x", {"attention": good, "mlp": {**good, "out": []}}, "l")
    with pytest.raises(KnowledgeError, match=r"^l\.attention: unknown key 'norm'"):
        layout_from("x", {"attention": {**good, "norm": "ln"}, "mlp": good}, "l")
    assert layout_from("x", {"attention": good, "mlp": good}, "l").mlp.core == "attn"


def test_the_wheel_ships_every_table():
    """pyproject's package data takes every file of swapkl/model/data (so ``pip install`` has the tables), and no
    module reads a data file from elsewhere in the package."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = conf["package-data"]["swapkl.model"]
    assert "swapkl*" in conf["packages"]["find"]["include"]
    for p in knowledge.DATA.iterdir():
        assert any(fnmatch.fnmatch(f"data/{p.name}", pat) for pat in patterns), p.name
    assert importlib.import_module("swapkl.model.supported").SUPPORT_FILE.parent == knowledge.DATA
