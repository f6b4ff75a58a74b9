"""The shipped offline task ``wikitext_lastword`` (swapkl/measure/lastword.py) and the check of a task's documents
against a run's regions (swapkl/measure/task_regions.py): the documents rebuild byte-identically from the shipped
WikiText-2 text, lie in their word range and are what their spans say, load from any working directory with no hub
and no include path, and a task overlapping the held-out text, the calibration text or the scoring prompts is
refused in one line, by recorded span and by shared passages alike."""
from __future__ import annotations

import os

import pytest

from swapkl.measure import lastword as LW
from swapkl.measure import lmeval
from swapkl.measure import task_regions as TR
from swapkl.scoring import corpora


@pytest.fixture(scope="module")
def corpus(wikitext_path):
    return corpora.from_file(wikitext_path)


@pytest.fixture(scope="module")
def task():
    return lmeval.load_tasks(None, [LW.TASK])[1][0]


class FakeLeaf:
    def __init__(self, docs):
        self.eval_docs = docs


def fake_task(docs, name="fake"):
    return {"name": name, "leaves": {name: FakeLeaf(docs)}}


def test_the_shipped_documents_rebuild_byte_identically(corpus, wikitext_path, capsys):
    assert corpus.sha256 == LW.SOURCE_SHA256
    assert LW.render(LW.build_docs(corpus.words)) == LW.JSONL.read_bytes()
    assert LW.main([os.fspath(wikitext_path)]) == 0  # the rebuild command says the same
    assert "identical to a fresh build" in capsys.readouterr().out


def test_every_document_is_its_span_of_the_word_range(corpus):
    docs = LW.read_docs()
    assert len(docs) >= 200
    lo, hi = LW.WORD_RANGE
    assert hi <= corpus.split_point  # inside the evaluation region, before the prompt region
    for d in docs:
        b, e = d["word_begin"], d["word_end"]
        assert lo <= b < e <= hi and LW.MIN_CONTEXT <= e - 1 - b <= LW.MAX_CONTEXT
        assert d["context"] == " ".join(corpus.words[b:e - 1]) and d["target"] == corpus.words[e - 1]
        assert LW.eligible(d["target"]) and d["target"] in d["context"].split()
        assert d["corpus_sha256"] == corpus.sha256 and 0 < d["chance"] < 0.5
    ends = [d["word_end"] for d in docs]
    assert ends == sorted(ends) and min(b - a for a, b in zip(ends, ends[1:])) >= LW.GAP


def test_loads_from_any_directory_without_hub_or_include_path(tmp_path, monkeypatch, task):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lmeval, "_MANAGERS", {})
    tm, [t] = lmeval.load_tasks(None, [LW.TASK])
    assert tm is lmeval._MANAGERS[("", False)] and ("", True) not in lmeval._MANAGERS  # no registry index
    obj = t["leaves"][LW.TASK]
    docs = list(obj.eval_docs)
    shipped = LW.read_docs()
    assert [d["target"] for d in docs] == [d["target"] for d in shipped]
    assert obj.doc_to_text(docs[3]) == shipped[3]["context"] and obj.doc_to_target(docs[3]) == " " + shipped[3]["target"]
    assert t["output_types"] == {LW.TASK: "loglikelihood"} and t["config_sha"] == task["config_sha"]
    assert lmeval.chance(t) == pytest.approx(sum(d["chance"] for d in shipped) / len(shipped))
    assert lmeval.chance(t, limit=10) == pytest.approx(sum(d["chance"] for d in shipped[:10]) / 10)


def test_held_out_text_up_to_the_word_range_passes_and_beyond_is_refused(corpus, task):
    lo = LW.WORD_RANGE[0]
    ok = TR.check_task_disjoint(task, TR.run_regions(corpus, heldout_words=lo, calib_words=4000))
    assert ok["by_span"] == ok["documents"] == len(LW.read_docs()) and ok["by_passage"] == 0
    assert ok["regions"] == {"held-out text": [0, lo], "calibration text": [20000, 24000]}
    with pytest.raises(TR.TaskOverlapError) as e:
        TR.check_task_disjoint(task, TR.run_regions(corpus, heldout_words=lo + 1))
    msg = str(e.value)
    assert "\n" not in msg and f"document 0 (words [{lo}, " in msg and f"held-out text (words [0, {lo + 1}))" in msg


def test_the_same_documents_without_provenance_are_caught_by_passages(corpus):
    docs = [{"text": d["context"] + " " + d["target"]} for d in LW.read_docs()]
    ok = TR.check_task_disjoint(fake_task(docs), TR.run_regions(corpus, heldout_words=LW.WORD_RANGE[0]))
    assert ok["by_passage"] == len(docs) and ok["by_span"] == 0
    with pytest.raises(TR.TaskOverlapError, match=r"document 0 shares a 20-word passage with the run's held-out text"):
        TR.check_task_disjoint(fake_task(docs), TR.run_regions(corpus, heldout_words=LW.WORD_RANGE[0] + 30))


def test_a_document_from_the_calibration_text_or_a_prompt_window_is_refused(corpus, stories_path):
    from transformers import AutoTokenizer

    from swapkl.scoring.prompts import make_prompts

    s = corpus.split_point
    calib_doc = {"question": "q", "passages": [" ".join(corpus.words[s + 100:s + 130])]}
    with pytest.raises(TR.TaskOverlapError, match=r"^lm-eval task 'fake' document 1 shares a 20-word passage with "
                                                  r"the run's calibration text"):
        TR.check_task_disjoint(fake_task([{"x": "unrelated words"}, calib_doc]), TR.run_regions(corpus, calib_words=4000))
    tok = AutoTokenizer.from_pretrained(stories_path)
    prompts = make_prompts(tok, corpus, 4, 64, seed=0)
    text = tok.decode(prompts.ids[2].tolist(), skip_special_tokens=True)
    doc = {"text": "a question about " + text}
    regions = TR.run_regions(corpus, prompts=prompts, tokenizer=tok)
    with pytest.raises(TR.TaskOverlapError, match=r"document 0 shares a 20-word passage with the run's scoring prompts"):
        TR.check_task_disjoint(fake_task([doc]), regions)
    far = {"text": " ".join(corpus.words[s + 5000:s + 5030])}  # prompt-region text no window of this run read
    assert TR.check_task_disjoint(fake_task([far]), regions)["by_passage"] == 1
    with pytest.raises(TR.TaskOverlapError, match="the run's prompt region"):
        TR.check_task_disjoint(fake_task([far]), TR.run_regions(corpus, whole_prompt_region=True))


def test_a_tasks_hash_does_not_depend_on_where_its_yaml_lies():
    """The task cache key's configuration hash names the task, not the checkout: lm-eval records the YAML's path
    (metadata.config_source), and the same task read from another folder hashes the same."""
    here = lmeval.load_tasks(None, ["wikitext_lastword"])[1][0]
    cfg = next(iter(here["leaves"].values())).dump_config()
    assert str(cfg["metadata"]["config_source"]).endswith("wikitext_lastword.yaml")
    moved = dict(cfg, metadata={**cfg["metadata"], "config_source": "/elsewhere/site-packages/wikitext_lastword.yaml"})
    assert lmeval.portable_config(moved) == lmeval.portable_config(cfg)
    assert "config_source" not in lmeval.portable_config(cfg)["metadata"]
    assert here["config_sha"] == lmeval.stable_hash({"wikitext_lastword": lmeval.portable_config(cfg)})[:16]
