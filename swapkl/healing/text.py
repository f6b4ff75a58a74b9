"""The training text of a heal, and the proof that it is disjoint from the evaluation text, the scoring prompts
and the calibration text.

A corpus (:mod:`swapkl.scoring.corpora`) is one word stream: words ``[0, split)`` are the *evaluation region*
(perplexity), everything after is the *prompt region*.  Within the prompt region, the first
:data:`CALIB_RESERVE_WORDS` words are reserved for calibration (BI, SLEB, Taylor read at most the first 2,048
words), and the scoring prompts are P windows of T tokens drawn anywhere in the prompt region's token stream
(:func:`swapkl.scoring.prompts.make_prompts`).  The *training region* of the corpus is the prompt region's token
stream after the calibration reserve, cut into consecutive chunks of ``seq_len`` tokens, minus every chunk that
touches a scoring-prompt window.  :func:`check_disjoint` asserts all of it in token coordinates before any
training.

A separate training file (``--train-text``) is used whole, and refused when it is the evaluation file (same path
or same content) or shares any passage of :data:`SHINGLE_WORDS` consecutive words with the evaluation corpus
(its evaluation and prompt regions).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from swapkl.errors import SwapklError
from swapkl.scoring import corpora
from swapkl.scoring.corpora import CALIB_RESERVE_WORDS
from swapkl.scoring.prompts import adds_bos, make_prompts, tokenize_stream

SHINGLE_WORDS = 20


class TrainTextError(SwapklError):
    """A training text that overlaps the evaluation text or the scoring prompts, or is too short."""


@dataclass
class TrainText:
    """``chunks``: (N, seq_len) token ids, BOS first when the tokenizer adds one; ``spans``: each chunk's
    ``[begin, end)`` in the source stream's token coordinates; ``description``: where it came from (JSON-able)."""

    chunks: torch.Tensor
    spans: list
    description: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        from swapkl.contract import stable_hash

        return stable_hash({k: v for k, v in self.description.items() if k != "chunks"})[:20]


def _cut(stream: list[int], begin: int, seq_len: int, bos: int | None, forbidden=()) -> tuple[list, list]:
    body = seq_len - (1 if bos is not None else 0)
    rows, spans = [], []
    for s in range(begin, len(stream) - body + 1, body):
        if any(s < b + n and b < s + body for b, n in forbidden):
            continue
        rows.append(([bos] if bos is not None else []) + stream[s:s + body])
        spans.append((s, s + body))
    return rows, spans


def _bos(tokenizer) -> int | None:
    return tokenizer.bos_token_id if adds_bos(tokenizer) else None


def corpus_train_text(corpus, tokenizer, seq_len: int, prompts: int = 16, tokens: int = 64,
                      prompt_seed: int = 0, avoid=()) -> TrainText:
    """The training region of ``corpus`` (module docstring), excluding the windows of the scoring contract
    (``prompts`` × ``tokens``, ``prompt_seed``) and the ``avoid`` windows ``(begin, length)`` of the prompt stream (a
    ``--repair bridge`` heal's calibration windows, drawn anywhere in the prompt region).  Raises
    :class:`TrainTextError` when nothing is left."""
    region = corpus.prompt_text().split(" ")
    if len(region) <= CALIB_RESERVE_WORDS:
        raise TrainTextError(f"corpus '{corpus.name}' has {len(region)} words after its evaluation region; a "
                             f"training region needs more than the {CALIB_RESERVE_WORDS} kept for calibration "
                             "(give --train-text FILE)")
    # the reserve first: tokenize_stream memoises one text, and make_prompts below reads the whole region again
    reserve = len(tokenize_stream(tokenizer, " ".join(region[:CALIB_RESERVE_WORDS])))
    stream = tokenize_stream(tokenizer, corpus.prompt_text())
    desc_p = make_prompts(tokenizer, corpus, prompts, tokens, prompt_seed).description
    body_p = tokens - (1 if desc_p["bos"] else 0)
    windows = [(int(s), body_p) for s in desc_p["window_starts"]]
    avoid = [(int(b), int(n)) for b, n in avoid]
    rows, spans = _cut(stream, reserve, seq_len, _bos(tokenizer), windows + avoid)
    if not rows:
        raise TrainTextError(f"corpus '{corpus.name}' has no {seq_len}-token training chunk after its calibration "
                             "reserve and scoring prompts (give --train-text FILE or a smaller --seq-len)")
    tt = TrainText(torch.tensor(rows, dtype=torch.long), spans, {
        "source": "corpus", "corpus": corpus.describe(), "region": "prompt region after the calibration reserve, "
        "minus the scoring-prompt windows", "calib_reserve_words": CALIB_RESERVE_WORDS, "calib_reserve_tokens":
        reserve, "stream_tokens": len(stream), "prompt_windows": windows, "seq_len": seq_len,
        "chunks": len(rows), **({"bridge_calibration_windows": avoid} if avoid else {})})
    check_disjoint(tt, calib_tokens=reserve, prompt_windows=windows, calib_windows=avoid)
    return tt


