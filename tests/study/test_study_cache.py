"""A finished study read back without loading (docs/study.md, "Resuming and the cache"): a model's row is keyed by
its identity from its files (config and weight files, a GGUF, a hub commit the local cache resolves), so the
repeat of a finished study loads no model and returns the first run's rows."""
from __future__ import annotations

import pytest

STORIES = "tests/fixtures/models/stories260K"
WIKI = "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"
SMALL = ["--prompts", "4", "--tokens", "32", "--corpus", WIKI, "--eval-text", WIKI, "--max-words", "300",
         "--budget", "1", "--n-boot", "20", "--methods", "replacement,interchange", "--no-evidence"]


def _plan(*argv):
    from swapkl.commands.cli import build_parser
    from swapkl.commands.study import build_plan

    return build_plan(build_parser().parse_args(["study", *argv]))


def test_the_repeat_of_a_finished_study_loads_no_model_and_returns_the_same_rows(tmp_path, monkeypatch):
    from swapkl.measure.evaluate import Evaluator
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.study.run import run_study
    from swapkl.scoring.corpora import load_corpus

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    plan = _plan(STORIES, *SMALL)
    loads = []

    def load(m):
        loads.append(m.spec)
        return load_checkpoint(m.spec, revision=m.revision)

    corpus = load_corpus(WIKI)
    first = run_study(plan, Evaluator.from_dict(plan.evaluator), corpus, load)
    assert loads == [STORIES] and first.rows[0]["status"] == "done" and not first.rows[0]["cached"]
    loads.clear()
    again = run_study(plan, Evaluator.from_dict(plan.evaluator), corpus, load)
    assert loads == []  # no model loaded on the repeat
    assert again.rows[0]["cached"]
    strip = ("cached",)
    assert {k: v for k, v in again.rows[0].items() if k not in strip} == \
        {k: v for k, v in first.rows[0].items() if k not in strip}


def test_a_hub_model_is_known_by_the_commit_the_local_cache_resolves(tmp_path, monkeypatch):
    from swapkl.model.fingerprint import offline_identity
    from swapkl.study.plan import StudyModel
    from swapkl.study.run import row_path

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    plan = _plan(STORIES, *SMALL)
    model = StudyModel("org/tiny")
    assert offline_identity("org/tiny") is None and row_path(plan, model) is None  # unknown: loaded as before
    refs = tmp_path / "hub" / "models--org--tiny" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    assert offline_identity("org/tiny") == "hub:org/tiny@" + "a" * 40
    before = row_path(plan, model)
    (refs / "main").write_text("b" * 40)  # main moved: another row
    assert row_path(plan, model) != before
    assert offline_identity("org/tiny", "c" * 40) == "hub:org/tiny@" + "c" * 40  # a commit is its own identity
    (refs / "v1").write_text("b" * 40)
    assert row_path(plan, StudyModel("org/tiny", "v1")) != row_path(plan, model)  # spec and revision in the key


def test_a_folder_whose_weights_change_is_another_row(tmp_path, monkeypatch):
    import shutil

    from swapkl.study.plan import StudyModel
    from swapkl.study.run import row_path

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    folder = tmp_path / "m"
    shutil.copytree(STORIES, folder)
    plan = _plan(str(folder), *SMALL)
    before = row_path(plan, StudyModel(str(folder)))
    weights = next(f for f in folder.iterdir() if f.suffix in (".safetensors", ".bin"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert row_path(plan, StudyModel(str(folder))) != before
    with pytest.raises(Exception, match="no such"):
        row_path(plan, StudyModel(str(tmp_path / "missing")))
