"""An lm-eval task's documents against the text a run reads from its corpus (docs/tasks.md "Offline tasks").

A run reads regions of one corpus (:mod:`swapkl.scoring.corpora`): held-out perplexity the first N words of the
evaluation region, the scoring prompts P windows anywhere in the prompt region's token stream, calibration the first
words of the prompt region (and a bridge's calibration windows anywhere in it).  A task evaluated in the same run
must not be built from that text.  :func:`check_task_disjoint` refuses, in one line, a task any document of which
overlaps one of those regions:

* a document that records its provenance (the shipped ``wikitext_lastword``: ``word_begin``, ``word_end``,
  ``corpus_sha256``) on the run's corpus (same sha256), by its word span against the word ranges of the regions;
* any other document (a hub task, a local YAML), by the passages of :data:`SHINGLE_WORDS` consecutive words it
  shares with the regions' text (every string field of the document; the scoring prompts as decoded text).

Other commands (evidence, study) call it with their own regions: ``check_task_disjoint(task, run_regions(corpus,
heldout_words=N, calib_words=C, prompts=prompts, tokenizer=tok))``.
"""
from __future__ import annotations

from dataclasses import dataclass

from swapkl.measure.lmeval import TaskError

#: a shared passage of this many consecutive words is an overlap (as for a heal's --train-text)
SHINGLE_WORDS = 20


class TaskOverlapError(TaskError):
    """A task with a document built from text the run reads (one line, exit 2 at the command line)."""


@dataclass(frozen=True)
class RunRegions:
    """The text one run reads from ``corpus``: held-out words ``[0, heldout_words)`` (evidence's second region:
    pass twice its evaluator's words), the first ``calib_words`` words of the prompt region, the decoded scoring
    prompt windows ``prompt_texts``, and ``whole_prompt_region`` when the run may read anywhere in the prompt region
    (a bridge's calibration windows)."""

    corpus: object
    heldout_words: int = 0
    calib_words: int = 0
    prompt_texts: tuple = ()
    whole_prompt_region: bool = False

    def word_ranges(self) -> dict:
        """``{region name: (begin, end)}`` word ranges of the corpus (the prompt windows: the whole prompt region,
        which holds them)."""
        c, split = self.corpus, self.corpus.split_point
        out = {}
        if self.heldout_words:
            out["held-out text"] = (0, int(self.heldout_words))
        if self.calib_words:
            out["calibration text"] = (split, split + int(self.calib_words))
        if self.prompt_texts or self.whole_prompt_region:
            out["scoring prompts" if not self.whole_prompt_region else "prompt region"] = (split, len(c.words))
        return out

    def texts(self) -> dict:
        """``{region name: [word sequences]}``, the text of each region for the passage check."""
        w, split = self.corpus.words, self.corpus.split_point
        out = {}
        if self.heldout_words:
            out["held-out text"] = [w[:int(self.heldout_words)]]
        if self.whole_prompt_region:
            out["prompt region"] = [w[split:]]
        else:
            if self.calib_words:
                out["calibration text"] = [w[split:split + int(self.calib_words)]]
            if self.prompt_texts:
                out["scoring prompts"] = [tuple(t.split()) for t in self.prompt_texts]
        return out


def run_regions(corpus, *, heldout_words: int = 0, calib_words: int = 0, prompts=None, tokenizer=None,
                whole_prompt_region: bool = False) -> RunRegions:
    """The :class:`RunRegions` of a run: ``prompts`` (a :class:`swapkl.scoring.prompts.Prompts` or a 2-D tensor of
    token ids) are decoded with ``tokenizer``."""
    texts = ()
    if prompts is not None:
        ids = getattr(prompts, "ids", prompts)
        texts = tuple(tokenizer.decode(row, skip_special_tokens=True) for row in ids.tolist())
    if not 0 <= heldout_words <= corpus.split_point:
        raise TaskError(f"held-out text of {heldout_words} words does not fit the evaluation region of corpus "
                        f"'{corpus.name}' ({corpus.split_point} words)")
    return RunRegions(corpus, int(heldout_words), int(calib_words), texts, bool(whole_prompt_region))


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _strings(v)


def _span(doc, sha: str):
    """The document's recorded word span on the corpus of ``sha``, else None."""
    if not isinstance(doc, dict) or doc.get("corpus_sha256") != sha:
        return None
    b, e = doc.get("word_begin"), doc.get("word_end")
    return (b, e) if isinstance(b, int) and isinstance(e, int) and 0 <= b < e else None


def _shingles(seqs) -> set:
    n = SHINGLE_WORDS
    return {hash(tuple(s[i:i + n])) for s in seqs for i in range(max(0, len(s) - n + 1))}