def check_disjoint(tt: TrainText, calib_tokens: int, prompt_windows, calib_windows=()) -> None:
    """Assert, in the prompt stream's token coordinates, that no training chunk touches the calibration reserve
    ``[0, calib_tokens)``, a scoring-prompt window or a bridge's calibration window (``(begin, length)`` each); the
    evaluation region is a separate word range before the whole stream.  Raises :class:`TrainTextError` naming the
    first overlap (the windows through :func:`swapkl.scoring.corpora.check_regions`, the one region check of the
    prompt stream)."""
    for b, e in tt.spans:
        if b < calib_tokens:
            raise TrainTextError(f"training chunk [{b}, {e}) overlaps the calibration text [0, {calib_tokens})")
    chunk = "training chunk"
    regions = {chunk: list(tt.spans), "scoring prompt window": [(pb, pb + n) for pb, n in prompt_windows],
               "bridge calibration window": [(pb, pb + n) for pb, n in calib_windows]}
    corpora.check_regions(regions, pairs=[(chunk, other) for other in regions if other != chunk],
                          error=TrainTextError)


def _shingles(words, n: int = SHINGLE_WORDS) -> set:
    return {hash(tuple(words[i:i + n])) for i in range(0, max(0, len(words) - n + 1))}


def check_file_disjoint(train: corpora.Corpus, others: list[tuple[str, corpora.Corpus]],
                        flag: str = "--train-text") -> None:
    """Refuse a training corpus that is one of ``others`` (``(role, corpus)``: the evaluation text, the scoring
    corpus) by path or content, or shares a passage of :data:`SHINGLE_WORDS` words with one of them (the held-out
    text of ``flag`` ``--heldout-text`` is checked the same way against the evaluation and training texts)."""
    tp = Path(train.name).expanduser()
    for role, other in others:
        op = Path(other.name).expanduser()
        if tp.exists() and op.exists() and tp.resolve() == op.resolve():
            raise TrainTextError(f"{flag} {train.name} is the {role} ({other.label}); give a text disjoint from it")
        if train.sha256 == other.sha256:
            raise TrainTextError(f"{flag} {train.name} has the same content as the {role} ({other.label}); "
                                 "give a text disjoint from it")
        theirs = _shingles(other.words)
        words = train.words
        for i in range(0, max(0, len(words) - SHINGLE_WORDS + 1)):
            if hash(tuple(words[i:i + SHINGLE_WORDS])) in theirs:
                where = "evaluation region" if other.split_point and _in_eval(other, words[i:i + SHINGLE_WORDS]) \
                    else "prompt region"
                raise TrainTextError(
                    f"{flag} {train.name} overlaps the {role} ({other.label}, its {where}) at word {i}: "
                    f"'{' '.join(words[i:i + 6])} ...'; give a text disjoint from it")


def _in_eval(corpus, passage) -> bool:
    ev = corpus.words[:corpus.split_point]
    n = len(passage)
    return any(tuple(ev[i:i + n]) == tuple(passage) for i in range(0, max(0, len(ev) - n + 1)))


def file_train_text(path, tokenizer, seq_len: int, others: list[tuple[str, corpora.Corpus]]) -> TrainText:
    """The whole of the text file ``path`` as training chunks, after :func:`check_file_disjoint` against
    ``others``.  Raises :class:`~swapkl.scoring.corpora.CorpusError` for a missing, binary or empty file and
    :class:`TrainTextError` for an overlap or a text shorter than one chunk."""
    train = corpora.from_file(path)
    check_file_disjoint(train, others)
    stream = tokenize_stream(tokenizer, " ".join(train.words))
    rows, spans = _cut(stream, 0, seq_len, _bos(tokenizer))
    if not rows:
        raise TrainTextError(f"--train-text {path} gives {len(stream)} tokens, fewer than one {seq_len}-token "
                             "chunk (give a longer text or a smaller --seq-len)")
    return TrainText(torch.tensor(rows, dtype=torch.long), spans, {
        "source": "file", "corpus": train.describe(), "region": "whole file", "stream_tokens": len(stream),
        "seq_len": seq_len, "chunks": len(rows),
        "checked_against": [{"role": r, "sha256": c.sha256} for r, c in others]})
