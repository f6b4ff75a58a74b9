"""Corpora and prompts: disjoint evaluation/prompt regions, labels, seeded windows, clear errors."""
from __future__ import annotations

import pytest
import torch

from swapkl.scoring import corpora
from swapkl.errors import ContractError
from swapkl.scoring.prompts import make_prompts


@pytest.fixture(scope="module")
def tok(stories_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(stories_path)


def test_eval_and_prompt_regions_are_disjoint(wikitext_path):
    c = corpora.from_file(wikitext_path)
    assert c.split_point == corpora.EVAL_REGION_WORDS == 20_000
    ev, pr = c.eval_text(20_000).split(), c.prompt_text().split()
    assert ev == list(c.words[:20_000]) and pr == list(c.words[20_000:])
    assert len(ev) + len(pr) == len(c.words)
    with pytest.raises(corpora.CorpusError, match="20000 words of evaluation text"):
        c.eval_text(20_001)


def test_prompt_windows_come_from_the_prompt_region_only(tok, wikitext_path):
    c = corpora.from_file(wikitext_path)
    p = make_prompts(tok, c, 6, 24, seed=3)
    assert p.ids.shape == (6, 24) and (p.ids[:, 0] == tok.bos_token_id).all()  # Llama: BOS + 23 tokens
    # every window is the prompt region's token stream at its recorded offset (the region starts after the
    # 20,000 evaluation words), and the windows do not overlap each other
    from swapkl.scoring.prompts import tokenize_stream

    stream = tokenize_stream(tok, c.prompt_text())
    starts = p.description["window_starts"]
    for row, start in zip(p.ids[:, 1:].tolist(), starts):
        assert row == stream[start:start + 23]
    assert all(abs(a - b) >= 23 for a in starts for b in starts if a != b)
    again = make_prompts(tok, c, 6, 24, seed=3)
    other = make_prompts(tok, c, 6, 24, seed=4)
    assert torch.equal(p.ids, again.ids) and not torch.equal(p.ids, other.ids)
    assert p.description["corpus"]["sha256"] == c.sha256


def test_builtin_fallback_is_labelled(tok):
    b = corpora.builtin()
    assert b.is_fallback and "fallback" in b.label and "not WikiText" in b.label
    assert b.describe()["fallback"] is True
    assert make_prompts(tok, b, 2, 16).ids.shape == (2, 16)


def test_too_short_corpus_is_a_clear_error(tok, tmp_path):
    f = tmp_path / "tiny.txt"
    f.write_text("one two three four five six seven eight nine ten " * 20)
    with pytest.raises(ContractError, match="too short: its prompt region has .* 50 prompts were asked for"):
        make_prompts(tok, corpora.from_file(f), 50, 64)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(corpora.CorpusError, match="empty"):
        corpora.from_file(empty)
    with pytest.raises(corpora.CorpusError, match="no such text file"):
        corpora.from_file(tmp_path / "missing.txt")


def test_auto_prefers_env_file(monkeypatch, tmp_path):
    f = tmp_path / "mine.txt"
    f.write_text("alpha beta gamma delta " * 100)
    monkeypatch.setenv(corpora.ENV_CORPUS, str(f))
    monkeypatch.setattr(corpora, "_CACHE", {})
    c = corpora.load_corpus()
    assert c.name == str(f) and c.label == "local file mine.txt"