def check_task_disjoint(task: dict, regions: RunRegions) -> dict:
    """Refuse (:class:`TaskOverlapError`, one line) ``task`` (:func:`swapkl.measure.lmeval.load_task`'s dict) when
    a document of any of its tasks overlaps a region of ``regions``; else ``{"task", "documents", "by_span",
    "by_passage", "regions"}``: how many documents were checked, by recorded span and by shared passages, against
    which regions."""
    corpus = regions.corpus
    ranges, seqs = regions.word_ranges(), regions.texts()
    shingles = None  # built on the first document without a span on this corpus
    by_span = by_passage = 0
    for leaf, obj in task["leaves"].items():
        for k, doc in enumerate(obj.eval_docs):
            span = _span(doc, corpus.sha256)
            if span is not None:
                by_span += 1
                for name, (b, e) in ranges.items():
                    if span[0] < e and b < span[1]:
                        raise TaskOverlapError(
                            f"lm-eval task '{leaf}' document {k} (words [{span[0]}, {span[1]}) of corpus "
                            f"'{corpus.name}') overlaps the run's {name} (words [{b}, {e})); refusing to evaluate "
                            "a task on text the run reads")
                continue
            by_passage += 1
            if shingles is None:
                shingles = {name: _shingles(s) for name, s in seqs.items()}
            _check_passages(leaf, k, doc, shingles, corpus)
    return {"task": task["name"], "documents": by_span + by_passage, "by_span": by_span, "by_passage": by_passage,
            "regions": {n: list(r) for n, r in ranges.items()}}


def _check_passages(leaf: str, k: int, doc, shingles: dict, corpus) -> None:
    n = SHINGLE_WORDS
    for text in _strings(doc):
        words = text.split()
        for i in range(max(0, len(words) - n + 1)):
            h = hash(tuple(words[i:i + n]))
            for name, hs in shingles.items():
                if h in hs:
                    raise TaskOverlapError(
                        f"lm-eval task '{leaf}' document {k} shares a {n}-word passage with the run's {name} of "
                        f"corpus '{corpus.name}' ('{' '.join(words[i:i + 6])} ...'); refusing to evaluate a task "
                        "on text the run reads")


def describe(summary: dict) -> str:
    """One note line for a result: what was checked."""
    regs = ", ".join(summary["regions"]) or "no region"
    return (f"task {summary['task']}: {summary['documents']} documents checked disjoint from the run's {regs} "
            f"({summary['by_span']} by recorded word span, {summary['by_passage']} by {SHINGLE_WORDS}-word passages)")


def check_run(loaded, scoring, *, heldout=None, heldout_words: int = 0, calib_words: int = 0, prompts=None,
              tokenizer=None, whole_prompt_region: bool = False) -> list[str]:
    """Every task of ``loaded`` (:func:`swapkl.measure.lmeval.load_tasks`' list) against the text one run reads:
    from the ``scoring`` corpus its calibration words, its scoring ``prompts`` (decoded with ``tokenizer``) or the
    whole prompt region; from the ``heldout`` corpus (default: ``scoring``) its first ``heldout_words`` words.
    Raises the one-line :class:`TaskOverlapError`; returns one note per task and corpus checked (:func:`describe`)."""
    regions = [run_regions(scoring, calib_words=calib_words, prompts=prompts, tokenizer=tokenizer,
                           whole_prompt_region=whole_prompt_region)]
    if heldout_words:
        regions.append(run_regions(heldout if heldout is not None else scoring, heldout_words=heldout_words))
    return [describe(check_task_disjoint(t, r)) for r in regions for t in loaded]


def check_contract(loaded, contract, tokenizer=None, *, heldout=None, heldout_words: int = 0,
                   whole_prompt_region: bool = False) -> list[str]:
    """:func:`check_run` for a run scored under swap-KL ``contract``: its corpus's calibration reserve
    (:data:`swapkl.scoring.corpora.CALIB_RESERVE_WORDS`), with ``tokenizer`` its scoring prompts
    (:func:`swapkl.scoring.prompts.make_prompts`), the whole prompt region when ``whole_prompt_region``, and the
    first ``heldout_words`` words of ``heldout`` (default: the contract's corpus)."""
    from swapkl.scoring.corpora import CALIB_RESERVE_WORDS, load_corpus
    from swapkl.scoring.prompts import make_prompts

    scoring = load_corpus(contract.corpus)
    prompts = None if tokenizer is None else make_prompts(tokenizer, scoring, contract.prompts, contract.tokens,
                                                           contract.seed, contract.bos)
    return check_run(loaded, scoring, heldout=heldout, heldout_words=heldout_words, calib_words=CALIB_RESERVE_WORDS,
                     prompts=prompts, tokenizer=tokenizer, whole_prompt_region=whole_prompt_region)
