"""swapkl.schema: result, curves and scores files from outside are validated before anything is built from them.

One test per failure reproduced on stories260K-shaped files (each asserts the one-line message names the field and
that validating allocated next to nothing), round trips of the project's own outputs, a property-based test that
feeds thousands of generated and mutated files to the readers (only UploadError may escape, memory stays bounded),
and the same through the dashboard's job manager and the CLI.
"""
from __future__ import annotations

import copy
import json
import os
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from swapkl import schema
from swapkl.errors import SwapklError, UploadError
from swapkl.removal.curves import CurvesResult
from swapkl.scoring.results import SwapResult
from swapkl.removal.plan import RemovalPlan, RunHooks

PEAK_LIMIT = 8 * 2 ** 20  # bytes: most any one read of a stories260K-sized (< 40 kB) file may allocate


# ============================================================================================ fixtures
@pytest.fixture(scope="module")
def real(stories_path, wikitext_path):
    """A real result (all 10 pairs, 3 prompts x 16 tokens) and real removal curves of stories260K, as the JSON
    text the project writes (``score --json``, ``curves --json``)."""
    from swapkl.scoring.score import score
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.contract import Contract
    from swapkl.scoring.corpora import from_file
    from swapkl.measure.evaluate import Evaluator
    from swapkl.measure.memo import EvalMemo
    from swapkl.removal.curves import removal_curves

    ck = load_checkpoint(str(stories_path), device="cpu")
    corpus = from_file(wikitext_path)
    res = score(ck, Contract(pairs="all", prompts=3, tokens=16, corpus=str(wikitext_path), device="cpu"),
                use_cache=False)
    scores = {"replacement": res.replacement(), "interchange": res.interchange()}
    curves = removal_curves(ck.model, ck.tokenizer, scores, RemovalPlan(budget=2, methods=["replacement", "interchange", "random", "anti", "bi"], evaluator=Evaluator("tiny", 200, 128, 64), method_params={"bi": {"calib_tokens": 128}}),
                            RunHooks(corpus=corpus, memo=EvalMemo(), identity=ck.identity))
    return _Files(result=res.to_json(), curves=curves.to_json(), res=res, cv=curves)


class _Files(dict):
    """The real files; a short repr for hypothesis' falsifying-example report."""

    def __repr__(self) -> str:
        return "<stories260K result and curves files>"


def result_doc(real) -> dict:
    return json.loads(real["result"])


