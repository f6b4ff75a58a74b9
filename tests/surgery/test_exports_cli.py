"""``prune --format hf|mergekit|gguf`` and ``prune --from RESULT.json --method M --n N`` at the command line:
what each writes, and the hostile cases (an impossible set, a non-GGUF source asked for a GGUF, output paths as
for ``prune``), each one ``error: ...`` line with exit code 2 and nothing written.  In-process through
``swapkl.commands.cli.main`` (one subprocess checks the real entry point)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from support.gguf_tiny import write_tiny_llama_gguf
from test_hostile_cli import assert_user_error, model_copy, one_error_line, run_cli, tree_digest

from swapkl.surgery.mergekit import kept_from_config


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", n_layers=5)


def _curves_file(path: Path, fingerprint: str | None = None, num_layers: int = 5) -> Path:
    from swapkl.removal.curves import CurvesResult

    def e(n, removed):
        return {"n": n, "removed": removed, "ppl": 10.0 + n, "ppl_ci": [9.0, 12.0 + n], "delta_pct": 5.0 * n,
                "delta_pct_ci": [1.0, 9.0 * n], "kl_to_base": 0.1 * n}
    model = {"display": "stories260K", "num_layers": num_layers, "fingerprint": fingerprint}
    CurvesResult(model=model, evaluator={"name": "matched"}, corpus={"label": "wikitext-2 eval"}, budget=2,
                 selection={"spacing": 1}, baseline_ppl=10.0, baseline_ppl_ci=[9.0, 11.0], baseline={},
                 methods={"bi": [e(1, [3]), e(2, [2, 3])], "random": [{**e(1, None)}]}).to_json(path)
    return path


def test_mergekit_yaml_from_curves(stories_path, tmp_path, cli):
    out = tmp_path / "bi-2.yaml"
    rc, so, se = cli("prune", stories_path, "--from", _curves_file(tmp_path / "cv.json"), "--method", "bi", "--n", "2",
                     "--format", "mergekit", "--out", out, "--verify")
    assert rc == 0, se
    assert "verified: the YAML read back keeps layers [0, 1, 4]" in so
    text = out.read_text()
    assert kept_from_config(yaml.safe_load(text)) == [0, 1, 4]
    assert "# chosen by: bi, n=2 (from cv.json)" in text
    assert "# measured on: stories260K · corpus wikitext-2 eval · budget 2 · spacing Δ=1 · evaluator matched" in text


def test_hf_folder_from_a_recommendation(stories_path, tmp_path, cli):
    from swapkl.removal.recommend import Recommendation

    entries = [{"n": n, "removed": r, "delta_pct": 1.0 * n} for n, r in ((1, [3]), (2, [1, 3]))]
    rec = Recommendation(model={"display": "stories260K", "num_layers": 5}, evaluator={"name": "matched", "window": 512},
                         corpus={"label": "wikitext-2"}, baseline_ppl=10.0, baseline_ppl_ci=[9.0, 11.0],
                         calib_base_ppl=9.5, entries=entries, candidates=[1, 3], signals={},
                         settings={"calib_tokens": 1024, "calib_stride": 256})
    f = tmp_path / "rec.json"
    f.write_text(rec.to_json())
    rc, so, se = cli("prune", stories_path, "--from", f, "--n", "2", "--format", "mergekit", "--out", tmp_path / "r.yaml")
    assert rc == 0, se
    text = (tmp_path / "r.yaml").read_text()
    assert kept_from_config(yaml.safe_load(text)) == [0, 2, 4] and "# chosen by: recommend, n=2 (from rec.json)" in text
    assert "calibration 1024 tokens of the prompt region, window 512/stride 256" in text
    rc, so, se = cli("prune", stories_path, "--from", f, "--n", "1", "--out", tmp_path / "hf", "--verify")
    assert rc == 0 and "removed layers [3], 4 of 5 kept" in so, se


def test_gguf_from_a_gguf_source_with_verify(tiny_gguf, tmp_path, cli):
    out = tmp_path / "cut.gguf"
    rc, so, se = cli("prune", tiny_gguf, "--remove", "0,4", "--format", "gguf", "--out", out, "--verify")
    assert rc == 0, se
    assert re.search(r"verified: .* \(max \|Δlogit\| 0\.0e\+00\)", so), so
    assert f"llama-quantize --prune-layers 0,4 {tiny_gguf} {out} COPY" in so
    assert "block_count and llama.attention.sliding_window_pattern trimmed" in so


def test_hf_stays_the_default(stories_path, tmp_path, cli):
    rc, so, se = cli("prune", stories_path, "--remove", "1", "--out", tmp_path / "hf")
    assert rc == 0, se
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "hf" / "swapkl_prune.json").is_file()


@pytest.mark.parametrize("case", ["impossible-gguf", "impossible-yaml", "not-a-gguf-source", "gguf-over-source",
                                  "yaml-in-source-folder", "wrong-suffix", "existing-file", "merge-as-yaml",
                                  "from-and-remove", "from-random", "from-other-model", "from-missing-n",
                                  "method-without-from", "from-bad-recommendation", "from-not-json"])
def test_hostile_exports(stories_path, tiny_gguf, tmp_path, cli, case):
    m = model_copy(stories_path, tmp_path / "m")
    g = tmp_path / "src.gguf"
    g.write_bytes(tiny_gguf.read_bytes())
    before = {**tree_digest(m), "g": g.read_bytes()}
    existing = tmp_path / "there.gguf"
    existing.write_text("keep me")
    cv = _curves_file(tmp_path / "cv.json")
    other = _curves_file(tmp_path / "other.json", num_layers=30)
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"entries": [{"n": 1, "removed": ["x"]}], "model": {}, "evaluator": {}, "corpus": {},
                               "baseline_ppl": 1.0, "calib_base_ppl": 1.0, "candidates": [], "signals": {},
                               "settings": {}}))
    notjson = tmp_path / "nj.json"
    notjson.write_bytes(b"\x00\xff binary")
    argv, pattern = {
        "impossible-gguf": (["prune", g, "--remove", "5", "--format", "gguf", "--out", tmp_path / "o.gguf"],
                            r"layer\(s\) \[5\] out of range: the model has layers 0\.\.4$"),
        "impossible-yaml": (["prune", m, "--remove", "0,1,2,3,4", "--format", "mergekit", "--out", tmp_path / "o.yaml"],
                            r"cannot remove all 5 layers"),
        "not-a-gguf-source": (["prune", m, "--remove", "1", "--format", "gguf", "--out", tmp_path / "o.gguf"],
                              r"--format gguf needs a GGUF source .*; m is a local model: export a Hugging Face folder"),
        "gguf-over-source": (["prune", g, "--remove", "1", "--format", "gguf", "--out", g, "--force"],
                             r"would overwrite the input"),
        "yaml-in-source-folder": (["prune", m, "--remove", "1", "--format", "mergekit", "--out", m / "cut.yaml"],
                                  r"is inside the source model folder"),
        "wrong-suffix": (["prune", g, "--remove", "1", "--format", "gguf", "--out", tmp_path / "o.bin"],
                         r"a pruned GGUF is one file; give a name ending in \.gguf$"),
        "existing-file": (["prune", g, "--remove", "1", "--format", "gguf", "--out", existing],
                          r"exists; choose a new file name, or --force to replace it$"),
        "merge-as-yaml": (["prune", m, "--merge", "1-2", "--format", "mergekit", "--out", tmp_path / "o.yaml"],
                          r"exports only as a Hugging Face folder \(hf\), not mergekit$"),
        "from-and-remove": (["prune", m, "--from", cv, "--method", "bi", "--n", "1", "--remove", "1", "--out",
                             tmp_path / "o"], r"either --from or --remove/--merge, not both$"),
        "from-random": (["prune", m, "--from", cv, "--method", "random", "--n", "1", "--format", "mergekit", "--out",
                         tmp_path / "o.yaml"], r"random at n=1 has no single removal set"),
        "from-other-model": (["prune", m, "--from", other, "--method", "bi", "--n", "1", "--format", "mergekit",
                              "--out", tmp_path / "o.yaml"], r"for a 30-layer model; this model has 5 layers$"),
        "from-missing-n": (["prune", m, "--from", cv, "--method", "bi", "--out", tmp_path / "o"], r"needs --n N"),
        "method-without-from": (["prune", m, "--remove", "1", "--method", "bi", "--out", tmp_path / "o"],
                                r"--method and --n go with --from"),
        "from-bad-recommendation": (["prune", m, "--from", rec, "--n", "1", "--out", tmp_path / "o"],
                                    r"rec\.json: recommend at n=1 has a malformed removal set$"),
        "from-not-json": (["prune", m, "--from", notjson, "--n", "1", "--out", tmp_path / "o"],
                          r"cannot read a curves or recommendation JSON"),
    }[case]
    rc, _, se = cli(*argv)
    assert rc == 2
    one_error_line(se, pattern)
    assert {**tree_digest(m), "g": g.read_bytes()} == before and existing.read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("o.") or p.name == "o" or p.suffix == ".tmp"]


def test_real_entry_point_refuses_gguf_from_a_folder(stories_path, tmp_path):
    r = run_cli("prune", stories_path, "--remove", "1", "--format", "gguf", "--out", tmp_path / "x.gguf",
                cache=tmp_path / "c", process=True)
    assert_user_error(r, r"^error: --format gguf needs a GGUF source")
