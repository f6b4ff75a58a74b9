"""The registry is the one list of methods and of what each supports: units, variants, calibration.  The queries
are checked against the METHODS literals read straight from the files; each calibration method reads the count a
run asks for (or its registered default) and records it in its settings and the result's caption."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from swapkl.contract import UNITS
from swapkl.errors import ContractError, SwapklError
from swapkl.removal import methods as M
from swapkl.removal.methods import base

METHOD_DIR = Path(M.__file__).parent


def literals() -> dict[str, dict]:
    """Every method declared in a METHODS literal of the package, read with ast (no registry involved)."""
    out = {}
    for f in sorted(METHOD_DIR.glob("*.py")):
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "METHODS" for t in node.targets):
                out.update({d["name"]: d for d in ast.literal_eval(node.value)})
    return out


def test_every_declared_method_is_registered_with_its_capabilities():
    lit = literals()
    assert len(lit) >= 14 and set(lit) <= set(M.available())
    for name, d in lit.items():
        spec = M.get(name)
        want_units = UNITS if d.get("units") == "any" else tuple(d.get("units", ("block",)))
        assert spec.units == want_units, name
        assert spec.variants == tuple(d.get("variants") or (("runs",) if d.get("runs") else ("sets",))), name
        assert spec.calibration == d.get("calibration"), name
        assert set(spec.variants) <= set(M.VARIANTS)


def test_which_methods_remove_sublayers():
    lit = literals()
    plain = tuple(s.name for s in M.specs() if lit.get(s.name, {}).get("units") == "any")
    assert set(plain) == {"replacement", "interchange", "anti-replacement", "anti-interchange", "random", "bi",
                          "sleb", "recommend"}
    for unit in ("attention", "mlp"):
        assert M.unit_methods(unit) == plain
        assert M.for_unit(["cka", "bi", "laco", "sleb", "mix", "nope"], unit) == ["bi", "sleb"]
    assert M.unit_methods("block") == tuple(s.name for s in M.specs())
    assert M.supports("anti", "mlp") and not M.supports("cka", "attention") and not M.supports("nope", "block")
    with pytest.raises(ContractError, match="unknown unit"):
        M.supports("bi", "ffn")


def test_what_each_method_returns():
    assert M.get("random").variants == ("runs",) and M.get("random").seeded
    assert M.get("laco").variants == ("merge",)
    assert M.get("mix").variants == M.get("mix-guided").variants == ("units",)
    assert all(M.get(n).variants == ("sets",) for n in ("replacement", "bi", "sleb", "angular", "recommend"))
    doc = base.__doc__
    for v in M.VARIANTS:  # the interface documents every variant a method may return
        assert f'``"{v}"``' in doc, v


def test_calibration_methods_and_their_defaults():
    lit = literals()
    want = tuple(s.name for s in M.specs() if "calibration" in lit.get(s.name, {}))
    assert M.calibration_methods() == want
    assert set(want) == {"bi", "cka", "angular", "sleb", "taylor", "recommend", "mix", "bridge", "bridge-joint",
                         "replaceme"}
    assert {n: M.get(n).calibration for n in want} == {"bi": 2048, "cka": 2048, "angular": 2048, "sleb": 1024,
                                                       "taylor": 1024, "recommend": 1024, "mix": 1024,
                                                       "bridge": 8192, "bridge-joint": 8192, "replaceme": 2048}


def test_calibration_params_maps_one_count_to_every_calibration_method():
    names = ["replacement", "bi", "cka", "angular", "sleb", "taylor", "mix", "recommend", "laco", "anti", "nope"]
    assert M.calibration_params(300, names) == {n: {"calib_tokens": 300} for n in
                                                ("bi", "cka", "angular", "sleb", "taylor", "mix", "recommend")}
    assert M.calibration_params(None, ["bi", "sleb", "random"]) == {"bi": {"calib_tokens": 2048},
                                                                    "sleb": {"calib_tokens": 1024}}
    assert M.calibration_params(64, ["anti", "mix-guided"]) == {}
    for bad in (15, 0, -5, 3.5, True, "64"):
        with pytest.raises(SwapklError, match="^--calib-tokens must be an integer of at least 16"):
            M.calibration_params(bad, ["bi"])


def test_calib_tokens_reads_params_else_the_default():
    class Ctx:
        def __init__(self, params):
            self.params = params

        def param(self, m, k, d):
            return self.params.get(m, {}).get(k, d)

    assert M.calib_tokens(Ctx({}), "taylor") == 1024
    assert M.calib_tokens(Ctx({"taylor": {"calib_tokens": 77}}), "taylor") == 77
    assert M.calib_tokens(Ctx({"taylor": {"calib_tokens": None}}), "angular") == 2048


def test_registering_a_method_checks_its_capabilities():
    try:
        M.register("caps-any", units="any", calibration=32, target="x:y")
        assert M.get("caps-any").units == UNITS and M.get("caps-any").calibrated
        M.register("caps-seeded", runs=3, target="x:y")
        assert M.get("caps-seeded").variants == ("runs",)
        for kw, msg in (({"units": ["ffn"]}, "unknown unit 'ffn'"), ({"variants": ["prune"]}, "variants"),
                        ({"variants": ["runs"]}, "seeded"), ({"runs": 2, "variants": ["sets"]}, "seeded"),
                        ({"calibration": 8}, "calibration")):
            with pytest.raises(SwapklError, match=f"^method caps-bad: .*{msg}"):
                M.register("caps-bad", target="x:y", **kw)
        assert M.find("caps-bad") is None
    finally:
        for n in ("caps-any", "caps-seeded"):
            M._REGISTRY.pop(n, None)


def test_one_refusal_for_methods_that_do_not_remove_the_unit():
    with pytest.raises(ContractError) as e:
        M.refuse_other_units(["bi", "cka", "taylor"], "mlp")
    assert str(e.value) == ("method(s) cka, taylor remove whole blocks only; for --unit mlp choose from: "
                            + ", ".join(M.unit_methods("mlp")))
    M.refuse_other_units(["bi", "sleb", "anti"], "attention")  # all apply: nothing raised


def test_no_second_list_of_unit_methods():
    import swapkl.removal.units as U

    assert not hasattr(U, "UNIT_METHODS")
    for f in Path(M.__file__).parents[2].rglob("*.py"):
        assert "UNIT_METHODS" not in f.read_text(encoding="utf-8"), f


def test_calibration_caption():
    info = {"bi": {"settings": {"calib_tokens": 512}}, "sleb": {"settings": {"calib_tokens": 512}},
            "replacement": {"settings": {"protocol": "replacement"}}}
    assert M.calibration_caption(info) == "calibration 512 tokens"
    info["taylor"] = {"settings": {"calib_tokens": 1024}}
    assert M.calibration_caption(info) == "calibration tokens: bi 512, sleb 512, taylor 1024"
    assert M.calibration_caption({"random": {"settings": {}}}) is None and M.calibration_caption({}) is None
    hostile = {"bi": {"settings": {"calib_tokens": float("inf")}}, "sleb": {"settings": {"calib_tokens": float("nan")}},
               "cka": {"settings": {"calib_tokens": True}}, "taylor": {"settings": ["x"]}, "mix": "x",
               "angular": {"settings": {"calib_tokens": 2.5}}, "recommend": {"settings": {"calib_tokens": 10 ** 30}}}
    assert M.calibration_caption(hostile) is None  # a file from outside never breaks a caption


# ---- on a tiny model: the count each calibration method reads and records

@pytest.fixture(scope="module")
def tiny(stories_path, wikitext_path):
    import transformers as tf

    from swapkl.scoring.corpora import from_file

    return (tf.AutoModelForCausalLM.from_pretrained(stories_path).eval(),
            tf.AutoTokenizer.from_pretrained(stories_path), from_file(wikitext_path))


class CountingContext(M.MethodContext):
    """A context that records every calibration read: (tokens asked, tokens returned)."""

    def calib_ids(self, max_tokens: int = 2048):
        ids = super().calib_ids(max_tokens)
        self.reads.append((int(max_tokens), int(ids.numel())))
        return ids


def run_method(tiny, name, params):
    from swapkl.measure.evaluate import Evaluator
    from swapkl.measure.memo import EvalMemo

    model, tok, corpus = tiny
    ctx = CountingContext(model=model, tokenizer=tok, scores={}, num_layers=5, candidates=[1, 2, 3], spacing=1,
                          partners=None, corpus=corpus, evaluator=Evaluator("tiny", 200, 128, 64), seeds=[0],
                          memo=EvalMemo(), params=params)
    ctx.reads = []
    return M.get(name).func(ctx, 1), ctx.reads


@pytest.mark.parametrize("name", ["bi", "cka", "angular", "sleb", "taylor", "mix", "recommend"])
def test_each_calibration_method_reads_and_records_the_count_asked(tiny, name):
    from swapkl.removal.methods.recommended import SEED_METHODS

    n = 256  # two of the evaluator's 128-token windows: angular's whole windows hold all of it too
    # the recommendation's seeds are methods too: the caller maps the count to them as well (as the CLI does)
    out, reads = run_method(tiny, name, M.calibration_params(n, [name, *(SEED_METHODS if name == "recommend" else ())]))
    assert reads and out.settings["calib_tokens"] == n
    assert all(got == n for asked, got in reads if asked == n)
    if name == "recommend":  # the search's region 0, and the rule's further regions (2N, 3N: docs/recommend-rule.md)
        assert {asked for asked, _ in reads} <= {n, 2 * n, 3 * n}
    else:
        assert {asked for asked, _ in reads} == {n}


@pytest.mark.parametrize("name", ["bi", "angular", "taylor"])
def test_without_a_count_each_method_reads_its_registered_default(tiny, name):
    out, reads = run_method(tiny, name, {})
    default = M.get(name).calibration
    assert {asked for asked, _ in reads} == {default}
    got = reads[0][1]  # the corpus holds at least this much calibration text
    want = got - got % 128 if name == "angular" else got  # angular: whole evaluator windows
    assert got == default and out.settings["calib_tokens"] == want == default


def test_the_count_reaches_the_result_and_its_caption(tiny):
    from swapkl.removal.curves import removal_curves
    from swapkl.measure.evaluate import Evaluator
    from swapkl.removal.plan import RemovalPlan, RunHooks

    model, tok, corpus = tiny
    names = ["taylor", "sleb"]
    plan = RemovalPlan(budget=1, methods=tuple(names), evaluator=Evaluator("tiny", 200, 128, 64), kl=False,
                       calib_tokens=192)
    assert {m: plan.method_params[m]["calib_tokens"] for m in names} == {"taylor": 192, "sleb": 192}
    r = removal_curves(model, tok, None, plan, RunHooks(corpus=corpus))
    assert {m: r.method_info[m]["settings"]["calib_tokens"] for m in names} == {"taylor": 192, "sleb": 192}
    assert "calibration 192 tokens" in r.provenance().extra
    from swapkl.views.captions import contract_caption

    assert "calibration 192 tokens" in contract_caption(r.provenance())


# ---- the command line: --calib-tokens reaches every calibration method of a run

@pytest.mark.parametrize("command", [["curves", "--budget", "1"], ["recommend", "--budget", "1"],
                                     ["evidence", "--budget", "1"]])
def test_too_few_calibration_tokens_is_one_line_before_any_work(cli, stories_path, command):
    rc, out, err = cli(command[0], stories_path, *command[1:], "--calib-tokens", "8")
    assert rc == 2 and err.strip().splitlines() == [
        "error: --calib-tokens must be an integer of at least 16 (got 8)"], err


def test_curves_cli_gives_every_calibration_method_the_count(cli, stories_path, tmp_path):
    import json

    out = tmp_path / "curves.json"
    rc, so, se = cli("curves", stories_path, "--budget", "1", "--methods", "replacement,taylor,angular,cka",
                     "--max-words", "300", "--calib-tokens", "512", "--prompts", "2", "--tokens", "16", "--no-kl",
                     "--device", "cpu", "--quiet", "--json", out)
    assert rc == 0, se
    d = json.loads(out.read_text())
    used = {m: d["method_info"][m]["settings"].get("calib_tokens") for m in d["method_info"]}
    assert used == {"replacement": None, "taylor": 512, "angular": 512, "cka": 512}  # angular: one 512-token window
    from swapkl.removal.curves import CurvesResult

    assert "calibration 512 tokens" in CurvesResult.from_json(out).provenance().extra