def rejected(fn, *args, **kw) -> tuple[str, int]:
    """Call ``fn``, which must raise UploadError; return (message, tracemalloc peak in bytes)."""
    tracemalloc.start()
    try:
        with pytest.raises(UploadError) as ei:
            fn(*args, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(ei.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg, peak


def mutated(doc: dict, path: tuple, value=None, delete: bool = False) -> str:
    d = copy.deepcopy(doc)
    node = d
    for k in path[:-1]:
        node = node[k]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(d)


# ============================================================================================ reproduced cases
@pytest.mark.parametrize("value, message", [
    (10 ** 9, "num_layers = 1000000000 is outside 1..1024"),
    (-5, "num_layers = -5 is outside 1..1024"),
    (0, "num_layers = 0 is outside 1..1024"),
    ("5", 'num_layers = "5" is not an integer'),
    (10 ** 400, "num_layers = a 401-digit integer is outside 1..1024"),
])
def test_num_layers_bounded_before_anything_is_built(real, value, message):
    """10**9 layers made the start page build a 10**9-pair list (5.2 GB); <= 0 crashed with negative dimensions."""
    msg, peak = rejected(SwapResult.from_json, mutated(result_doc(real), ("num_layers",), value))
    assert msg == f"result file: {message}"
    assert peak < 1 * 2 ** 20


def test_negative_pair_index_is_refused(real):
    """(-1, 2) was accepted and showed a wrong value at [4][2] (Python's negative indexing)."""
    doc = result_doc(real)
    k = doc["pairs"].index([1, 2])
    doc["pairs"][k] = [-1, 2]
    msg, peak = rejected(SwapResult.from_json, json.dumps(doc))
    assert msg == f"result file: pairs[{k}] = (-1, 2) is outside 0..4"
    assert peak < 1 * 2 ** 20


@pytest.mark.parametrize("pair, problem", [([2, 99], "(2, 99) is outside 0..4"), ([3, 1], "(3, 1) is not ordered"),
                                           ([1, "2"], '[1, "2"] is not a pair'), ([0, 1], "(0, 1) is listed twice")])
def test_bad_pairs(real, pair, problem):
    doc = result_doc(real)
    doc["pairs"][3] = pair
    msg, _ = rejected(SwapResult.from_json, json.dumps(doc))
    assert msg.startswith(f"result file: pairs[3] = {problem}"), msg


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_tokens_name_their_field(real, token):
    """Python's json reads NaN/Infinity; the pages then crashed ("Out of range float values are not JSON
    compliant: nan")."""
    text = real["result"].replace('"noise_floor": 0.0', f'"noise_floor": {token}', 1)
    assert token in text
    msg, _ = rejected(SwapResult.from_json, text)
    assert msg == f"result file: noise_floor = {token} is not a finite number (JSON has no NaN or Infinity)"
    doc = result_doc(real)
    doc["per_prompt"]["interchange"]["1,2"][1] = float("nan")
    msg, _ = rejected(SwapResult.from_json, json.dumps(doc))
    assert msg.startswith('result file: per_prompt.interchange["1,2"][1] = NaN is not a finite number')
    # 1e999 is a valid JSON number that Python reads as inf
    msg, _ = rejected(SwapResult.from_json, real["result"].replace('"noise_floor": 0.0', '"noise_floor": 1e999'))
    assert msg == "result file: noise_floor = Infinity is not a finite number"
    # the strict reader (no validator after it) refuses the token itself
    msg, _ = rejected(schema.parse_json, '{"a": NaN}', "f")
    assert msg.startswith("f: NaN is not a JSON number")


def test_string_noise_floor(real):
    msg, _ = rejected(SwapResult.from_json, mutated(result_doc(real), ("noise_floor",), "0.001"))
    assert msg == 'result file: noise_floor = "0.001" is not a number or null'


def test_missing_and_ragged_per_prompt_entries(real):
    doc = result_doc(real)
    msg, _ = rejected(SwapResult.from_json, mutated(doc, ("per_prompt", "replacement_directed", "3,2"), delete=True))
    assert msg == 'result file: per_prompt.replacement_directed["3,2"] is missing'
    msg, _ = rejected(SwapResult.from_json, mutated(doc, ("per_prompt", "interchange", "0,1"), [0.5]))
    assert msg.endswith('interchange["0,1"] = [0.5] has 1 values; the other per-prompt vectors have 3')
    msg, _ = rejected(SwapResult.from_json, mutated(doc, ("per_prompt", "interchange", "0,9"), [0.1, 0.2, 0.3]))
    assert msg == 'result file: per_prompt.interchange has the key "0,9", which is not one of the result\'s pairs'
    msg, _ = rejected(SwapResult.from_json, mutated(doc, ("per_prompt",), None))
    assert msg == "result file: per_prompt = null is not an object"


@pytest.mark.parametrize("path, value, message", [
    (("model",), ["stories260K"], 'model = ["stories260K"] is not a model name (string) or identity (object)'),
    (("model", "num_layers"), "five", 'model.num_layers = "five" is not an integer or null'),
    (("model", "kind"), "ftp", 'model.kind = "ftp" is not one of hub, local, gguf, builtin'),
    (("contract",), None, "contract = null is not an object"),
    (("contract", "prompts"), True, "contract.prompts = true is not an integer"),
    (("contract", "positions"), "middle", "contract: positions must be one of ('all', 'last'), got 'middle'"),
    (("contract", "shell"), "rm -rf", "contract.shell is not a known field"),
    (("replacement",), [[0.0] * 5] * 4, "replacement = an array of 4 has 4 rows, not 5 (num_layers)"),
    (("interchange", 2), [None, 1.0, "x", None, 2.0], 'interchange[2][2] = "x" is not a number or null'),
    (("meta", "seconds"), "slow", 'meta.seconds = "slow" is not a number or null'),
    (("format",), "swapkl.result/9", 'format = "swapkl.result/9" is not one of swapkl.result/1'),
])
def test_wrong_types_name_the_field(real, path, value, message):
    """``model`` as a list or ``contract: null`` escaped as AttributeError/TypeError."""
    msg, _ = rejected(SwapResult.from_json, mutated(result_doc(real), path, value))
    assert msg.startswith(f"result file: {message}"), msg


def test_model_name_string_is_the_documented_short_form(real):
    res = SwapResult.from_json(mutated(result_doc(real), ("model",), "my-model"))
    assert res.identity == {"display": "my-model"}


@pytest.mark.parametrize("depth", [33, 1000, 200_000])
def test_deep_nesting_is_refused_before_parsing(real, depth):
    """Deeply nested JSON raised RecursionError out of json.loads."""
    deep = "[" * depth + "]" * depth
    msg, peak = rejected(SwapResult.from_json, deep)
    assert msg == "result file: nested more than 32 levels deep (swapkl files use at most 7)"
    text = real["result"].replace('"meta": {', f'"meta": {{"x": {deep}, ', 1)
    msg2, _ = rejected(SwapResult.from_json, text.encode())
    assert msg2 == msg
    assert peak < 2 * depth + 2 ** 20  # the text once more (ASCII brackets) plus one numpy step
    # brackets inside strings do not count; a dict handed over directly is walked without recursion too
    assert schema.nesting_depth('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"[[["}') == 1
    nested = []
    node = nested
    for _ in range(depth):
        node.append([])
        node = node[0]
    doc = result_doc(real)
    doc["meta"]["x"] = nested
    msg3, _ = rejected(SwapResult.from_json, doc)
    assert msg3.startswith("result file: meta.x") and "nested more than 32 levels deep" in msg3


def test_size_limit_on_the_raw_bytes(real, tmp_path):
    big = real["result"].encode()
    msg, _ = rejected(schema.parse_json, big, "result file", max_bytes=1000)
    assert msg == f"result file: {len(big)} bytes is larger than the 1000 bytes limit"
    f = tmp_path / "big.json"
    f.write_bytes(b" " * (schema.MAX_BYTES + 1))
    msg, peak = rejected(SwapResult.load, f)
    assert "64.0 MiB is larger than the 64.0 MiB limit" in msg and peak < 2 ** 20  # never read
    msg, _ = rejected(SwapResult.load, tmp_path / "missing.json")
    assert msg == f"no such result file: {tmp_path / 'missing.json'}"


def test_not_json_at_all():
    for raw, msg in [(b"\xff\xfe{}", "not UTF-8 text at byte 0"), ("{not json", "Expecting property name"),
                     ("", "Expecting value"), ('{"num_layers": 1' + "0" * 5000 + "}", "4300 digits")]:
        m, _ = rejected(SwapResult.from_json, raw)
        assert m.startswith("result file: not a JSON file (") and msg in m, m
    m, _ = rejected(SwapResult.from_json, "[1, 2]")
    assert m == "result file: the top level = [1, 2] is not an object (not a swapkl result file?)"
    m, _ = rejected(SwapResult.from_json, '{"hello": 1}')
    assert m == "result file: num_layers is missing (not a swapkl result file?)"


# ============================================================================================ curves files
@pytest.mark.parametrize("path, value, message", [
    (("methods", "replacement", 0, "removed"), [9], "methods.replacement[0].removed[0] = 9 is outside 0..4"),
    (("methods", "replacement", 0, "removed"), [-1], "methods.replacement[0].removed[0] = -1 is outside 0..4"),
    (("methods", "replacement", 0, "removed"), [1, 2], "methods.replacement[0].removed = [1, 2] removes 2 layers"),
    (("methods", "replacement", 0, "ppl"), None, "methods.replacement[0].ppl = null is not a number"),
    (("methods", "replacement", 0, "ppl"), -3.0, "methods.replacement[0].ppl = -3.0 is outside 0..inf"),
    (("methods", "replacement", 0, "n"), 0, "methods.replacement[0].n = 0 is outside 1..1024"),
    (("baseline_ppl",), "98", 'baseline_ppl = "98" is not a number'),
    (("budget",), 10 ** 9, "budget = 1000000000 is outside 0..1024"),
    (("selection", "candidates"), [1, 7], "selection.candidates[1] = 7 is outside 0..4"),
    (("verdict", "evidence", "replacement"), None, "verdict.evidence.replacement = null is not an object"),
    (("verdict", "regime"), "great", 'verdict.regime = "great" is not one of divergent, tied, weak'),
    (("notes",), "one note", 'notes = "one note" is not an array'),
    (("model",), 5, "model = 5 is not a model name"),
    (("evaluator", "window"), 0, "evaluator.window = 0 is outside 1..1000000000"),
])
def test_curves_fields(real, path, value, message):
    doc = json.loads(real["curves"])
    msg, _ = rejected(CurvesResult.from_json, mutated(doc, path, value))
    assert msg.startswith(f"curves file: {message}"), msg


def test_curves_spread_needs_both_ends(real):
    """Found by the fuzzer: the curves figure reads delta_pct_max whenever delta_pct_min is there."""
    doc = json.loads(real["curves"])
    doc["methods"]["random"][0]["delta_pct_min"] = 12.5
    msg, _ = rejected(CurvesResult.from_json, mutated(doc, ("methods", "random", 0, "delta_pct_max"), None))
    assert msg == "curves file: methods.random[0].delta_pct_min = 12.5 comes without its other end (delta_pct_max)"


def test_curves_method_names_and_nan(real):
    doc = json.loads(real["curves"])
    doc["methods"][""] = []
    msg, _ = rejected(CurvesResult.from_json, doc)
    assert msg == 'curves file: methods = "" has a method name that is not a short string'
    text = real["curves"].replace('"baseline_ppl": ', '"baseline_ppl": NaN, "x": ', 1)
    msg, _ = rejected(CurvesResult.from_json, text)
    assert msg == "curves file: baseline_ppl = NaN is not a finite number (JSON has no NaN or Infinity)"
    msg, _ = rejected(CurvesResult.from_json, mutated(doc, ("budget",), None, delete=True))
    assert msg == "curves file: budget is missing (not a swapkl curves file?)"


# ============================================================================================ round trips
def test_project_outputs_load_back(real, tmp_path):
    """Files the project writes (score --json, curves --json, dashboard snapshots) load, unchanged."""
    res, cv = real["res"], real["cv"]
    path = res.save(tmp_path / "r.json")
    back = SwapResult.load(path)
    assert back.pairs == res.pairs and back.identity == res.identity and back.contract == res.contract
    np.testing.assert_array_equal(back.replacement_directed(), res.replacement_directed())
    assert json.dumps(back.to_dict()["per_prompt"]) == json.dumps(res.to_dict()["per_prompt"])
    assert SwapResult.from_json(res.to_dict()).pairs == res.pairs          # the in-memory dict too
    cv.to_json(tmp_path / "c.json")
    for src in (tmp_path / "c.json", str(tmp_path / "c.json"), real["curves"], real["curves"].encode(),
                json.loads(real["curves"])):
        c = CurvesResult.from_json(src)
        assert json.loads(c.to_json()) == json.loads(real["curves"])


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:All-NaN slice")
def test_summary_nan_is_written_as_null(real):
    """A KL ratio over all-zero replacement KLs is NaN: to_json writes null, so the file loads back."""
    vec = {(0, 1): {"repl_ij": [0.0, 0.0], "repl_ji": [0.0, 0.0], "inter": [0.1, 0.2]}}
    r = SwapResult.from_pair_vectors(2, vec, contract={}, identity={})
    text = json.dumps(r.to_dict(), allow_nan=False)
    assert json.loads(text)["summary"]["kl_ratio"]["mean"] is None
    assert SwapResult.from_json(text).pairs == [(0, 1)]


def test_plain_score_matrices(tmp_path):
    from swapkl.commands.curves import load_scores

    m = np.full((5, 5), 0.2).tolist()
    m[0][0] = None
    f = tmp_path / "plain.json"
    f.write_text(json.dumps({"replacement": m, "interchange": m, "model": "x"}))
    scores, ident, contract = load_scores(str(f))
    assert scores["replacement"].shape == (5, 5) and np.isnan(scores["replacement"][0, 0]) and ident == {
        "display": "x"} and contract == {}
    for bad, message in [
        ({"replacement": [[0.1, "a"], [0.2, 0.3]], "interchange": m}, 'replacement[0][1] = "a" is not a number'),
        ({"replacement": [[0.1, 0.2], [0.3]], "interchange": m},
         "replacement[1] = [0.3] has 1 values; the matrix is 2×2"),
        ({"replacement": [[0.1, 0.2]], "interchange": m},
         "replacement[0] = [0.1, 0.2] has 2 values; the matrix is 1×1"),
        ({"replacement": m, "interchange": [[0.1]]},
         "interchange = an array of 1 has 1 rows, not 5 (the size of replacement)"),
        ({"replacement": [[0.0]] * 1025, "interchange": m}, "replacement = an array of 1025 has more than 1024 rows"),
        ({"replacement": [], "interchange": m}, "replacement = [] is empty"),
        ({"interchange": m}, "replacement is missing"),
    ]:
        f.write_text(json.dumps(bad))
        msg, _ = rejected(load_scores, str(f))
        assert msg.startswith(f"scores file {f}: {message}"), msg


# ============================================================================================ property-based
DEEP = "__deep__"
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
    st.sampled_from([10 ** 9, -1, 0, 1, 4, 5, 99, 1024, 1025, 2 ** 63, 10 ** 300, "", "5", "NaN", DEEP, [], {},
                     [[0, 1]], [0, 1], [1, 0], [-1, 2], [[0.1] * 5] * 5, {"0,1": [1.0, 2.0, 3.0]}]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.lists(st.one_of(st.integers(-3, 8), st.floats(-2, 2), st.none()), max_size=5),
    st.dictionaries(st.text(max_size=6), st.integers(-3, 3), max_size=3),
)


def _nodes(doc) -> list[tuple]:
    """Every (container, key) of a JSON tree, iteratively."""
    out, stack = [], [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out.append((node, k))
            if isinstance(v, (dict, list)) and v:
                stack.append(v)
    return out


@st.composite
def hostile_files(draw, base_text: str) -> bytes:
    """A real file mutated 1-3 times in its tree (delete a key or item, replace a value with a hostile one,
    duplicate an item, rename a key, nest deeply), then maybe at the byte level (truncate, overwrite, insert,
    NaN tokens, deep prefix) or replaced by random bytes."""
    doc = json.loads(base_text)
    for _ in range(draw(st.integers(1, 3))):
        nodes = _nodes(doc)
        node, key = nodes[draw(st.integers(0, len(nodes) - 1))]
        op = draw(st.sampled_from(["delete", "replace", "replace", "replace", "duplicate", "rename"]))
        if op == "delete":
            del node[key]
        elif op == "replace":
            node[key] = copy.deepcopy(draw(HOSTILE))  # never let a later mutation change HOSTILE's lists
        elif op == "duplicate" and isinstance(node, list):
            node.append(copy.deepcopy(node[key]))
        elif op == "rename" and isinstance(node, dict):
            node[draw(st.sampled_from(["0,9", "9,0", "1, 2", "01,2", "x", "seconds"]))] = node.pop(key)
    text = json.dumps(doc).replace(json.dumps(DEEP), "[" * draw(st.sampled_from([33, 500, 5000])) + "1" +
                                   "]" * 40)
    raw = text.encode()
    op = draw(st.sampled_from(["none", "none", "truncate", "overwrite", "insert", "nan", "prefix", "random"]))
    if op in ("truncate", "overwrite", "insert"):
        at = draw(st.integers(0, len(raw)))
        junk = draw(st.binary(min_size=1, max_size=6))
        raw = raw[:at] if op == "truncate" else raw[:at] + junk + raw[at + (len(junk) if op == "overwrite" else 0):]
    elif op == "nan":
        raw = raw.replace(b"0.", draw(st.sampled_from([b"NaN, 0.", b"Infinity", b"-Infinity"])), 1)
    elif op == "prefix":
        raw = b"[" * draw(st.integers(1, 100)) + raw
    elif op == "random":
        raw = draw(st.binary(max_size=300))
    return raw


def _read_bounded(fn, raw):
    """``fn(raw)``: the object or None (UploadError), and the tracemalloc peak in bytes."""
    tracemalloc.start()
    try:
        try:
            obj = fn(raw)
        except UploadError as e:
            msg = str(e)
            assert "\n" not in msg and len(msg) < 400 and msg.split(":")[0] in ("result file", "curves file"), msg
            obj = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"{peak / 2 ** 20:.1f} MiB allocated reading {raw[:200]!r}"
    return obj


# ~15 s per test here (2 cores); SWAPKL_FUZZ_EXAMPLES=20000 for a deeper search
PROPERTY = settings(max_examples=int(os.environ.get("SWAPKL_FUZZ_EXAMPLES", "1000")), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


@PROPERTY
@given(data=st.data())
def test_mutated_result_files_only_raise_upload_error(real, data):
    """Whatever the bytes, reading a result file ends in an UploadError or in a SwapResult whose matrices,
    statistics, tables and JSON export work (memory bounded per example by PEAK_LIMIT)."""
    from swapkl import views as plots

    raw = data.draw(hostile_files(real["result"]))
    res = _read_bounded(SwapResult.from_json, raw)
    if res is not None and res.num_layers <= 64:
        event("valid result")
        res.replacement(), res.interchange(), res.pair_table()
        plots.top_pairs_table(res, 5), plots.contract_caption(res)
        json.dumps(res.to_dict(), allow_nan=False)


@PROPERTY
@given(data=st.data())
def test_mutated_curves_files_only_raise_upload_error(real, data):
    """The same for curves files: an UploadError or a CurvesResult that writes back and draws."""
    from swapkl import views as plots

    raw = data.draw(hostile_files(real["curves"]))
    cv = _read_bounded(CurvesResult.from_json, raw)
    if cv is not None:
        event("valid curves")
        CurvesResult.from_json(cv.to_json())
        plots.removed_layers_table(cv), plots.removal_curves(cv)


# ============================================================================================ job manager, CLI
def test_hostile_upload_through_the_job_manager(real, tmp_path, monkeypatch):
    """The dashboard's "Open saved results": a hostile file is one readable SwapklError and no job."""
    from swapkl.jobs import JobManager

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    mgr = JobManager()
    try:
        doc = result_doc(real)
        for raw, message in [
            (mutated(doc, ("num_layers",), 10 ** 9).encode(), "result file: num_layers = 1000000000 is outside"),
            (real["result"].replace('"noise_floor": 0.0', '"noise_floor": NaN').encode(),
             "result file: noise_floor = NaN is not a finite number"),
            (mutated(doc, ("contract",), None), "result file: contract = null is not an object"),
            (b"[" * 100_000, "result file: nested more than 32 levels deep"),
            (b"\x00\x01garbage", "result file: not a JSON file"),
        ]:
            with pytest.raises(SwapklError) as ei:
                mgr.open_files(raw)
            assert type(ei.value) is UploadError and str(ei.value).startswith(message), str(ei.value)
        cdoc = json.loads(real["curves"])
        with pytest.raises(UploadError, match=r"^curves file: methods.bi\[1\].removed\[0\] = 99 is outside 0..4"):
            mgr.open_files(real["result"], mutated(cdoc, ("methods", "bi", 1, "removed"), [99, 1]))
        assert mgr.jobs() == []
        job = mgr.open_files(real["result"].encode(), real["curves"].encode())  # the real pair still opens
        assert job.status == "done" and job.curves.methods.keys() == real["cv"].methods.keys()
    finally:
        mgr.shutdown()


def test_cli_bad_scores_and_curves_files_are_one_line(tmp_path, capsys, stories_path, monkeypatch):
    """``curves --scores`` with strings or ragged rows, ``report --curves`` with a bad entry: exit 2, one line
    naming the field, no traceback (and the scores file is checked before the model loads)."""
    from swapkl.model import checkpoints
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(checkpoints, "load_checkpoint", lambda *a, **k: pytest.fail("the model was loaded"))
    f = tmp_path / "plain.json"
    for bad, message in [({"replacement": [[0.1, "a"], [0.2, 0.3]], "interchange": [[0, 1], [1, 0]]},
                          'replacement[0][1] = "a" is not a number or null'),
                         ({"replacement": [[0.1, 0.2], [0.3]], "interchange": [[0, 1], [1, 0]]},
                          "replacement[1] = [0.3] has 1 values; the matrix is 2×2")]:
        f.write_text(json.dumps(bad))
        assert main(["curves", str(stories_path), "--budget", "1", "--scores", str(f), "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().count("\n") == 0
        assert err.strip() == f"error: scores file {f}: {message}", err
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"model": {}, "evaluator": {}, "budget": 1, "baseline_ppl": 10.0,
                             "methods": {"replacement": [{"n": 1, "removed": [1], "ppl": "high", "delta_pct": 1}]}}))
    assert main(["report", "--curves", str(c), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f'error: curves file {c}: methods.replacement[0].ppl = "high" is not a number', err
