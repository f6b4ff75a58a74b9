"""Text corpora: WikiText-2 (hub or local file), any local text file, and a built-in offline fallback.

One rule keeps swap-KL prompts and perplexity text apart: a corpus is one word stream; its first
``eval_words`` words (20,000, the largest evaluator contract, or half the stream if it is shorter) are the
*evaluation region* (perplexity test text), everything after is the *prompt region* (swap-KL prompts and
calibration text for SLEB / Block Influence).  The hub and the local copy of WikiText-2 give the same word
stream, so they give the same prompts.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from swapkl.errors import SwapklError
from swapkl.store import PROJECT_ROOT

# Deferred imports: datasets (optional, slow to import) is imported only when the wikitext-2 corpus is requested.

EVAL_REGION_WORDS = 20_000
#: prompt-region words kept for calibration text (BI, SLEB, Taylor read at most the first 2,048; a heal trains after
#: them); a multiple of tokenize_stream's 2,000-word pieces, so the reserve's tokens are exactly the first tokens of
#: the prompt region's stream
CALIB_RESERVE_WORDS = 4000
ENV_CORPUS = "SWAPKL_CORPUS"
BUILTIN = "builtin:pydoc"
WIKITEXT2 = "wikitext2"


class CorpusError(SwapklError):
    pass


@dataclass(frozen=True)
class Corpus:
    """A word stream with a name that says where it came from.

    ``label`` is what the UI and exports print next to every number computed from it; a fallback corpus
    says so in its label.
    """

    name: str
    words: tuple[str, ...]
    label: str
    is_fallback: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(" ".join(self.words).encode()).hexdigest()

    @property
    def split_point(self) -> int:
        return min(EVAL_REGION_WORDS, len(self.words) // 2)

    def eval_text(self, max_words: int) -> str:
        """The first ``max_words`` words of the evaluation region, joined by single spaces (docs/method.md §3)."""
        if max_words > self.split_point:
            raise CorpusError(
                f"corpus '{self.name}' has {self.split_point} words of evaluation text; {max_words} were asked for"
            )
        return " ".join(self.words[:max_words])

    def prompt_text(self) -> str:
        """The prompt region: every word after the evaluation region, joined by single spaces."""
        return " ".join(self.words[self.split_point:])

    def describe(self) -> dict:
        return {"name": self.name, "label": self.label, "sha256": self.sha256, "words": len(self.words),
                "eval_region_words": self.split_point, "fallback": self.is_fallback}


def check_regions(regions: dict, pairs=None, error: type[SwapklError] = CorpusError, corpus: Corpus | None = None,
                  eval_words: int = 0) -> None:
    """Assert that the named token ranges of one corpus's prompt-region stream do not intersect.

    ``regions``: ``{name: [(begin, end), ...]}`` half-open token ranges in the stream
    :func:`swapkl.scoring.prompts.tokenize_stream` makes of :meth:`Corpus.prompt_text` (e.g. ``"calibration
    window"``, ``"scoring prompt window"``, ``"training chunk"``); ``pairs``: the (name, name) pairs that must be
    disjoint (default every pair of different names; ranges of one name may overlap).  The evaluation region is a
    word range before that stream: with ``corpus`` and ``eval_words`` it must fit in the corpus's first
    ``split_point`` words.  Raises ``error`` (one line naming the first overlap) otherwise."""
    if corpus is not None and not 0 <= eval_words <= corpus.split_point:
        raise error(f"the evaluation text ({eval_words} words) does not fit the evaluation region of corpus "
                    f"'{corpus.name}' ({corpus.split_point} words before the prompt region)")
    names = list(regions)
    want = {frozenset(p) for p in pairs} if pairs is not None else \
        {frozenset((a, b)) for a in names for b in names if a != b}
    spans = sorted((int(b), int(e), n) for n, rs in regions.items() for b, e in rs if int(e) > int(b))
    furthest: dict = {}  # name -> the range of that name reaching furthest so far
    for b, e, n in spans:
        for other, (ob, oe) in furthest.items():
            if other != n and oe > b and frozenset((n, other)) in want:
                (n1, r1), (n2, r2) = sorted(((n, (b, e)), (other, (ob, oe))), key=lambda x: names.index(x[0]))
                where = f" of corpus '{corpus.name}'" if corpus is not None else ""
                raise error(f"{n1} [{r1[0]}, {r1[1]}) overlaps {n2} [{r2[0]}, {r2[1]}) in the prompt region's "
                            f"token stream{where}; refusing to compute")
        if n not in furthest or e > furthest[n][1]:
            furthest[n] = (b, e)


def join_rows(rows) -> str:
    """docs/method.md §3: drop empty rows and join with blank lines."""
    return "\n\n".join(r for r in rows if r.strip())


def from_text(text: str, name: str, label: str | None = None, is_fallback: bool = False) -> Corpus:
    words = tuple(text.split())
    if not words:
        raise CorpusError(f"corpus '{name}' is empty (no words)")
    return Corpus(name=name, words=words, label=label or name, is_fallback=is_fallback)


MAX_INVALID_UTF8 = 0.10  # share of characters that may be invalid UTF-8 (a stray Latin-1 accent passes)


def decode_text(data: bytes, path: str | os.PathLike) -> str:
    """``data`` as text, or :class:`CorpusError` naming ``path`` when it is not text: it holds NUL bytes (any
    binary: executables, archives, UTF-16) or more than :data:`MAX_INVALID_UTF8` of its characters are not
    valid UTF-8.  A few invalid bytes become U+FFFD."""
    if b"\0" in data:
        raise CorpusError(f"{path} is not a text file (it contains NUL bytes); give a UTF-8 text file")
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
    if text and bad > MAX_INVALID_UTF8 * len(text):
        raise CorpusError(f"{path} is not a text file ({100 * bad / len(text):.0f} % of it is not valid UTF-8); "
                          "give a UTF-8 text file")
    return text


def from_file(path: str | os.PathLike) -> Corpus:
    """A corpus from a UTF-8 text file; :class:`CorpusError` for a missing, unreadable, binary or empty file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise CorpusError(f"no such text file: {p}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CorpusError(f"cannot read {p}: {e}") from e
    rows = decode_text(data, p).splitlines()
    return from_text(join_rows(rows), name=str(p), label=f"local file {p.name}")


def builtin() -> Corpus:
    """English prose that every Python install has: the standard library's pydoc topic texts.

    Used only when nothing better is available, and labelled as such."""
    from pydoc_data import topics  # deferred: a 0.7 MB module, read only for this fallback text

    text = join_rows(topics.topics[k] for k in sorted(topics.topics))
    return from_text(text, name=BUILTIN, label="built-in fallback corpus (Python pydoc topics, not WikiText)",
                     is_fallback=True)


def wikitext2() -> Corpus:
    """WikiText-2 raw test split through ``datasets`` (needs the hub)."""
    try:
        import datasets

        ds = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")
    except Exception as e:  # offline, no such dataset, ...
        raise CorpusError(f"cannot load WikiText-2 through datasets ({type(e).__name__}: {e})") from e
    return from_text(join_rows(ds["text"]), name=WIKITEXT2, label="WikiText-2 raw test (hub)")


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False") or \
        os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("0", "", "false", "False")


_CACHE: dict[str, Corpus] = {}


def load_corpus(spec: str | None = None) -> Corpus:
    """Resolve a corpus spec.

    ``None`` / ``"auto"``: ``$SWAPKL_CORPUS`` if set, else WikiText-2 from the hub when reachable, else a
    local WikiText-2 copy next to the project (``../shared/data/...``), else the built-in fallback.
    ``"wikitext2"``: the hub.  ``"builtin"`` / ``"builtin:pydoc"``: the fallback.  Anything else: a file path.
    """
    key = spec or "auto"
    if key in _CACHE:
        return _CACHE[key]
    if key == "auto":
        corpus = _auto()
    elif key == WIKITEXT2:
        corpus = wikitext2()
    elif key in ("builtin", BUILTIN):
        corpus = builtin()
    else:
        corpus = from_file(key)
    _CACHE[key] = corpus
    return corpus


def local_wikitext_candidates() -> list[Path]:
    here = PROJECT_ROOT
    rel = Path("data") / "wikitext-2-raw" / "wiki.test.raw"
    return [here / ".." / "shared" / rel, here / "shared" / rel, Path.cwd() / ".." / "shared" / rel]


def _auto() -> Corpus:
    env = os.environ.get(ENV_CORPUS)
    if env:
        return from_file(env)
    for cand in local_wikitext_candidates():
        if cand.is_file():
            c = from_file(cand)
            return Corpus(c.name, c.words, "WikiText-2 raw test (local copy)", False)
    if not _hub_offline():
        try:
            return wikitext2()
        except CorpusError:
            pass
    return builtin()
