"""The bridge's calibration windows, the scoring prompts and the evaluation text are disjoint (asserted in token
coordinates, and checked here on the text itself)."""
import pytest

from conftest import WIKITEXT
from swapkl.repair.calibration import RegionError, calibration_text, check_disjoint
from swapkl.scoring.corpora import load_corpus
from swapkl.scoring.prompts import make_prompts, tokenize_stream


def test_regions_are_disjoint(stories):
    tok = stories.tokenizer
    corpus = load_corpus(str(WIKITEXT))
    prompts = make_prompts(tok, corpus, 16, 64, seed=0)
    ct = calibration_text(tok, corpus, prompts.description, 64, tokens=4096, window=128, seed=3)
    assert ct.ids.shape == (32, 128) and ct.description["tokens"] == 4096
    body_p = 64 - (1 if prompts.description["bos"] else 0)
    p_ranges = [(s, s + body_p) for s in prompts.description["window_starts"]]
    for b, e in ct.spans:  # token ranges of the same stream never meet
        assert all(e <= pb or pe <= b for pb, pe in p_ranges)
    # the windows' ids are the stream's tokens at those ranges
    stream = tokenize_stream(tok, corpus.prompt_text())
    bos = 1 if prompts.description["bos"] else 0
    for row, (b, e) in zip(ct.ids.tolist(), ct.spans):
        assert row[bos:] == stream[b:e]
    # and none of the calibration text is in the evaluation region (the corpus's first words): 20-word passages
    eval_words = corpus.words[:corpus.split_point]
    shingles = {tuple(eval_words[k:k + 20]) for k in range(len(eval_words) - 19)}
    for row in ct.ids[:4].tolist():
        w = tok.decode(row[bos:]).split()
        assert not any(tuple(w[k:k + 20]) in shingles for k in range(1, len(w) - 21))
    # another seed, other windows; the same seed, the same windows
    assert calibration_text(tok, corpus, prompts.description, 64, 4096, 128, seed=4).spans != ct.spans
    assert calibration_text(tok, corpus, prompts.description, 64, 4096, 128, seed=3).spans == ct.spans


def test_overlap_is_refused():
    with pytest.raises(RegionError, match=r"calibration window \[100, 164\) overlaps scoring prompt window \[150, 213\)"):
        check_disjoint([(0, 64), (100, 164)], [(150, 63)])
    check_disjoint([(0, 64), (213, 277)], [(150, 63)])


def test_too_short_corpus(stories):
    corpus = load_corpus(str(WIKITEXT))
    prompts = make_prompts(stories.tokenizer, corpus, 4, 32, seed=0)
    with pytest.raises(RegionError, match="calibration windows of .* outside the scoring prompts"):
        calibration_text(stories.tokenizer, corpus, prompts.description, 32, tokens=10**9, window=256)
