"""The four regions of a corpus -- bridge calibration windows, scoring prompts, heal training text and evaluation
text -- are disjoint, and a configuration that would overlap is refused in one line (the heal's training text cut
around the bridge's calibration windows, healing/text.check_disjoint; the region check of one stream,
swapkl.scoring.corpora.check_regions, which repair/calibration calls)."""
import numpy as np
import pytest

from conftest import WIKITEXT
from swapkl.errors import SwapklError
from swapkl.healing import text as T
from swapkl.repair.calibration import calibration_text
from swapkl.scoring.corpora import CorpusError, check_regions, load_corpus
from swapkl.scoring.prompts import make_prompts, tokenize_stream

SEQ = 64


@pytest.fixture(scope="module")
def regions(stories):
    tok = stories.tokenizer
    corpus = load_corpus(str(WIKITEXT))
    prompts = make_prompts(tok, corpus, 16, 64, seed=0)
    calib = calibration_text(tok, corpus, prompts.description, 64, tokens=8192, window=256, seed=0)
    return tok, corpus, prompts, calib


def test_heal_training_text_blind_to_the_bridge_windows_overlaps_them_and_is_refused(regions):
    tok, corpus, prompts, calib = regions
    old = T.corpus_train_text(corpus, tok, SEQ)  # the training region blind to the bridge windows (no --repair)
    cal = set()
    for b, e in calib.spans:
        cal.update(range(b, e))
    assert any(any(t in cal for t in range(b, e)) for b, e in old.spans)  # the overlap the issue names
    reserve = old.description["calib_reserve_tokens"]
    windows = old.description["prompt_windows"]
    with pytest.raises(T.TrainTextError, match=r"^training chunk \[\d+, \d+\) overlaps bridge calibration window") as e:
        T.check_disjoint(old, reserve, windows, calib_windows=[(b, e - b) for b, e in calib.spans])
    assert "\n" not in str(e.value)


def test_four_regions_token_ranges_do_not_intersect(regions):
    tok, corpus, prompts, calib = regions
    tt = T.corpus_train_text(corpus, tok, SEQ, avoid=[(b, e - b) for b, e in calib.spans])
    assert len(tt.description["bridge_calibration_windows"]) == len(calib.spans) == 32
    stream = tokenize_stream(tok, corpus.prompt_text())
    body_p = 64 - (1 if prompts.description["bos"] else 0)
    # a plain coverage map of the prompt region's token stream: one bit per region
    cover = np.zeros(len(stream), dtype=np.int64)
    for bit, ranges in ((1, calib.spans), (2, [(s, s + body_p) for s in prompts.description["window_starts"]]),
                        (4, tt.spans)):
        mark = np.zeros(len(stream), dtype=bool)
        for b, e in ranges:
            mark[b:e] = True
        cover += bit * mark
    assert set(np.unique(cover)) <= {0, 1, 2, 4}  # no token in two regions
    assert (cover == 1).sum() == 8192 - 32 and (cover == 4).sum() > 100_000  # the calibration windows' text (no BOS)
    reserve = tt.description["calib_reserve_tokens"]
    assert min(b for b, _ in tt.spans) >= reserve  # and training starts after the calibration reserve
    # the evaluation region is the corpus's first words; the stream above is what follows them
    assert tokenize_stream(tok, " ".join(corpus.words[corpus.split_point:])) == stream
    check_regions({"x": [(0, 1)]}, corpus=corpus, eval_words=5000)  # the matched evaluator fits before it


def test_check_regions_refuses_an_overlap_in_one_line():
    ok = {"calibration window": [(0, 64), (300, 364)], "scoring prompt window": [(100, 163)],
          "training chunk": [(163, 227), (400, 464)]}
    check_regions(ok)
    bad = dict(ok, **{"training chunk": [(163, 227), (350, 414)]})
    with pytest.raises(CorpusError, match=r"^calibration window \[300, 364\) overlaps training chunk \[350, 414\) "
                                          r"in the prompt region's token stream; refusing to compute$"):
        check_regions(bad)
    # ranges of one region may overlap each other; only the named pairs are checked
    check_regions({"a": [(0, 10), (5, 15)], "b": [(20, 30)]})
    check_regions({"a": [(0, 10)], "b": [(5, 15)], "c": [(30, 40)]}, pairs=[("a", "c")])
    with pytest.raises(SwapklError, match=r"b \[5, 15\) overlaps c \[12, 20\)"):
        check_regions({"a": [(0, 10)], "b": [(5, 15)], "c": [(12, 20)]}, pairs=[("b", "c")])
    corpus = load_corpus(str(WIKITEXT))
    with pytest.raises(CorpusError, match="does not fit the evaluation region"):
        check_regions({}, corpus=corpus, eval_words=corpus.split_point + 1)
