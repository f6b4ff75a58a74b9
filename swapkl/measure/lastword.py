"""The shipped offline task ``wikitext_lastword``: LAMBADA-style last-word prediction on WikiText-2 text that no
default contract reads (docs/tasks.md "Offline tasks").

Each document is a passage of :data:`MIN_CONTEXT`-:data:`MAX_CONTEXT` words of the WikiText-2 raw test word stream
(:mod:`swapkl.scoring.corpora`: the same stream from the hub or the local copy), starting at a sentence where one
fits, followed by a target word that already occurs in the passage (LAMBADA's construction: the passage holds what
the word needs).  A target is a word of letters only, at least 3 long, not a function word; targets are at least
:data:`GAP` words apart.  Every document lies in words :data:`WORD_RANGE` of the evaluation region: held-out
perplexity reads the first N words (the matched evaluator 5,000; evidence's second region the next 5,000), the
scoring prompts and calibration text the prompt region from word 20,000 on.  Each records its word span and the
corpus's sha256 (:mod:`swapkl.measure.task_regions` checks a run's regions against them).

The task is an lm-eval YAML (``tasks/wikitext_lastword/``, package data) whose ``custom_dataset`` is
:func:`dataset` here, so it loads from any working directory with no hub.  ``output_type: loglikelihood`` with
``acc``: the target is the model's greedy continuation of the passage (lm-eval's ``is_greedy``, as lambada_openai).

Rebuild: ``python -m swapkl.measure.lastword tests/fixtures/data/wikitext-2-raw/wiki.test.raw [--write]`` (without
``--write`` it checks that the shipped file is byte-identical to a fresh build).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TASK = "wikitext_lastword"
#: the folder swapkl adds to every lm-eval include path (its own tasks, one folder each)
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
JSONL = TASKS_DIR / TASK / f"{TASK}.jsonl"
#: the word range of the WikiText-2 raw test stream the documents come from
WORD_RANGE = (15_000, 20_000)
MIN_CONTEXT, MAX_CONTEXT, GAP = 60, 120, 12
#: the sha256 of the source word stream (:attr:`swapkl.scoring.corpora.Corpus.sha256` of WikiText-2 raw test)
SOURCE_SHA256 = "06f8f4136de90fcf1b32ffda9136ecab621b3e437c370b5cdd27b37e9e9e9efc"
SOURCE = "WikiText-2 raw test (wikitext-2-raw-v1, split test)"
_WORD = re.compile(r"[A-Za-z]{3,}")
_STOP = frozenset("""the and that with this from were was for have has had which their there they been into also
other after when would about more than then them its his her she him but not are one two three only some such these
those over most many first while where what both each during who who whom could should will may might can did does
being because before between under again further same very just any all our out off own too you your yours""".split())


def eligible(word: str) -> bool:
    """A possible target: letters only, at least 3, not a function word."""
    return bool(_WORD.fullmatch(word)) and word.lower() not in _STOP


def _context_start(words, i: int, lo: int) -> int:
    """The earliest sentence start in ``[i - MAX_CONTEXT, i - MIN_CONTEXT]`` (a word after ``.``), else
    ``i - MAX_CONTEXT``; never before ``lo``."""
    first = max(lo, i - MAX_CONTEXT)
    for s in range(first, i - MIN_CONTEXT + 1):
        if s == lo or words[s - 1] == ".":
            return s
    return first


def build_docs(words, word_range=WORD_RANGE, sha256: str = SOURCE_SHA256) -> list[dict]:
    """The documents of ``words[word_range[0]:word_range[1]]`` (deterministic)."""
    lo, hi = word_range
    docs, last = [], -GAP
    for i in range(lo + MIN_CONTEXT, min(hi, len(words))):
        t = words[i]
        if i - last < GAP or not eligible(t):
            continue
        b = _context_start(words, i, lo)
        ctx = words[b:i]
        if t not in ctx:
            continue
        cands = len({w for w in ctx if eligible(w)})
        docs.append({"context": " ".join(ctx), "target": t, "word_begin": b, "word_end": i + 1,
                     "corpus_sha256": sha256, "chance": round(1.0 / cands, 6)})
        last = i
    return docs


def render(docs) -> bytes:
    return "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in docs).encode("utf-8")


def read_docs(path=JSONL) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def dataset(**_kwargs):
    """lm-eval's ``custom_dataset``: the shipped documents as a ``datasets.DatasetDict`` with one ``test`` split."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(read_docs())})


def main(argv=None) -> int:
    from swapkl.scoring import corpora

    args = list(sys.argv[1:] if argv is None else argv)
    write = "--write" in args
    paths = [a for a in args if a != "--write"]
    if len(paths) != 1:
        print("usage: python -m swapkl.measure.lastword WIKI_TEST_RAW [--write]", file=sys.stderr)
        return 2
    corpus = corpora.from_file(paths[0])
    if corpus.sha256 != SOURCE_SHA256:
        print(f"error: {paths[0]} is not the WikiText-2 raw test word stream (sha256 {corpus.sha256[:12]}...)",
              file=sys.stderr)
        return 2
    docs = build_docs(corpus.words)
    data = render(docs)
    if write:
        JSONL.write_bytes(data)
        print(f"wrote {JSONL} ({len(docs)} documents)")
        return 0
    same = JSONL.is_file() and JSONL.read_bytes() == data
    print(f"{JSONL}: {'identical to' if same else 'DIFFERS from'} a fresh build ({len(docs)} documents)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
